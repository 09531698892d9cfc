//! The PostgreSQL ledger and the in-memory one write the same rows for the same claims.

use std::future::Future;
use std::num::NonZeroU32;

use locks_schedule::{
    Attempt, Claim, ClaimAnswer, CrashPolicy, Ledger, MemoryLedger, MissedSlots, Outcome,
    RunRecord, Schedule, SlotKind, SystemClock,
};

use locks_schedule_postgres::{PostgresLedger, install_ledger};

use crate::support::{database_url, ledger, pool_on, rows_kept, unique};

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

/// Claims the current slot of `name` on `ledger`, under at-least-once (3 attempts).
async fn claim(ledger: &impl Ledger, name: &str, holder: &str) -> ClaimAnswer {
    // The longest period: both ledgers' claims fall in one slot but once a year.
    let schedule: Schedule = "every 366d".parse().expect("a schedule");
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

/// `runs` lists a slot's rows by job name in the same order on both ledgers, whatever
/// the collation: here the ledger's `name` column collates by ICU's `en-US` (where `a`
/// sorts before `B`, as in a database whose default collation follows a language's
/// rules, as most production ones do), while the memory ledger sorts names by their
/// bytes (`B` before `a`). A column's collation rather than a database's default, which
/// can be ICU's only from PostgreSQL 15: the test runs on 13-18 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_lists_names_in_the_same_order_on_both_ledgers_whatever_the_collation() {
    let admin = throwaway_pg::testing::connect(&database_url()).await;
    let database = unique("agree_collation");
    admin
        .batch_execute(&format!("CREATE DATABASE {database} TEMPLATE template0"))
        .await
        .expect("a database of the test's own");
    let base = database_url();
    let (before, query) = base
        .split_once('?')
        .map_or((base.as_str(), ""), |(b, q)| (b, q));
    let (server, _) = before.rsplit_once('/').expect("a database in the URL");
    let url = if query.is_empty() {
        format!("{server}/{database}")
    } else {
        format!("{server}/{database}?{query}")
    };
    let client = throwaway_pg::testing::connect(&url).await;
    install_ledger(&client).await.expect("install the ledger");
    let icu = "ALTER TABLE scheduled_job_runs ALTER COLUMN name TYPE text COLLATE \"en-US-x-icu\"";
    (client.batch_execute(icu).await).expect("the name column collating by ICU's en-US");
    let postgres = PostgresLedger::new(pool_on(&url, 2));
    let memory = MemoryLedger::new(SystemClock);
    let mut listed = Vec::new();
    for ledger in [&postgres as &dyn NamesRuns, &memory] {
        listed.push(ledger.claim_and_list().await);
    }
    drop(client);
    drop(postgres);
    let _ = admin
        .batch_execute(&format!("DROP DATABASE {database} WITH (FORCE)"))
        .await;
    assert_eq!(listed[0], listed[1], "PostgreSQL, then memory");
}

/// Claims the current slot of the jobs `B` and `a`, then lists the names `runs` gives.
trait NamesRuns: Sync {
    fn claim_and_list(&self) -> std::pin::Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>>;
}

impl<L: Ledger> NamesRuns for L {
    fn claim_and_list(&self) -> std::pin::Pin<Box<dyn Future<Output = Vec<String>> + Send + '_>> {
        Box::pin(async move {
            for name in ["B", "a"] {
                let ClaimAnswer::Claimed { .. } = claim(self, name, "h").await else {
                    panic!("{name}'s first claim runs");
                };
            }
            let runs = self.runs(None, 10).await.expect("rows");
            runs.into_iter().map(|row| row.name).collect()
        })
    }
}
