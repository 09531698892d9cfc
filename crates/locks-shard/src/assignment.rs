//! Assignment: on each tick of a membership, a member reads the member list, computes its
//! share, and sheds the shards above it or takes free ones up to it (beginning a term
//! and starting its task for each shard it takes).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use locks_port::{
    DistributedLock, LockAcquisitionError, LockGuard, LostSignal, PermitHolder, Semaphore,
};
use opentelemetry::KeyValue;

use crate::assign::{
    expected_from_terms, held_by_listed, members_of, target_share, to_shed, to_try,
};
use crate::group::ShardGroup;
use crate::metrics::Instruments;
use crate::task::{Owned, Running, TermPlan, Told, spawn};
use crate::terms::{ShardTerms, held_members};

/// How far off a wait too long for the clock ends: in effect, never (as tokio's own
/// sleeps read such a duration).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// What a member's ticks remember from one tick, and one membership, to the next.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// The member list of the last tick that listed this member.
    seen: Vec<u32>,
    /// When the member list last changed, until this member settled (the rebalance
    /// duration).
    changed_at: Option<Instant>,
    /// After a join: how many members are expected (the last membership's, or for a
    /// fresh member the holders of the group's terms that did not end), and until when
    /// this member takes free shards only up to its share among that many (`None`: a
    /// wait too long for the clock, until they are back).
    expect: Option<(usize, Option<Instant>)>,
}

impl View {
    /// A new membership begins: if an earlier one saw other members, expect them back
    /// for `wait`.
    pub(crate) fn joined(&mut self, wait: Duration) {
        self.expect_back(self.seen.len(), wait);
    }

    /// Whether this member has seen no member list yet (a process's first membership):
    /// what it expects comes from the term store ([`Assignment::expect_fleet`]).
    pub(crate) fn fresh(&self) -> bool {
        self.seen.is_empty()
    }

    /// Expects `expected` members (this one among them) for `wait`; nothing to wait
    /// for when that is this member alone or the wait is zero.
    fn expect_back(&mut self, expected: usize, wait: Duration) {
        self.expect =
            (expected > 1 && !wait.is_zero()).then(|| (expected, Instant::now().checked_add(wait)));
    }

    /// How many shards this member may own by taking free ones, now that the member list
    /// is `members` long: `None` for no limit but the share; else the largest share among
    /// the members expected back, until they are back or the wait ran out.
    fn take_cap(&mut self, shards: usize, members: usize) -> Option<usize> {
        let (expected, until) = self.expect?;
        if members >= expected || until.is_some_and(|until| Instant::now() >= until) {
            self.expect = None;
            return None;
        }
        Some(shards.div_ceil(expected))
    }
}

/// The members a tick read: the slots standing for the members, the one standing for
/// this member, and the roster as read (slots with holder ids).
#[derive(Debug, Clone, Copy)]
struct Listed<'a> {
    members: &'a [u32],
    me: u32,
    held: &'a [PermitHolder],
}

/// What a member's ticks work with: its manager, term store and group, and how its terms
/// run. Borrowed from the member for one membership.
#[derive(Debug)]
pub(crate) struct Assignment<'a, M, T> {
    pub(crate) locks: &'a M,
    pub(crate) terms: &'a T,
    pub(crate) group: &'a ShardGroup,
    pub(crate) drain_grace: Duration,
    pub(crate) takeover_delay: Duration,
    /// The member's renewal expiry (renewals on), written with its roster entry.
    pub(crate) renewal: Option<Duration>,
    pub(crate) instruments: &'a Instruments,
    pub(crate) attributes: &'a [KeyValue],
    /// Told by a term's tokio task when the term lost its lock (and let it go), so that
    /// the member ticks at once: a shard it lost and may own again is taken back without
    /// waiting for the next tick.
    pub(crate) told: &'a Arc<Told>,
}

impl<M, T> Assignment<'_, M, T>
where
    M: DistributedLock + Semaphore,
    M::Guard: 'static,
    T: ShardTerms + Clone + 'static,
{
    /// One tick: reads the members, and sheds or takes shards.
    pub(crate) async fn tick<F, Fut>(
        &self,
        slot: u32,
        holder_id: Option<&str>,
        running: &mut BTreeMap<usize, Running>,
        task: &Arc<F>,
        view: &mut View,
    ) where
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        tracing::trace!(slot, "tick");
        // The shards whose locks this member just lost are tried first: most often
        // still its share, and free.
        let retake: Vec<usize> = running
            .iter()
            .filter(|(_, term)| term.lost_lock())
            .map(|(&shard, _)| shard)
            .collect();
        running.retain(|_, term| !term.is_finished());
        self.rejoined(slot, running).await;
        let members_name = self.group.members_name();
        let (mut held, from_roster) =
            match held_members(self.locks, self.terms, self.group.name(), &members_name).await {
                Ok(read) => read,
                Err(error) => {
                    tracing::warn!(error = %error, "reading the shard group's members failed");
                    return;
                }
            };
        tracing::trace!(members = held.len(), owned = running.len(), "members read");
        if from_roster {
            self.listed(slot, holder_id, &mut held).await;
        }
        let (members, me) = members_of(
            held.iter().map(|h| (h.slot, h.holder_id.as_deref())),
            slot,
            holder_id,
        );
        // A list without this member (its membership lost, and not yet told) is not
        // remembered: what it expects back after joining again is the fleet it was in.
        let Some(share) = target_share(self.group.len(), &members, me) else {
            return;
        };
        if members != view.seen {
            view.seen.clone_from(&members);
            view.changed_at = Some(Instant::now());
        }
        let take_up_to = view
            .take_cap(self.group.len(), members.len())
            .map_or(share, |cap| cap.min(share));
        if tracing::enabled!(tracing::Level::TRACE) {
            let stopping = running.values().filter(|term| term.is_stopping()).count();
            tracing::trace!(
                members = members.len(),
                share,
                take_up_to,
                active = running.len() - stopping,
                stopping,
                "share"
            );
        }
        let listed = Listed {
            members: &members,
            me,
            held: &held,
        };
        self.rebalance(
            slot,
            holder_id,
            (share, take_up_to),
            (&retake, listed),
            running,
            task,
        )
        .await;
        let settled = running.len() == share && running.values().all(|term| !term.is_stopping());
        if settled && let Some(at) = view.changed_at.take() {
            self.instruments
                .rebalance
                .record(at.elapsed().as_secs_f64(), self.attributes);
        }
    }

    /// Makes sure the roster `held` lists this member's `slot` under its own holder id.
    /// This member holds its slot (its membership is not lost), so a roster that does
    /// not list the slot (its entry failed, or was deleted), or lists it under another
    /// holder id, is out of date: a write of that other member's row for the slot it
    /// held before, which reached the server late (a renewal sent before a network cut
    /// and delivered after it, once this member had taken the slot and entered). Such a
    /// row made every member count one member too few: one holder id under two slots,
    /// and this member counted as that one. It enters again, and counts itself under
    /// its slot meanwhile. (Read from the lock table, a member not listed has lost its
    /// permit: it waits for its membership's end, as before the roster.)
    async fn listed(&self, slot: u32, holder_id: Option<&str>, held: &mut Vec<PermitHolder>) {
        let me = || PermitHolder::new(slot, holder_id.map(str::to_owned), None);
        match held.iter_mut().find(|h| h.slot == slot) {
            Some(listed) if listed.holder_id.as_deref() == holder_id => return,
            Some(listed) => {
                tracing::debug!(
                    slot,
                    listed = listed.holder_id.as_deref(),
                    "the roster names another member under this member's slot; entering again"
                );
                *listed = me();
            }
            None => held.push(me()),
        }
        self.enter(slot, holder_id).await;
    }

    /// Enters this member in the group's roster ([`ShardTerms::enter`]), with its
    /// renewal expiry when it renews. A failure is logged; the next tick that does not
    /// find it listed enters again.
    pub(crate) async fn enter(&self, slot: u32, holder_id: Option<&str>) {
        let expiry = self.renewal.filter(|_| holder_id.is_some());
        if let Err(error) = self
            .terms
            .enter(self.group.name(), slot, holder_id, expiry)
            .await
        {
            tracing::warn!(error = %error, "entering the shard group's roster failed");
        }
    }

    /// A fresh member (no member list seen yet) expects, for `wait`, as many members
    /// as the group's terms that did not end have distinct holders
    /// ([`expected_from_terms`]): after an outage in which its process was started
    /// again, the fleet it finds there is most likely coming back, and it takes free
    /// shards only up to its share among them, as a rejoining member does. One read of
    /// the term store; if it fails, the member expects nobody.
    pub(crate) async fn expect_fleet(&self, view: &mut View, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        match self.terms.terms(self.group.name()).await {
            Ok(terms) => view.expect_back(expected_from_terms(&terms), wait),
            Err(error) => {
                tracing::warn!(error = %error, "reading the shard terms at a first join failed");
            }
        }
    }

    /// Records in the term store the terms this member kept through a new membership
    /// under its new `slot`, so that observers name their owner again (see
    /// [`ShardTerms::rejoined`]). A failure is tried again on the next tick. A term the
    /// store says was superseded while this member was away (its lock lost, not told
    /// yet) is dropped at once, its task with it, and no longer counts as owned.
    async fn rejoined(&self, slot: u32, running: &mut BTreeMap<usize, Running>) {
        let mut superseded = Vec::new();
        for (&index, term) in running.iter_mut() {
            let (shard, token, recorded) = term.term();
            if recorded == slot {
                continue;
            }
            match self
                .terms
                .rejoined(self.group.name(), shard, token, slot)
                .await
            {
                Ok(true) => term.rejoined(slot),
                Ok(false) => superseded.push(index),
                Err(error) => {
                    tracing::warn!(error = %error, "recording a kept shard's new member slot failed");
                    break;
                }
            }
        }
        for index in superseded {
            if let Some(term) = running.remove(&index) {
                let (shard, token, _) = term.term();
                tracing::warn!(
                    shard,
                    token,
                    "a newer term of the shard began while this member was away; its task was dropped"
                );
                term.abort().await;
            }
        }
    }

    /// Sheds the shards above `share`, or takes free ones up to `take_up_to` (the share,
    /// or less while members are expected back), trying first the shards in `retake`
    /// (whose locks this member just lost), then those the term store says no other
    /// listed member holds ([`to_try`]).
    async fn rebalance<F, Fut>(
        &self,
        slot: u32,
        holder_id: Option<&str>,
        (share, take_up_to): (usize, usize),
        (retake, listed): (&[usize], Listed<'_>),
        running: &mut BTreeMap<usize, Running>,
        task: &Arc<F>,
    ) where
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let active: Vec<(usize, time::OffsetDateTime)> = running
            .iter()
            .filter(|(_, term)| !term.is_stopping())
            .map(|(&shard, term)| (shard, term.since()))
            .collect();
        if active.len() > share {
            for shard in to_shed(self.group, slot, &active, share) {
                if let Some(term) = running.get_mut(&shard) {
                    term.hand_off();
                }
            }
            return;
        }
        let mut wanted = take_up_to.saturating_sub(active.len());
        if wanted == 0 {
            return;
        }
        let owned: Vec<usize> = running.keys().copied().collect();
        // Its own lost shards are tried first, without a read: a retake after a
        // terminated session is not held up by the term store.
        let others: Vec<u32> = listed
            .members
            .iter()
            .copied()
            .filter(|&m| m != listed.me)
            .collect();
        let busy = if retake.len() >= wanted {
            BTreeSet::new()
        } else {
            self.busy(listed.held).await
        };
        let mut candidates = retake.iter().copied().chain(
            to_try(self.group, slot, &owned, &others, |shard| {
                busy.contains(&shard)
            })
            .into_iter()
            .filter(|shard| !retake.contains(shard)),
        );
        // As many tries at once as shards are still wanted, in that order (after a
        // member died, its shards are taken in one round trip, not one after the
        // other), and the next candidate tried as soon as a try finds its shard busy:
        // a slow try (a connection being opened on a loaded server) holds up only its
        // own shard, not the others of its round.
        let mut trying = FuturesUnordered::new();
        let mut failed = false;
        loop {
            while !failed && trying.len() < wanted {
                let Some(shard) = candidates.next() else {
                    break;
                };
                trying.push(async move { (shard, self.take(slot, holder_id, shard, task).await) });
            }
            let Some((shard, outcome)) = trying.next().await else {
                break;
            };
            match outcome {
                Ok(Some(term)) => {
                    running.insert(shard, term);
                    wanted -= 1;
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(error = %error, "taking a shard failed");
                    failed = true;
                }
            }
        }
    }

    /// The shards whose latest term says a listed member most likely holds them
    /// ([`held_by_listed`]): one read of the term store, made only when this member has
    /// shards to take. If it fails, none: every shard is tried in score order.
    async fn busy(&self, held: &[PermitHolder]) -> BTreeSet<usize> {
        match self.terms.terms(self.group.name()).await {
            Ok(terms) => terms
                .iter()
                .filter(|term| held_by_listed(term, held))
                .filter_map(|term| self.group.index_of(&term.shard))
                .collect(),
            Err(error) => {
                tracing::debug!(error = %error, "reading the shard terms before taking failed");
                BTreeSet::new()
            }
        }
    }

    /// Takes `shard` if its lock is free: begins a term and starts its task.
    async fn take<F, Fut>(
        &self,
        slot: u32,
        holder_id: Option<&str>,
        shard: usize,
        task: &Arc<F>,
    ) -> Result<Option<Running>, LockAcquisitionError>
    where
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = self.group.shard(shard).unwrap_or_default();
        let trying = Instant::now();
        let Some(guard) = self.locks.try_acquire(&self.group.shard_key(name)).await? else {
            tracing::trace!(shard = name, took = ?trying.elapsed(), "shard busy");
            return Ok(None);
        };
        // The previous owner's session ended before this grant: its loss notice is
        // counted from here, not from after the term's begin.
        let taken_at = tokio::time::Instant::now();
        tracing::trace!(shard = name, took = ?trying.elapsed(), "shard lock taken");
        // What the next owner waits if this term does not end: the manager's bound, or
        // this member's takeover delay when the manager does not know (the store keeps
        // the longer of it and an unended previous term's).
        let notice = Some(
            self.locks
                .loss_notice_bound()
                .unwrap_or(self.takeover_delay),
        );
        let begun = match self
            .terms
            .begin_with_notice(self.group.name(), name, slot, holder_id, notice)
            .await
        {
            Ok(begun) => begun,
            Err(error) => {
                guard.release().await;
                return Err(error);
            }
        };
        self.instruments.terms.add(1, self.attributes);
        tracing::trace!(
            shard = name,
            token = begun.term.token,
            previous_ended = begun.previous_ended,
            "term begun"
        );
        let owned = Owned {
            group: self.group.name().into(),
            shard: name.into(),
            index: shard,
            token: begun.term.token,
            since: begun.term.since,
        };
        let plan = TermPlan {
            owned,
            slot,
            terms: self.terms.clone(),
            // The previous owner did not end its term: it may not have stopped yet. Its
            // own manager's bound on how soon it is told says how long to wait, from
            // when this member was granted the lock (the owner's session had ended by
            // then).
            // A wait too long for the clock (up to `Duration::MAX`, which a member may
            // set as its takeover delay, and the memory store records as its notice) is
            // as good as endless.
            wait_until: (!begun.previous_ended).then(|| {
                let wait = begun.previous_loss_notice.unwrap_or(self.takeover_delay);
                taken_at
                    .checked_add(wait)
                    .unwrap_or_else(|| taken_at + FAR_FUTURE)
            }),
            drain_grace: self.drain_grace,
            instruments: self.instruments.clone(),
            attributes: self.attributes.to_vec(),
            told: Arc::clone(self.told),
        };
        let task = Arc::clone(task);
        Ok(Some(spawn(guard, plan, move |owned, stop| {
            task(owned, stop)
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejoined_member_takes_only_its_share_among_the_members_it_saw_until_they_are_back() {
        let mut view = View::default();
        view.joined(Duration::from_secs(60));
        assert_eq!(view.take_cap(24, 1), None, "a first join waits for nobody");
        view.seen = vec![1, 2, 3];
        view.joined(Duration::from_secs(60));
        assert_eq!(
            view.take_cap(24, 1),
            Some(8),
            "alone, it takes 8 of 24, not 24"
        );
        assert_eq!(view.take_cap(24, 2), Some(8));
        assert_eq!(
            view.take_cap(24, 3),
            None,
            "all back: no limit but the share"
        );
        assert_eq!(view.take_cap(24, 1), None, "and it stays lifted");
        view.joined(Duration::ZERO);
        assert_eq!(view.take_cap(24, 1), None, "a zero wait turns it off");
        view.joined(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(view.take_cap(24, 1), None, "the wait ran out");
    }

    #[tokio::test]
    async fn a_fresh_member_expects_the_fleet_it_finds_in_the_term_table() {
        use locks_memory::InMemoryLockManager;

        use crate::terms::{MemoryTerms, ShardTerms};

        let group = ShardGroup::new("g", (0..24).map(|i| format!("s{i}"))).expect("a group");
        let terms = MemoryTerms::new();
        for (i, holder) in ["a", "a", "b", "c", "c"].into_iter().enumerate() {
            terms
                .begin("g", &format!("s{i}"), 0, Some(holder))
                .await
                .expect("begun");
        }
        // c left cleanly: its terms ended.
        terms.end("g", "s3", 1).await.expect("ended");
        terms.end("g", "s4", 1).await.expect("ended");
        let locks = InMemoryLockManager::default();
        let instruments = Instruments::global();
        let told = Arc::new(Told::default());
        let assignment = Assignment {
            locks: &locks,
            terms: &terms,
            group: &group,
            drain_grace: Duration::ZERO,
            takeover_delay: Duration::ZERO,
            renewal: None,
            instruments: &instruments,
            attributes: &[],
            told: &told,
        };
        let mut view = View::default();
        assert!(view.fresh());
        assignment.expect_fleet(&mut view, Duration::ZERO).await;
        assert_eq!(view.take_cap(24, 1), None, "a zero wait turns it off");
        assignment
            .expect_fleet(&mut view, Duration::from_secs(60))
            .await;
        assert_eq!(
            view.take_cap(24, 1),
            Some(12),
            "a and b left terms behind: alone, it takes 12 of 24, not 24"
        );
        assert_eq!(
            view.take_cap(24, 2),
            None,
            "both back: no limit but the share"
        );
        let empty = MemoryTerms::new();
        let assignment = Assignment {
            terms: &empty,
            ..assignment
        };
        assignment
            .expect_fleet(&mut view, Duration::from_secs(60))
            .await;
        assert_eq!(
            view.take_cap(24, 1),
            None,
            "a group's first start waits for nobody"
        );
    }
}
