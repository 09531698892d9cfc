//! Who holds and who waits for a semaphore's permits, from `pg_locks`; and whether one
//! permit is held, from a probe of its slot that never reads `pg_locks`.

use std::collections::{BTreeSet, HashMap};

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LockMode, PermitDerivation, PermitHolder,
    PermitHolders,
};
use time::OffsetDateTime;

use tokio_postgres::Client;

use super::encoding::{SINCE_EPOCH_UNIX, TURNSTILE_SLOT, permits_of_marker};
use crate::errors::driver_error;
use crate::inner::Inner;
use crate::inspect::{AdvisoryLockId, InspectError, int4_pair_lock_holders, one_statement};
use crate::query::Query;

/// Whether slot `($1, $2)` is held by another session: a shared try of it, released in the
/// same statement when granted. Granted means nobody holds it exclusively (a permit is
/// always exclusive); refused means somebody does. The statement holds the shared lock
/// for the few microseconds between its two calls: an acquisition that tries the slot
/// in that moment finds it taken and takes another slot or waits for its next look (a
/// waiter looks every 1 to 5 ms, see [`super::sql::wait`]), so a probe delays a permit by
/// at most one look and never lets two sessions hold one. One lock-table entry, taken and
/// freed: the cost does not grow with the locks held on the server.
static PROBE: Query = Query::new(
    "SELECT CASE WHEN pg_try_advisory_lock_shared($1::int4, $2::int4) \
     THEN NOT pg_advisory_unlock_shared($1::int4, $2::int4) ELSE true END",
);

/// [`Semaphore::permit_held`](locks_port::Semaphore::permit_held) of a manager: one
/// pooled connection, one statement ([`PROBE`]), never `pg_locks`.
pub(crate) async fn permit_held(
    inner: &Inner,
    name: &str,
    slot: u32,
) -> Result<bool, LockAcquisitionError> {
    let class = PermitDerivation::CURRENT.class(name);
    // A slot past any permit count is held by nobody.
    let Ok(slot) = i32::try_from(slot) else {
        return Ok(false);
    };
    let row = one_statement(inner, name, &PROBE, &[&class, &slot], "to look with")
        .await?
        .map_err(|error| driver_error(name, error))?;
    row.try_get::<_, Option<bool>>(0)
        .ok()
        .flatten()
        .ok_or_else(|| {
            LockAcquisitionError::new(
                name,
                AcquisitionErrorKind::Backend,
                "the permit probe gave an unreadable answer",
            )
        })
}

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
/// Its cost grows with every lock held on the server: `pg_locks` copies the whole lock
/// table, holding up other sessions' lock requests meanwhile (`docs/capacity.md`, "What
/// each observation read costs").
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
                && lock.mode == LockMode::Exclusive
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
