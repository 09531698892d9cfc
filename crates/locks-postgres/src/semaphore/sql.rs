//! The semaphore's statements (ADR 0018). Every one binds only numbers and the
//! connection's marker (`$1`), and acts only on the connection's own server session: on
//! another one (a transaction-pooling proxy) it does nothing and answers NULL.
//!
//! `$2` is always the semaphore's class; slots are `$3` and up (see
//! [`PermitDerivation`](locks_port::PermitDerivation)).

/// Takes the marker `($2, $3)` shared, then lists the other markers of the class held
/// on the database (granted). The marker is taken before the look (the sub-select is
/// correlated with it and `OFFSET 0` keeps it a separate step), so of two processes
/// that disagree on N at least the later one sees the other.
pub(super) const MARK: &str = "SELECT m.marked, \
     (SELECT array_agg(DISTINCT l.objid::int8) FROM pg_locks l \
      WHERE m.marked AND l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
        AND l.classid = $2::int4::oid \
        AND l.objid::int8 BETWEEN 2147483648 AND 4294967294 \
        AND l.objid <> $3::int4::oid) \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = $1 \
           THEN pg_advisory_lock_shared($2::int4, $3::int4)::text = '' END AS marked \
           OFFSET 0) AS m";

/// Takes the turnstile if it is free (nobody waits and nobody is scanning).
pub(super) const TRY_GATE: &str = "SELECT CASE WHEN current_setting('locks.session', true) = $1 \
     THEN pg_try_advisory_lock($2::int4, -1) END";

/// Waits in the turnstile's queue; `$3` is the `lock_timeout` in ms as text ('0':
/// forever), scoped to this statement's transaction.
pub(super) const WAIT_GATE: &str = "SELECT CASE WHEN current_setting('locks.session', true) = $1 \
     THEN pg_advisory_lock($2::int4, -1)::text = '' END \
     FROM (SELECT set_config('lock_timeout', $3, true)) AS options";

/// Held by the turnstile holder: takes the first free slot of `0..$3` and, if one was
/// free, leaves the turnstile and records when (`($2 + 1, $4)` shared). Answers the
/// slot, or NULL when all are busy (the turnstile is still held).
pub(super) const SCAN: &str = "SELECT g.slot, CASE WHEN g.slot IS NOT NULL \
     THEN pg_advisory_unlock($2::int4, -1) \
     AND pg_advisory_lock_shared($2::int4 + 1, $4::int4)::text = '' END \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = $1 \
           THEN (SELECT s FROM generate_series(0, $3::int4 - 1) AS s \
                 WHERE pg_try_advisory_lock($2::int4, s) LIMIT 1) END AS slot \
           OFFSET 0) AS g";

/// Held by the turnstile holder when every slot was busy: waits for slot `$3` for at
/// most `$5` ms; once granted, leaves the turnstile and records when (`$4`).
pub(super) const WAIT_SLOT: &str = "SELECT CASE WHEN current_setting('locks.session', true) = $1 \
     THEN pg_advisory_lock($2::int4, $3::int4)::text = '' \
     AND pg_advisory_unlock($2::int4, -1) \
     AND pg_advisory_lock_shared($2::int4 + 1, $4::int4)::text = '' END \
     FROM (SELECT set_config('lock_timeout', $5, true)) AS options";

/// Frees everything the session holds: the permit, its marker and "since" lock, or a
/// waiter's marker and turnstile. The session holds nothing else (permits never share a
/// connection), so this is exact.
pub(super) const LEAVE: &str = "SELECT CASE WHEN current_setting('locks.session', true) = $1 \
     THEN pg_advisory_unlock_all()::text = '' END";

/// The keepalive of a held permit's connection.
pub(super) const PING: &str = "SELECT current_setting('locks.session', true) = $1";
