//! Spans and events, following the OpenTelemetry database conventions.

use std::time::Duration;

use locks_port::AcquisitionErrorKind;
use tracing::Span;
use tracing::field::Empty;

/// The span of one acquisition (`acquire` or `try_acquire`).
pub(crate) fn acquire_span(
    key: Option<&str>,
    lock_id: i64,
    operation: &'static str,
    timeout: Option<Duration>,
) -> Span {
    let span = tracing::info_span!(
        "eventsource.lock.acquire",
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "postgresql",
        db.operation.name = operation,
        db.response.status_code = Empty,
        error.type = Empty,
        lock.key = Empty,
        lock.id = lock_id,
        lock.timeout_ms = Empty,
        lock.acquired = Empty,
        lock.wait_ms = Empty,
    );
    if let Some(key) = key {
        span.record("lock.key", key);
    }
    if let Some(timeout) = timeout {
        span.record("lock.timeout_ms", duration_ms(timeout));
    }
    span
}

/// The span of one release.
pub(crate) fn release_span(key: Option<&str>, lock_id: i64) -> Span {
    let span = tracing::info_span!(
        "eventsource.lock.release",
        otel.kind = "client",
        otel.status_code = Empty,
        db.system.name = "postgresql",
        db.operation.name = "pg_advisory_unlock",
        db.response.status_code = Empty,
        error.type = Empty,
        lock.key = Empty,
        lock.id = lock_id,
        lock.released = Empty,
    );
    if let Some(key) = key {
        span.record("lock.key", key);
    }
    span
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
        _ => "backend",
    }
}

/// Whole milliseconds, saturating; signed because OpenTelemetry attributes have no
/// unsigned integers (a `u64` would arrive as a string).
pub(crate) fn duration_ms(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
