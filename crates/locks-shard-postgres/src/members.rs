//! Member renewals: a row per member with an expiry, and the end of a frozen member's
//! lock sessions once its renewal expired.

use std::time::Duration;

use locks_shard::locks_port::PermitDerivation;

/// The member table (in the connection's `search_path` schema).
pub const MEMBERS_TABLE: &str = "locks_shard_members";

/// The statement that creates the member table, for migration tools (run by
/// [`install_shard_terms`](crate::install_shard_terms) too).
pub const MEMBERS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS locks_shard_members (\
     group_name text NOT NULL, \
     member_slot integer NOT NULL, \
     application_name text NOT NULL, \
     expires timestamptz NOT NULL, \
     holder_id text, \
     PRIMARY KEY (group_name, member_slot))";

/// Adds the `holder_id` column to a member table created before it existed (run by
/// [`install_shard_terms`](crate::install_shard_terms) after [`MEMBERS_SCHEMA`]; does
/// nothing on a table that has it). The roster names a member by it: the
/// `application_name` carries a holder id too long for the server's 63 bytes only as its
/// start and a hash ([`holder_application_name`](locks_postgres::holder_application_name)),
/// which is not the id its terms carry.
pub const MEMBERS_UPGRADE: &str =
    "ALTER TABLE locks_shard_members ADD COLUMN IF NOT EXISTS holder_id text";

/// Whether slot `member_slot` of the semaphore class `$CLASS` is held: a shared try of it,
/// let go in the same expression when granted (the adapter's `permit_held` probe). One
/// lock-table entry taken and freed; never `pg_locks`.
macro_rules! held {
    ($class:literal) => {
        concat!(
            "CASE WHEN pg_try_advisory_lock_shared(",
            $class,
            "::int4, member_slot) THEN NOT pg_advisory_unlock_shared(",
            $class,
            "::int4, member_slot) ELSE true END"
        )
    };
}

/// The upsert of a member's row (`$1` group, `$2` slot, `$3` its sessions' application
/// name, or `''` without a holder id, and the parameter `$holder` its whole holder id, or
/// NULL), expiring after `$4` seconds, or never when `$4` is NULL (a member that does not
/// renew, or whose expiry is too long for the clock: its row lasts until another member
/// takes its slot, and says nothing while the slot is free). [`ENTER`] alone, and the first part of a renewal (`renew_mine!`).
macro_rules! upsert_member {
    ($holder:literal) => {
        concat!(
            "INSERT INTO locks_shard_members AS m \
               (group_name, member_slot, application_name, expires, holder_id) \
             VALUES ($1, $2, $3, COALESCE(clock_timestamp() + make_interval(secs => $4::float8), \
               'infinity'::timestamptz), ",
            $holder,
            "::text) \
             ON CONFLICT (group_name, member_slot) DO UPDATE \
               SET application_name = EXCLUDED.application_name, expires = EXCLUDED.expires, \
                 holder_id = EXCLUDED.holder_id"
        )
    };
}

/// A renewal's first part: `mine`, the upsert of this member's row (`upsert_member!`,
/// `$4` the expiry in seconds, `$6` the holder id), then a comma.
macro_rules! renew_mine {
    () => {
        concat!("WITH mine AS (", upsert_member!("$6"), " RETURNING 1), ")
    };
}

/// Enters a member in the roster: its row (`upsert_member!`, `$5` the holder id).
pub(crate) const ENTER: &str = upsert_member!("$5");

/// The roster (`$1` group, `$2` the membership semaphore's class): each row whose slot
/// is held now, by a probe of the slot, never `pg_locks`: its cost grows with the group's
/// rows, not with the locks held on the server. With each, the application name and the
/// whole holder id (see [`MEMBERS_UPGRADE`]).
pub(crate) const ROSTER: &str = concat!(
    "SELECT member_slot, application_name, holder_id FROM locks_shard_members \
     WHERE group_name = $1 AND ",
    held!("$2"),
    " ORDER BY member_slot"
);

/// A renewal's first statement: renews this member's row (as [`RENEW`]), forgets the
/// group's expired rows whose slot is free (members that left or died), and counts the
/// expired rows whose slot is still held (by a probe, never `pg_locks`). Only when that
/// count is not zero does the renewal run [`RENEW`], which reads `pg_locks` to end the
/// sessions of those members: a member whose process stopped is rare, and a renewal
/// costs the same at any server size otherwise.
pub(crate) const RENEW_LOOK: &str = concat!(
    renew_mine!(),
    "expired AS MATERIALIZED (\
       SELECT member_slot, ",
    held!("$5"),
    " AS held FROM locks_shard_members \
       WHERE group_name = $1 AND member_slot <> $2 AND expires < clock_timestamp()), \
     forgotten AS (\
       DELETE FROM locks_shard_members f USING expired e \
       WHERE f.group_name = $1 AND f.member_slot = e.member_slot AND NOT e.held \
         AND f.expires < clock_timestamp() \
       RETURNING 1) \
     SELECT count(*) FILTER (WHERE held)::int8 FROM expired"
);

/// One statement: renews this member's row (`$1` group, `$2` slot, `$3` its sessions'
/// application name, `$4` the expiry in seconds, `$6` its holder id); deletes the group's expired rows; and
/// for each expired row whose membership slot (`$5` the semaphore's class) is still held
/// by a session of its application name, ends that session, and every session of that
/// name when no row of that name is live. A member that left (its slot free) is only
/// forgotten; one that stopped is ended. A member that joined again under another slot
/// (its row there live) while the session of its old membership, gone on its side,
/// still holds the old slot on the server (after a network cut, until the server's
/// timers end it), loses that session alone, not the sessions it runs its shards on.
/// Sessions are told apart by their name, which is one holder id's alone however long
/// the ids (`holder_application_name`): a stopped member whose id begins as a live one's
/// loses its sessions, and the live one none. (A data-modifying `WITH` runs whether or
/// not the rest reads it; every part reads the table as it was before this statement.)
pub(crate) const RENEW: &str = concat!(
    renew_mine!(),
    "expired AS (\
       DELETE FROM locks_shard_members \
       WHERE group_name = $1 AND member_slot <> $2 AND expires < clock_timestamp() \
       RETURNING member_slot, application_name), \
     stuck AS (\
       SELECT a.pid, e.application_name FROM expired e \
       JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
         AND l.classid = $5::int4::oid AND l.objid = e.member_slot::oid \
       JOIN pg_stat_activity a ON a.pid = l.pid AND a.application_name = e.application_name), \
     renewing AS (\
       SELECT application_name FROM locks_shard_members \
       WHERE group_name = $1 AND expires >= clock_timestamp() \
       UNION SELECT $3) \
     SELECT count(pg_terminate_backend(a.pid))::int8 FROM pg_stat_activity a \
     WHERE a.pid <> pg_backend_pid() AND (a.pid IN (SELECT pid FROM stuck) \
       OR a.application_name IN (SELECT application_name FROM stuck \
         WHERE application_name NOT IN (SELECT application_name FROM renewing)))"
);

/// The class of the group's membership semaphore.
pub(crate) fn members_class(members_name: &str) -> i32 {
    PermitDerivation::CURRENT.class(members_name)
}

/// An expiry from which a member's row never expires: the server's clock cannot add much
/// more (`clock_timestamp()` plus `Duration::MAX` is out of `timestamptz`'s range), and
/// the member's own self-stop never comes due for such an expiry either.
const ENDLESS: Duration = Duration::from_secs(1_000 * 366 * 86_400);

/// The expiry in seconds, as the statement takes it: `None` (never expires) from
/// [`ENDLESS`] on.
pub(crate) fn seconds(expiry: Duration) -> Option<f64> {
    (expiry < ENDLESS).then_some(expiry.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::{ENTER, RENEW, RENEW_LOOK, ROSTER};

    #[test]
    fn what_a_tick_and_a_renewal_run_never_reads_pg_locks() {
        for (name, statement) in [
            ("ENTER", ENTER),
            ("ROSTER", ROSTER),
            ("RENEW_LOOK", RENEW_LOOK),
        ] {
            assert!(
                !statement.contains("pg_locks"),
                "{name} reads the whole lock table: {statement}"
            );
        }
        assert!(
            RENEW.contains("pg_locks"),
            "only the renewal that found a stopped member's slot held reads it"
        );
        assert!(ROSTER.contains("pg_try_advisory_lock_shared($2::int4, member_slot)"));
    }
}
