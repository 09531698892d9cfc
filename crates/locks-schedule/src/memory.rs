//! The in-memory ledger: the same decisions as the PostgreSQL one, in one process, on a
//! clock the test controls.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use time::OffsetDateTime;

use crate::claim::{Claim, Decision, SlotRow};
use crate::ledger::{
    Attempt, ClaimAnswer, Ledger, LedgerError, Outcome, RunRecord, recorded_detail,
};

/// Where the in-memory ledger reads the time: the stand-in for the database's clock.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> OffsetDateTime;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// A clock that moves only when told: for tests.
///
/// ```
/// use locks_schedule::{Clock, ManualClock};
/// let clock = ManualClock::new(time::macros::datetime!(2026-01-01 00:00 UTC));
/// clock.advance(std::time::Duration::from_secs(90));
/// assert_eq!(clock.now(), time::macros::datetime!(2026-01-01 00:01:30 UTC));
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<OffsetDateTime>>,
}

impl ManualClock {
    /// A clock stopped at `now`.
    #[must_use]
    pub fn new(now: OffsetDateTime) -> Self {
        Self {
            now: Arc::new(Mutex::new(now)),
        }
    }

    /// Sets the time.
    pub fn set(&self, now: OffsetDateTime) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = now;
    }

    /// Moves the time on by `by` (saturating at the largest date `time` represents).
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = now
            .checked_add(time::Duration::try_from(by).unwrap_or(time::Duration::MAX))
            .unwrap_or(time::PrimitiveDateTime::MAX.assume_utc());
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The earliest instant an `OffsetDateTime` holds: the first local time at the largest
/// offset east, so every slot of a job sorts after it whatever its offset.
fn earliest_instant() -> OffsetDateTime {
    let east = time::UtcOffset::from_hms(25, 59, 59).unwrap_or(time::UtcOffset::UTC);
    time::PrimitiveDateTime::MIN.assume_offset(east)
}

/// A [`Ledger`] in memory, on an injected [`Clock`]: the schedule's contract for users'
/// tests, with no database. Clones share the rows.
#[derive(Clone)]
pub struct MemoryLedger<C = SystemClock> {
    clock: C,
    rows: Arc<Mutex<BTreeMap<(String, OffsetDateTime), RunRecord>>>,
}

impl<C> fmt::Debug for MemoryLedger<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLedger").finish_non_exhaustive()
    }
}

impl<C: Clock> MemoryLedger<C> {
    /// An empty ledger on `clock`.
    #[must_use]
    pub fn new(clock: C) -> Self {
        Self {
            clock,
            rows: Arc::default(),
        }
    }

    /// The clock's time as the ledger keeps it (to the microsecond, in UTC, as
    /// PostgreSQL's `timestamptz`: [`locks_port::stored_time`]).
    fn stamp(&self) -> OffsetDateTime {
        locks_port::stored_time(self.clock.now())
    }
}

impl<C: Clock> Ledger for MemoryLedger<C> {
    async fn now(&self) -> Result<OffsetDateTime, LedgerError> {
        Ok(self.stamp())
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        LedgerError::check_name(claim.name)?;
        LedgerError::check_holder(claim.name, claim.holder)?;
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.stamp();
        let key = (claim.name.to_owned(), claim.slot.start());
        let row = rows.get(&key).map(|record| SlotRow {
            attempt: record.attempt,
            outcome: record.outcome,
        });
        let latest = rows
            .keys()
            .filter(|(name, _)| name == claim.name)
            .map(|(_, slot)| *slot)
            .max();
        Ok(match claim.decide(now, row.as_ref(), latest) {
            Decision::NotDue => ClaimAnswer::NotDue { now },
            Decision::NothingToDo => ClaimAnswer::NothingToDo,
            Decision::AlreadyDone(outcome) => ClaimAnswer::Done(outcome),
            Decision::Run => {
                let record = RunRecord::new(
                    claim.name,
                    claim.slot.start(),
                    claim.holder,
                    1,
                    now,
                    Outcome::Running,
                );
                rows.insert(key, record);
                ClaimAnswer::Claimed {
                    attempt: 1,
                    previous: None,
                    started: now,
                }
            }
            Decision::Retry { attempt, previous } => {
                let mut record = RunRecord::new(
                    claim.name,
                    claim.slot.start(),
                    claim.holder,
                    attempt,
                    now,
                    Outcome::Running,
                );
                // The detail the PostgreSQL ledger writes: the row's outcome before.
                record.detail = row
                    .as_ref()
                    .map(|row| format!("previous attempt: {}", row.outcome));
                rows.insert(key, record);
                ClaimAnswer::Claimed {
                    attempt,
                    previous: Some(previous),
                    started: now,
                }
            }
            Decision::Abandon => {
                if let Some(record) = rows.get_mut(&key) {
                    abandon(record, now);
                }
                ClaimAnswer::Settled(Outcome::Abandoned)
            }
            Decision::RecordMissed => {
                let mut record = RunRecord::new(
                    claim.name,
                    claim.slot.start(),
                    claim.holder,
                    0,
                    now,
                    Outcome::Missed,
                );
                record.finished = Some(now);
                rows.insert(key, record);
                ClaimAnswer::Settled(Outcome::Missed)
            }
        })
    }

    async fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> Result<bool, LedgerError> {
        LedgerError::check_name(attempt.name)?;
        LedgerError::check_holder(attempt.name, attempt.holder)?;
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.stamp();
        match rows.get_mut(&(attempt.name.to_owned(), attempt.slot)) {
            Some(record)
                if record.outcome == Outcome::Running
                    && record.attempt == attempt.attempt
                    && record.holder == attempt.holder =>
            {
                record.outcome = outcome;
                record.finished = Some(now);
                record.detail = detail.map(|detail| recorded_detail(detail).into_owned());
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn running_before(
        &self,
        name: &str,
        before: OffsetDateTime,
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        LedgerError::check_name(name)?;
        let rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        // The job's rows before `before` only, in slot order (the keys sort by job, then
        // slot): a firing reads its own job's past, not every row kept.
        let first = (name.to_owned(), earliest_instant());
        Ok((rows.range(first..))
            .take_while(|((job, slot), _)| job == name && *slot < before)
            .filter(|(_, record)| record.outcome == Outcome::Running)
            .map(|((_, slot), _)| *slot)
            .collect())
    }

    async fn abandon_stale(
        &self,
        name: &str,
        slots: &[OffsetDateTime],
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        LedgerError::check_name(name)?;
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let now = self.stamp();
        let mut abandoned = Vec::new();
        for &slot in slots {
            if let Some(record) = rows.get_mut(&(name.to_owned(), slot))
                && record.outcome == Outcome::Running
            {
                abandon(record, now);
                abandoned.push(slot);
            }
        }
        abandoned.sort();
        Ok(abandoned)
    }

    async fn runs(&self, name: Option<&str>, limit: u32) -> Result<Vec<RunRecord>, LedgerError> {
        name.map_or(Ok(()), LedgerError::check_name)?;
        let rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut records: Vec<RunRecord> = rows
            .values()
            .filter(|record| name.is_none_or(|name| record.name == name))
            .cloned()
            .collect();
        records.sort_by(|a, b| b.slot.cmp(&a.slot).then_with(|| a.name.cmp(&b.name)));
        records.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(records)
    }

    async fn prune(&self, before: OffsetDateTime) -> Result<u64, LedgerError> {
        let mut rows = self.rows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut latest: BTreeMap<String, OffsetDateTime> = BTreeMap::new();
        for (name, slot) in rows.keys() {
            latest.insert(name.clone(), *slot);
        }
        let count = rows.len();
        rows.retain(|(name, slot), _| *slot >= before || latest.get(name) == Some(slot));
        Ok(u64::try_from(count - rows.len()).unwrap_or(u64::MAX))
    }
}

/// Marks a dead runner's row `abandoned` at `now`, with the detail the PostgreSQL ledger
/// writes.
fn abandon(record: &mut RunRecord, now: OffsetDateTime) {
    record.outcome = Outcome::Abandoned;
    record.finished = Some(now);
    record.detail = Some(format!("the runner {} died", record.holder));
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn the_ledger_keeps_its_clock_s_time_as_postgresql_would() {
        let clock = ManualClock::new(datetime!(2026-12-07 23:59:59.123456789 +02:00));
        let ledger = MemoryLedger::new(clock);
        assert_eq!(
            ledger.now().await.expect("now"),
            datetime!(2026-12-07 21:59:59.123456 UTC),
            "UTC, to the microsecond"
        );
        let system = MemoryLedger::new(SystemClock).now().await.expect("now");
        assert_eq!(system, locks_port::stored_time(system));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn running_before_reads_only_the_job_s_running_rows_before_the_slot() {
        let ledger = MemoryLedger::new(SystemClock);
        let t = datetime!(2026-01-01 00:00 UTC);
        let minute = time::Duration::minutes(1);
        let far_east = (t - minute).to_offset(time::UtcOffset::from_hms(14, 0, 0).expect("+14"));
        let row = |name: &str, slot: OffsetDateTime, outcome| RunRecord {
            name: name.to_owned(),
            slot,
            holder: "h".to_owned(),
            attempt: 1,
            started: slot,
            finished: None,
            outcome,
            detail: None,
        };
        let first = time::PrimitiveDateTime::MIN.assume_utc();
        let rows = [
            row("a", first, Outcome::Running),
            row("a", far_east, Outcome::Running),
            row("a", t, Outcome::Running),
            row("a", t + minute, Outcome::Succeeded),
            row("a", t + minute * 2, Outcome::Running),
            row("a", t + minute * 3, Outcome::Running),
            row("", t, Outcome::Running),
            row("ab", t, Outcome::Running),
            row("b", t, Outcome::Running),
        ];
        ledger.rows.lock().expect("rows").extend(
            rows.into_iter()
                .map(|record| ((record.name.clone(), record.slot), record)),
        );
        let before = ledger.running_before("a", t + minute * 3).await;
        assert_eq!(before.expect("read"), [first, far_east, t, t + minute * 2]);
        let none = ledger.running_before("a", first).await;
        assert_eq!(none.expect("read"), Vec::<OffsetDateTime>::new());
        let other = ledger.running_before("c", t + minute * 9).await;
        assert_eq!(other.expect("read"), Vec::<OffsetDateTime>::new());
    }
}
