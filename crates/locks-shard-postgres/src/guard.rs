//! The check a progress write makes in its own transaction.

use locks_shard::Owned;

/// The statement [`guard_write`] runs, for callers on another driver: `$1` the group,
/// `$2` the shard, `$3` the token; one row whose one column says whether the token is
/// the shard's latest (no row: the shard never had a term). It locks the shard's term
/// row `FOR SHARE` until the transaction ends, so the next term cannot begin in between.
pub const GUARD_WRITE: &str = "SELECT token = $3 FROM locks_shard_terms \
     WHERE group_name = $1 AND shard = $2 FOR SHARE";

/// Whether the term `owned` is still its shard's latest, checked in `transaction` under
/// the term row's lock: `true`, write the progress in the same transaction and commit
/// (the next term's begin waits for the commit, and the next task starts after its
/// begin); `false`, a newer term began (the shard moved, this owner is stale): roll back
/// and stop.
///
/// # Errors
/// The driver's error (for example, the term table is missing).
pub async fn guard_write(
    transaction: &tokio_postgres::Transaction<'_>,
    owned: &Owned,
) -> Result<bool, tokio_postgres::Error> {
    let row = transaction
        .query_opt(GUARD_WRITE, &[&&*owned.group, &&*owned.shard, &owned.token])
        .await?;
    Ok(match row {
        Some(row) => row.try_get::<_, Option<bool>>(0)?.unwrap_or(false),
        None => false,
    })
}
