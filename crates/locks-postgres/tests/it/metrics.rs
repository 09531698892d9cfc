//! The metrics reach an OpenTelemetry SDK (its in-memory exporter) from a real server:
//! acquisitions by outcome, the wait, locks held, a lock lost to `pg_terminate_backend`,
//! keepalives; and no attribute carries key text. Each test has a meter provider of its
//! own, given to the manager with `builder.meter(..)` (the global one is tested in the
//! `observability` binary, which owns the process's globals).

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;

use locks_leader::{LeaderElection, Leadership, TermEnd};
use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockMode, LostReason, ReleaseOutcome,
};
use locks_port::{PermitGuard, Semaphore};

use crate::faults::{holder_pids, terminate_backend, wait_for};
use crate::recorded::{Point, Recorded, find, observations, total};
use crate::semaphores::terminate_slot_holder;
use crate::support::{admin, unique_key};

/// The only attributes the instruments may carry.
const ATTRIBUTES: [&str; 5] = [
    "lock.mode",
    "lock.outcome",
    "error.type",
    "lock.lost_reason",
    "lock.id",
];

/// Every attribute is one of [`ATTRIBUTES`] and no value carries any of `keys`.
fn assert_no_key_text(points: &[Point], keys: &[&str]) {
    for point in points {
        for (name, value) in &point.attributes {
            assert!(ATTRIBUTES.contains(&name.as_str()), "{point:?}");
            for key in keys {
                assert!(!value.contains(key), "{point:?} carries key text");
            }
        }
    }
}

const ACQUISITIONS: &str = "eventsource.lock.acquisitions";
const ACQUIRE_DURATION: &str = "eventsource.lock.acquire.duration";
const HELD: &str = "eventsource.lock.held";
const LOST: &str = "eventsource.lock.lost";
const KEEPALIVE_DURATION: &str = "eventsource.lock.keepalive.duration";
const PERMIT_ACQUISITIONS: &str = "eventsource.semaphore.acquisitions";
const PERMIT_ACQUIRE_DURATION: &str = "eventsource.semaphore.acquire.duration";
const PERMITS: &str = "eventsource.semaphore.permits";
const PERMITS_LOST: &str = "eventsource.semaphore.permits.lost";
const IS_LEADER: &str = "eventsource.leader.is_leader";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquired_busy_and_timed_out_acquisitions_are_counted_with_their_wait() {
    let recorded = Recorded::new();
    let holder = recorded.manager(2).build();
    let other = recorded.manager(2).build();
    let key = unique_key("metrics-outcomes");

    let guard = holder
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    let shared_key = unique_key("metrics-shared");
    let reader = holder
        .acquire(&shared_key, AcquireOptions::shared())
        .await
        .expect("shared");
    assert!(other.try_acquire(&key).await.expect("no error").is_none());
    let waited = Duration::from_millis(300);
    let error = other
        .acquire(&key, AcquireOptions::new().with_timeout(waited))
        .await
        .expect_err("held elsewhere");
    assert!(error.is_timeout(), "{error}");

    let points = recorded.points();
    let exclusive = ("lock.mode", "exclusive");
    assert_eq!(
        total(
            &points,
            ACQUISITIONS,
            &[exclusive, ("lock.outcome", "acquired")]
        ),
        1.0,
        "{points:#?}"
    );
    assert_eq!(
        total(
            &points,
            ACQUISITIONS,
            &[("lock.mode", "shared"), ("lock.outcome", "acquired")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &points,
            ACQUISITIONS,
            &[exclusive, ("lock.outcome", "busy")]
        ),
        1.0
    );
    assert_eq!(
        total(
            &points,
            ACQUISITIONS,
            &[exclusive, ("lock.outcome", "timeout")]
        ),
        1.0
    );
    for point in find(&points, ACQUISITIONS, &[]) {
        assert_eq!(point.unit, "{acquisition}");
        assert_eq!(point.attribute("error.type"), None, "{point:?}");
        assert_eq!(point.attribute("lock.id"), None, "{point:?}");
    }
    // The wait: one observation per call; the timed-out one waited its timeout.
    assert_eq!(observations(&points, ACQUIRE_DURATION, &[]), 4);
    let [timed_out] = find(
        &points,
        ACQUIRE_DURATION,
        &[exclusive, ("lock.outcome", "timeout")],
    )[..] else {
        panic!("one timeout series: {points:#?}");
    };
    assert_eq!(timed_out.unit, "s");
    assert!(
        timed_out.value >= waited.as_secs_f64() && timed_out.value < 5.0,
        "waited {} s",
        timed_out.value
    );
    // Held: the two locks, by mode.
    assert_eq!(total(&points, HELD, &[exclusive]), 1.0);
    assert_eq!(total(&points, HELD, &[("lock.mode", "shared")]), 1.0);
    assert_no_key_text(&points, &[&key, &shared_key]);

    guard.release().await;
    reader.release().await;
    let points = recorded.points();
    assert_eq!(total(&points, HELD, &[]), 0.0, "{points:#?}");
    // The loss series exist from the start, at zero: a release is not a loss.
    let losses = find(&points, LOST, &[]);
    assert_eq!(losses.len(), 4, "two modes, two reasons: {losses:#?}");
    assert_eq!(total(&points, LOST, &[]), 0.0, "a release is not a loss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_acquisition_is_counted_with_its_error_type() {
    let recorded = Recorded::new();
    // A pool of one, in use: a try fails at once with PoolUnavailable.
    let manager = recorded.manager(1).build();
    let key = unique_key("metrics-error");
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    let error = manager
        .try_acquire(&unique_key("metrics-error-2"))
        .await
        .expect_err("no free connection");
    assert_eq!(
        error.kind(),
        locks_port::AcquisitionErrorKind::PoolUnavailable
    );
    let points = recorded.points();
    assert_eq!(
        total(
            &points,
            ACQUISITIONS,
            &[
                ("lock.outcome", "error"),
                ("error.type", "pool_unavailable")
            ]
        ),
        1.0,
        "{points:#?}"
    );
    guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_to_pg_terminate_backend_is_counted_and_no_longer_held() {
    let recorded = Recorded::new();
    let manager = recorded
        .manager(2)
        .health_check_interval(Duration::from_millis(20))
        .build();
    let admin = admin().await;
    let key = unique_key("metrics-lost");
    let lock_id = manager.lock_id(&key);
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    let [pid] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one holder");
    };
    terminate_backend(&admin, pid).await;
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost in time");
    assert_eq!(reason, LostReason::ConnectionClosed);
    // Recorded once the signal has fired (only a loss that fires it counts): a moment
    // after the guard can see it.
    wait_for("the loss recorded", || async {
        total(&recorded.points(), LOST, &[]) > 0.0
    })
    .await;

    let points = recorded.points();
    let wanted = [
        ("lock.mode", "exclusive"),
        ("lock.lost_reason", "connection_closed"),
    ];
    let [lost] = find(&points, LOST, &wanted)[..] else {
        panic!("one lost series: {points:#?}");
    };
    assert_eq!(lost.value, 1.0);
    assert_eq!(lost.unit, "{lock}");
    assert_eq!(lost.attribute("lock.id"), None);
    assert_eq!(total(&points, LOST, &[]), 1.0, "no other loss: {points:#?}");
    assert_eq!(total(&points, HELD, &[]), 0.0, "{points:#?}");
    assert_no_key_text(&points, &[&key]);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_round_trips_are_recorded() {
    let recorded = Recorded::new();
    let manager = recorded
        .manager(1)
        .lease(None)
        .keepalive(Some(Duration::from_millis(50)))
        .health_check_interval(Duration::from_millis(10))
        .build();
    let key = unique_key("metrics-keepalive");
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    wait_for("two keepalives", || async {
        observations(&recorded.points(), KEEPALIVE_DURATION, &[]) >= 2
    })
    .await;
    let points = recorded.points();
    let [keepalive] = find(&points, KEEPALIVE_DURATION, &[])[..] else {
        panic!("one keepalive series: {points:#?}");
    };
    assert_eq!(keepalive.unit, "s");
    assert!(keepalive.attributes.is_empty(), "{keepalive:?}");
    assert!(
        keepalive.value > 0.0 && keepalive.value < 5.0 * keepalive.count as f64,
        "{keepalive:?}"
    );
    assert!(!guard.is_lost());
    guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_id_is_an_attribute_only_when_asked_for() {
    let recorded = Recorded::new();
    let manager = recorded.manager(1).metrics_lock_id(true).build();
    let key = unique_key("metrics-lock-id");
    let lock_id = manager.lock_id(&key);
    let guard = manager
        .acquire(&key, AcquireOptions::new().with_mode(LockMode::Exclusive))
        .await
        .expect("acquire");
    let points = recorded.points();
    let id = lock_id.to_string();
    let [acquired] = find(
        &points,
        ACQUISITIONS,
        &[("lock.outcome", "acquired"), ("lock.id", &id)],
    )[..] else {
        panic!("the acquisition with its lock id: {points:#?}");
    };
    assert_eq!(acquired.value, 1.0);
    assert_eq!(
        find(&points, ACQUIRE_DURATION, &[("lock.id", &id)]).len(),
        1
    );
    // Locks held stays one series per mode, whatever the switch.
    for point in find(&points, HELD, &[]) {
        assert_eq!(point.attribute("lock.id"), None, "{point:?}");
    }
    assert_no_key_text(&points, &[&key]);
    guard.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_many_counts_one_acquisition_and_every_lock_held() {
    let recorded = Recorded::new();
    let manager = recorded.manager(1).build();
    let keys = [unique_key("metrics-many-a"), unique_key("metrics-many-b")];
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let locks = manager
        .acquire_many(&refs, AcquireOptions::new())
        .await
        .expect("acquire_many");
    let points = recorded.points();
    assert_eq!(
        total(&points, ACQUISITIONS, &[("lock.outcome", "acquired")]),
        1.0
    );
    assert_eq!(total(&points, HELD, &[]), 2.0, "{points:#?}");
    locks.release().await;
    assert_eq!(total(&recorded.points(), HELD, &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_off_records_nothing() {
    let recorded = Recorded::new();
    let manager = recorded.manager(1).metrics(false).build();
    let guard = manager
        .acquire(&unique_key("metrics-off"), AcquireOptions::new())
        .await
        .expect("acquire");
    let points = recorded.points();
    assert!(points.is_empty(), "{points:#?}");
    guard.release().await;
}

/// Permits have instruments of their own: acquisitions by outcome and their wait,
/// permits held, a permit lost to `pg_terminate_backend` (counted in
/// `lost_lock_counts` too); none of it shows in the lock instruments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_are_counted_by_outcome_held_and_lost_apart_from_locks() {
    let recorded = Recorded::new();
    let manager = recorded
        .manager(6)
        .health_check_interval(Duration::from_millis(20))
        .build();
    let admin = admin().await;
    let name = unique_key("metrics-permits");
    let first = manager
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("first permit");
    let second = manager
        .try_acquire_permit(&name, 2)
        .await
        .expect("try")
        .expect("second permit");
    assert!(
        manager
            .try_acquire_permit(&name, 2)
            .await
            .expect("try")
            .is_none()
    );
    let timed_out = manager
        .acquire_permit(&name, 2, Duration::from_millis(100))
        .await
        .expect_err("no third permit");
    assert!(timed_out.is_timeout(), "{timed_out}");
    let refused = manager
        .acquire_permit(&name, 3, AcquireOptions::new())
        .await
        .expect_err("a different N");

    let points = recorded.points();
    let outcome = |outcome: &str| total(&points, PERMIT_ACQUISITIONS, &[("lock.outcome", outcome)]);
    assert_eq!(outcome("acquired"), 2.0, "{points:#?}");
    assert_eq!(outcome("busy"), 1.0, "{points:#?}");
    assert_eq!(outcome("timeout"), 1.0, "{points:#?}");
    assert_eq!(
        total(
            &points,
            PERMIT_ACQUISITIONS,
            &[("error.type", "configuration")]
        ),
        1.0,
        "{refused}: {points:#?}"
    );
    assert_eq!(observations(&points, PERMIT_ACQUIRE_DURATION, &[]), 5);
    let [held] = find(&points, PERMITS, &[])[..] else {
        panic!("one permits series: {points:#?}");
    };
    assert_eq!((held.value, held.unit.as_str()), (2.0, "{permit}"));
    for lock_instrument in [ACQUISITIONS, HELD] {
        assert_eq!(total(&points, lock_instrument, &[]), 0.0, "{points:#?}");
    }

    assert_eq!(first.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(total(&recorded.points(), PERMITS, &[]), 1.0);

    let class = manager.semaphore_class(&name);
    terminate_slot_holder(&admin, class, slot_of(&second)).await;
    let reason = tokio::time::timeout(Duration::from_secs(10), second.lost())
        .await
        .expect("lost in time");
    assert_eq!(reason, LostReason::ConnectionClosed);
    let points = recorded.points();
    let wanted = [("lock.lost_reason", "connection_closed")];
    assert_eq!(total(&points, PERMITS_LOST, &wanted), 1.0, "{points:#?}");
    assert_eq!(total(&points, PERMITS_LOST, &[]), 1.0, "{points:#?}");
    assert_eq!(total(&points, PERMITS, &[]), 0.0, "{points:#?}");
    assert_eq!(
        total(&points, LOST, &[]),
        0.0,
        "a permit is not a lock: {points:#?}"
    );
    assert_eq!(manager.lost_lock_counts().connection_closed, 1);
    assert_eq!(second.release().await, ReleaseOutcome::Lost(reason));
    assert_eq!(
        total(&recorded.points(), PERMITS, &[]),
        0.0,
        "released twice"
    );
    assert_no_key_text(&recorded.points(), &[&name]);
}

/// `eventsource.leader.is_leader` is 1 while a term runs its task and 0 after, also when
/// the term is dropped mid-task; the election's name is an attribute only when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_leader_follows_each_term_and_names_the_election_only_when_asked() {
    let recorded = Recorded::new();
    let manager = recorded.manager(2).build();
    let meter = recorded.provider.meter("it-leader");
    let name = unique_key("metrics-leader");
    let election = LeaderElection::new(manager.clone(), name.clone())
        .takeover_delay(Duration::ZERO)
        .meter(&meter);
    let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let term = election.term(|_lost| async move {
        started.send(()).expect("the test listens");
        finished.await.expect("told to finish");
    });
    let mut term = Box::pin(term);
    tokio::select! {
        _ = &mut term => panic!("the term ended before its task was told to"),
        _ = running.recv() => {}
    }
    let points = recorded.points();
    let [leading] = find(&points, IS_LEADER, &[])[..] else {
        panic!("one is_leader series: {points:#?}");
    };
    assert_eq!((leading.value, leading.unit.as_str()), (1.0, "{leader}"));
    assert!(leading.attributes.is_empty(), "{leading:?}");
    assert_eq!(total(&points, "eventsource.leader.terms", &[]), 1.0);
    assert_no_key_text(&points, &[&name]);
    finish.send(()).expect("the task waits");
    assert!(matches!(term.await, Ok(TermEnd::Finished(()))));
    assert_eq!(total(&recorded.points(), IS_LEADER, &[]), 0.0);

    // Named, and dropped mid-term: back to 0, and `Following`.
    let named = LeaderElection::new(manager, name.clone())
        .takeover_delay(Duration::ZERO)
        .meter(&meter)
        .metrics_name(true);
    let changes = named.subscribe();
    let (started, mut running) = tokio::sync::mpsc::unbounded_channel();
    let mut term = Box::pin(named.term(|_lost| async move {
        started.send(()).expect("the test listens");
        std::future::pending::<()>().await;
    }));
    tokio::select! {
        _ = &mut term => panic!("the term ended"),
        _ = running.recv() => {}
    }
    let wanted = [("leader.election", name.as_str())];
    assert_eq!(total(&recorded.points(), IS_LEADER, &wanted), 1.0);
    assert_eq!(
        total(&recorded.points(), "eventsource.leader.terms", &wanted),
        1.0,
        "the named election's first term"
    );
    assert!(changes.borrow().is_leading());
    drop(term);
    assert_eq!(total(&recorded.points(), IS_LEADER, &wanted), 0.0);
    assert_eq!(*changes.borrow(), Leadership::Following);
    assert_eq!(
        total(&recorded.points(), "eventsource.leader.terms", &[]),
        2.0,
        "two terms led in all"
    );
}

/// `lock_table_usage()` records the server's lock table in two gauges: the advisory
/// entries and the capacity it read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_table_usage_records_its_gauges() {
    let recorded = Recorded::new();
    let manager = recorded.manager(2).build();
    let guard = manager
        .acquire(&unique_key("lock-table-gauge"), AcquireOptions::new())
        .await
        .expect("a lock");
    let usage = manager.lock_table_usage().await.expect("usage");
    assert!(usage.advisory >= 1, "{usage:?}");
    let points = recorded.points();
    let gauge = |name: &str| -> f64 {
        let found = find(&points, name, &[]);
        assert_eq!(found.len(), 1, "{name}: {points:#?}");
        assert_eq!(found[0].unit, "{lock}");
        found[0].value
    };
    #[allow(clippy::cast_precision_loss)] // small counts
    {
        assert_eq!(
            gauge("eventsource.server.lock_table.advisory"),
            usage.advisory as f64
        );
        assert_eq!(
            gauge("eventsource.server.lock_table.capacity"),
            usage.capacity as f64
        );
    }
    drop(guard);
}

/// A permit's slot, as `pg_locks` has it.
fn slot_of(permit: &impl PermitGuard) -> i32 {
    i32::try_from(permit.info().slot()).expect("slots are below 65,536")
}
