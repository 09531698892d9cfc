//! Copying a tenant's stream from source to target, position for position.

use uuid::Uuid;

use crate::error::StoreFailure;
use crate::ports::{Event, EventStore, StoreError, StoreId};
use crate::report::SyncLag;

/// A store and the id it is registered under (for error messages).
#[derive(Debug)]
pub(crate) struct Endpoint<'a, S> {
    pub(crate) id: &'a StoreId,
    pub(crate) store: &'a S,
}

impl<S> Clone for Endpoint<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Endpoint<'_, S> {}

impl<S: EventStore> Endpoint<'_, S> {
    pub(crate) fn fail(&self, error: StoreError) -> StoreFailure {
        StoreFailure {
            store_id: self.id.clone(),
            error,
        }
    }

    pub(crate) async fn position(&self, tenant_id: Uuid) -> Result<u64, StoreFailure> {
        self.store
            .position(tenant_id)
            .await
            .map_err(|error| self.fail(error))
    }
}

/// The lag of `target` behind `source` for the tenant, from the two heads.
pub(crate) async fn measure_lag<S: EventStore>(
    tenant_id: Uuid,
    source: Endpoint<'_, S>,
    target: Endpoint<'_, S>,
) -> Result<SyncLag, StoreFailure> {
    let source_position = source.position(tenant_id).await?;
    let target_position = target.position(tenant_id).await?;
    Ok(SyncLag {
        source_position,
        target_position,
    })
}

/// Appends to `target` the source's events after the target's head, in batches, until
/// the target's head reaches `up_to` or the source has no more. Returns how many
/// events this call appended.
///
/// Every append is conditional on the target's head, so a concurrent copier (a dual
/// write mirroring its event, another catch-up) never makes an event land twice: the
/// loser of a race re-reads the head and goes on from there.
pub(crate) async fn sync_to<S: EventStore>(
    tenant_id: Uuid,
    source: Endpoint<'_, S>,
    target: Endpoint<'_, S>,
    up_to: u64,
    batch_size: usize,
) -> Result<u64, StoreFailure> {
    let mut copied = 0u64;
    let mut conflict_at = None;
    loop {
        let head = target.position(tenant_id).await?;
        if head >= up_to {
            return Ok(copied);
        }
        let wanted = usize::try_from(up_to - head)
            .unwrap_or(usize::MAX)
            .min(batch_size);
        let batch = source
            .store
            .read(tenant_id, head, wanted)
            .await
            .map_err(|error| source.fail(error))?;
        if batch.is_empty() {
            return Ok(copied);
        }
        let events: Vec<Event> = batch.into_iter().map(|stored| stored.event).collect();
        match target.store.append(tenant_id, Some(head), &events).await {
            Ok(_) => {
                copied += u64::try_from(events.len()).unwrap_or(u64::MAX);
                conflict_at = None;
            }
            // Someone else appended first: look at the head again. A store that keeps
            // reporting a conflict at an unchanged head is not making progress.
            Err(StoreError::Conflict { .. }) if conflict_at != Some(head) => {
                conflict_at = Some(head);
            }
            Err(error) => return Err(target.fail(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryEventStore;

    #[tokio::test]
    async fn copies_in_batches_up_to_the_bound_and_never_twice() {
        let tenant = Uuid::new_v4();
        let (source_id, target_id) = (StoreId::from("s"), StoreId::from("t"));
        let (source, target) = (InMemoryEventStore::new(), InMemoryEventStore::new());
        let events: Vec<_> = (0..10u8).map(|i| Event::new("E", vec![i])).collect();
        source.append(tenant, None, &events).await.unwrap();
        let s = Endpoint {
            id: &source_id,
            store: &source,
        };
        let t = Endpoint {
            id: &target_id,
            store: &target,
        };
        assert_eq!(sync_to(tenant, s, t, 4, 3).await.unwrap(), 4);
        assert_eq!(sync_to(tenant, s, t, 4, 3).await.unwrap(), 0);
        assert_eq!(sync_to(tenant, s, t, u64::MAX, 3).await.unwrap(), 6);
        let copied: Vec<_> = target.events(tenant).into_iter().map(|e| e.event).collect();
        assert_eq!(copied, events);
        let lag = measure_lag(tenant, s, t).await.unwrap();
        assert!(lag.is_synced());
    }
}
