//! One membership of a shard group: from a granted membership permit until the permit is
//! lost, the caller shuts down, or this member's renewal is overdue, ticking the
//! assignment and renewing the member's liveness meanwhile.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use locks_port::{DistributedLock, LostSignal, PermitGuard, Semaphore};

use crate::assignment::Assignment;
use crate::renewal::Renewals;
use crate::task::{Owned, Running};
use crate::terms::ShardTerms;

/// A membership's settings: the assignment it ticks, how often, and the member's renewal
/// expiry.
#[derive(Debug)]
pub(crate) struct Membership<'a, M, T> {
    pub(crate) assignment: Assignment<'a, M, T>,
    pub(crate) tick: Duration,
    pub(crate) renewal: Option<Duration>,
}

impl<M, T> Membership<'_, M, T>
where
    M: DistributedLock + Semaphore,
    M::Guard: 'static,
    T: ShardTerms + Clone + 'static,
{
    /// One membership: ticks until the membership permit is lost, `shutdown` is ready,
    /// or this member's renewal is overdue.
    pub(crate) async fn hold<P, F, Fut>(
        &self,
        permit: &P,
        running: &mut BTreeMap<usize, Running>,
        task: &Arc<F>,
        shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Left
    where
        P: PermitGuard,
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let slot = permit.info().slot();
        let holder_id = permit.info().holder_id().map(str::to_owned);
        let lost = permit.lost();
        let renewals = match (self.renewal, holder_id.clone()) {
            (Some(expiry), Some(holder)) => Some(Renewals::start(
                self.assignment.terms.clone(),
                self.assignment.group.name().to_owned(),
                slot,
                holder,
                expiry,
            )),
            _ => None,
        };
        let overdue = async {
            match &renewals {
                Some(renewals) => renewals.overdue().await,
                None => std::future::pending().await,
            }
        };
        let ticking = async {
            let mut seen: Vec<u32> = Vec::new();
            let mut changed_at: Option<Instant> = None;
            loop {
                self.assignment
                    .tick(
                        slot,
                        holder_id.as_deref(),
                        running,
                        task,
                        &mut seen,
                        &mut changed_at,
                    )
                    .await;
                tokio::time::sleep(self.tick).await;
            }
        };
        tokio::select! {
            biased;
            reason = lost.clone() => {
                tracing::warn!(reason = reason.as_str(),
                    "shard group membership lost; handing every shard over");
                Left::Lost
            }
            () = shutdown => Left::Shutdown,
            () = overdue => {
                tracing::warn!(
                    "this member's renewal is overdue; stopping every task before the other \
                     members may end its sessions"
                );
                Left::Overdue
            }
            never = ticking => never,
        }
    }
}

/// Why a membership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// The membership permit was lost.
    Lost,
    /// The caller's shutdown future was ready.
    Shutdown,
    /// This member's renewal is overdue: the others may end its sessions.
    Overdue,
}

/// Hands every term over at once and waits until each released its lock.
pub(crate) async fn stop_all(terms: Vec<Running>) {
    let mut stopping = Vec::with_capacity(terms.len());
    for mut term in terms {
        term.hand_off();
        stopping.push(term);
    }
    for term in stopping {
        term.stop().await;
    }
}
