//! Who leads, as anyone can see it: the holder of the leading permit, joined with the
//! term its leader proclaimed on the board.

use std::time::Duration;

use locks_port::{LeaderBoard, LockAcquisitionError, Proclamation, Semaphore};
use opentelemetry::KeyValue;
use time::OffsetDateTime;

use crate::metrics::Instruments;

/// The name of the semaphore a leader holds while its task runs: `name` and the suffix
/// `"\u{0}leading"` (no election name a user picks is likely to end so).
#[must_use]
pub fn leading_name(name: &str) -> String {
    format!("{name}\u{0}leading")
}

/// Who leads now (see [`LeaderElection::who_leads`](crate::LeaderElection::who_leads)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's holder id, when its manager has one.
    pub holder_id: Option<String>,
    /// Since when its term runs: the proclamation's time (full precision) with a board;
    /// without one, the grant of the leading permit as the backend shows it (to the
    /// second on PostgreSQL).
    pub since: Option<OffsetDateTime>,
    /// The term's number, with a board: strictly growing across terms.
    pub term: Option<u64>,
    /// What the leader published, with a board (empty when it published nothing).
    pub value: Option<String>,
}

/// An election's board, when it has none: an election without a board neither
/// proclaims nor reads terms. It has no values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoBoard {}

impl LeaderBoard for NoBoard {
    async fn proclaim(&self, _: &str, _: &str) -> Result<Proclamation, LockAcquisitionError> {
        match *self {}
    }

    async fn retire(&self, _: &str, _: u64) -> Result<(), LockAcquisitionError> {
        match *self {}
    }

    async fn latest(&self, _: &str) -> Result<Option<Proclamation>, LockAcquisitionError> {
        match *self {}
    }
}

/// The leader of `name`: the leading permit's holder, and with a board the term it
/// proclaimed. A held permit whose holder has no live term on the board (a winner about
/// to proclaim, or a dead leader's term left unretired) is nobody yet.
pub(crate) async fn who_leads<S: Semaphore, B: LeaderBoard>(
    semaphores: &S,
    board: Option<&B>,
    name: &str,
) -> Result<Option<Leader>, LockAcquisitionError> {
    // The permit first: a term read after it is at least as new as the permit's holder.
    let holders = semaphores.permit_holders(&leading_name(name)).await?;
    let Some(held) = holders.held.into_iter().next() else {
        return Ok(None);
    };
    let Some(board) = board else {
        return Ok(Some(Leader {
            holder_id: held.holder_id,
            since: held.since,
            term: None,
            value: None,
        }));
    };
    Ok(board
        .latest(name)
        .await?
        .filter(|term| !term.retired && term.holder_id == held.holder_id)
        .map(|term| Leader {
            holder_id: term.holder_id,
            since: Some(term.since),
            term: Some(term.term),
            value: Some(term.value),
        }))
}

/// How often a [`LeaderWatch`] reads who leads by default.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// The changes of an election's leader, read every interval (see
/// [`LeaderElection::watch`](crate::LeaderElection::watch)).
#[derive(Debug)]
pub struct LeaderWatch<'a, S, B> {
    /// What it reads: the election's semaphores, board and name.
    semaphores: &'a S,
    board: Option<&'a B>,
    name: &'a str,
    /// The election's instruments and attributes, to count the changes it reports.
    instruments: &'a Instruments,
    attributes: &'a [KeyValue],
    interval: Duration,
    seen: Option<Option<Leader>>,
}

impl<'a, S: Semaphore, B: LeaderBoard> LeaderWatch<'a, S, B> {
    pub(crate) fn new(
        semaphores: &'a S,
        board: Option<&'a B>,
        name: &'a str,
        instruments: &'a Instruments,
        attributes: &'a [KeyValue],
    ) -> Self {
        Self {
            semaphores,
            board,
            name,
            instruments,
            attributes,
            interval: DEFAULT_WATCH_INTERVAL,
            seen: None,
        }
    }

    /// Reads every `interval` instead of [`DEFAULT_WATCH_INTERVAL`] (a zero interval
    /// is read as 1 ms). Each read is two queries on PostgreSQL.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The leader: on the first call as it is now, then each time it has changed
    /// (another term, another value, or nobody). Reads every interval until then.
    ///
    /// # Errors
    /// A read's backend failure. The watch stays usable: the next call reads again,
    /// so a change during the failure is reported then (never lost, though a leader
    /// that came and went meanwhile is not seen).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call loses nothing; the next one compares with the last
    /// leader it reported.
    pub async fn changed(&mut self) -> Result<Option<Leader>, LockAcquisitionError> {
        loop {
            if self.seen.is_some() {
                tokio::time::sleep(self.interval).await;
            }
            let now = who_leads(self.semaphores, self.board, self.name).await?;
            match &self.seen {
                Some(seen) if *seen == now => {}
                Some(_) => {
                    self.instruments.changes.add(1, self.attributes);
                    self.seen = Some(now.clone());
                    return Ok(now);
                }
                None => {
                    self.seen = Some(now.clone());
                    return Ok(now);
                }
            }
        }
    }

    /// The leader last reported, if a call has reported one yet.
    #[must_use]
    pub fn last(&self) -> Option<&Option<Leader>> {
        self.seen.as_ref()
    }
}
