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
///
/// The permit is asked with [`Semaphore::permit_held`] first (on PostgreSQL one probe of
/// its slot, whose cost does not grow with the locks held on the server): nobody holds it,
/// nobody leads. With a board, a held permit and a term not retired name the term's
/// leader, and `permit_holders` is never read: a winner retires any term left unretired
/// before it takes the leading permit (see [`LeaderElection::term`]), so while the
/// permit is held the board's live term is its holder's. Without a board the holder is
/// named from [`Semaphore::permit_holders`] (on PostgreSQL a read of `pg_locks`, whose
/// cost grows with the server's lock table), only while somebody leads.
///
/// [`LeaderElection::term`]: crate::LeaderElection::term
pub(crate) async fn who_leads<S: Semaphore, B: LeaderBoard>(
    semaphores: &S,
    board: Option<&B>,
    name: &str,
) -> Result<Option<Leader>, LockAcquisitionError> {
    read_leader(semaphores, board, name)
        .await
        .map_err(|error| error.for_read(format!("who leads '{name}'")))
}

/// [`who_leads`], its errors as they came.
async fn read_leader<S: Semaphore, B: LeaderBoard>(
    semaphores: &S,
    board: Option<&B>,
    name: &str,
) -> Result<Option<Leader>, LockAcquisitionError> {
    let leading = leading_name(name);
    // The permit first: a term read after it is at least as new as the permit's holder.
    if !semaphores.permit_held(&leading, 0).await? {
        return Ok(None);
    }
    let Some(board) = board else {
        let holders = semaphores.permit_holders(&leading).await?;
        return Ok(holders.held.into_iter().next().map(|held| Leader {
            holder_id: held.holder_id,
            since: held.since,
            term: None,
            value: None,
        }));
    };
    Ok(board
        .latest(name)
        .await?
        .filter(|term| !term.retired)
        .map(|term| Leader {
            holder_id: term.holder_id,
            since: Some(term.since),
            term: Some(term.term),
            value: Some(term.value),
        }))
}

/// How often a [`LeaderWatch`] reads who leads by default.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// After a read that took [`SLOW_READ`] or more, a watch waits at least this many times
/// its duration before the next read, so that its reads take at most a tenth of its
/// time whatever the interval. With a board a read on PostgreSQL is two small
/// statements (a probe and a primary-key lookup) whatever the server holds; without
/// one, a read while somebody leads copies the server's whole lock table (`pg_locks`),
/// which grows with the locks held (about 0.2 s at 10^5 on a shared machine), and this
/// keeps such a watch from reading back to back.
const PAUSE_PER_READ: u32 = 9;

/// A read this slow stretches the pause (see [`PAUSE_PER_READ`]); faster ones leave the
/// interval as asked (a small server answers in a few ms).
const SLOW_READ: Duration = Duration::from_millis(50);

/// The wait before the next read: the interval, or longer after a slow read.
fn pause(interval: Duration, last_read: Duration) -> Duration {
    if last_read < SLOW_READ {
        return interval;
    }
    interval.max(last_read.saturating_mul(PAUSE_PER_READ))
}

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
    /// Whether a read was made (or begun), whatever its answer: every read after the
    /// first waits the interval, a failed first read's next one too.
    read_once: bool,
    /// How long the last read took.
    last_read: Duration,
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
            read_once: false,
            last_read: Duration::ZERO,
        }
    }

    /// Reads every `interval` instead of [`DEFAULT_WATCH_INTERVAL`] (a zero interval
    /// is read as 1 ms). Each read is at most two statements on PostgreSQL; with a
    /// board neither reads `pg_locks`, so its cost does not grow with the locks held on
    /// the server (without a board, a read while somebody leads does). After a read
    /// that took 50 ms or more, the watch waits at least nine times its duration before
    /// the next, so that its reads take at most a tenth of its time.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The leader: on the first call as it is now, then each time it has changed
    /// (another term, another value, or nobody). Reads every interval until then.
    ///
    /// # Errors
    /// A read's backend failure. The watch stays usable: the next call reads again
    /// after the interval (a failed first read too, so a caller that calls again at once
    /// does not read back to back), so a change during the failure is reported then (never lost, though a leader
    /// that came and went meanwhile is not seen).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call loses nothing; the next one compares with the last
    /// leader it reported.
    pub async fn changed(&mut self) -> Result<Option<Leader>, LockAcquisitionError> {
        loop {
            if self.read_once {
                tokio::time::sleep(pause(self.interval, self.last_read)).await;
            }
            self.read_once = true;
            let started = tokio::time::Instant::now();
            let read = who_leads(self.semaphores, self.board, self.name).await;
            self.last_read = started.elapsed();
            let now = read?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::pause;

    #[test]
    fn a_read_of_50_ms_or_more_stretches_the_pause_to_nine_times_its_duration() {
        let ms = Duration::from_millis;
        assert_eq!(pause(ms(100), ms(2)), ms(100), "fast reads: the interval");
        assert_eq!(pause(ms(20), ms(49)), ms(20), "below 50 ms: the interval");
        assert_eq!(pause(ms(20), ms(50)), ms(450));
        assert_eq!(pause(ms(100), ms(200)), ms(1800), "a read of 0.2 s: 1.8 s");
        assert_eq!(pause(ms(1), Duration::MAX), Duration::MAX, "saturates");
    }
}
