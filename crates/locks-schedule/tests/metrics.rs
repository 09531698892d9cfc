//! The schedule's instruments, recorded through the OpenTelemetry SDK's in-memory
//! exporter while a job runs, finds its slot run, finds its lock busy and finds a gap.

use std::time::Duration;

use locks_memory::InMemoryLockTable;
use locks_port::DistributedLock;
use locks_schedule::metrics::{ALREADY_RUN, BUSY, LATENESS, MISSED, RUNS};
use locks_schedule::{Clock, JobContext, ManualClock, MemoryLedger, ScheduledJob};
use opentelemetry::metrics::MeterProvider;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use time::macros::datetime;

/// One exported point: instrument, attributes, value (or a histogram's sum), count.
type Point = (String, Vec<(String, String)>, f64, u64);

/// Every point exported.
fn points(exporter: &InMemoryMetricExporter, provider: &SdkMeterProvider) -> Vec<Point> {
    exporter.reset();
    provider.force_flush().expect("flush");
    let exported = exporter.get_finished_metrics().expect("exported");
    let mut points = Vec::new();
    for scope in exported.last().expect("an export").scope_metrics() {
        for metric in scope.metrics() {
            let attributes = |kvs: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                kvs.map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
                    .collect::<Vec<_>>()
            };
            #[allow(clippy::cast_precision_loss)] // small test counts
            match metric.data() {
                AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                    for point in sum.data_points() {
                        let value = point.value() as f64;
                        points.push((
                            metric.name().to_owned(),
                            attributes(&mut point.attributes()),
                            value,
                            0,
                        ));
                    }
                }
                AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
                    for point in histogram.data_points() {
                        points.push((
                            metric.name().to_owned(),
                            attributes(&mut point.attributes()),
                            point.sum(),
                            point.count(),
                        ));
                    }
                }
                other => panic!("unexpected data for {}: {other:?}", metric.name()),
            }
        }
    }
    points
}

fn value(points: &[Point], name: &str, attribute: Option<(&str, &str)>) -> f64 {
    points
        .iter()
        .filter(|(n, attributes, _, _)| {
            n == name
                && attribute
                    .is_none_or(|(k, v)| attributes.iter().any(|(ak, av)| ak == k && av == v))
        })
        .map(|(_, _, value, _)| value)
        .sum()
}

#[tokio::test]
async fn runs_already_run_busy_missed_and_lateness_are_recorded() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let clock = ManualClock::new(datetime!(2026-12-04 06:00:00.25 UTC));
    let ledger = MemoryLedger::new(clock.clone());
    let table = InMemoryLockTable::new();
    let (host_a, host_b) = (table.manager(), table.manager());
    let job =
        ScheduledJob::new("metered", "1m".parse().expect("1m")).meter(&provider.meter("test"));
    let ok = |_: JobContext| async { Ok::<(), String>(()) };
    assert!(
        job.run_once_per_slot(&host_a, &ledger, ok)
            .await
            .expect("fire")
            .verdict
            .ran()
    );
    job.run_once_per_slot(&host_b, &ledger, ok)
        .await
        .expect("fire");
    let held = host_b
        .try_acquire(&job.lock_key(None))
        .await
        .expect("lock")
        .expect("free");
    job.run_once_per_slot(&host_a, &ledger, ok)
        .await
        .expect("fire");
    drop(held);
    // Down for three slots, then a failing run 2 s into its slot.
    clock.set(datetime!(2026-12-04 06:04:02 UTC));
    assert_eq!(clock.now(), datetime!(2026-12-04 06:04:02 UTC));
    let fail = |_: JobContext| async { Err::<(), String>("no report today".into()) };
    job.run_once_per_slot(&host_b, &ledger, fail)
        .await
        .expect("fire");

    let points = points(&exporter, &provider);
    let job_attribute = Some(("schedule.job", "metered"));
    assert_eq!(
        value(&points, RUNS, Some(("schedule.outcome", "succeeded"))),
        1.0
    );
    assert_eq!(
        value(&points, RUNS, Some(("schedule.outcome", "failed"))),
        1.0
    );
    assert_eq!(
        value(
            &points,
            ALREADY_RUN,
            Some(("schedule.outcome", "succeeded"))
        ),
        1.0
    );
    assert_eq!(value(&points, BUSY, job_attribute), 1.0);
    assert_eq!(value(&points, MISSED, job_attribute), 1.0);
    let lateness: Vec<_> = points
        .iter()
        .filter(|(name, ..)| name == LATENESS)
        .collect();
    assert_eq!(
        lateness.iter().map(|(.., count)| count).sum::<u64>(),
        2,
        "{lateness:?}"
    );
    let late = lateness.iter().map(|(_, _, sum, _)| sum).sum::<f64>();
    assert!(
        (late - Duration::from_millis(2_250).as_secs_f64()).abs() < 1e-9,
        "0.25 s + 2 s, got {late}"
    );
}
