//! The firing loop's contract: three hosts run [`ScheduledJob::run_every_slot`] on one
//! ledger with skewed clocks; every slot runs exactly once, and nothing runs once the
//! loops are dropped.
//!
//! The loop reads no host clock (it sleeps to the boundaries of the ledger's), so a host
//! whose clock is off is played by a [`SkewedLedger`]: the ledger as seen from a host that
//! reads the time `skew` off, as the host ledger of `locks-schedule-postgres`'s skew test
//! does. Its claims still go to the shared ledger and are decided on its clock.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use locks_port::DistributedLock;
use time::OffsetDateTime;

use crate::{
    Attempt, Claim, ClaimAnswer, JobContext, Ledger, LedgerError, Outcome, RunRecord, ScheduledJob,
    SlotKind,
};

/// The three hosts' clock skews in milliseconds: three of the five of the PostgreSQL
/// ledger's skew test (up to 2.9 s off, so two hosts are off by more than a 1 s slot).
pub const LOOP_SKEWS_MS: [i64; 3] = [-2_700, 400, 2_900];

/// How long each run of the loops' job takes.
const JOB_LENGTH: Duration = Duration::from_millis(100);

/// How long the check waits after dropping the loops, for a run that should not come.
const AFTER_DROP: Duration = Duration::from_millis(2_500);

/// `ledger` as a host whose clock is `skew` off sees it: [`Ledger::now`] is the ledger's
/// clock plus `skew`; claims, records and reads go to `ledger` unchanged. It counts the
/// host's claims of a current slot that the ledger did not refuse as not due: its
/// firings, by slot.
#[derive(Debug)]
pub struct SkewedLedger<'a, G> {
    ledger: &'a G,
    skew: time::Duration,
    firings: Mutex<BTreeMap<OffsetDateTime, usize>>,
}

impl<'a, G: Ledger> SkewedLedger<'a, G> {
    /// `ledger` with its clock read `skew` off.
    #[must_use]
    pub fn new(ledger: &'a G, skew: time::Duration) -> Self {
        Self {
            ledger,
            skew,
            firings: Mutex::default(),
        }
    }

    /// How many firings claimed each slot (a claim of the current slot the ledger
    /// answered, not refused as not due).
    #[must_use]
    pub fn firings(&self) -> BTreeMap<OffsetDateTime, usize> {
        self.firings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl<G: Ledger> Ledger for SkewedLedger<'_, G> {
    async fn now(&self) -> Result<OffsetDateTime, LedgerError> {
        Ok(self.ledger.now().await? + self.skew)
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        let answer = self.ledger.claim(claim).await?;
        if claim.kind == SlotKind::Current && !matches!(answer, ClaimAnswer::NotDue { .. }) {
            *self
                .firings
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(claim.slot.start())
                .or_default() += 1;
        }
        Ok(answer)
    }

    async fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> Result<bool, LedgerError> {
        self.ledger.finish(attempt, outcome, detail).await
    }

    async fn running_before(
        &self,
        name: &str,
        before: OffsetDateTime,
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        self.ledger.running_before(name, before).await
    }

    async fn abandon_stale(
        &self,
        name: &str,
        slots: &[OffsetDateTime],
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        self.ledger.abandon_stale(name, slots).await
    }

    async fn runs(&self, name: Option<&str>, limit: u32) -> Result<Vec<RunRecord>, LedgerError> {
        self.ledger.runs(name, limit).await
    }

    async fn prune(&self, before: OffsetDateTime) -> Result<u64, LedgerError> {
        self.ledger.prune(before).await
    }
}

/// What three looping hosts ran.
#[derive(Debug)]
pub struct LoopRuns {
    /// Runs per slot (by the slot the job was told), from the job's own record.
    pub runs_per_slot: BTreeMap<OffsetDateTime, usize>,
    /// Runs per host.
    pub runs_per_host: [usize; 3],
    /// The slots between the first run and the last that did not run.
    pub gaps: usize,
    /// Each host's firings per slot, from its first firing to its last: a host that
    /// skipped a slot has a 0 there, one that fired twice in a slot a 2 (which a host
    /// that reads the time off does in its first slot: it fires at the start, and again
    /// at the boundary of its own view).
    pub firings_per_host: [Vec<usize>; 3],
    /// Runs, and ledger rows written, after the loops were dropped.
    pub after_drop: usize,
    /// Whether the job's lock was free after the drop.
    pub lock_free_after_drop: bool,
}

impl LoopRuns {
    /// Slots run more than once.
    #[must_use]
    pub fn doubled(&self) -> usize {
        self.runs_per_slot
            .values()
            .filter(|runs| **runs > 1)
            .count()
    }
}

/// Runs `name` on 1 s slots on three `hosts`, each through `ledger` read with its skew of
/// [`LOOP_SKEWS_MS`], for `slots` seconds of the runtime's timer, with a 100 ms job;
/// then drops the loops, waits 2.5 s, and reports what ran (a loop that ends on its own
/// fails the check).
pub async fn run_skewed_loops<L, G>(hosts: [&L; 3], ledger: &G, name: &str, slots: u32) -> LoopRuns
where
    L: DistributedLock,
    G: Ledger,
{
    let seen: Mutex<Vec<(usize, OffsetDateTime)>> = Mutex::default();
    let record = |host: usize, slot: OffsetDateTime| {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((host, slot));
    };
    let job = |host: usize| {
        ScheduledJob::new(name, "1s".parse().expect("a schedule")).holder(format!("host-{host}"))
    };
    let views = [0, 1, 2]
        .map(|host| SkewedLedger::new(ledger, time::Duration::milliseconds(LOOP_SKEWS_MS[host])));
    let host_loop = |host: usize| {
        let (job, locks, record, ledger) = (job(host), hosts[host], &record, &views[host]);
        async move {
            let ended = job
                .run_every_slot(locks, ledger, |context: JobContext| async move {
                    record(host, context.slot.start());
                    tokio::time::sleep(JOB_LENGTH).await;
                    Ok::<(), String>(())
                })
                .await;
            panic!("host {host}: the firing loop ended: {ended:?}");
        }
    };
    let loops = async {
        tokio::join!(host_loop(0), host_loop(1), host_loop(2));
    };
    let run_for = Duration::from_secs(u64::from(slots));
    assert!(
        tokio::time::timeout(run_for, loops).await.is_err(),
        "the loops never end"
    );
    let before = seen.lock().unwrap_or_else(PoisonError::into_inner).len();
    let rows_before = ledger.runs(Some(name), 10_000).await.expect("runs").len();
    tokio::time::sleep(AFTER_DROP).await;
    let seen = seen.into_inner().unwrap_or_else(PoisonError::into_inner);
    let rows_after = ledger.runs(Some(name), 10_000).await.expect("runs").len();
    let lock_free_after_drop = hosts[0]
        .try_acquire(&job(0).lock_key(None))
        .await
        .expect("try_acquire")
        .is_some();
    let mut runs_per_slot = BTreeMap::new();
    let mut runs_per_host = [0; 3];
    for (host, slot) in &seen {
        *runs_per_slot.entry(*slot).or_default() += 1;
        runs_per_host[*host] += 1;
    }
    let gaps = per_second(&runs_per_slot)
        .iter()
        .filter(|runs| **runs == 0)
        .count();
    LoopRuns {
        firings_per_host: views.map(|view| per_second(&view.firings())),
        runs_per_slot,
        runs_per_host,
        gaps,
        after_drop: (seen.len() - before) + rows_after.saturating_sub(rows_before),
        lock_free_after_drop,
    }
}

/// The counts of each 1 s slot from the first counted to the last (0 where none).
fn per_second(counts: &BTreeMap<OffsetDateTime, usize>) -> Vec<usize> {
    let (Some(first), Some(last)) = (counts.keys().next(), counts.keys().last()) else {
        return Vec::new();
    };
    (0..=(*last - *first).whole_seconds())
        .map(|second| {
            let slot = *first + time::Duration::seconds(second);
            counts.get(&slot).copied().unwrap_or(0)
        })
        .collect()
}

/// The check: with three hosts up to 2.9 s off, each looping for `slots` seconds, each
/// host fired at most once in every slot and in at least half of them (a host whose skew
/// leaves it a fraction of the ledger's slot skips one when its claim is slower than
/// that), every slot from the first run to the last ran exactly
/// once (by the job's record and by the ledger's rows, one attempt each), and after the
/// loops are dropped nothing runs and the job's lock is free.
pub async fn every_slot_runs_each_slot_once<L, G>(
    hosts: [&L; 3],
    ledger: &G,
    name: &str,
    slots: u32,
) where
    L: DistributedLock,
    G: Ledger,
{
    let runs = run_skewed_loops(hosts, ledger, name, slots).await;
    let expected = usize::try_from(slots).unwrap_or(usize::MAX) - 1;
    assert!(runs.runs_per_slot.len() >= expected, "{runs:?}");
    assert_eq!(runs.doubled(), 0, "slots run twice: {runs:?}");
    assert_eq!(runs.gaps, 0, "slots not run: {runs:?}");
    for (host, firings) in runs.firings_per_host.iter().enumerate() {
        // The start is the exception: a host that reads the time off starts its loop in
        // a slot of its own view, whose boundary may come before the true one.
        let after_start = || firings.iter().skip(1);
        assert!(
            firings.len() >= expected && after_start().all(|count| *count <= 1),
            "host {host} fired twice in a slot, or stopped firing: {:?}",
            runs.firings_per_host
        );
        // A host whose clock is off fires when the ledger's slot has only the rest of its
        // skew's second left (0.3 s for -2.7 s): a claim slower than that is refused as
        // not due, and the slot is skipped by that host (the `MissedSlots` policy), which
        // a loaded machine does. The loop must still fire in most slots.
        let fired = after_start().filter(|count| **count == 1).count();
        assert!(
            2 * fired >= firings.len().saturating_sub(1),
            "host {host} fired in only {fired} of {} slots: {:?}",
            firings.len().saturating_sub(1),
            runs.firings_per_host
        );
    }
    assert_eq!(
        runs.after_drop, 0,
        "ran after the loops were dropped: {runs:?}"
    );
    assert!(
        runs.lock_free_after_drop,
        "the dropped loops left the lock held"
    );
    let rows = ledger.runs(Some(name), 10_000).await.expect("runs");
    let mut ledger_slots: Vec<OffsetDateTime> = rows.iter().map(|row| row.slot).collect();
    ledger_slots.sort();
    let run_slots: Vec<OffsetDateTime> = runs.runs_per_slot.keys().copied().collect();
    assert_eq!(
        ledger_slots, run_slots,
        "the ledger's rows are the slots run"
    );
    let latest = rows.iter().map(|row| row.slot).max();
    for row in &rows {
        assert_eq!(row.attempt, 1, "{row:?}");
        // The run the drop interrupted stays `running`, for the next firing to settle.
        if Some(row.slot) != latest {
            assert_eq!(row.outcome, Outcome::Succeeded, "{row:?}");
        }
    }
    println!(
        "run_every_slot, hosts skewed {LOOP_SKEWS_MS:?} ms: {} slots, each run once; runs per \
         host {:?}",
        runs.runs_per_slot.len(),
        runs.runs_per_host
    );
}
