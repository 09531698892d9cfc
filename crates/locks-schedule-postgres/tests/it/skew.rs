//! Five processes whose clocks disagree by up to ±3 s fire at every slot boundary of
//! their own clock (each skipping some), with a 100 ms job that records its run: every
//! slot some host fired in runs exactly once. Two negative controls in the same setting:
//! a plain `try_acquire` runs some slots twice, and so does a ledger keyed by each
//! host's own clock.
//!
//! Each host is a child process of this test binary ([`child_entry`]); its clock is the
//! system clock plus an injected skew, and it decides only when the host fires. The
//! server (and so the ledger) runs on the system clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use locks_port::{DistributedLock, LockGuard};
use locks_postgres::PostgresLockManager;
use locks_schedule::{
    Attempt, Claim, ClaimAnswer, JobContext, Ledger, LedgerError, Outcome, RunRecord, ScheduledJob,
    SlotKind,
};
use throwaway_pg::testing::child::{Child, env, say};
use time::OffsetDateTime;
use tokio_postgres::Client;

use crate::support::{database_url, ledger, pool_on, unique};

const ROLE: &str = "SCHEDULE_CHILD_ROLE";
const HOST: &str = "SCHEDULE_HOST";
const SKEW: &str = "SCHEDULE_SKEW_MS";
const MODE: &str = "SCHEDULE_MODE";
const JOB: &str = "SCHEDULE_JOB";
const TABLE: &str = "SCHEDULE_TABLE";
const FIRST: &str = "SCHEDULE_FIRST_BOUNDARY";
const BOUNDARIES: &str = "SCHEDULE_BOUNDARIES";

/// The hosts' clock skews in milliseconds (host clock = server clock + skew). Their
/// fractions keep every firing at least 100 ms from a server slot boundary, so which
/// slot a firing falls in is not a coin toss.
const SKEWS_MS: [i64; 5] = [-2_700, -1_300, 400, 1_600, 2_900];
/// The job's length.
const JOB_LENGTH: Duration = Duration::from_millis(100);

/// The entry point of child processes; a no-op in a normal test run.
#[test]
fn child_entry() {
    throwaway_pg::testing::child::entry(ROLE, |role, runtime| match role {
        "fire" => runtime.block_on(child_fire()),
        "crash" => runtime.block_on(crate::crash::child_crash()),
        other => panic!("unknown {ROLE} {other:?}"),
    });
}

/// How a host makes sure a slot runs once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `run_once_per_slot` on the PostgreSQL ledger: the server's clock names the slot.
    Ledger,
    /// A plain `try_acquire` around the job (the control).
    TryAcquire,
    /// `run_once_per_slot` on a ledger whose clock is the host's own (the control).
    HostLedger,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Ledger => "ledger",
            Self::TryAcquire => "try_acquire",
            Self::HostLedger => "host_ledger",
        }
    }
}

/// Whether host `host` skips its `k`-th boundary: two hosts of five skip each boundary,
/// a different pair each time, so no host fires at every boundary.
fn skips(host: usize, k: u64) -> bool {
    (7 * k + 3 * host as u64) % 5 < 2
}

/// The child: fires at each of `BOUNDARIES` whole seconds of its own clock from
/// `FIRST_BOUNDARY` (unix seconds, host clock), skipping some, and records each firing.
async fn child_fire() {
    let host: usize = env(HOST).parse().expect("a host number");
    let skew = time::Duration::milliseconds(env(SKEW).parse().expect("a skew"));
    let first: i64 = env(FIRST).parse().expect("a unix second");
    let boundaries: u64 = env(BOUNDARIES).parse().expect("a count");
    let table = env(TABLE);
    let name = env(JOB);
    let mode = match env(MODE).as_str() {
        "ledger" => Mode::Ledger,
        "try_acquire" => Mode::TryAcquire,
        "host_ledger" => Mode::HostLedger,
        other => panic!("unknown mode {other}"),
    };
    let url = database_url();
    let client = Arc::new(throwaway_pg::testing::connect(&url).await);
    let locks = PostgresLockManager::new(pool_on(&url, 2));
    let ledger = ledger().await;
    let job =
        ScheduledJob::new(name.clone(), "1s".parse().expect("1s")).holder(format!("host-{host}"));
    let host_ledger = HostClockLedger {
        client: Arc::clone(&client),
        skew,
        table: table.clone(),
    };
    let host_now = || OffsetDateTime::now_utc() + skew;
    say("ready");
    for k in 0..boundaries {
        let boundary = OffsetDateTime::from_unix_timestamp(first + i64::try_from(k).expect("k"))
            .expect("a time");
        let wait = Duration::try_from(boundary - host_now()).unwrap_or(Duration::ZERO);
        tokio::time::sleep(wait).await;
        if skips(host, k) {
            continue;
        }
        let firing_slot: OffsetDateTime = client
            .query_one(
                "SELECT to_timestamp(floor(extract(epoch FROM clock_timestamp())))",
                &[],
            )
            .await
            .expect("the server's clock")
            .get(0);
        let record = |claimed: Option<OffsetDateTime>| {
            let client = Arc::clone(&client);
            let insert = format!(
                "INSERT INTO {table}_runs (host, db_slot, claimed_slot) VALUES \
                 ($1, to_timestamp(floor(extract(epoch FROM clock_timestamp()))), $2)"
            );
            async move {
                client
                    .execute(&insert, &[&i32::try_from(host).expect("host"), &claimed])
                    .await
                    .map_err(|error| error.to_string())?;
                tokio::time::sleep(JOB_LENGTH).await;
                Ok::<(), String>(())
            }
        };
        let verdict = match mode {
            Mode::Ledger | Mode::HostLedger => {
                let job_run = |context: JobContext| record(Some(context.slot.start()));
                let report = if mode == Mode::Ledger {
                    job.run_once_per_slot(&locks, &ledger, job_run).await
                } else {
                    job.run_once_per_slot(&locks, &host_ledger, job_run).await
                };
                format!("{:?}", report.expect("a firing").verdict)
            }
            Mode::TryAcquire => match locks.try_acquire(&name).await.expect("try_acquire") {
                Some(guard) => {
                    record(None).await.expect("record");
                    guard.release().await;
                    "ran".to_owned()
                }
                None => "busy".to_owned(),
            },
        };
        client
            .execute(
                &format!(
                    "INSERT INTO {table}_firings (host, k, slot, verdict) VALUES ($1, $2, $3, $4)"
                ),
                &[
                    &i32::try_from(host).expect("host"),
                    &i64::try_from(k).expect("k"),
                    &firing_slot,
                    &verdict,
                ],
            )
            .await
            .expect("record the firing");
    }
    say("done");
}

/// The control's ledger: the slot comes from the host's clock and a claim is a plain
/// insert of `(name, slot)`, with no check against the server's clock.
struct HostClockLedger {
    client: Arc<Client>,
    skew: time::Duration,
    table: String,
}

impl Ledger for HostClockLedger {
    async fn now(&self) -> Result<OffsetDateTime, LedgerError> {
        Ok(OffsetDateTime::now_utc() + self.skew)
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        if claim.kind == SlotKind::Previous {
            return Ok(ClaimAnswer::NothingToDo);
        }
        let inserted = self
            .client
            .execute(
                &format!(
                    "INSERT INTO {}_host_ledger VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    self.table
                ),
                &[&claim.name, &claim.slot.start()],
            )
            .await
            .map_err(|error| LedgerError::new(error.to_string(), None))?;
        Ok(if inserted == 1 {
            ClaimAnswer::Claimed {
                attempt: 1,
                previous: None,
                started: OffsetDateTime::now_utc() + self.skew,
            }
        } else {
            ClaimAnswer::Done(Outcome::Succeeded)
        })
    }

    async fn finish(
        &self,
        _: &Attempt<'_>,
        _: Outcome,
        _: Option<&str>,
    ) -> Result<bool, LedgerError> {
        Ok(true)
    }

    async fn running_before(
        &self,
        _: &str,
        _: OffsetDateTime,
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        Ok(Vec::new())
    }

    async fn abandon_stale(
        &self,
        _: &str,
        _: &[OffsetDateTime],
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        Ok(Vec::new())
    }

    async fn runs(&self, _: Option<&str>, _: u32) -> Result<Vec<RunRecord>, LedgerError> {
        Ok(Vec::new())
    }

    async fn prune(&self, _: OffsetDateTime) -> Result<u64, LedgerError> {
        Ok(0)
    }
}

/// What a fleet of five skewed hosts did: runs per server slot for every slot some host
/// fired in, and the runs outside those slots.
#[derive(Debug)]
struct Fleet {
    runs_per_fired_slot: BTreeMap<OffsetDateTime, i64>,
    runs_elsewhere: i64,
    firings: i64,
    runs_not_in_claimed_slot: i64,
}

impl Fleet {
    fn doubled(&self) -> usize {
        self.runs_per_fired_slot
            .values()
            .filter(|runs| **runs > 1)
            .count()
    }

    fn missed(&self) -> usize {
        self.runs_per_fired_slot
            .values()
            .filter(|runs| **runs == 0)
            .count()
    }
}

/// Runs five hosts in `mode` for `boundaries` boundaries each and collects what ran.
async fn run_fleet(mode: Mode, boundaries: u64) -> Fleet {
    let _ledger = ledger().await;
    let admin = throwaway_pg::testing::admin().await;
    let table = unique("skew");
    admin
        .batch_execute(&format!(
            "CREATE TABLE {table}_runs (host int, db_slot timestamptz, claimed_slot timestamptz); \
             CREATE TABLE {table}_firings (host int, k bigint, slot timestamptz, verdict text); \
             CREATE TABLE {table}_host_ledger (name text, slot timestamptz, PRIMARY KEY (name, slot))"
        ))
        .await
        .expect("tables");
    let now: OffsetDateTime = admin
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .expect("now")
        .get(0);
    // Far enough ahead that the fastest clock (+2.9 s) reaches it after every child started.
    let first = now.unix_timestamp() + 7;
    let job = unique("skewed_job");
    let mut children: Vec<Child> = SKEWS_MS
        .iter()
        .enumerate()
        .map(|(host, skew)| {
            Child::spawn(
                format!("{} host {host} (skew {skew} ms)", mode.name()),
                "skew::child_entry",
                [
                    (ROLE, "fire".to_owned()),
                    (HOST, host.to_string()),
                    (SKEW, skew.to_string()),
                    (MODE, mode.name().to_owned()),
                    (JOB, job.clone()),
                    (TABLE, table.clone()),
                    (FIRST, first.to_string()),
                    (BOUNDARIES, boundaries.to_string()),
                ],
            )
        })
        .collect();
    for child in &mut children {
        child.expect("ready").await;
    }
    // Slower than the answer bound of one message: wait in rounds.
    for child in &mut children {
        loop {
            match tokio::time::timeout(Duration::from_secs(50), child.expect("done")).await {
                Ok(_) => break,
                Err(_) => continue,
            }
        }
    }
    let rows = admin
        .query(
            &format!(
                "SELECT f.slot, (SELECT count(*) FROM {table}_runs r WHERE r.db_slot = f.slot) \
                 FROM (SELECT DISTINCT slot FROM {table}_firings) f ORDER BY 1"
            ),
            &[],
        )
        .await
        .expect("runs per slot");
    let runs_per_fired_slot = rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    let count = |sql: String| {
        let admin = &admin;
        async move {
            admin
                .query_one(&sql, &[])
                .await
                .expect("a count")
                .get::<_, i64>(0)
        }
    };
    let fleet = Fleet {
        runs_per_fired_slot,
        runs_elsewhere: count(format!(
            "SELECT count(*) FROM {table}_runs WHERE db_slot NOT IN (SELECT slot FROM {table}_firings)"
        ))
        .await,
        firings: count(format!("SELECT count(*) FROM {table}_firings")).await,
        runs_not_in_claimed_slot: count(format!(
            "SELECT count(*) FROM {table}_runs WHERE claimed_slot IS NOT NULL AND claimed_slot <> db_slot"
        ))
        .await,
    };
    let total: i64 = fleet.runs_per_fired_slot.values().sum();
    println!(
        "{}: {} firings over {} server slots, {total} runs, {} slots run twice or more, {} missed, max {} runs in a slot",
        mode.name(),
        fleet.firings,
        fleet.runs_per_fired_slot.len(),
        fleet.doubled(),
        fleet.missed(),
        fleet
            .runs_per_fired_slot
            .values()
            .max()
            .copied()
            .unwrap_or(0)
    );
    fleet
}

/// The property: with the server's clock naming the slot, every slot some host fired in
/// ran exactly once, although hosts disagree by up to 5.6 s and skip firings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_hosts_run_each_fired_slot_exactly_once() {
    let fleet = run_fleet(Mode::Ledger, 60).await;
    assert_eq!(
        fleet.firings,
        60 * 3,
        "three of five hosts fire at each boundary"
    );
    assert!(fleet.runs_per_fired_slot.len() >= 60, "{fleet:?}");
    assert_eq!(fleet.doubled(), 0, "slots run twice: {fleet:?}");
    assert_eq!(fleet.missed(), 0, "slots fired in but not run: {fleet:?}");
    assert_eq!(fleet.runs_elsewhere, 0, "{fleet:?}");
    assert_eq!(
        fleet.runs_not_in_claimed_slot, 0,
        "a job ran outside its slot: {fleet:?}"
    );
}

/// Control: a lock alone lets a job shorter than the skew run twice in a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plain_try_acquire_runs_slots_twice() {
    let fleet = run_fleet(Mode::TryAcquire, 20).await;
    assert!(
        fleet.doubled() > 0,
        "the control should run some slot twice: {fleet:?}"
    );
}

/// Control: a ledger keyed by each host's own clock runs some slots twice (and others
/// not at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_ledger_on_host_clocks_runs_slots_twice() {
    let fleet = run_fleet(Mode::HostLedger, 20).await;
    assert!(
        fleet.doubled() > 0,
        "the control should run some slot twice: {fleet:?}"
    );
}
