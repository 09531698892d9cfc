//! The members' instruments, read back through an in-memory exporter.

use std::time::Duration;

use locks_memory::InMemoryLockTable;
use locks_port::LostSignal;
use locks_shard::{MemoryTerms, Owned, ShardGroup, ShardMember, metrics};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// The latest value of each sum, and the count of each histogram, by name.
fn read(provider: &SdkMeterProvider, exporter: &InMemoryMetricExporter, name: &str) -> f64 {
    provider.force_flush().expect("flush");
    let finished = exporter.get_finished_metrics().expect("metrics");
    let Some(resource) = finished.last() else {
        return 0.0;
    };
    resource
        .scope_metrics()
        .flat_map(|scope| scope.metrics())
        .filter(|metric| metric.name() == name)
        .map(|metric| match metric.data() {
            AggregatedMetrics::I64(MetricData::Sum(sum)) => {
                sum.data_points().map(|p| p.value() as f64).sum::<f64>()
            }
            AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                sum.data_points().map(|p| p.value() as f64).sum::<f64>()
            }
            AggregatedMetrics::F64(MetricData::Histogram(histogram)) => histogram
                .data_points()
                .map(|p| p.count() as f64)
                .sum::<f64>(),
            other => panic!("{name}: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_terms_handoffs_and_rebalances_are_counted() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let meter = provider.meter("shard-test");
    let table = InMemoryLockTable::new();
    let terms = MemoryTerms::new();
    let group = ShardGroup::new("g", (0..6).map(|i| format!("s{i}"))).expect("a group");
    let member = |name: &str| {
        ShardMember::new(
            table.manager_with_holder_id(name),
            terms.clone(),
            group.clone(),
        )
        .tick(Duration::from_millis(5))
        .meter(&meter)
    };
    let (a, b) = (member("a"), member("b"));
    let task = |_owned: Owned, stop: LostSignal| async move {
        stop.await;
    };
    let (leave, left) = tokio::sync::oneshot::channel::<()>();
    let both = async {
        let b_run = b.run_until(task, async {
            let _ = left.await;
        });
        tokio::join!(a.run(task), b_run)
    };
    let check = async {
        let balanced =
            |shards: &locks_shard::Shards| shards.is_balanced() && shards.members.len() == 2;
        let mut watch = a.watch().interval(Duration::from_millis(5));
        while !balanced(&watch.changed().await.expect("owners")) {}
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(read(&provider, &exporter, metrics::OWNED), 6.0);
        let terms_begun = read(&provider, &exporter, metrics::TERMS);
        assert!(terms_begun >= 6.0, "{terms_begun}");
        assert!(read(&provider, &exporter, metrics::REBALANCE_DURATION) >= 1.0);
        let _ = leave.send(());
        let mut watch = a.watch().interval(Duration::from_millis(5));
        loop {
            let shards = watch.changed().await.expect("owners");
            if shards.members.len() == 1 && shards.is_balanced() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(read(&provider, &exporter, metrics::OWNED), 6.0);
        assert!(read(&provider, &exporter, metrics::HANDOFFS) >= 3.0);
    };
    tokio::select! {
        _ = both => panic!("the members stopped"),
        () = check => {}
    }
}
