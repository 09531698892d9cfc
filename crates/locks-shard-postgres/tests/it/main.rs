//! The term store and a fleet of members on a real PostgreSQL server (the test server of
//! `throwaway-pg`, or the one `LOCKS_DATABASE_URL` names).

mod fleet;
mod processes;
mod record;
mod rejoin;
mod renewal;
mod restart;
mod roster;
mod support;
mod takeover;
mod terms;
