//! For crates that keep tables of their own beside the locks, on the same database (a
//! shard group's terms, a schedule's ledger): install a schema once under a transaction
//! lock, bound each operation by an answer timeout, say a driver error in the server's
//! words, and name a holder's sessions as the manager publishes them. One copy of each,
//! so the stores built on this crate say and do these things alike.

use std::future::Future;
use std::time::Duration;

/// Runs `ddl` (idempotent install statements, `CREATE TABLE IF NOT EXISTS ...`, several
/// separated by `;`) in one transaction that first takes the transaction lock of
/// `install_key` (a key of the install's own, as [`FENCING_INSTALL_KEY`] is the fencing
/// table's): two concurrent `CREATE TABLE IF NOT EXISTS` of a new table can otherwise
/// fail with a unique violation in the server's catalog. On failure the transaction is
/// rolled back, so the session stays usable for whoever reuses it.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let client = pool.get().await?;
/// locks_postgres::install_under_lock(
///     &client,
///     "my-store:install",
///     "CREATE TABLE IF NOT EXISTS my_store (k text PRIMARY KEY, v bigint NOT NULL)",
/// )
/// .await?;
/// # Ok(())
/// # }
/// ```
///
/// [`FENCING_INSTALL_KEY`]: crate::FENCING_INSTALL_KEY
///
/// # Errors
/// The driver's error when a statement fails (for example, no `CREATE` privilege).
pub async fn install_under_lock(
    client: &tokio_postgres::Client,
    install_key: &str,
    ddl: &str,
) -> Result<(), tokio_postgres::Error> {
    crate::xact::install_under_lock(client, install_key, ddl).await
}

/// `locks:<holder id>` as a manager built with that holder id publishes it as its
/// sessions' `application_name` ([`HOLDER_APPLICATION_NAME_PREFIX`]). What to look for in
/// `pg_stat_activity` to find a holder's sessions.
///
/// The whole id when the name can carry it as it is: at most 63 bytes with the prefix
/// (the server's limit; it cuts a longer name) and no NUL byte (which the protocol cannot
/// carry). Else the id's start (without NUL bytes, cut at a character boundary), `#` and
/// 16 hex digits of [`lock_id`](locks_port::lock_id) of the whole id, 63 bytes in all: two
/// ids publish two names however alike their first bytes are (a pod name and a UUID), so
/// the sessions of one are never taken for the other's (`locks-shard-postgres` ends a
/// stopped member's sessions by this name).
///
/// [`HOLDER_APPLICATION_NAME_PREFIX`]: crate::HOLDER_APPLICATION_NAME_PREFIX
///
/// ```
/// use locks_postgres::holder_application_name;
///
/// assert_eq!(holder_application_name("worker-7"), "locks:worker-7");
/// let pod = "projections-worker-eu-west-1-7c9f8d6b5-x2x4z-0123456789abcdef";
/// let a = holder_application_name(&format!("{pod}-a"));
/// let b = holder_application_name(&format!("{pod}-b"));
/// assert_ne!(a, b);
/// assert!(a.starts_with("locks:projections-worker-eu-west-1-7c9f8d6b5-x#"));
/// assert_eq!(a.len(), 63);
/// ```
#[must_use]
pub fn holder_application_name(holder_id: &str) -> String {
    crate::settings::published_holder_id(holder_id)
}

/// `operation`, or `timed_out()` when it has not finished within `timeout`. A timeout
/// too long for the runtime's timer (up to `Duration::MAX`) means no limit.
///
/// # Errors
/// The operation's error, or `timed_out()`.
///
/// # Cancel safety
/// As `operation`: dropped at the timeout, or with this future.
pub async fn answer_within<T, E>(
    timeout: Duration,
    operation: impl Future<Output = Result<T, E>>,
    timed_out: impl FnOnce() -> E,
) -> Result<T, E> {
    match tokio::time::Instant::now().checked_add(timeout) {
        Some(deadline) => tokio::time::timeout_at(deadline, operation)
            .await
            .unwrap_or_else(|_| Err(timed_out())),
        None => operation.await,
    }
}

/// What failed (`what`, "beginning a shard term") and why, in the server's words:
/// `what: message (SQLSTATE)`, with its DETAIL and HINT when it has them; for an error
/// that did not come from the server (a closed connection), the driver's own words and
/// each source's, none repeated (as this crate's own errors say them). The driver's
/// `Display` says only "db error" for a server error, so a reason built from it would say
/// nothing.
#[must_use]
pub fn server_words(what: &str, error: &tokio_postgres::Error) -> String {
    format!("{what}: {}", crate::errors::describe(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_id_is_published_whole_or_with_a_hash_of_it_within_63_bytes() {
        let fits = "x".repeat(57);
        assert_eq!(holder_application_name(&fits), format!("locks:{fits}"));
        let long = holder_application_name(&"x".repeat(100));
        assert_eq!(long.len(), 63);
        assert_eq!(long[..46], format!("locks:{}", "x".repeat(40)));
        assert_eq!(long.as_bytes()[46], b'#');
        // Alike in the 57 bytes the server would keep of each: two names.
        let (a, b) = (format!("{fits}-a"), format!("{fits}-b"));
        assert_ne!(holder_application_name(&a), holder_application_name(&b));
        // A character that would cross the limit is left out whole.
        let cut = holder_application_name(&"€".repeat(30));
        assert_eq!(cut.len(), 62, "13 characters of 3 bytes, the hash");
        // NUL bytes are left out, and the name says that the id was changed.
        let nul = holder_application_name("a\0b");
        assert!(nul.starts_with("locks:ab#") && nul != holder_application_name("ab"));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn answer_within_ends_a_slow_operation_and_saturates_a_long_timeout() {
        let slow = tokio::time::sleep(Duration::from_secs(60));
        let outcome: Result<(), &str> = answer_within(
            Duration::from_millis(10),
            async {
                slow.await;
                Ok(())
            },
            || "timed out",
        )
        .await;
        assert_eq!(outcome, Err("timed out"));
        let outcome: Result<u8, &str> =
            answer_within(Duration::MAX, async { Ok(7) }, || "timed out").await;
        assert_eq!(outcome, Ok(7));
    }
}
