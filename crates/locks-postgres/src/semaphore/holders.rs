//! Who holds and who waits for a semaphore's permits, from `pg_locks`.

use std::collections::{BTreeSet, HashMap};

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, PermitDerivation, PermitHolder, PermitHolders,
};
use time::OffsetDateTime;

use tokio_postgres::Client;

use super::encoding::{SINCE_EPOCH_UNIX, TURNSTILE_SLOT, permits_of_marker};
use crate::inner::Inner;
use crate::inspect::{AdvisoryLockId, InspectError, int4_pair_lock_holders};

/// [`Semaphore::permit_holders`](locks_port::Semaphore::permit_holders) of a manager:
/// one pooled connection, one query.
pub(crate) async fn permit_holders(
    inner: &Inner,
    name: &str,
) -> Result<PermitHolders, LockAcquisitionError> {
    let failed =
        |reason: String| LockAcquisitionError::new(name, AcquisitionErrorKind::Backend, reason);
    let client = crate::pool::for_one_read_of(
        inner.pool(),
        inner.settings().connect_timeout,
        name,
        "to look with",
    )
    .await?;
    semaphore_holders(&client, name)
        .await
        .map_err(|error| failed(error.to_string()))
}

/// Who holds and who waits for the permits of the semaphore `name` on `client`'s
/// database, without a manager (for a CLI or a health endpoint): the permits held (by
/// slot, with the holder id and the second each was granted), how many sessions wait
/// for one (they hold the marker of N, not a slot), and the N in use. A pooled
/// connection derefs to a [`Client`].
///
/// # Errors
/// [`InspectError::Query`] when the server refuses.
pub async fn semaphore_holders(client: &Client, name: &str) -> Result<PermitHolders, InspectError> {
    let class = PermitDerivation::CURRENT.class(name);
    let locks = int4_pair_lock_holders(client, &[class, class | 1]).await?;
    let mut permits = BTreeSet::new();
    let mut participants = BTreeSet::new();
    let mut slots: Vec<(u32, Option<i32>, Option<String>)> = Vec::new();
    let mut since: HashMap<i32, i32> = HashMap::new();
    for lock in locks.into_iter().filter(|lock| lock.granted) {
        let AdvisoryLockId::Int4Pair(of, slot) = lock.lock else {
            continue;
        };
        if of == class | 1 {
            if let Some(pid) = lock.pid {
                since.insert(pid, slot);
            }
        } else if of == class {
            if let Some(n) = permits_of_marker(slot) {
                permits.insert(n);
                participants.extend(lock.pid);
            } else if slot != TURNSTILE_SLOT
                && let Ok(slot) = u32::try_from(slot)
            {
                slots.push((slot, lock.pid, lock.holder_id));
            }
        }
    }
    let mut holders = PermitHolders::default();
    holders.waiting = participants.len().saturating_sub(slots.len());
    holders.permits = permits.into_iter().collect();
    slots.sort_by_key(|(slot, ..)| *slot);
    holders.held = slots
        .into_iter()
        .map(|(slot, pid, holder_id)| {
            let granted = pid.and_then(|pid| since.get(&pid)).and_then(|&seconds| {
                OffsetDateTime::from_unix_timestamp(SINCE_EPOCH_UNIX + i64::from(seconds)).ok()
            });
            PermitHolder::new(slot, holder_id, granted)
        })
        .collect();
    Ok(holders)
}
