//! A member of a shard group, its settings and its public API: joins with a permit of
//! the membership semaphore and holds each membership (`membership.rs`), whose ticks take
//! or shed shards until it owns its share (`assignment.rs`).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockAcquisitionError, LostSignal,
    PermitGuard, Semaphore,
};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::assignment::{Assignment, View};
use crate::group::ShardGroup;
use crate::membership::{Left, Membership, abort_all, overdue, stop_all};
use crate::metrics::Instruments;
use crate::observe::{ShardWatch, Shards, owners};
use crate::renewal::{SelfStop, answer_budget};
use crate::task::{DEFAULT_DRAIN_GRACE, DEFAULT_TAKEOVER_DELAY, LettingGo, Owned, Running, Told};
use crate::terms::ShardTerms;

/// How often a member reads the member list and takes or sheds shards.
pub const DEFAULT_TICK: Duration = Duration::from_millis(100);

/// The pause before a member joins again after it lost its membership or failed to join.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);

/// How long a member that joins again after losing its membership waits, at most, for
/// the members it saw before to be back before it takes more free shards than its
/// share among them, and a process's first join for the members its group's term store
/// names (see [`ShardMember::rejoin_wait`]).
pub const DEFAULT_REJOIN_WAIT: Duration = Duration::from_secs(2);

/// How long a member's liveness renewal lasts by default (see
/// [`ShardMember::renewal`]): a member whose process stopped loses its shards within
/// this, plus a fifth of it (the others' renewal period), plus the takeover delay.
pub const DEFAULT_RENEWAL_EXPIRY: Duration = Duration::from_secs(10);

/// The shortest renewal expiry a member runs with (see [`ShardMember::renewal`]): 500 ms.
/// A member renews every fifth of its expiry and stops its own tasks 0.8 of it after its
/// last confirmed renewal was sent, so the answers to two renewals in a row, and the
/// fifth waited between them, must fit in 0.8 of the expiry: each renewal has 0.3 of it
/// to be answered in, 150 ms at this floor. A shorter expiry leaves too little for a
/// loaded server's answer and the runtime's timers, and the member stops itself over and
/// over, its peers perhaps ending its sessions too (its row expired before its next
/// renewal landed). Measured on PostgreSQL on a loaded 2-core machine, where the slowest
/// of 1,000 renewals took 24 ms: a lone member of 24 shards started no task at 1-5 ms (each
/// round stopped before a task could start), 29-37 tasks in 3 s at 20 ms, and at 100 ms
/// (30 ms an answer) still stopped itself in one run of six.
pub const MIN_RENEWAL_EXPIRY: Duration = Duration::from_millis(500);

/// A member of a shard group: runs one task per shard it owns. See the crate's
/// documentation for the contract and an example.
#[derive(Debug)]
pub struct ShardMember<M, T> {
    locks: M,
    terms: T,
    group: ShardGroup,
    tick: Duration,
    backoff: Duration,
    drain_grace: Duration,
    takeover_delay: Duration,
    rejoin_wait: Duration,
    renewal: Option<Duration>,
    instruments: Instruments,
    attributes: Vec<KeyValue>,
}

impl<M, T> ShardMember<M, T>
where
    M: DistributedLock + Semaphore,
    M::Guard: 'static,
    T: ShardTerms + Clone + 'static,
{
    /// A member of `group` on `locks` (a manager, or a reference to one) keeping its
    /// terms in `terms`, with the default tick, back-off, drain grace and takeover delay.
    ///
    /// A member holds one permit of the membership semaphore and one lock per owned
    /// shard: on PostgreSQL, one pool connection each, and one more for its reads.
    pub fn new(locks: M, terms: T, group: ShardGroup) -> Self {
        Self {
            locks,
            terms,
            group,
            tick: DEFAULT_TICK,
            backoff: DEFAULT_BACKOFF,
            drain_grace: DEFAULT_DRAIN_GRACE,
            takeover_delay: DEFAULT_TAKEOVER_DELAY,
            rejoin_wait: DEFAULT_REJOIN_WAIT,
            renewal: Some(DEFAULT_RENEWAL_EXPIRY),
            instruments: Instruments::global(),
            attributes: Vec::new(),
        }
    }

    /// How often the member reads the member list and takes or sheds shards, counted
    /// from one tick's start to the next (a zero tick is read as 1 ms). A member also
    /// ticks at once when one of its terms lost its lock, to take the shard back.
    #[must_use]
    pub fn tick(mut self, tick: Duration) -> Self {
        self.tick = tick.max(Duration::from_millis(1));
        self
    }

    /// The pause before joining again after a lost membership or a failed join.
    #[must_use]
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a task told to stop for a hand-off may go on before its future is
    /// dropped (see [`DEFAULT_DRAIN_GRACE`]). A lost shard's task gets no grace.
    #[must_use]
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
        self
    }

    /// How soon, at worst, this member assumes an owner is told of a loss when its
    /// manager does not say ([`loss_notice_bound`](DistributedLock::loss_notice_bound)
    /// `None`; see [`DEFAULT_TAKEOVER_DELAY`]): what it records in its own terms for the
    /// next owner to wait then, and how long it waits before starting a shard whose
    /// previous term was not ended and recorded nothing (the store or the owner's version
    /// keeps none), counted from the grant of the shard's lock. It must exceed the time
    /// an owner needs to notice a loss (its manager's health-check interval), and the
    /// members of a fleet should agree on it; zero gives that order up. A delay too long
    /// for the clock (up to `Duration::MAX`) is waited as an endless one.
    #[must_use]
    pub fn takeover_delay(mut self, delay: Duration) -> Self {
        self.takeover_delay = delay;
        self
    }

    /// How long a member that joins again after losing its membership (a server
    /// restart, a cut network: the others most likely lost theirs too) waits, at most,
    /// for as many members as its last membership saw: until then it takes free shards
    /// only up to its share among that many ([`DEFAULT_REJOIN_WAIT`]). Without it the
    /// first member back takes every free shard and hands most of them over again as
    /// the others return, a move per shard. Kafka's `group.initial.rebalance.delay.ms`
    /// waits so for a group's start. The shards of a member that does not come back are
    /// taken once the wait ran out; zero turns the wait off, and a wait too long for the
    /// clock (up to `Duration::MAX`) lasts until they are back.
    ///
    /// A process's first join expects, for the same wait, the fleet the term store
    /// names: as many members as the group's latest terms that did not end have distinct
    /// holder ids (a clean leave ends its terms; a crash or an outage leaves them), this
    /// member standing in for one of them whether or not its holder id is among them (a
    /// process started again has a new one). So a member process started again during
    /// an outage takes only its share among the fleet coming back. The cost: after a
    /// whole fleet crashed, a lone process started again waits up to this long before it
    /// takes every shard; and processes started at once may expect more members than
    /// come (the first one's new terms counted beside the old ones), waiting the whole wait.
    #[must_use]
    pub fn rejoin_wait(mut self, wait: Duration) -> Self {
        self.rejoin_wait = wait;
        self
    }

    /// How long each renewal of this member's liveness lasts ([`DEFAULT_RENEWAL_EXPIRY`]);
    /// `None` turns renewals off. At least [`MIN_RENEWAL_EXPIRY`] (500 ms): a shorter one,
    /// zero among them, makes [`run`](Self::run) fail at once with a
    /// [`Configuration`](AcquisitionErrorKind::Configuration) error, as the renewals could
    /// not keep up with it. A member renews every fifth of it, through
    /// [`ShardTerms::renew`], which also ends the lock sessions of members whose renewal
    /// expired (on PostgreSQL, with `pg_terminate_backend`): a member whose process
    /// stopped (`SIGSTOP`, a frozen VM) loses its shards within about 1.2 times the
    /// expiry plus the takeover delay, instead of for as long as it stays stopped. A
    /// member whose renewals fail (cut off from the server) drops its tasks, without a
    /// drain, 0.8 times the expiry after its last confirmed renewal was sent, before the
    /// others may end its sessions, and joins again. It needs a holder id on the manager (the sessions are found by it), unique per
    /// process; a member without one neither renews nor can be ended so.
    #[must_use]
    pub fn renewal(mut self, expiry: Option<Duration>) -> Self {
        self.renewal = expiry;
        self
    }

    /// Records the member's instruments on `meter` instead of the global provider's.
    #[must_use]
    pub fn meter(mut self, meter: &Meter) -> Self {
        self.instruments = Instruments::on(meter);
        self
    }

    /// Adds the group's name to the instruments as `shard.group` (off by default: names
    /// are key text).
    #[must_use]
    pub fn metrics_name(mut self, on: bool) -> Self {
        self.attributes = if on {
            vec![KeyValue::new("shard.group", self.group.name().to_owned())]
        } else {
            Vec::new()
        };
        self
    }

    /// The group.
    #[must_use]
    pub fn group(&self) -> &ShardGroup {
        &self.group
    }

    /// Who owns which shard now, as any process sees it (see [`Shards`]).
    ///
    /// # Errors
    /// A backend failure of the member list or of the term store.
    pub async fn owners(&self) -> Result<Shards, LockAcquisitionError> {
        owners(&self.locks, &self.terms, &self.group).await
    }

    /// Watches who owns which shard: each change, read every tick of the watch.
    #[must_use]
    pub fn watch(&self) -> ShardWatch<'_, M, T> {
        ShardWatch::new(&self.locks, &self.terms, &self.group)
    }

    /// Joins the group and runs `task` for each shard this member owns, until an error
    /// that retrying cannot mend.
    ///
    /// `task(owned, stop)` is called when a term's task starts; its future is dropped
    /// when the shard's lock is lost (at once), or, when the shard moves to another
    /// member (this member's share shrank), `stop` fires with
    /// [`LostReason::Released`](locks_port::LostReason::Released) and the future is
    /// dropped when it finishes or when the drain grace ran out. The shard's lock is
    /// released only after the future is dropped, so the next owner's task starts after
    /// this one stopped. A task that returns ends its term; the shard is taken again on
    /// a later tick (by this member or another) under a new token.
    ///
    /// Each term runs on a tokio task of its own.
    ///
    /// # Errors
    /// A [`Configuration`](AcquisitionErrorKind::Configuration) error at once, before the
    /// member joins, for a [`renewal`](Self::renewal) expiry below [`MIN_RENEWAL_EXPIRY`];
    /// once it has joined and before any task runs, for a manager's holder id with a NUL
    /// (no term store can keep it: PostgreSQL's `text` cannot hold one), the member
    /// leaving its place;
    /// one when other members use another shard list, or when the manager refuses the
    /// join for a reason retrying cannot fix (on PostgreSQL: a missing grant, or a
    /// read-only standby behind a single-host URL); or
    /// [`InvalidKey`](AcquisitionErrorKind::InvalidKey). Other
    /// failures (the backend unreachable) are retried after the back-off: behind a
    /// failover, give the manager a multi-host URL with `target_session_attrs=read-write`,
    /// whose failures while the new primary is promoted are `Unreachable`, and retried. A lost
    /// membership permit is not an end: the member joins again at once and keeps the
    /// shards whose locks it still holds (their tasks go on, under the same terms); a
    /// shard whose lock went with it has its task dropped as any lost shard's. A term whose
    /// end could not be written when its task stopped (the term store unreachable) is
    /// ended before the member joins again, and it joins only once none is left (a
    /// `Configuration` error of that end ends `run` as a refused join does).
    ///
    /// # Cancel safety
    /// Dropping the future aborts every term's tokio task: each task's future is
    /// dropped, then its shard's lock released (by the guard's drop), then the
    /// membership permit. Terms dropped so are not ended, so their next owners wait the
    /// takeover delay.
    pub async fn run<F, Fut>(&self, task: F) -> Result<Infallible, LockAcquisitionError>
    where
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.run_until(task, std::future::pending::<()>()).await?;
        unreachable!("run_until returns Ok only once its shutdown future is ready")
    }

    /// As [`run`](Self::run), and leaves the group cleanly once `shutdown` is ready:
    /// every task is told to stop (its signal fires with
    /// [`LostReason::Released`](locks_port::LostReason::Released)), drained within the
    /// grace, its term ended and its lock released, and the membership permit last, so
    /// the other members take the shards over at once, without a takeover delay. A term
    /// still in its own takeover delay (its task not started) is ended, and its lock
    /// released, once that delay ran out, so a leave may take up to that delay longer.
    ///
    /// # Errors
    /// As [`run`](Self::run).
    ///
    /// # Cancel safety
    /// As [`run`](Self::run): dropping the future is an unclean leave.
    pub async fn run_until<F, Fut>(
        &self,
        task: F,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), LockAcquisitionError>
    where
        F: Fn(Owned, LostSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.check_renewal()?;
        let task = Arc::new(task);
        let members = self.group.members_name();
        let permits = self.group.member_permits();
        let mut shutdown = pin!(shutdown);
        let self_stop = self.renewal.map(SelfStop::new);
        // Whether the last membership renewed (a holder id): only then does the
        // self-stop deadline bind the terms kept through a rejoin.
        let mut renewing = false;
        // The terms running, kept from one membership to the next when only the
        // membership was lost (their locks still held).
        let mut running: BTreeMap<usize, Running> = BTreeMap::new();
        // The member list as the last tick saw it, kept from one membership to the next.
        let mut view = View::default();
        // Told when a term lost its lock, so that the next tick comes at once.
        let told = Arc::new(Told::default());
        loop {
            running.retain(|_, term| !term.is_finished());
            if running.is_empty()
                && let Some(deadline) = &self_stop
            {
                deadline.restart();
            }
            let bound = self_stop.as_ref().filter(|_| renewing);
            // Terms whose end could not be written are ended first: joined again, this
            // member's slot and holder would name them to observers as still running.
            // Until they are, it does not join (nor could it begin a term without the
            // term store).
            // A term whose lock went with the membership may still be writing its end:
            // once it has, it is ended or left unended.
            let letting_go: Vec<_> = running.values().filter_map(Running::letting_go).collect();
            let ending = async {
                while !letting_go.iter().all(LettingGo::done) {
                    tokio::time::sleep(self.tick.min(Duration::from_millis(5))).await;
                }
                told.end_unended(&self.terms).await
            };
            let within = tokio::time::timeout(self.backoff.max(self.tick), ending);
            let Some(ended) = keeping(&mut running, within, shutdown.as_mut(), bound).await else {
                return Ok(());
            };
            let unended = match ended {
                Ok(Ok(())) => None,
                Ok(Err(error)) if error.kind() == AcquisitionErrorKind::Configuration => {
                    // As a refused join: retrying will not end them.
                    stop_all(&mut running).await;
                    return Err(error);
                }
                Ok(Err(error)) => Some(error.to_string()),
                Err(_) => Some("no answer within the try".to_owned()),
            };
            if let Some(why) = unended {
                tracing::warn!(
                    left = told.unended_count(),
                    error = why,
                    "terms this member could not end are still not ended; it joins again once \
                     they are (trying again after the back-off)"
                );
                if !backed_off(&mut running, self.backoff, shutdown.as_mut(), bound).await {
                    return Ok(());
                }
                continue;
            }
            let join = self
                .locks
                .acquire_permit(&members, permits, AcquireOptions::new());
            let Some(joined) = keeping(&mut running, join, shutdown.as_mut(), bound).await else {
                return Ok(());
            };
            let permit = match joined {
                Ok(permit) => permit,
                Err(error) => {
                    let kind = error.kind();
                    if matches!(
                        kind,
                        AcquisitionErrorKind::Configuration | AcquisitionErrorKind::InvalidKey
                    ) {
                        stop_all(&mut running).await;
                        return Err(if kind == AcquisitionErrorKind::Configuration {
                            self.refusal(error).await
                        } else {
                            error
                        });
                    }
                    tracing::warn!(error = %error, "joining the shard group failed; retrying");
                    if !backed_off(&mut running, self.backoff, shutdown.as_mut(), bound).await {
                        return Ok(());
                    }
                    continue;
                }
            };
            if let Err(refused) = check_holder_id(self.group.name(), permit.info().holder_id()) {
                // As a refused join: every store keeps the holder id in its terms.
                stop_all(&mut running).await;
                permit.release().await;
                return Err(refused);
            }
            renewing = self_stop.is_some() && permit.info().holder_id().is_some();
            let left = self
                .membership(self_stop.as_ref(), &told)
                .hold(&permit, &mut running, &task, &mut view, shutdown.as_mut())
                .await;
            match left {
                Left::Lost => {
                    // Only the membership's session may have ended: the terms whose
                    // locks are held go on, and this member joins again at once.
                    tracing::warn!(
                        kept = running.len(),
                        "joining the shard group again, keeping the running shards"
                    );
                    permit.release().await;
                }
                Left::Overdue => {
                    // The others may end this member's sessions soon: no drain.
                    abort_all(&mut running).await;
                    permit.release().await;
                    tokio::time::sleep(self.backoff).await;
                }
                Left::Shutdown => {
                    // Leaving: every task drains and every lock is released before the
                    // permit.
                    stop_all(&mut running).await;
                    permit.release().await;
                    return Ok(());
                }
            }
        }
    }

    /// Refuses a renewal expiry below [`MIN_RENEWAL_EXPIRY`].
    fn check_renewal(&self) -> Result<(), LockAcquisitionError> {
        match self.renewal {
            Some(expiry) if expiry < MIN_RENEWAL_EXPIRY => Err(LockAcquisitionError::new(
                self.group.name(),
                AcquisitionErrorKind::Configuration,
                format!(
                    "a shard member's renewal expiry of {expiry:?} is too short: it renews \
                     every fifth of it and stops its own tasks 0.8 of it after its last \
                     confirmed renewal, so each renewal would have {:?} to be answered in; \
                     the expiry must be at least {MIN_RENEWAL_EXPIRY:?} \
                     (locks_shard::MIN_RENEWAL_EXPIRY), or None to turn renewals off",
                    answer_budget(expiry)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The settings of one membership, borrowed from this member.
    fn membership<'a>(
        &'a self,
        self_stop: Option<&'a SelfStop>,
        told: &'a Arc<Told>,
    ) -> Membership<'a, M, T> {
        Membership {
            assignment: Assignment {
                locks: &self.locks,
                terms: &self.terms,
                group: &self.group,
                drain_grace: self.drain_grace,
                takeover_delay: self.takeover_delay,
                renewal: self.renewal,
                instruments: &self.instruments,
                attributes: &self.attributes,
                told,
            },
            tick: self.tick,
            rejoin_wait: self.rejoin_wait,
            self_stop,
        }
    }

    /// Why a join was refused: a disagreement on the shard list when the permits in use
    /// differ from this member's, else the semaphore's own words.
    async fn refusal(&self, error: LockAcquisitionError) -> LockAcquisitionError {
        match self.locks.permit_holders(&self.group.members_name()).await {
            Ok(holders) => {
                let others: Vec<u32> = holders
                    .permits
                    .into_iter()
                    .filter(|&p| p != self.group.member_permits())
                    .collect();
                if others.is_empty() {
                    error
                } else {
                    self.group.disagreement(&others).with_source(error)
                }
            }
            Err(_) => error,
        }
    }
}

/// Waits out `backoff` while running the terms kept from a lost membership, as
/// [`keeping`] does: `false` once `shutdown` is ready.
async fn backed_off(
    running: &mut BTreeMap<usize, Running>,
    backoff: Duration,
    shutdown: Pin<&mut impl Future<Output = ()>>,
    deadline: Option<&SelfStop>,
) -> bool {
    keeping(running, tokio::time::sleep(backoff), shutdown, deadline)
        .await
        .is_some()
}

/// Waits for `until` while running the terms kept from a lost membership: `None` once
/// `shutdown` is ready (every kept term handed over first); past the self-stop
/// `deadline` the kept terms are dropped at once and the wait goes on.
async fn keeping<O>(
    running: &mut BTreeMap<usize, Running>,
    until: impl Future<Output = O>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    deadline: Option<&SelfStop>,
) -> Option<O> {
    let mut until = pin!(until);
    loop {
        let armed = deadline.filter(|_| !running.is_empty());
        tokio::select! {
            biased;
            () = shutdown.as_mut() => {
                stop_all(running).await;
                return None;
            }
            () = overdue(armed) => {
                tracing::warn!(
                    "this member's renewal is overdue while it joins again; stopping every \
                     task before the other members may end its sessions"
                );
                abort_all(running).await;
            }
            out = &mut until => return Some(out),
        }
    }
}

/// Refuses a holder id no term store can keep: one with a NUL, which PostgreSQL's `text`
/// cannot hold (the terms and the roster keep the whole id). Its length is not bounded:
/// no store indexes it.
fn check_holder_id(group: &str, holder_id: Option<&str>) -> Result<(), LockAcquisitionError> {
    holder_id.map_or(Ok(()), |holder_id| {
        locks_port::check_stored_text(group, "a shard member's holder id", holder_id, usize::MAX)
    })
}
