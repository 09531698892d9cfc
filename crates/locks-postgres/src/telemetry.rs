//! Spans and events, following the OpenTelemetry database conventions.

use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LockMode, LostReason, WaitStrategy,
};
use tracing::field::Empty;
use tracing::{Level, Span};

/// The level of the acquire and release spans unless the builder says otherwise:
/// DEBUG, as tower-http's request spans. A lock cycle is two spans, and a subscriber
/// that records them (an OpenTelemetry pipeline, say) spends far more on them than the
/// cycle costs; at the usual INFO filter they cost nothing. Failures are WARNING events
/// and lost locks INFO spans with an ERROR status, whatever this level.
pub(crate) const DEFAULT_SPAN_LEVEL: Level = Level::DEBUG;

/// A span named `$name` at the runtime level `$level` (a callsite per level: tracing's
/// callsites are static).
macro_rules! span_at {
    ($level:expr, $name:literal, $($fields:tt)*) => {
        match $level {
            // What each macro below checks first, before its fields are built.
            level if !tracing::level_enabled!(level) => Span::none(),
            Level::TRACE => tracing::trace_span!($name, $($fields)*),
            Level::DEBUG => tracing::debug_span!($name, $($fields)*),
            Level::INFO => tracing::info_span!($name, $($fields)*),
            Level::WARN => tracing::warn_span!($name, $($fields)*),
            _ => tracing::error_span!($name, $($fields)*),
        }
    };
}

/// The span of one acquisition by the manager (`acquire`, or `try_acquire` with a
/// zero timeout), its operation named from the options.
pub(crate) fn manager_acquire_span(
    level: Level,
    key: Option<&str>,
    lock_id: i64,
    options: &AcquireOptions,
) -> Span {
    if !tracing::level_enabled!(level) {
        return Span::none(); // as below, without naming the operation first
    }
    let shared = options.mode() == LockMode::Shared;
    let operation = match (options.timeout(), options.wait_strategy(), shared) {
        (Some(timeout), _, false) if timeout.is_zero() => "pg_try_advisory_lock",
        (Some(timeout), _, true) if timeout.is_zero() => "pg_try_advisory_lock_shared",
        (Some(_), WaitStrategy::Poll, false) => "pg_try_advisory_lock",
        (Some(_), WaitStrategy::Poll, true) => "pg_try_advisory_lock_shared",
        (_, _, false) => "pg_advisory_lock",
        (_, _, true) => "pg_advisory_lock_shared",
    };
    let span = acquire_span(level, key, lock_id, operation, options.timeout());
    if !span.is_disabled() {
        span.record("lock.mode", options.mode().as_str());
    }
    span
}

/// The span of one acquisition, at `level`.
pub(crate) fn acquire_span(
    level: Level,
    key: Option<&str>,
    lock_id: i64,
    operation: &'static str,
    timeout: Option<Duration>,
) -> Span {
    let span = span_at!(
        level,
        "eventsource.lock.acquire",
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "postgresql",
        db.operation.name = operation,
        db.response.status_code = Empty,
        error.type = Empty,
        lock.key = Empty,
        lock.id = lock_id,
        lock.mode = Empty,
        lock.timeout_ms = Empty,
        lock.acquired = Empty,
        lock.wait_ms = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(key) = key {
        span.record("lock.key", key);
    }
    if let Some(timeout) = timeout {
        span.record("lock.timeout_ms", duration_ms(timeout));
    }
    span
}

/// Closes an acquisition's span: how long it took, whether it was granted, and on
/// failure the error kind, SQLSTATE and a DEBUG (timeout) or WARNING event carrying the
/// reason only (never the error's message, which names the key).
/// When an acquisition started, for its span's `lock.wait_ms`; `None` (no clock read)
/// when no subscriber records the span.
pub(crate) fn started(span: &Span) -> Option<tokio::time::Instant> {
    (!span.is_disabled()).then(tokio::time::Instant::now)
}

pub(crate) fn finish_acquire_span(
    span: &Span,
    started: Option<tokio::time::Instant>,
    outcome: Result<bool, &LockAcquisitionError>,
) {
    if let Some(started) = started {
        span.record("lock.wait_ms", duration_ms(started.elapsed()));
    }
    match outcome {
        Ok(acquired) => {
            if !span.is_disabled() {
                span.record("lock.acquired", acquired);
            }
        }
        Err(error) => {
            span.record("lock.acquired", false);
            let sqlstate = std::error::Error::source(error)
                .and_then(|source| source.downcast_ref::<tokio_postgres::Error>())
                .and_then(crate::errors::sqlstate)
                .or_else(|| error.is_timeout().then_some("55P03"));
            record_failure(span, error.kind(), sqlstate);
            let kind = kind_name(error.kind());
            if error.is_timeout() {
                tracing::debug!(parent: span, kind, reason = error.reason(), "lock not acquired");
            } else {
                tracing::warn!(parent: span, kind, reason = error.reason(), "lock not acquired");
            }
        }
    }
}

/// The span of a lost lock, carrying the reason to alert on.
pub(crate) fn lost_span(
    key: Option<&str>,
    lock_id: i64,
    mode: LockMode,
    reason: LostReason,
) -> Span {
    let span = tracing::info_span!(
        "eventsource.lock.lost",
        otel.status_code = "ERROR",
        db.system.name = "postgresql",
        error.type = "lock_lost",
        lock.key = Empty,
        lock.id = lock_id,
        lock.mode = mode.as_str(),
        lock.lost_reason = reason.as_str(),
    );
    if let Some(key) = key {
        span.record("lock.key", key);
    }
    span
}

/// The span of one release, at `level`.
pub(crate) fn release_span(level: Level, key: Option<&str>, lock_id: i64, mode: LockMode) -> Span {
    let operation = match mode {
        LockMode::Shared => "pg_advisory_unlock_shared",
        _ => "pg_advisory_unlock",
    };
    let span = span_at!(
        level,
        "eventsource.lock.release",
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "postgresql",
        db.operation.name = operation,
        db.response.status_code = Empty,
        error.type = Empty,
        lock.key = Empty,
        lock.id = lock_id,
        lock.mode = mode.as_str(),
        lock.released = Empty,
    );
    if let Some(key) = key.filter(|_| !span.is_disabled()) {
        span.record("lock.key", key);
    }
    span
}

/// Records on a release's span whether the lock was released (nothing to do when no
/// subscriber records the span: looking the field up by name is the cost).
pub(crate) fn record_released(span: &Span, released: bool) {
    if !span.is_disabled() {
        span.record("lock.released", released);
    }
}

/// Records a failure on the current span: its SQLSTATE and an error type.
pub(crate) fn record_failure(span: &Span, kind: AcquisitionErrorKind, sqlstate: Option<&str>) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind_name(kind));
    if let Some(sqlstate) = sqlstate {
        span.record("db.response.status_code", sqlstate);
    }
}

/// A low-cardinality name for an error kind.
pub(crate) fn kind_name(kind: AcquisitionErrorKind) -> &'static str {
    match kind {
        AcquisitionErrorKind::Timeout => "timeout",
        AcquisitionErrorKind::PoolUnavailable => "pool_unavailable",
        AcquisitionErrorKind::ConnectionLost => "connection_lost",
        AcquisitionErrorKind::Cancelled => "cancelled",
        AcquisitionErrorKind::Unreachable => "unreachable",
        AcquisitionErrorKind::Configuration => "configuration",
        AcquisitionErrorKind::Deadlock => "deadlock",
        _ => "backend",
    }
}

/// Whole milliseconds, saturating; signed because OpenTelemetry attributes have no
/// unsigned integers (a `u64` would arrive as a string).
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
