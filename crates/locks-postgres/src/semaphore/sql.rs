//! The semaphore's statements (ADR 0018). Every one binds only numbers and the
//! connection's marker (`$1`), and acts only on the connection's own server session: on
//! another one (a transaction-pooling proxy) it does nothing and answers NULL.
//!
//! `$2` is always the semaphore's class; slots are `$3` and up (see
//! [`PermitDerivation`](locks_port::PermitDerivation)).

/// The end of the statements that may take a slot, after a step `t` whose `gate` says
/// the turnstile is held: take the first free slot of `0..$permits` and, if one was free,
/// leave the turnstile and record when (`($2 + 1, $since)` shared). Each step is a
/// `LATERAL` sub-select on the step before (kept apart by `OFFSET 0`), so they run in
/// order.
macro_rules! take_a_slot {
    ($permits:literal, $since:literal) => {
        concat!(
            " CROSS JOIN LATERAL (SELECT CASE WHEN t.gate \
             THEN (SELECT s FROM generate_series(0, ",
            $permits,
            "::int4 - 1) AS s WHERE pg_try_advisory_lock($2::int4, s) LIMIT 1) END AS slot \
             OFFSET 0) AS g \
             CROSS JOIN LATERAL (SELECT CASE WHEN g.slot IS NOT NULL \
             THEN pg_advisory_unlock($2::int4, -1) \
             AND pg_advisory_lock_shared($2::int4 + 1, ",
            $since,
            "::int4)::text = '' END AS done OFFSET 0) AS f"
        )
    };
}

/// The first statement of an acquisition, the only one when a permit is free: takes the
/// marker `($2, $3)` shared; lists the other markers of the class held on the database;
/// when there are none, tries the turnstile; holding it, [`take_a_slot!`] of `0..$4`
/// (`$5`: the second of the grant). Answers `(marked, others, gate, slot)`: `marked`
/// NULL on another server session (nothing was done), `gate` whether the turnstile was
/// taken (still held when `slot` is NULL: every slot busy), `slot` the permit taken.
///
/// The marker is taken before the look, so of two processes that disagree on N at least
/// the later one sees the other.
pub(super) const ENTER: &str = concat!(
    "SELECT m.marked, o.others, t.gate, g.slot \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = $1 \
           THEN pg_advisory_lock_shared($2::int4, $3::int4)::text = '' END AS marked \
           OFFSET 0) AS m \
     CROSS JOIN LATERAL (SELECT array_agg(DISTINCT l.objid::int8) AS others FROM pg_locks l \
      WHERE m.marked AND l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
        AND l.classid = $2::int4::oid \
        AND l.objid::int8 BETWEEN 2147483648 AND 4294967294 \
        AND l.objid <> $3::int4::oid) AS o \
     CROSS JOIN LATERAL (SELECT CASE WHEN m.marked AND o.others IS NULL \
           THEN pg_try_advisory_lock($2::int4, -1) END AS gate OFFSET 0) AS t",
    take_a_slot!("$4", "$5")
);

/// Waits in the turnstile's queue (`$3`: the `lock_timeout` in ms as text, '0' forever,
/// scoped to this statement's transaction), then [`take_a_slot!`] of `0..$4` (`$5`: the
/// second of the grant). Answers `(gate, slot)`: `gate` NULL on another server session; a
/// timeout is an error (55P03) and leaves nothing taken.
pub(super) const WAIT_GATE_THEN_SCAN: &str = concat!(
    "SELECT t.gate, g.slot \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = $1 \
           THEN pg_advisory_lock($2::int4, -1)::text = '' END AS gate \
           FROM (SELECT set_config('lock_timeout', $3, true)) AS options OFFSET 0) AS t",
    take_a_slot!("$4", "$5")
);

/// Held by the turnstile holder: [`take_a_slot!`] of `0..$3` (`$4`: the second of the
/// grant). Answers the slot, or NULL when all are busy (the turnstile is still held).
pub(super) const SCAN: &str = concat!(
    "SELECT g.slot \
     FROM (SELECT CASE WHEN current_setting('locks.session', true) = $1 THEN true END AS gate \
           OFFSET 0) AS t",
    take_a_slot!("$3", "$4")
);

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
