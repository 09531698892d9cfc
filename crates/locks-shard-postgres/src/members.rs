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
     PRIMARY KEY (group_name, member_slot))";

/// One statement: renews this member's row (`$1` group, `$2` slot, `$3` its sessions'
/// application name, `$4` the expiry in seconds); deletes the group's expired rows; and
/// for each expired member whose membership slot (`$5` the semaphore's class) is still
/// held by a session of its application name, ends every session of that name. A member
/// that left (its slot free) is only forgotten; one that stopped is ended. (A
/// data-modifying `WITH` runs whether or not the rest reads it.)
pub(crate) const RENEW: &str = "WITH mine AS (\
       INSERT INTO locks_shard_members AS m \
         (group_name, member_slot, application_name, expires) \
       VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4::float8)) \
       ON CONFLICT (group_name, member_slot) DO UPDATE \
         SET application_name = EXCLUDED.application_name, expires = EXCLUDED.expires \
       RETURNING 1), \
     expired AS (\
       DELETE FROM locks_shard_members \
       WHERE group_name = $1 AND member_slot <> $2 AND expires < clock_timestamp() \
       RETURNING member_slot, application_name), \
     stuck AS (\
       SELECT DISTINCT e.application_name FROM expired e \
       JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
         AND l.classid = $5::int4::oid AND l.objid = e.member_slot::oid \
       JOIN pg_stat_activity a ON a.pid = l.pid AND a.application_name = e.application_name) \
     SELECT count(pg_terminate_backend(a.pid))::int8 FROM pg_stat_activity a \
     JOIN stuck s ON a.application_name = s.application_name \
     WHERE a.pid <> pg_backend_pid()";

/// The class of the group's membership semaphore.
pub(crate) fn members_class(members_name: &str) -> i32 {
    PermitDerivation::CURRENT.class(members_name)
}

/// The expiry in seconds, as the statement takes it.
pub(crate) fn seconds(expiry: Duration) -> f64 {
    expiry.as_secs_f64()
}
