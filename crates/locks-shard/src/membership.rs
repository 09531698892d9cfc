//! One membership of a shard group: from a granted membership permit until the permit is
//! lost, the caller shuts down, or this member's renewal is overdue, ticking the
//! assignment and renewing the member's liveness meanwhile; and the two ways a member
//! lets go of the terms it runs (handed over, or dropped at once).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use locks_port::{DistributedLock, LostSignal, PermitGuard, Semaphore};
use tokio::time::MissedTickBehavior;

use crate::assignment::{Assignment, View};
use crate::renewal::{Renewals, SelfStop};
use crate::task::{Owned, Running};
use crate::terms::ShardTerms;

/// A membership's settings: the assignment it ticks, how often, and the member's renewal
/// expiry.
#[derive(Debug)]
pub(crate) struct Membership<'a, M, T> {
    pub(crate) assignment: Assignment<'a, M, T>,
    pub(crate) tick: Duration,
    /// How long a member that joined again waits for the members it saw before.
    pub(crate) rejoin_wait: Duration,
    /// The member's renewal deadline (renewals on), carried from one membership to the
    /// next.
    pub(crate) self_stop: Option<&'a SelfStop>,
}

impl<M, T> Membership<'_, M, T>
where
    M: DistributedLock + Semaphore,
    M::Guard: 'static,
    T: ShardTerms + Clone + 'static,
{
    /// One membership: ticks until the membership permit is lost, `shutdown` is ready,
    /// or this member's renewal is overdue. `running` may hold terms kept from the
    /// previous membership: they go on, and are re-recorded under the new slot.
    pub(crate) async fn hold<P, F, Fut>(
        &self,
        permit: &P,
        running: &mut BTreeMap<usize, Running>,
        task: &Arc<F>,
        view: &mut View,
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
        let mut renewals = match (self.self_stop, holder_id.clone()) {
            (Some(deadline), Some(holder)) => Some(Renewals::start(
                self.assignment.terms.clone(),
                self.assignment.group.name().to_owned(),
                slot,
                holder,
                deadline.clone(),
            )),
            _ => None,
        };
        let overdue = overdue(self.self_stop.filter(|_| renewals.is_some()));
        view.joined(self.rejoin_wait);
        let ticking = async {
            // Listed in the roster before the first tick, so that this member's first
            // read finds itself and the others' next ones find it: by its first
            // renewal, which writes its row, when it renews (one write, not two).
            match renewals.as_mut() {
                Some(renewals) => renewals.first_tried().await,
                None => self.assignment.enter(slot, holder_id.as_deref()).await,
            }
            if view.fresh() {
                self.assignment.expect_fleet(view, self.rejoin_wait).await;
            }
            // A tick every period from the last one's start (not a period after its
            // work), and at once when one of this member's terms lost its lock.
            let mut ticks = tokio::time::interval(self.tick);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                self.assignment
                    .tick(slot, holder_id.as_deref(), running, task, view)
                    .await;
                tokio::select! {
                    biased;
                    () = self.assignment.told.lost.notified() => {}
                    _ = ticks.tick() => {}
                }
            }
        };
        tokio::select! {
            biased;
            reason = lost.clone() => {
                tracing::warn!(reason = reason.as_str(),
                    "shard group membership lost; joining again, keeping the shards whose \
                     locks are held");
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

/// Ready when `deadline` is overdue; never without one.
pub(crate) async fn overdue(deadline: Option<&SelfStop>) {
    match deadline {
        Some(deadline) => deadline.overdue().await,
        None => std::future::pending().await,
    }
}

/// Hands every term over at once and waits until each released its lock.
pub(crate) async fn stop_all(running: &mut BTreeMap<usize, Running>) {
    let mut stopping = Vec::with_capacity(running.len());
    for (_, mut term) in std::mem::take(running) {
        term.hand_off();
        stopping.push(term);
    }
    for term in stopping {
        term.stop().await;
    }
}

/// Drops every term's task at once (no drain, the terms not ended: the others may end
/// this member's sessions soon) and waits until each lock's guard is dropped.
pub(crate) async fn abort_all(running: &mut BTreeMap<usize, Running>) {
    for (_, term) in std::mem::take(running) {
        term.abort().await;
    }
}
