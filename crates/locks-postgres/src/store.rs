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
/// sessions' `application_name` ([`HOLDER_APPLICATION_NAME_PREFIX`]): no NUL bytes (the
/// protocol cannot carry them), at most 63 bytes (the server's limit), cut at a character
/// boundary. What to look for in `pg_stat_activity` to find a holder's sessions.
///
/// [`HOLDER_APPLICATION_NAME_PREFIX`]: crate::HOLDER_APPLICATION_NAME_PREFIX
///
/// ```
/// assert_eq!(locks_postgres::holder_application_name("worker-7"), "locks:worker-7");
/// assert_eq!(locks_postgres::holder_application_name(&"é".repeat(40)).len(), 62);
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
    fn a_holder_id_is_published_without_nul_and_within_63_bytes() {
        assert_eq!(holder_application_name("a\0b"), "locks:ab");
        let long = holder_application_name(&"x".repeat(100));
        assert_eq!(long.len(), 63);
        // A character that would cross the limit is left out whole.
        let cut = holder_application_name(&"é".repeat(40));
        assert!(cut.len() <= 63 && cut.is_char_boundary(cut.len()));
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
