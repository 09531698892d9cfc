//! The PostgreSQL ledger and the in-memory one write the same rows for the same claims.

use std::num::NonZeroU32;

use locks_schedule::{
    Attempt, Claim, ClaimAnswer, CrashPolicy, Ledger, MemoryLedger, MissedSlots, Outcome,
    RunRecord, Schedule, SlotKind, SystemClock,
};

use crate::support::{ledger, rows_kept, unique};

/// What a row says apart from its times (each ledger's clock writes those).
fn shown(row: &RunRecord) -> (String, u32, Outcome, Option<String>, bool) {
    (
        row.holder.clone(),
        row.attempt,
        row.outcome,
        row.detail.clone(),
        row.finished.is_some(),
    )
}

/// Claims the day's slot of `name` on `ledger`, under at-least-once (3 attempts).
async fn claim(ledger: &impl Ledger, name: &str, holder: &str) -> ClaimAnswer {
    let schedule: Schedule = "every 1d".parse().expect("a schedule");
    let now = ledger.now().await.expect("the ledger's clock");
    let claim = Claim {
        name,
        slot: schedule.slot_at(now).expect("a slot"),
        kind: SlotKind::Current,
        holder,
        crash: CrashPolicy::AtLeastOnce {
            max_attempts: NonZeroU32::new(3).expect("3"),
        },
        missed: MissedSlots::Skip,
    };
    ledger.claim(&claim).await.expect("a claim")
}

/// A failed attempt, then a runner that died: each retry's row, on both ledgers.
async fn retried_rows(
    ledger: &impl Ledger,
    name: &str,
) -> Vec<(String, u32, Outcome, Option<String>, bool)> {
    let mut seen = Vec::new();
    let latest = async || {
        let rows = ledger.runs(Some(name), 1).await.expect("rows");
        shown(&rows[0])
    };
    let ClaimAnswer::Claimed { attempt: 1, .. } = claim(ledger, name, "a").await else {
        panic!("the first claim runs");
    };
    let slot = ledger.runs(Some(name), 1).await.expect("rows")[0].slot;
    let first = Attempt {
        name,
        slot,
        attempt: 1,
        holder: "a",
    };
    assert!(
        ledger
            .finish(&first, Outcome::Failed, Some("boom"))
            .await
            .expect("finish")
    );
    seen.push(latest().await);
    let ClaimAnswer::Claimed { attempt: 2, .. } = claim(ledger, name, "b").await else {
        panic!("a failure is retried");
    };
    seen.push(latest().await);
    // "b" dies mid-job: its row stays running; "c" retries it.
    let ClaimAnswer::Claimed { attempt: 3, .. } = claim(ledger, name, "c").await else {
        panic!("a dead run is retried");
    };
    seen.push(latest().await);
    seen
}

/// A retry's row: the same on both ledgers while the retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_slot_s_row_is_the_same_on_both_ledgers() {
    let _kept = rows_kept().await;
    let postgres = retried_rows(&ledger().await, &unique("agree-retry")).await;
    let memory = retried_rows(&MemoryLedger::new(SystemClock), "agree-retry").await;
    assert_eq!(postgres, memory);
}
