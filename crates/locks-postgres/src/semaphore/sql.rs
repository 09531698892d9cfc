//! The semaphore's statements (ADR 0018). Every one acts only on the connection's own
//! server session: on another one (a transaction-pooling proxy) it does nothing and
//! answers NULL.
//!
//! The entry and the leave are prepared in the connection's own slots
//! ([`Query`]), with the connection's marker in their text as the lock statements have
//! it; the wait is a `DO` block sent as a simple query. All run through the connection's
//! one path ([`crate::connection::Session`]).
//!
//! `$1` of the entry is the semaphore's class; slots are `0..N` within it (see
//! [`PermitDerivation`](locks_port::PermitDerivation) and [`super::encoding`]).
//!
//! No statement ends with the turnstile held: a waiter whose process stops between two
//! statements holds at most its marker, and the queue goes on without it.

use std::fmt::Write as _;

use crate::query::Query;

/// The first statement of an acquisition, the only one when a permit is free: takes the
/// marker `($1, $2)` shared; lists the other markers of the class held on the database;
/// when there are none, tries the turnstile; holding it, takes the first free slot of
/// `0..$3` and records when (`($1 + 1, $4)` shared), and leaves the turnstile whether or
/// not a slot was free. Answers `(marked, others, gate, slot)`: `marked` NULL on another
/// server session (nothing was done), `gate` whether the turnstile was free, `slot` the
/// permit taken.
///
/// The marker is taken before the look, so of two processes that disagree on N at least
/// the later one sees the other. Each step is a `LATERAL` sub-select on the step before
/// (kept apart by `OFFSET 0`), so they run in order.
pub(super) static ENTER: Query = Query::new(
    "SELECT m.marked, o.others, t.gate, g.slot \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = :marker \
           THEN pg_advisory_lock_shared($1::int4, $2::int4)::text = '' END AS marked \
           OFFSET 0) AS m \
     CROSS JOIN LATERAL (SELECT array_agg(DISTINCT l.objid::int8) AS others FROM pg_locks l \
      WHERE m.marked AND l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
        AND l.classid = $1::int4::oid \
        AND l.objid::int8 BETWEEN 2147483648 AND 4294967294 \
        AND l.objid <> $2::int4::oid) AS o \
     CROSS JOIN LATERAL (SELECT CASE WHEN m.marked AND o.others IS NULL \
           THEN pg_try_advisory_lock($1::int4, -1) END AS gate OFFSET 0) AS t \
     CROSS JOIN LATERAL (SELECT CASE WHEN t.gate \
           THEN (SELECT s FROM generate_series(0, $3::int4 - 1) AS s \
                 WHERE pg_try_advisory_lock($1::int4, s) LIMIT 1) END AS slot \
           OFFSET 0) AS g \
     CROSS JOIN LATERAL (SELECT CASE WHEN t.gate THEN pg_advisory_unlock($1::int4, -1) \
           AND (g.slot IS NULL \
                OR pg_advisory_lock_shared($1::int4 + 1, $4::int4)::text = '') END AS done \
           OFFSET 0) AS f",
);

/// The shortest pause between two looks at the slots of a turnstile holder.
pub(super) const POLL_MS: u32 = 1;
/// The longest pause a long wait grows to (a hundredth of the time waited so far), so
/// that an idle turnstile holder costs the server less.
pub(super) const SLOWEST_POLL_MS: u32 = 5;

/// A wait for a permit, in one server-side statement that ends only with a permit, at
/// the deadline, or cancelled: queue on the turnstile (the server's FIFO queue, bounded
/// by `lock_timeout`); holding it, try every slot, pause, and again, until one is free;
/// then take it, record when, and leave the turnstile in the same step. At the deadline
/// it leaves the turnstile itself. The server grants the permit even when the client is
/// stopped or cut off, so a waiter never holds the turnstile while nobody runs its wait.
///
/// The pause is [`POLL_MS`], growing to a hundredth of the time the turnstile has been
/// held up to [`SLOWEST_POLL_MS`]; or four times the last look when that is longer (a
/// large N), so that the looking backend spends at most a fifth of its time looking.
///
/// A `DO` block takes no parameters: every value is a number formatted here, and the
/// session marker (16 hex digits) is checked before use. The answer is the setting
/// `locks.semaphore`, read by the `SELECT` sent with it: `'<slot> <idle seconds>'` for
/// a permit (the idle seconds bound how long the slot was free before this waiter saw
/// it), `''` at the deadline, NULL on another server session.
pub(super) fn wait(marker: &str, class: i32, permits: u32, lock_timeout_ms: u32) -> Option<String> {
    if marker.is_empty() || !marker.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return None;
    }
    let mut sql = String::with_capacity(1600);
    let _ = write!(
        sql,
        "DO $locks$ DECLARE \
           c int4 := {class}; n int4 := {permits}; \
           stop timestamptz := CASE WHEN {lock_timeout_ms} > 0 \
             THEN clock_timestamp() + {lock_timeout_ms} * interval '1 ms' END; \
           s int4; missed timestamptz; looked timestamptz; began timestamptz; \
         BEGIN \
           IF current_setting('locks.session', true) IS DISTINCT FROM '{marker}' THEN \
             RETURN; \
           END IF; \
           PERFORM set_config('locks.semaphore', '', false); \
           IF NOT pg_try_advisory_lock(c, -1) THEN \
             IF stop IS NOT NULL THEN \
               PERFORM set_config('lock_timeout', greatest(1, ceil(extract(epoch FROM \
                 stop - clock_timestamp()) * 1000))::int8::text, true); \
             END IF; \
             BEGIN \
               PERFORM pg_advisory_lock(c, -1); \
             EXCEPTION WHEN lock_not_available THEN \
               RETURN; \
             END; \
           END IF; \
           began := clock_timestamp(); \
           LOOP \
             looked := clock_timestamp(); \
             SELECT g INTO s FROM generate_series(0, n - 1) AS g \
               WHERE pg_try_advisory_lock(c, g) LIMIT 1; \
             IF s IS NOT NULL THEN \
               PERFORM pg_advisory_unlock(c, -1); \
               PERFORM pg_advisory_lock_shared(c + 1, least(2147483647, \
                 floor(extract(epoch FROM clock_timestamp())) - {epoch})::int4); \
               PERFORM set_config('locks.semaphore', s::text || ' ' || coalesce( \
                 extract(epoch FROM clock_timestamp() - missed), 0)::text, false); \
               RETURN; \
             END IF; \
             missed := clock_timestamp(); \
             IF stop IS NOT NULL AND missed >= stop THEN \
               PERFORM pg_advisory_unlock(c, -1); \
               RETURN; \
             END IF; \
             PERFORM pg_sleep(greatest({poll}, least({slowest}, \
               extract(epoch FROM missed - began) / 100), \
               4 * extract(epoch FROM missed - looked))); \
           END LOOP; \
         END $locks$; \
         SELECT CASE WHEN current_setting('locks.session', true) = '{marker}' \
           THEN current_setting('locks.semaphore', true) END",
        epoch = super::encoding::SINCE_EPOCH_UNIX,
        poll = f64::from(POLL_MS) / 1000.0,
        slowest = f64::from(SLOWEST_POLL_MS) / 1000.0,
    );
    Some(sql)
}

/// Frees everything the session holds: the permit, its marker and "since" lock, or a
/// waiter's marker. The session holds nothing else (permits never share a
/// connection), so this is exact.
pub(super) static LEAVE: Query = Query::new(
    "SELECT CASE WHEN current_setting('locks.session', true) = :marker \
     THEN pg_advisory_unlock_all()::text = '' END",
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_and_the_leave_carry_the_marker() {
        for query in [&ENTER, &LEAVE] {
            let sql = query.sql("0123456789abcdef");
            assert!(sql.contains("locks.session', true) = '0123456789abcdef'"));
            assert!(!sql.contains(":marker"));
        }
        // Two statics: two prepared statements on a connection, never one for both.
        assert!(!std::ptr::eq(&ENTER, &LEAVE));
        // The entry binds the class, the marker's slot, N and the time; the leave nothing.
        let enter = ENTER.sql("0123456789abcdef");
        assert!(enter.contains("$4") && !enter.contains("$5"));
        assert!(!LEAVE.sql("0123456789abcdef").contains('$'));
    }
}
