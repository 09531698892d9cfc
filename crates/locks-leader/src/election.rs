//! The campaign: a semaphore of one permit, a takeover delay, a second "leading" permit
//! held only while the task runs, and the term proclaimed on the board meanwhile.

use std::future::Future;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, LeaderBoard, LockAcquisitionError, LossNotifier,
    LostReason, LostSignal, PermitGuard, Semaphore, check_board_name, check_published_value,
};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use time::OffsetDateTime;
use tokio::sync::watch;

use crate::metrics::Instruments;
use crate::observe::{Leader, LeaderWatch, NoBoard, leading_name, who_leads};

/// Where this process stands, as [`LeaderElection::subscribe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Leadership {
    /// Not leading: campaigning, backing off, or not started.
    Following,
    /// Leading since `since`: the task runs.
    #[non_exhaustive]
    Leading {
        /// When the task was handed over (this process's clock).
        since: OffsetDateTime,
        /// The grant's fencing token, when the manager hands them out.
        fencing_token: Option<i64>,
        /// The term's number on the board, when the election has one.
        term: Option<u64>,
    },
}

impl Leadership {
    /// Whether this process leads.
    #[must_use]
    pub fn is_leading(&self) -> bool {
        matches!(self, Self::Leading { .. })
    }
}

/// How one term ended.
#[derive(Debug)]
#[non_exhaustive]
pub enum TermEnd<T> {
    /// The task finished while leading; leadership was released.
    Finished(T),
    /// Leadership was lost; the task was stopped (its future dropped) first.
    Lost(LostReason),
}

/// The back-off between a lost term (or a failed campaign) and the next campaign.
pub const DEFAULT_BACKOFF: Duration = Duration::from_secs(1);

/// How long a winner waits before it starts its task, so that a leader whose session
/// was ended has noticed and stopped first: longer than the slowest manager takes to tell
/// a holder its session ended, so two leaders' tasks never run at once.
///
/// Set from a measurement (`docs/benchmarks.md`, "How soon a holder is told"; the
/// adapter's `tests/it/told.rs` reproduces it): 88 terminated sessions per kind of pool,
/// on the shared 2-core test machine under load. On a pool whose connections announce
/// their own end (`locks_postgres::plain_pool`, `tls_pool`, or a pool built on its
/// `LockConnect`) a holder was told within 29 ms at worst; on any other pool (deadpool's
/// own connector) only the manager's health check (every 200 ms) tells it: within 200 ms
/// usually, 369 ms at worst (the first check came before the connection's task had seen
/// the socket close). An election cannot tell which pool its manager has, so the default
/// covers the slower: 500 ms, 130 ms above the worst measured. On a pool that announces
/// its end, [`takeover_delay`](LeaderElection::takeover_delay) can be 100 ms (3.4 times
/// its worst). The adapter's tests check both: the default keeps the order on a pool that
/// does not announce its end, 100 ms on one that does.
///
/// A leader cut off from the server is another matter, which no takeover delay covers:
/// the server frees its permit only when its own timers give the session up, the
/// adapter's lease makes the leader stop before that, and fencing tokens guard what it
/// writes.
pub const DEFAULT_TAKEOVER_DELAY: Duration = Duration::from_millis(500);

/// Campaigns for the leadership of `name`: the holder of the one permit of the
/// semaphore `name` leads. See the crate's documentation for an example.
///
/// Without [`board`](Self::board) an election neither publishes nor reads terms; with
/// one, each term is proclaimed there (with [`publish`](Self::publish)'s value) before
/// the task starts and retired after it stops, and [`who_leads`](Self::who_leads) and
/// [`watch`](Self::watch) report the term's number, value and start. An observer is an
/// election that never campaigns: it only calls `who_leads` or `watch`.
#[derive(Debug)]
pub struct LeaderElection<S, B = NoBoard> {
    semaphores: S,
    board: Option<B>,
    value: String,
    name: String,
    backoff: Duration,
    takeover_delay: Duration,
    state: watch::Sender<Leadership>,
    instruments: Instruments,
    /// `leader.election`, when asked for.
    attributes: Vec<KeyValue>,
}

impl<S: Semaphore> LeaderElection<S> {
    /// An election for `name` on `semaphores` (a manager or a reference to one), with the default back-off and takeover delay and no board.
    ///
    /// A leader holds two permits (the election's, and the one of [`leading_name`]
    /// while its task runs): on PostgreSQL that is two pool connections, and a third for
    /// [`who_leads`](Self::who_leads) or a board's statements meanwhile. With a pool of
    /// one connection the winner would wait for the second forever.
    ///
    /// Its instruments (the [`metrics`](crate::metrics) module) are made on the global
    /// meter provider as it is now (a no-op when none is installed);
    /// [`meter`](Self::meter) gives another meter.
    pub fn new(semaphores: S, name: impl Into<String>) -> Self {
        Self {
            semaphores,
            board: None,
            value: String::new(),
            name: name.into(),
            backoff: DEFAULT_BACKOFF,
            takeover_delay: DEFAULT_TAKEOVER_DELAY,
            state: watch::Sender::new(Leadership::Following),
            instruments: Instruments::global(),
            attributes: Vec::new(),
        }
    }
}

impl<S: Semaphore, B: LeaderBoard> LeaderElection<S, B> {
    /// Proclaims each term on `board` (and reads terms from it): usually the same
    /// manager as the semaphores' (on PostgreSQL its table must be installed first).
    /// With a board, the election's name has at most
    /// [`MAX_BOARD_NAME`](locks_port::MAX_BOARD_NAME) bytes and no NUL: another is a
    /// `Configuration` error of every campaign and read.
    #[must_use]
    pub fn board<C: LeaderBoard>(self, board: C) -> LeaderElection<S, C> {
        LeaderElection {
            semaphores: self.semaphores,
            board: Some(board),
            value: self.value,
            name: self.name,
            backoff: self.backoff,
            takeover_delay: self.takeover_delay,
            state: self.state,
            instruments: self.instruments,
            attributes: self.attributes,
        }
    }

    /// The value each term publishes on the board (an address, a version): at most
    /// [`MAX_PUBLISHED_VALUE`](locks_port::MAX_PUBLISHED_VALUE) bytes, no NUL. A value
    /// the board refuses is a `Configuration` error of the campaign.
    #[must_use]
    pub fn publish(mut self, value: impl Into<String>) -> Self {
        self.value = value.into();
        self
    }

    /// Records the election's instruments on `meter` instead of the global provider's.
    #[must_use]
    pub fn meter(mut self, meter: &Meter) -> Self {
        self.instruments = Instruments::on(meter);
        self
    }

    /// Adds the election's name to its instruments as `leader.election` (off by
    /// default: names are key text, so this is the user's choice; one series per
    /// election).
    #[must_use]
    pub fn metrics_name(mut self, on: bool) -> Self {
        self.attributes = if on {
            vec![KeyValue::new("leader.election", self.name.clone())]
        } else {
            Vec::new()
        };
        self
    }

    /// The pause before campaigning again after a lost term or a failed campaign.
    #[must_use]
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a winner waits before starting its task (see
    /// [`DEFAULT_TAKEOVER_DELAY`] for the measured figures). It must exceed the time a
    /// leader needs to notice a loss: 100 ms is enough on a pool that announces a
    /// connection's end (`plain_pool`, `tls_pool`), not on others; zero gives up the
    /// ordering.
    #[must_use]
    pub fn takeover_delay(mut self, delay: Duration) -> Self {
        self.takeover_delay = delay;
        self
    }

    /// The election's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Follows this process's leadership: every change, starting with `Following`.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        self.state.subscribe()
    }

    /// Who leads `name` now, without campaigning; `None` when nobody does.
    ///
    /// It names a process only while its task runs: the leader holds a second permit,
    /// of [`leading_name`], from just before its task starts until just after it stops,
    /// and this reads that one (a winner waiting out the takeover delay is not named).
    /// With a board, the leader is named only once its term is proclaimed, with the
    /// term's number, value and start, and no longer once it is retired.
    ///
    /// What it costs on PostgreSQL: with a board, a probe of the leading permit's slot
    /// and a primary-key lookup, neither of which reads `pg_locks`, so it costs the same
    /// whatever the server holds; without a board, the probe, and while somebody leads
    /// a read of `pg_locks` too (which copies the server's whole lock table: see the
    /// workspace's `docs/capacity.md`). Watch a large server with a board.
    ///
    /// # Errors
    /// A backend failure, as from [`Semaphore::permit_holders`] or
    /// [`LeaderBoard::latest`]; with a board, a `Configuration` error for a name the
    /// board refuses (a NUL, more than [`MAX_BOARD_NAME`](locks_port::MAX_BOARD_NAME)
    /// bytes) once somebody leads.
    pub async fn who_leads(&self) -> Result<Option<Leader>, LockAcquisitionError> {
        who_leads(&self.semaphores, self.board.as_ref(), &self.name).await
    }

    /// Watches who leads: each change, read every
    /// [`DEFAULT_WATCH_INTERVAL`](crate::DEFAULT_WATCH_INTERVAL) (see
    /// [`LeaderWatch::interval`]). No campaign: any process can watch.
    #[must_use]
    pub fn watch(&self) -> LeaderWatch<'_, S, B> {
        LeaderWatch::new(
            &self.semaphores,
            self.board.as_ref(),
            &self.name,
            &self.instruments,
            &self.attributes,
        )
    }

    /// One term: waits to lead, runs `task` while leading, and says how it ended.
    ///
    /// `task` is handed the term's [`LostSignal`]: it fires when the term ends, with the
    /// reason of the loss that ended it (either permit's session, whichever went first),
    /// or `Released` once the task returned or this future was dropped. The task's future
    /// is dropped on a loss anyway; the signal is for what it handed on (a spawned
    /// subtask, a connection of its own to close).
    ///
    /// # Errors
    /// The campaign's error (the permit could not be waited for, or the board refused
    /// the term). With a board, an election name with a NUL or of more than
    /// [`MAX_BOARD_NAME`](locks_port::MAX_BOARD_NAME) bytes, or a published value the
    /// board refuses, is a `Configuration` error before any permit is taken.
    ///
    /// # Cancel safety
    /// Dropping the future stops the task and gives up the leadership (a proclaimed
    /// term is then left unretired; observers stop naming it once the leading permit
    /// is free).
    pub async fn term<F, Fut, T>(&self, task: F) -> Result<TermEnd<T>, LockAcquisitionError>
    where
        F: FnOnce(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        if self.board.is_some() {
            // What the board would refuse when the term is proclaimed is refused before
            // the campaign takes a permit (and waits out the takeover delay).
            check_board_name(&self.name)?;
            check_published_value(&self.name, &self.value)?;
        }
        let permit = self
            .semaphores
            .acquire_permit(&self.name, 1, AcquireOptions::new())
            .await?;
        let lost = permit.lost();
        // A leader whose session just ended may not know yet: let it stop first.
        if tokio::time::timeout(self.takeover_delay, lost.clone())
            .await
            .is_ok()
        {
            return Ok(TermEnd::Lost(
                lost.reason().unwrap_or(LostReason::ConnectionClosed),
            ));
        }
        // A term left unretired (its leader died, or its term was dropped) must not be
        // read as this process's once it holds the leading permit: observers trust the
        // board's live term while that permit is held. The predecessor has been told
        // of its loss by now (the takeover delay), so retiring its term early unnames
        // only a leader that must stop.
        if let Some(board) = &self.board
            && let Err(error) = retire_live_term(board, &self.name).await
        {
            permit.release().await;
            return Err(error);
        }
        // The second permit, held while the task runs: it names this process to
        // `who_leads`, and a predecessor still running its task holds it until the
        // task stops, so two leaders' tasks never overlap.
        let leading_key = leading_name(&self.name);
        let leading = tokio::select! {
            biased;
            reason = lost.clone() => {
                permit.release().await;
                return Ok(TermEnd::Lost(reason));
            }
            leading = self.semaphores.acquire_permit(&leading_key, 1, AcquireOptions::new()) => {
                leading
            }
        };
        let leading = match leading {
            Ok(leading) => leading,
            Err(error) => {
                permit.release().await;
                return Err(error);
            }
        };
        let term = match &self.board {
            None => None,
            Some(board) => match board.proclaim(&self.name, &self.value).await {
                Ok(proclaimed) => Some(proclaimed.term),
                Err(error) => {
                    leading.release().await;
                    permit.release().await;
                    return Err(error);
                }
            },
        };
        self.state.send_replace(Leadership::Leading {
            since: OffsetDateTime::now_utc(),
            fencing_token: permit.info().fencing_token(),
            term,
        });
        self.instruments.is_leader.add(1, &self.attributes);
        self.instruments.terms.add(1, &self.attributes);
        // Says `Following` again when the term ends, or when this future is dropped
        // mid-term (after the task's future, made later, is dropped).
        let running = Running(self);
        let leading_lost = leading.lost();
        // The task's signal is the term's, not either permit's: it fires with the reason
        // the term ended (a lost leading permit is not the `Released` of the election
        // permit given up after it), for a clone the task kept outside itself too.
        let told = TermSignal(LossNotifier::new());
        let ended = tokio::select! {
            biased;
            reason = lost => TermEnd::Lost(reason),
            // The leading permit names this process: without it, it must not lead.
            reason = leading_lost => TermEnd::Lost(reason),
            output = task(told.0.signal()) => TermEnd::Finished(output),
        };
        if let TermEnd::Lost(reason) = &ended {
            told.0.notify(*reason);
        }
        drop(told);
        // The task's future is dropped by now: it stopped before anyone hears of it.
        drop(running);
        if let (Some(board), Some(term)) = (&self.board, term)
            && let Err(error) = board.retire(&self.name, term).await
        {
            tracing::warn!(
                error = %error,
                term,
                "the term could not be retired; observers stop naming it when the leading \
                 permit is released"
            );
        }
        leading.release().await;
        if let TermEnd::Lost(reason) = &ended {
            tracing::warn!(
                reason = reason.as_str(),
                "leadership lost; the task was stopped"
            );
        }
        permit.release().await;
        Ok(ended)
    }

    /// Campaigns until the task finishes while leading: each lost term stops the task
    /// and, after the back-off, campaigns again with a new task from `task`. Failed
    /// campaigns are retried after the back-off too, except configuration errors.
    ///
    /// # Errors
    /// A [`Configuration`](AcquisitionErrorKind::Configuration) error of the campaign
    /// (for example, other processes use `name` as a semaphore of more permits, the
    /// published value is too long or has a NUL, with a board the name has a NUL or more
    /// than [`MAX_BOARD_NAME`](locks_port::MAX_BOARD_NAME) bytes (every board refuses
    /// it: [`check_board_name`](locks_port::check_board_name)), or on PostgreSQL a
    /// missing grant or a read-only standby behind a single-host URL), or
    /// [`InvalidKey`](AcquisitionErrorKind::InvalidKey) for an empty name. Other failures are retried after the back-off: behind a
    /// failover, give the manager a multi-host URL with `target_session_attrs=read-write`,
    /// whose failures while the new primary is promoted are `Unreachable`.
    ///
    /// # Cancel safety
    /// Dropping the future stops the task and gives up the leadership.
    pub async fn run<F, Fut, T>(&self, mut task: F) -> Result<T, LockAcquisitionError>
    where
        F: FnMut(LostSignal) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            match self.term(&mut task).await {
                Ok(TermEnd::Finished(output)) => return Ok(output),
                Ok(TermEnd::Lost(_)) => {}
                Err(error)
                    if matches!(
                        error.kind(),
                        AcquisitionErrorKind::Configuration | AcquisitionErrorKind::InvalidKey
                    ) =>
                {
                    return Err(error);
                }
                Err(error) => {
                    tracing::warn!(error = %error, "campaign failed; retrying after the back-off");
                }
            }
            tokio::time::sleep(self.backoff).await;
        }
    }
}

/// Retires the latest term of `name` on `board` if it is not retired yet (only while it
/// is the latest: a newer term is left as it is).
///
/// The step a leader takes after its takeover delay and before it takes the leading
/// permit ([`LeaderElection::term`] does): observers with a board trust the board's live
/// term while the leading permit is held, so a term left live by a leader that died must
/// be retired before another process holds that permit. A process that leads by hand
/// (the election's permit, then [`leading_name`]'s) takes it too.
///
/// # Errors
/// A backend failure of the board.
pub async fn retire_live_term<B: LeaderBoard>(
    board: &B,
    name: &str,
) -> Result<(), LockAcquisitionError> {
    match board.latest(name).await? {
        Some(term) if !term.retired => board.retire(name, term.term).await,
        _ => Ok(()),
    }
}

/// The notifier of a term's task signal: told `Released` when the term ends without a
/// loss, or when its future is dropped mid-term (a loss is told before).
struct TermSignal(LossNotifier);

impl Drop for TermSignal {
    fn drop(&mut self) {
        self.0.notify(LostReason::Released);
    }
}

/// A term running its task: dropped, the election follows again.
struct Running<'a, S, B>(&'a LeaderElection<S, B>);

impl<S, B> Drop for Running<'_, S, B> {
    fn drop(&mut self) {
        let election = self.0;
        election.state.send_replace(Leadership::Following);
        election.instruments.is_leader.add(-1, &election.attributes);
    }
}
