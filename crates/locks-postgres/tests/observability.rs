//! The spans reach an OpenTelemetry pipeline with the database conventions, and key
//! text stays out when asked.
//!
//! A test binary of its own because it installs a global subscriber: a scoped one
//! (`set_default`) misses spans when other tests on other threads hit the same
//! callsites first and cache "no interest" (tokio-rs/tracing#3611). Tests here run in
//! parallel against one exporter, so each looks only at the spans of its own lock id.

use std::sync::OnceLock;
use std::time::Duration;

use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::{KeyVisibility, PostgresLockManager};
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::{Key, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::prelude::*;

#[path = "it/support.rs"]
#[allow(dead_code)] // shared with the `it` binary, which uses all of it
mod support;

use support::{pool, unannounced_pool, unique_key};

/// The process-wide exporter behind the global subscriber, installed once.
fn exporter() -> &'static (InMemorySpanExporter, SdkTracerProvider) {
    static PIPELINE: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    PIPELINE.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("locks-it")))
            .with(Everything)
            .init();
        (exporter, provider)
    })
}

/// Every span field and event field of the run, as text: what any subscriber (a log
/// file, an exporter) could ever see.
static RECORDED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Everything;

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={value:?}", field.name()));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push_str(&format!(" {}={value}", field.name()));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Everything {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let metadata = attrs.metadata();
        let mut fields = Fields(format!("{} level={}", metadata.name(), metadata.level()));
        attrs.record(&mut fields);
        RECORDED.lock().unwrap().push(fields.0);
    }
    fn on_record(
        &self,
        _id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields("record".to_owned());
        values.record(&mut fields);
        RECORDED.lock().unwrap().push(fields.0);
    }
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(event.metadata().name().to_owned());
        event.record(&mut fields);
        RECORDED.lock().unwrap().push(fields.0);
    }
}

/// The lock spans are at DEBUG unless the manager (or `TransactionLocks`) says
/// otherwise: a subscriber at the usual INFO filter records none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_spans_are_at_debug_unless_the_builder_says_otherwise() {
    let _ = exporter();
    for (level, manager) in [
        (tracing::Level::DEBUG, PostgresLockManager::new(pool(1))),
        (
            tracing::Level::INFO,
            PostgresLockManager::builder(pool(1))
                .span_level(tracing::Level::INFO)
                .build(),
        ),
    ] {
        let key = unique_key("level");
        let id = locks_port::lock_id(&key);
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        guard.release().await;
        let recorded = RECORDED.lock().unwrap().clone();
        let spans: Vec<&String> = recorded
            .iter()
            .filter(|text| {
                text.starts_with("eventsource.lock.") && text.contains(&format!("lock.id={id}"))
            })
            .collect();
        assert_eq!(spans.len(), 2, "an acquire and a release span: {spans:?}");
        for span in spans {
            assert!(
                span.contains(&format!("level={level}")),
                "{span} at {level}"
            );
        }
    }
}

/// With hidden keys, no span or event of any path, failures and losses included,
/// carries the key text (while the same paths with keys shown do: the check can fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_keys_stay_out_of_every_record_on_failure_paths() {
    let _ = exporter();
    for visibility in [KeyVisibility::Hidden, KeyVisibility::Shown] {
        let key = unique_key("hidden-failures");
        let manager = PostgresLockManager::builder(pool(1))
            .key_visibility(visibility)
            .build();
        let other = PostgresLockManager::builder(pool(1))
            .key_visibility(visibility)
            .build();
        // Timeout, busy try, exhausted pool, not held.
        let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
        let _ = other
            .acquire(
                &key,
                AcquireOptions::new().with_timeout(Duration::from_millis(50)),
            )
            .await
            .expect_err("held");
        assert!(other.try_acquire(&key).await.unwrap().is_none());
        let _ = manager
            .try_acquire(&key)
            .await
            .expect_err("the pool of one is in use");
        // A lost lock: its backend terminated.
        let admin = support::admin().await;
        admin
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
                 AND objid::bigint = ($1::bigint & 4294967295)",
                &[&locks_port::lock_id(&key)],
            )
            .await
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
        guard.release().await;
        assert!(manager.release(&key).await.is_err());
        // Unreachable.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
        let refused = PostgresLockManager::builder(locks_postgres::plain_pool(&url, 1).unwrap())
            .key_visibility(visibility)
            .build();
        let _ = refused.try_acquire(&key).await.expect_err("refused");
        let _ = refused
            .acquire(
                &key,
                AcquireOptions::new().with_timeout(Duration::from_millis(100)),
            )
            .await
            .expect_err("refused");

        let recorded = RECORDED.lock().unwrap();
        let leaks: Vec<&String> = recorded.iter().filter(|text| text.contains(&key)).collect();
        match visibility {
            KeyVisibility::Hidden => assert!(leaks.is_empty(), "key text leaked: {leaks:#?}"),
            _ => assert!(
                !leaks.is_empty(),
                "with keys shown the records name the key"
            ),
        }
    }
}

/// Runs `body`; returns the finished spans about `lock_id`, in the order they ended.
async fn exported<F: std::future::Future<Output = ()>>(lock_id: i64, body: F) -> Vec<SpanData> {
    let (exporter, provider) = exporter();
    body.await;
    provider.force_flush().expect("flush");
    exporter
        .get_finished_spans()
        .expect("spans")
        .into_iter()
        .filter(|span| attribute(span, "lock.id") == Some(&Value::I64(lock_id)))
        .collect()
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == Key::from(key.to_owned()))
        .map(|kv| &kv.value)
}

fn string(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(Value::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_and_release_spans_carry_database_attributes() {
    let manager = PostgresLockManager::new(pool(2));
    let other = PostgresLockManager::new(pool(2));
    let key = unique_key("otel");
    let id = locks_port::lock_id(&key);
    let spans = exported(id, async {
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        let error = other
            .acquire(
                &key,
                AcquireOptions::new().with_timeout(Duration::from_millis(50)),
            )
            .await
            .expect_err("held");
        assert!(error.is_timeout());
        guard.release().await;
    })
    .await;
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "eventsource.lock.acquire",
            "eventsource.lock.acquire",
            "eventsource.lock.release"
        ],
        "one span per acquire and per release"
    );
    for span in &spans {
        assert_eq!(span.span_kind, SpanKind::Client);
        assert_eq!(
            string(span, "db.system.name").as_deref(),
            Some("postgresql")
        );
        assert_eq!(attribute(span, "lock.id"), Some(&Value::I64(id)));
        assert_eq!(string(span, "lock.key").as_deref(), Some(key.as_str()));
    }
    let granted = &spans[0];
    assert_eq!(
        string(granted, "db.operation.name").as_deref(),
        Some("pg_advisory_lock")
    );
    assert_eq!(
        attribute(granted, "lock.acquired"),
        Some(&Value::Bool(true))
    );
    assert!(attribute(granted, "lock.wait_ms").is_some());
    assert_eq!(attribute(granted, "db.response.status_code"), None);

    let timed_out = &spans[1];
    assert_eq!(
        attribute(timed_out, "lock.acquired"),
        Some(&Value::Bool(false))
    );
    assert_eq!(
        string(timed_out, "db.response.status_code").as_deref(),
        Some("55P03")
    );
    assert_eq!(string(timed_out, "error.type").as_deref(), Some("timeout"));
    assert_eq!(
        attribute(timed_out, "lock.timeout_ms"),
        Some(&Value::I64(50))
    );
    assert!(
        matches!(timed_out.status, Status::Error { .. }),
        "{:?}",
        timed_out.status
    );

    let released = &spans[2];
    assert_eq!(
        string(released, "db.operation.name").as_deref(),
        Some("pg_advisory_unlock")
    );
    assert_eq!(
        attribute(released, "lock.released"),
        Some(&Value::Bool(true))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_keys_stay_out_of_spans() {
    let manager = PostgresLockManager::builder(pool(1))
        .key_visibility(KeyVisibility::Hidden)
        .build();
    let key = unique_key("tenant-secret");
    let spans = exported(locks_port::lock_id(&key), async {
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        guard.release().await;
    })
    .await;
    assert_eq!(spans.len(), 2);
    for span in &spans {
        assert_eq!(
            attribute(span, "lock.key"),
            None,
            "key text leaked into {}",
            span.name
        );
        assert!(
            span.attributes
                .iter()
                .all(|kv| !kv.value.to_string().contains(&key)),
            "key text leaked into an attribute of {}",
            span.name
        );
        assert_eq!(
            attribute(span, "lock.id"),
            Some(&Value::I64(locks_port::lock_id(&key)))
        );
    }
}

/// Terminates the backend that holds the lock `id`.
async fn terminate_holder(admin: &locks_postgres::tokio_postgres::Client, id: i64) {
    let terminated: bool = admin
        .query_one(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&id],
        )
        .await
        .expect("the holder's backend")
        .get(0);
    assert!(terminated);
}

/// The tests that terminate a holder's backend, one at a time: a connection of an
/// announcing pool that ends is announced process-wide, which wakes every manager's
/// monitor, so the other test's monitor would find its closed connection before its
/// release does.
static TERMINATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A failed unlock is visible in the pipeline: the release span is an error, and the
/// WARNING `Error releasing advisory lock` is an event on it. (On a pool whose
/// connections' end wakes no monitor, so the release is the first to find it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unlock_is_a_warning_event_on_an_error_span() {
    let _alone = TERMINATING.lock().await;
    let manager = PostgresLockManager::builder(unannounced_pool(1))
        .health_check_interval(Duration::from_secs(3600))
        .lease(None)
        .keepalive(None)
        .build();
    let admin = support::admin().await;
    let key = unique_key("otel-terminated");
    let id = locks_port::lock_id(&key);
    let spans = exported(id, async {
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        terminate_holder(&admin, id).await;
        for _ in 0..100 {
            if support::holders(&admin, id).await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            guard.release().await,
            locks_port::ReleaseOutcome::SessionClosed
        );
    })
    .await;
    let released = spans
        .iter()
        .find(|span| span.name == "eventsource.lock.release")
        .expect("a release span");
    assert_eq!(
        attribute(released, "lock.released"),
        Some(&Value::Bool(false))
    );
    assert!(
        matches!(released.status, Status::Error { .. }),
        "{:?}",
        released.status
    );
    assert_eq!(
        string(released, "error.type").as_deref(),
        Some("connection_lost")
    );
    let warning = released
        .events
        .iter()
        .find(|event| event.name.starts_with("Error releasing advisory lock"))
        .expect("the WARNING is an event of the release span");
    assert!(
        warning
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "level" && kv.value.as_str() == "WARN"),
        "{:?}",
        warning.attributes
    );
}

/// Without `builder.meter(..)` the instruments are made on the global meter provider as
/// it is when the manager is built: a manager built before the application installs one
/// records nothing (OpenTelemetry's no-ops), one built after records through it. The
/// managers record `lock.id`, so this test finds its own points among those of the other
/// tests of this binary (which record through the global provider once it is installed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_meter_the_global_provider_at_build_time_is_used() {
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    let before = PostgresLockManager::builder(pool(1))
        .metrics_lock_id(true)
        .build();
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    opentelemetry::global::set_meter_provider(provider.clone());
    let after = PostgresLockManager::builder(pool(1))
        .metrics_lock_id(true)
        .build();
    let mut ids = Vec::new();
    for manager in [&before, &after] {
        let key = unique_key("global-meter");
        ids.push(manager.lock_id(&key).to_string());
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        guard.release().await;
    }
    provider.force_flush().expect("flush");
    let exported = exporter.get_finished_metrics().expect("exported");
    let acquisitions_of = |id: &str| -> u64 {
        let Some(last) = exported.last() else {
            return 0;
        };
        let mut total = 0;
        for metric in last.scope_metrics().flat_map(|scope| scope.metrics()) {
            if metric.name() != "eventsource.lock.acquisitions" {
                continue;
            }
            let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() else {
                panic!("a u64 counter: {:?}", metric.data());
            };
            total += sum
                .data_points()
                .filter(|point| {
                    point
                        .attributes()
                        .any(|kv| kv.key.as_str() == "lock.id" && kv.value.to_string() == id)
                })
                .map(|point| point.value())
                .sum::<u64>();
        }
        total
    };
    assert_eq!(acquisitions_of(&ids[0]), 0, "built before the provider");
    assert_eq!(acquisitions_of(&ids[1]), 1, "built after the provider");
}

/// A lost lock is visible in the pipeline: an `eventsource.lock.lost` span with an ERROR
/// status and the reason to alert on (`lock.lost_reason`), and the WARNING `advisory
/// lock lost` as its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_is_a_warning_event_on_an_error_span_with_its_reason() {
    let _alone = TERMINATING.lock().await;
    let manager = PostgresLockManager::builder(pool(1)).build();
    let admin = support::admin().await;
    let key = unique_key("otel-lost");
    let id = locks_port::lock_id(&key);
    let spans = exported(id, async {
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        terminate_holder(&admin, id).await;
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the holder was told");
        assert_eq!(reason, locks_port::LostReason::ConnectionClosed);
    })
    .await;
    // The holder is told first; the monitor's span follows on its own thread.
    let mut spans = spans;
    for _ in 0..100 {
        if spans
            .iter()
            .any(|span| span.name == "eventsource.lock.lost")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        spans = exported(id, async {}).await;
    }
    let lost = spans
        .iter()
        .find(|span| span.name == "eventsource.lock.lost")
        .unwrap_or_else(|| panic!("a lost span among {:?}", names(&spans)));
    assert!(
        matches!(lost.status, Status::Error { .. }),
        "{:?}",
        lost.status
    );
    assert_eq!(
        string(lost, "lock.lost_reason").as_deref(),
        Some(locks_port::LostReason::ConnectionClosed.as_str())
    );
    let warning = (lost.events.iter())
        .find(|event| event.name.starts_with("advisory lock lost"))
        .expect("the WARNING is an event of the lost span");
    assert!(
        (warning.attributes.iter())
            .any(|kv| kv.key.as_str() == "level" && kv.value.as_str() == "WARN"),
        "{:?}",
        warning.attributes
    );
}

fn names(spans: &[SpanData]) -> Vec<&str> {
    spans.iter().map(|span| span.name.as_ref()).collect()
}
