//! Metrics through the OpenTelemetry metrics API (the `opentelemetry` crate only: the
//! application installs the SDK and an exporter, as OpenTelemetry's guidance for
//! libraries says).
//!
//! The instruments are made once per manager, from the meter given to
//! [`PostgresLockManagerBuilder::meter`](crate::PostgresLockManagerBuilder::meter) or
//! else from the global meter provider as it is when the manager is built. With no
//! meter given and no provider installed, none is made (as with `metrics(false)`): the
//! lock cycle reads no clock for them and calls nothing. Otherwise every attribute set
//! is made here once (no key text ever, and nothing allocated per measurement), so the
//! hot path passes a slice it already has.
//!
//! | instrument | kind | unit | attributes |
//! | --- | --- | --- | --- |
//! | [`ACQUISITIONS`] | counter | `{acquisition}` | `lock.mode`, `lock.outcome`, `error.type` (failures) |
//! | [`ACQUIRE_DURATION`] | histogram | `s` | as above |
//! | [`HELD`] | up-down counter | `{lock}` | `lock.mode` |
//! | [`LOST`] | counter | `{lock}` | `lock.mode`, `lock.lost_reason` |
//! | [`KEEPALIVE_DURATION`] | histogram | `s` | none |
//! | [`PERMIT_ACQUISITIONS`] | counter | `{acquisition}` | `lock.outcome`, `error.type` (failures) |
//! | [`PERMIT_ACQUIRE_DURATION`] | histogram | `s` | as above |
//! | [`PERMITS_HELD`] | up-down counter | `{permit}` | none |
//! | [`PERMITS_LOST`] | counter | `{permit}` | `lock.lost_reason` |
//! | [`LOCK_TABLE_ADVISORY`] | gauge | `{lock}` | none |
//! | [`LOCK_TABLE_CAPACITY`] | gauge | `{lock}` | none |
//!
//! The two lock table gauges are the server's, not the manager's: each call of
//! [`lock_table_usage`](crate::PostgresLockManager::lock_table_usage) records them, so
//! an application that wants them on a dashboard calls it periodically.
//! | [`PERMITS_IDLE_WAITING`] | counter | `s` | `lock.id` (opt-in) |
//!
//! Whether this process leads an election, and how many terms it has led, are the
//! instruments of the `locks-leader` crate's `LeaderElection`,
//! `eventsource.leader.is_leader` and `eventsource.leader.terms` (see there).
//!
//! `lock.id` joins the acquisition and loss attributes only when the builder's
//! [`metrics_lock_id`](crate::PostgresLockManagerBuilder::metrics_lock_id) asks for it:
//! one series per lock id is the user's choice to make. The loss series start at zero
//! when the manager is built. With
//! [`metrics(false)`](crate::PostgresLockManagerBuilder::metrics) no instrument is made
//! and the hooks do nothing (the bench's baseline for what the no-ops cost).
//!
//! A semaphore's permits have instruments of their own (a permit is not a lock: it
//! never shows in [`HELD`]), with `lock.id` (the semaphore's class) under the same
//! opt-in.

use std::time::Duration;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError, LockMode, LostReason};
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, UpDownCounter};
use opentelemetry::{InstrumentationScope, KeyValue};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::telemetry::kind_name;

/// The name of the instrumentation scope (the meter), with the crate's version.
pub(crate) const SCOPE: &str = "locks-postgres";

/// Acquisition calls by outcome (`acquire`, `try_acquire`, `acquire_many`).
pub(crate) const ACQUISITIONS: &str = "eventsource.lock.acquisitions";
/// How long each acquisition call took, from the call to its outcome: the wait.
pub(crate) const ACQUIRE_DURATION: &str = "eventsource.lock.acquire.duration";
/// Locks held by the manager now.
pub(crate) const HELD: &str = "eventsource.lock.held";
/// Locks lost while held (not released by their holder), by reason.
pub(crate) const LOST: &str = "eventsource.lock.lost";
/// The round trip of each answered keepalive on a held connection.
pub(crate) const KEEPALIVE_DURATION: &str = "eventsource.lock.keepalive.duration";

/// Permit acquisition calls by outcome (`acquire_permit`, `try_acquire_permit`).
pub(crate) const PERMIT_ACQUISITIONS: &str = "eventsource.semaphore.acquisitions";
/// How long each permit acquisition call took.
pub(crate) const PERMIT_ACQUIRE_DURATION: &str = "eventsource.semaphore.acquire.duration";
/// Permits held by the manager now.
pub(crate) const PERMITS_HELD: &str = "eventsource.semaphore.permits";
/// Permits lost while held, by reason.
pub(crate) const PERMITS_LOST: &str = "eventsource.semaphore.permits.lost";
/// Advisory lock entries in the server's lock table (everyone's), when last asked.
pub(crate) const LOCK_TABLE_ADVISORY: &str = "eventsource.server.lock_table.advisory";
/// The server's documented lock table capacity, when last asked.
pub(crate) const LOCK_TABLE_CAPACITY: &str = "eventsource.server.lock_table.capacity";
/// Permit time left idle while a waiter of this manager queued: for each permit granted
/// after a wait, how long the slot may have been free before the waiter took it (the
/// time since its last look found every slot busy, an upper bound). Its rate over the
/// rate of permit time held is the idle share an operator should see near zero.
pub(crate) const PERMITS_IDLE_WAITING: &str = "eventsource.semaphore.idle_waiting";

/// The attribute names.
const MODE: &str = "lock.mode";
const OUTCOME: &str = "lock.outcome";
const ERROR_TYPE: &str = "error.type";
const LOST_REASON: &str = "lock.lost_reason";
const LOCK_ID: &str = "lock.id";

/// Bucket boundaries of the acquisition histogram, in seconds: an uncontended grant
/// takes a fraction of a millisecond, a wait in the queue up to the call's timeout.
const ACQUIRE_BOUNDARIES: [f64; 18] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0,
];
/// Bucket boundaries of the keepalive histogram, in seconds, up to the default answer
/// timeout.
const KEEPALIVE_BOUNDARIES: [f64; 15] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0,
];

/// The modes, in the order of the attribute tables.
const MODES: [LockMode; 2] = [LockMode::Exclusive, LockMode::Shared];
/// The error kinds with an `error.type` of their own (a timeout is an outcome).
const ERROR_KINDS: [AcquisitionErrorKind; 7] = [
    AcquisitionErrorKind::PoolUnavailable,
    AcquisitionErrorKind::Unreachable,
    AcquisitionErrorKind::Configuration,
    AcquisitionErrorKind::Deadlock,
    AcquisitionErrorKind::ConnectionLost,
    AcquisitionErrorKind::Cancelled,
    AcquisitionErrorKind::Backend,
];
/// Acquired, busy, timeout, then one per error kind.
const OUTCOMES: usize = 3 + ERROR_KINDS.len();

/// The manager's instruments, or none when the builder turned metrics off.
pub(crate) struct Metrics {
    instruments: Option<Instruments>,
}

/// The instruments, and every attribute set they record with.
struct Instruments {
    acquisitions: Counter<u64>,
    acquire_duration: Histogram<f64>,
    held: UpDownCounter<i64>,
    lost: Counter<u64>,
    keepalive_duration: Histogram<f64>,
    permit_acquisitions: Counter<u64>,
    permit_acquire_duration: Histogram<f64>,
    permits_held: UpDownCounter<i64>,
    permits_lost: Counter<u64>,
    lock_table_advisory: Gauge<u64>,
    lock_table_capacity: Gauge<u64>,
    permits_idle_waiting: Counter<f64>,
    /// Whether `lock.id` is recorded (the builder's opt-in).
    with_lock_id: bool,
    /// Per mode and outcome (`mode * OUTCOMES + outcome`).
    outcome_attributes: Box<[Box<[KeyValue]>]>,
    /// Per outcome, for permits (no mode).
    permit_outcome_attributes: Box<[Box<[KeyValue]>]>,
    /// Per mode.
    mode_attributes: [[KeyValue; 1]; 2],
}

impl Metrics {
    /// The instruments, on `meter` or else on the global provider's meter for this crate;
    /// none when `on` is false, or when no meter is given and the global provider is
    /// OpenTelemetry's default no-op one (decided once, here: the lock cycle then reads
    /// no clock and calls no instrument, as with `metrics(false)`).
    pub(crate) fn new(on: bool, meter: Option<&Meter>, with_lock_id: bool) -> Self {
        let recorded = on && (meter.is_some() || !no_global_provider());
        Self {
            instruments: recorded.then(|| Instruments::new(meter, with_lock_id)),
        }
    }

    /// When an acquisition started, for its wait; `None` (no clock read) when metrics
    /// are off.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.instruments.as_ref().map(|_| Instant::now())
    }

    /// One acquisition call that began at `started` ended: granted (`Ok(true)`), busy
    /// (`Ok(false)`, a try that found the lock held) or failed.
    pub(crate) fn acquisition(
        &self,
        mode: LockMode,
        lock_id: i64,
        started: Option<Instant>,
        outcome: Result<bool, &LockAcquisitionError>,
    ) {
        if let (Some(instruments), Some(started)) = (&self.instruments, started) {
            instruments.acquisition(mode, lock_id, started.elapsed(), outcome);
        }
    }

    /// `count` locks of `mode` were added to (positive) or taken out of (negative) the
    /// bookkeeping.
    pub(crate) fn held_changed(&self, mode: LockMode, count: i64) {
        if let Some(instruments) = &self.instruments {
            instruments
                .held
                .add(count, &instruments.mode_attributes[mode_index(mode)]);
        }
    }

    /// A held lock was lost (called once its lost signal has fired: a loss that finds
    /// the signal already fired, by a release of its group, is not one).
    pub(crate) fn lost(&self, mode: LockMode, lock_id: i64, reason: LostReason) {
        if let Some(instruments) = &self.instruments {
            instruments.lost(mode, lock_id, reason);
        }
    }

    /// A keepalive was answered after `round_trip`.
    pub(crate) fn keepalive_answered(&self, round_trip: Duration) {
        if let Some(instruments) = &self.instruments {
            instruments
                .keepalive_duration
                .record(round_trip.as_secs_f64(), &[]);
        }
    }

    /// One permit acquisition call on the semaphore of `class` that began at `started`
    /// ended, as [`acquisition`](Self::acquisition) says for a lock.
    pub(crate) fn permit_acquisition(
        &self,
        class: i32,
        started: Option<Instant>,
        outcome: Result<bool, &LockAcquisitionError>,
    ) {
        if let (Some(instruments), Some(started)) = (&self.instruments, started) {
            instruments.permit_acquisition(class, started.elapsed(), outcome);
        }
    }

    /// A permit was granted (`1`) or given back or lost (`-1`).
    pub(crate) fn permits_changed(&self, count: i64) {
        if let Some(instruments) = &self.instruments {
            instruments.permits_held.add(count, &[]);
        }
    }

    /// The server's lock table was read.
    pub(crate) fn lock_table(&self, advisory: u64, capacity: u64) {
        if let Some(instruments) = &self.instruments {
            instruments.lock_table_advisory.record(advisory, &[]);
            instruments.lock_table_capacity.record(capacity, &[]);
        }
    }

    /// A permit of the semaphore of `class` was granted after a wait, `idle` seconds at
    /// most after it was freed (see [`PERMITS_IDLE_WAITING`]).
    pub(crate) fn permit_idle_while_waiting(&self, class: i32, idle: f64) {
        if let Some(instruments) = &self.instruments
            && idle.is_finite()
            && idle >= 0.0
        {
            if instruments.with_lock_id {
                let attributes = with_lock_id(&[], i64::from(class));
                instruments.permits_idle_waiting.add(idle, &attributes);
            } else {
                instruments.permits_idle_waiting.add(idle, &[]);
            }
        }
    }

    /// A held permit of the semaphore of `class` was lost.
    pub(crate) fn permit_lost(&self, class: i32, reason: LostReason) {
        if let Some(instruments) = &self.instruments {
            let reason = [KeyValue::new(LOST_REASON, reason.as_str())];
            if instruments.with_lock_id {
                let attributes = with_lock_id(&reason, i64::from(class));
                instruments.permits_lost.add(1, &attributes);
            } else {
                instruments.permits_lost.add(1, &reason);
            }
        }
    }
}

impl Instruments {
    fn new(meter: Option<&Meter>, with_lock_id: bool) -> Self {
        let global;
        let meter = match meter {
            Some(meter) => meter,
            None => {
                global = opentelemetry::global::meter_with_scope(scope());
                &global
            }
        };
        let acquisitions = meter
            .u64_counter(ACQUISITIONS)
            .with_unit("{acquisition}")
            .with_description("Lock acquisition calls, by outcome.")
            .build();
        let acquire_duration = meter
            .f64_histogram(ACQUIRE_DURATION)
            .with_unit("s")
            .with_description("How long a lock acquisition call took, until granted or not.")
            .with_boundaries(ACQUIRE_BOUNDARIES.to_vec())
            .build();
        let held = meter
            .i64_up_down_counter(HELD)
            .with_unit("{lock}")
            .with_description("Locks held by the lock manager.")
            .build();
        let lost = meter
            .u64_counter(LOST)
            .with_unit("{lock}")
            .with_description("Locks lost while held, by reason.")
            .build();
        let keepalive_duration = meter
            .f64_histogram(KEEPALIVE_DURATION)
            .with_unit("s")
            .with_description("Round trip of the keepalive on a held lock's connection.")
            .with_boundaries(KEEPALIVE_BOUNDARIES.to_vec())
            .build();
        let permit_acquisitions = meter
            .u64_counter(PERMIT_ACQUISITIONS)
            .with_unit("{acquisition}")
            .with_description("Semaphore permit acquisition calls, by outcome.")
            .build();
        let permit_acquire_duration = meter
            .f64_histogram(PERMIT_ACQUIRE_DURATION)
            .with_unit("s")
            .with_description("How long a permit acquisition call took, until granted or not.")
            .with_boundaries(ACQUIRE_BOUNDARIES.to_vec())
            .build();
        let permits_held = meter
            .i64_up_down_counter(PERMITS_HELD)
            .with_unit("{permit}")
            .with_description("Semaphore permits held by the lock manager.")
            .build();
        let permits_lost = meter
            .u64_counter(PERMITS_LOST)
            .with_unit("{permit}")
            .with_description("Semaphore permits lost while held, by reason.")
            .build();
        let lock_table_advisory = meter
            .u64_gauge(LOCK_TABLE_ADVISORY)
            .with_unit("{lock}")
            .with_description("Advisory locks in the server's lock table, held or waited for.")
            .build();
        let lock_table_capacity = meter
            .u64_gauge(LOCK_TABLE_CAPACITY)
            .with_unit("{lock}")
            .with_description(
                "The server's lock table capacity: max_locks_per_transaction \
                 * (max_connections + max_prepared_transactions).",
            )
            .build();
        let permits_idle_waiting = meter
            .f64_counter(PERMITS_IDLE_WAITING)
            .with_unit("s")
            .with_description(
                "Permit time left idle while a waiter queued (an upper bound per grant).",
            )
            .build();
        // Each loss series starts at zero when the manager is built, so that a query of
        // its increase sees the first loss (a counter series that appears at 1 has no
        // increase to show).
        for reason in [LostReason::ConnectionClosed, LostReason::KeepaliveFailed] {
            for mode in MODES {
                lost.add(0, &lost_set(mode, reason));
            }
            permits_lost.add(0, &[KeyValue::new(LOST_REASON, reason.as_str())]);
        }
        let outcome_attributes = MODES
            .iter()
            .flat_map(|mode| (0..OUTCOMES).map(move |outcome| outcome_set(Some(*mode), outcome)))
            .collect();
        let permit_outcome_attributes = (0..OUTCOMES)
            .map(|outcome| outcome_set(None, outcome))
            .collect();
        Self {
            acquisitions,
            acquire_duration,
            held,
            lost,
            keepalive_duration,
            permit_acquisitions,
            permit_acquire_duration,
            permits_held,
            permits_lost,
            lock_table_advisory,
            lock_table_capacity,
            permits_idle_waiting,
            with_lock_id,
            outcome_attributes,
            permit_outcome_attributes,
            mode_attributes: MODES.map(|mode| [KeyValue::new(MODE, mode.as_str())]),
        }
    }

    fn acquisition(
        &self,
        mode: LockMode,
        lock_id: i64,
        wait: Duration,
        outcome: Result<bool, &LockAcquisitionError>,
    ) {
        let index = mode_index(mode) * OUTCOMES + outcome_index(outcome);
        self.record_acquisition(
            (&self.acquisitions, &self.acquire_duration),
            &self.outcome_attributes[index],
            lock_id,
            wait,
        );
    }

    fn permit_acquisition(
        &self,
        class: i32,
        wait: Duration,
        outcome: Result<bool, &LockAcquisitionError>,
    ) {
        self.record_acquisition(
            (&self.permit_acquisitions, &self.permit_acquire_duration),
            &self.permit_outcome_attributes[outcome_index(outcome)],
            i64::from(class),
            wait,
        );
    }

    /// One acquisition on `counter` and `histogram`, with `lock.id` if asked for.
    fn record_acquisition(
        &self,
        (counter, histogram): (&Counter<u64>, &Histogram<f64>),
        attributes: &[KeyValue],
        lock_id: i64,
        wait: Duration,
    ) {
        if self.with_lock_id {
            let attributes = with_lock_id(attributes, lock_id);
            counter.add(1, &attributes);
            histogram.record(wait.as_secs_f64(), &attributes);
        } else {
            counter.add(1, attributes);
            histogram.record(wait.as_secs_f64(), attributes);
        }
    }

    fn lost(&self, mode: LockMode, lock_id: i64, reason: LostReason) {
        let attributes = lost_set(mode, reason);
        if self.with_lock_id {
            self.lost.add(1, &with_lock_id(&attributes, lock_id));
        } else {
            self.lost.add(1, &attributes);
        }
    }
}

/// This crate's instrumentation scope: its name and version.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// Whether the global meter provider is still OpenTelemetry's default, the no-op
/// provider, whose instruments record nothing. It carries no state (a zero-sized
/// value), where every provider that records holds its pipeline; so an empty provider
/// is taken for the no-op one.
fn no_global_provider() -> bool {
    std::mem::size_of_val(&*opentelemetry::global::meter_provider()) == 0
}

fn mode_index(mode: LockMode) -> usize {
    usize::from(mode == LockMode::Shared)
}

/// The index of an outcome in the attribute table: acquired, busy, timeout, then
/// [`ERROR_KINDS`] (a kind added later counts as `backend`).
fn outcome_index(outcome: Result<bool, &LockAcquisitionError>) -> usize {
    match outcome {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(error) if error.is_timeout() => 2,
        Err(error) => {
            3 + ERROR_KINDS
                .iter()
                .position(|kind| *kind == error.kind())
                .unwrap_or(ERROR_KINDS.len() - 1)
        }
    }
}

/// The attributes of one outcome index, with the mode for a lock (`None`: a permit).
fn outcome_set(mode: Option<LockMode>, outcome: usize) -> Box<[KeyValue]> {
    let mode = mode.map(|mode| KeyValue::new(MODE, mode.as_str()));
    let outcome = match outcome {
        0 => vec![KeyValue::new(OUTCOME, "acquired")],
        1 => vec![KeyValue::new(OUTCOME, "busy")],
        2 => vec![KeyValue::new(OUTCOME, "timeout")],
        error => vec![
            KeyValue::new(OUTCOME, "error"),
            KeyValue::new(ERROR_TYPE, kind_name(ERROR_KINDS[error - 3])),
        ],
    };
    mode.into_iter().chain(outcome).collect()
}

/// The attributes of a loss.
fn lost_set(mode: LockMode, reason: LostReason) -> [KeyValue; 2] {
    [
        KeyValue::new(MODE, mode.as_str()),
        KeyValue::new(LOST_REASON, reason.as_str()),
    ]
}

/// `attributes` and `lock.id`, on the stack.
fn with_lock_id(attributes: &[KeyValue], lock_id: i64) -> SmallVec<[KeyValue; 4]> {
    attributes
        .iter()
        .cloned()
        .chain(std::iter::once(KeyValue::new(LOCK_ID, lock_id)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No unit test installs a global provider: the default one is the no-op one here.
    #[test]
    fn no_instrument_is_made_on_the_no_op_provider_and_a_given_meter_is_used() {
        use opentelemetry::metrics::MeterProvider;

        assert!(no_global_provider());
        assert!(Metrics::new(true, None, false).started().is_none());
        let recording = opentelemetry_sdk::metrics::SdkMeterProvider::builder().build();
        let meter = recording.meter_with_scope(scope());
        assert!(Metrics::new(true, Some(&meter), false).started().is_some());
        assert!(Metrics::new(false, Some(&meter), false).started().is_none());
        // An installed provider that records holds its pipeline: it is not taken for the
        // no-op one.
        assert_ne!(std::mem::size_of_val(&recording), 0);
        let noop = opentelemetry::metrics::NoopMeterProvider::new();
        assert_eq!(std::mem::size_of_val(&noop), 0);
    }

    #[test]
    fn every_outcome_has_its_own_attributes_and_no_two_are_alike() {
        let metrics = Instruments::new(None, false);
        assert_eq!(metrics.outcome_attributes.len(), 2 * OUTCOMES);
        let rendered: Vec<String> = metrics
            .outcome_attributes
            .iter()
            .map(|set| format!("{set:?}"))
            .collect();
        for (index, set) in rendered.iter().enumerate() {
            assert!(
                !rendered[index + 1..].contains(set),
                "{set} appears twice in the table"
            );
        }
        let timeout = LockAcquisitionError::timed_out("k", Duration::from_secs(1));
        let backend = LockAcquisitionError::new("k", AcquisitionErrorKind::Backend, "x");
        let pool = LockAcquisitionError::new("k", AcquisitionErrorKind::PoolUnavailable, "x");
        assert_eq!(outcome_index(Ok(true)), 0);
        assert_eq!(outcome_index(Ok(false)), 1);
        assert_eq!(outcome_index(Err(&timeout)), 2);
        assert!(rendered[outcome_index(Err(&pool))].contains("pool_unavailable"));
        assert!(rendered[outcome_index(Err(&backend))].contains("backend"));
        let shared = OUTCOMES + outcome_index(Ok(true));
        assert!(rendered[shared].contains("shared"), "{}", rendered[shared]);
        // A permit's outcomes are the lock's without the mode.
        assert_eq!(metrics.permit_outcome_attributes.len(), OUTCOMES);
        for (index, set) in metrics.permit_outcome_attributes.iter().enumerate() {
            assert_eq!(set.len(), metrics.outcome_attributes[index].len() - 1);
            assert!(set.iter().all(|kv| kv.key.as_str() != MODE), "{set:?}");
        }
    }
}
