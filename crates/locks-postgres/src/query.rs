//! A statement as the connection knows it: a [`Query`], prepared once per connection
//! (kept with the connection) and then one round trip, with `:marker` where the
//! connection's marker goes; and the set-up every connection runs first
//! ([`SESSION_SETUP`]). The lock's own statements are built on it one floor up.

use std::sync::atomic::{AtomicUsize, Ordering};

/// A statement, declared as a `static` in the module of the strategy it belongs to:
/// prepared once per connection (kept with the connection, in the place [`Query::index`]
/// numbers: a new strategy numbers nothing by hand), from `text` with `:marker` for the
/// connection's marker. Its parameters are bound by the caller and its one row read by
/// the caller (see the connection's `Session::query_within`).
#[derive(Debug)]
pub(crate) struct Query {
    /// Its SQL, with `:marker` where the connection's marker goes.
    text: &'static str,
    /// Its place among every connection's prepared statements, once numbered.
    index: AtomicUsize,
}

/// [`Query::index`] before the query is first used.
const UNNUMBERED: usize = usize::MAX;

impl Query {
    /// The query `text` (with `:marker` where the connection's marker goes).
    pub(crate) const fn new(text: &'static str) -> Self {
        Self {
            text,
            index: AtomicUsize::new(UNNUMBERED),
        }
    }

    /// The SQL text of a connection whose marker is `marker`.
    pub(crate) fn sql(&self, marker: &str) -> String {
        with_marker(self.text, marker)
    }

    /// The query's place among a connection's prepared statements: numbered on first
    /// use, the same on every connection of the process. Numbers are dense (one per
    /// `static` query, a handful of spares if threads race to number one), so a
    /// connection's cache is a short vector.
    #[inline]
    pub(crate) fn index(&self) -> usize {
        match self.index.load(Ordering::Relaxed) {
            UNNUMBERED => self.number(),
            index => index,
        }
    }

    #[cold]
    fn number(&self) -> usize {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let mine = NEXT.fetch_add(1, Ordering::Relaxed);
        match self
            .index
            .compare_exchange(UNNUMBERED, mine, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => mine,
            Err(numbered) => numbered,
        }
    }
}

/// `text` with the connection's `marker` (16 hex digits, checked) quoted in place of
/// `:marker`.
fn with_marker(text: &str, marker: &str) -> String {
    debug_assert!(marker.bytes().all(|byte| byte.is_ascii_hexdigit()));
    text.replace(":marker", &format!("'{marker}'"))
}

/// Run once on every connection the manager uses, before its first lock statement
/// (pipelined with it). `$1` is the `application_name` (or NULL), `$2` the
/// connection's marker, `$3` to `$7` the lease's server timers (or NULL: see
/// [`crate::lease::ServerTimers::as_settings`]), `$8` whether to read the backend's
/// start (a manager with stall patience: see `stall.rs`), `$9` the lease's
/// `idle_session_timeout` (or NULL: 0).
///
/// It first claims the server session: `locks.session = $2`, unless the session
/// already carries another connection's marker (then it changes nothing and answers
/// NULL as the owner: the server session is shared, a transaction-pooling proxy). On
/// a claimed session it sets, at session level, so they hold for every later statement:
/// - `statement_timeout = 0`: a server, role or URL `statement_timeout` must not end a
///   wait in `pg_advisory_lock` (the timer is armed when a statement starts, so a
///   statement-local override could not disarm it);
/// - `idle_session_timeout = 0` (PostgreSQL 14+; skipped where the setting does not
///   exist) and `idle_in_transaction_session_timeout = 0`: a session holding a lock is
///   idle, and ending it would free the lock; `idle_session_timeout = $9` instead when
///   the lease holds stopped holders too (`$9` not NULL: on a server without the
///   setting the statement fails with the server's "unrecognized configuration
///   parameter", and the statement pipelined behind it finds the session unmarked);
/// - `application_name = $1` (`locks:<holder id>`) when the manager has a holder id:
///   other sessions can see in `pg_stat_activity` which holders are ours;
/// - the lease's timers, when the manager has a lease: `tcp_keepalives_idle`,
///   `tcp_keepalives_interval`, `tcp_keepalives_count`, `tcp_user_timeout` and
///   `client_connection_check_interval` (each skipped where the server lacks it).
///
/// Answers `pg_is_in_recovery()` (a standby must not be used: its advisory locks
/// exclude nothing on the primary), the owner (the marker, or NULL when foreign), the
/// backend's pid and, when `$8`, its `backend_start` from `pg_stat_activity` (else
/// NULL): the pair names the server session, so a stalled one can be looked up later
/// from another connection (pids are reused; a pid and a start are not).
pub(crate) static SESSION_SETUP: Query = Query::new(
    "SELECT pg_is_in_recovery(), owner, pg_backend_pid(), \
     CASE WHEN $8::bool \
     THEN (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()) END \
     FROM (SELECT CASE WHEN coalesce(current_setting('locks.session', true), '') IN ('', $2) \
     THEN set_config('locks.session', $2, false) END AS owner) AS mark, \
     LATERAL (SELECT \
     CASE WHEN owner IS NOT NULL THEN set_config('statement_timeout', '0', false) END, \
     CASE WHEN owner IS NOT NULL \
     THEN set_config('idle_in_transaction_session_timeout', '0', false) END, \
     CASE WHEN owner IS NOT NULL \
     AND (current_setting('idle_session_timeout', true) IS NOT NULL OR $9::text IS NOT NULL) \
     THEN set_config('idle_session_timeout', coalesce($9, '0'), false) END, \
     CASE WHEN owner IS NOT NULL AND $1::text IS NOT NULL \
     THEN set_config('application_name', $1, false) END, \
     CASE WHEN owner IS NOT NULL AND $3::text IS NOT NULL \
     THEN set_config('tcp_keepalives_idle', $3, false) END, \
     CASE WHEN owner IS NOT NULL AND $4::text IS NOT NULL \
     THEN set_config('tcp_keepalives_interval', $4, false) END, \
     CASE WHEN owner IS NOT NULL AND $5::text IS NOT NULL \
     THEN set_config('tcp_keepalives_count', $5, false) END, \
     CASE WHEN owner IS NOT NULL AND $6::text IS NOT NULL \
     AND current_setting('tcp_user_timeout', true) IS NOT NULL \
     THEN set_config('tcp_user_timeout', $6, false) END, \
     CASE WHEN owner IS NOT NULL AND $7::text IS NOT NULL \
     AND current_setting('client_connection_check_interval', true) IS NOT NULL \
     THEN set_config('client_connection_check_interval', $7, false) END) AS settings",
);
