//! The ledger table and the [`Ledger`] on it.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use locks_schedule::{
    Attempt, Claim, ClaimAnswer, Decision, Ledger, LedgerError, Outcome, RunRecord, SlotRow,
    recorded_detail,
};
use time::OffsetDateTime;

use crate::errors;

/// The ledger table (in the connection's `search_path` schema).
pub const LEDGER_TABLE: &str = "scheduled_job_runs";

/// The statements that create the ledger table, for migration tools: what
/// [`install_ledger`] runs.
pub const LEDGER_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS scheduled_job_runs (\
     name text NOT NULL, \
     slot timestamptz NOT NULL, \
     holder text NOT NULL, \
     attempt integer NOT NULL CHECK (attempt >= 0), \
     started timestamptz NOT NULL, \
     finished timestamptz, \
     outcome text NOT NULL CHECK (outcome IN \
       ('running', 'succeeded', 'failed', 'abandoned', 'missed')), \
     detail text, \
     PRIMARY KEY (name, slot))";

/// The key whose transaction lock [`install_ledger`] holds while it creates the table.
const INSTALL_KEY: &str = "locks-schedule-postgres:install:scheduled_job_runs";

/// How long the ledger waits for any one answer of the server, by default.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

const ROW: &str = "SELECT attempt, outcome FROM scheduled_job_runs \
     WHERE name = $1 AND slot = $2 FOR UPDATE";
const NOW_AND_LATEST: &str = "SELECT clock_timestamp(), \
     (SELECT max(slot) FROM scheduled_job_runs WHERE name = $1)";
const INSERT: &str = "INSERT INTO scheduled_job_runs \
     (name, slot, holder, attempt, started, finished, outcome) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name, slot) DO NOTHING";
const RETRY: &str = "UPDATE scheduled_job_runs \
     SET holder = $3, attempt = $4, started = $5, finished = NULL, outcome = 'running', \
         detail = 'previous attempt: ' || outcome \
     WHERE name = $1 AND slot = $2";
const ABANDON: &str = "UPDATE scheduled_job_runs \
     SET finished = $3, outcome = 'abandoned', detail = 'the runner ' || holder || ' died' \
     WHERE name = $1 AND slot = $2";
const RUNNING_BEFORE: &str = "SELECT slot FROM scheduled_job_runs \
     WHERE name = $1 AND slot < $2 AND outcome = 'running'";
const ABANDON_STALE: &str = "UPDATE scheduled_job_runs \
     SET finished = clock_timestamp(), outcome = 'abandoned', \
         detail = 'the runner ' || holder || ' died' \
     WHERE name = $1 AND slot = ANY($2) AND outcome = 'running' RETURNING slot";
const FINISH: &str = "UPDATE scheduled_job_runs \
     SET finished = clock_timestamp(), outcome = $5, detail = $6 \
     WHERE name = $1 AND slot = $2 AND attempt = $3 AND holder = $4 AND outcome = 'running'";
const RUNS: &str = "SELECT name, slot, holder, attempt, started, finished, outcome, detail \
     FROM scheduled_job_runs WHERE $1::text IS NULL OR name = $1 \
     ORDER BY slot DESC, name COLLATE \"C\" LIMIT $2";
const PRUNE: &str = "DELETE FROM scheduled_job_runs r WHERE slot < $1 \
     AND slot < (SELECT max(slot) FROM scheduled_job_runs l WHERE l.name = r.name)";

/// Creates the ledger table if it does not exist. Run it once per database (a migration,
/// a deploy step); the ledger never creates it on its own. Idempotent, and safe to run
/// from several processes at once: the statement runs in a transaction holding a
/// transaction-scoped advisory lock, because two concurrent `CREATE TABLE IF NOT EXISTS`
/// of a new table can fail with a unique violation in the catalog.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 4)?;
/// let client = pool.get().await?;
/// locks_schedule_postgres::install_ledger(&client).await?; // as install_leader_board(&client)
/// let ledger = locks_schedule_postgres::PostgresLedger::new(pool);
/// # drop(ledger);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The driver's error when the statement fails (for example, no `CREATE` privilege).
pub async fn install_ledger(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    locks_postgres::install_under_lock(client, INSTALL_KEY, LEDGER_SCHEMA).await
}

/// The [`Ledger`] on PostgreSQL: the table [`LEDGER_TABLE`] and the server's
/// `clock_timestamp()` as the clock that names slots. Each claim is one transaction (row
/// locked `FOR UPDATE`, the decision of [`Claim::decide`] written, committed), so no
/// claim is ever half written; the table's key `(name, slot)` refuses a second row for a
/// slot even if the caller's lock did not exclude. A job name with a NUL (which `text`
/// cannot hold) or of more than [`MAX_JOB_NAME`](locks_schedule::MAX_JOB_NAME) bytes
/// (past what the key's index holds), or a holder with a NUL, is refused before the
/// server is asked, as on every ledger; a NUL in a job's error is recorded as U+FFFD
/// ([`recorded_detail`](locks_schedule::recorded_detail)), as on every ledger.
#[derive(Debug, Clone)]
pub struct PostgresLedger {
    pool: Pool,
    answer_timeout: Duration,
}

impl PostgresLedger {
    /// A ledger on the pool's database (the table must exist: [`install_ledger`]).
    #[must_use]
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
        }
    }

    /// How long each operation waits for the server (checkout included) before it fails;
    /// [`DEFAULT_ANSWER_TIMEOUT`] by default. Any duration is accepted: one too long for the
    /// runtime's timer means no limit.
    #[must_use]
    pub fn answer_timeout(mut self, timeout: Duration) -> Self {
        self.answer_timeout = timeout;
        self
    }

    async fn bounded<T>(
        &self,
        what: &str,
        operation: impl Future<Output = Result<T, LedgerError>>,
    ) -> Result<T, LedgerError> {
        locks_postgres::answer_within(self.answer_timeout, operation, || {
            errors::timed_out(what, self.answer_timeout)
        })
        .await
    }

    async fn client(&self, what: &str) -> Result<deadpool_postgres::Object, LedgerError> {
        self.pool
            .get()
            .await
            .map_err(|error| errors::pool(what, error, self.pool.status().max_size))
    }

    /// The first column of `sql`'s rows, slot starts, oldest first.
    async fn slots(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        self.bounded(what, async {
            let client = self.client(what).await?;
            let driver = |error| errors::driver(what, error);
            let rows = client.query(sql, params).await.map_err(driver)?;
            let mut slots = (rows.iter())
                .map(|row| row.try_get(0).map_err(driver))
                .collect::<Result<Vec<OffsetDateTime>, _>>()?;
            slots.sort();
            Ok(slots)
        })
        .await
    }

    async fn claim_in_transaction(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        const WHAT: &str = "claiming a slot";
        let driver = |error| errors::driver(WHAT, error);
        let mut client = self.client(WHAT).await?;
        let transaction = client.transaction().await.map_err(driver)?;
        let slot = claim.slot.start();
        let row = transaction
            .query_opt(ROW, &[&claim.name, &slot])
            .await
            .map_err(driver)?
            .map(|row| -> Result<SlotRow, LedgerError> {
                let attempt: i32 = row.try_get(0).map_err(driver)?;
                let outcome: String = row.try_get(1).map_err(driver)?;
                Ok(SlotRow {
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    outcome: parse_outcome(&outcome)?,
                })
            })
            .transpose()?;
        let clock = transaction
            .query_one(NOW_AND_LATEST, &[&claim.name])
            .await
            .map_err(driver)?;
        let now: OffsetDateTime = clock.try_get(0).map_err(driver)?;
        let latest: Option<OffsetDateTime> = clock.try_get(1).map_err(driver)?;
        let holder = claim.holder;
        let answer = match claim.decide(now, row.as_ref(), latest) {
            Decision::NotDue => return Ok(ClaimAnswer::NotDue { now }),
            Decision::NothingToDo => return Ok(ClaimAnswer::NothingToDo),
            Decision::AlreadyDone(outcome) => return Ok(ClaimAnswer::Done(outcome)),
            Decision::Run => {
                let inserted = transaction
                    .execute(
                        INSERT,
                        &[
                            &claim.name,
                            &slot,
                            &holder,
                            &1_i32,
                            &now,
                            &None::<OffsetDateTime>,
                            &"running",
                        ],
                    )
                    .await
                    .map_err(driver)?;
                if inserted == 0 {
                    // A row appeared since the read: someone claimed without the lock.
                    return Ok(ClaimAnswer::Done(Outcome::Running));
                }
                ClaimAnswer::Claimed {
                    attempt: 1,
                    previous: None,
                    started: now,
                }
            }
            Decision::Retry { attempt, previous } => {
                let attempt_number = i32::try_from(attempt).unwrap_or(i32::MAX);
                transaction
                    .execute(RETRY, &[&claim.name, &slot, &holder, &attempt_number, &now])
                    .await
                    .map_err(driver)?;
                ClaimAnswer::Claimed {
                    attempt,
                    previous: Some(previous),
                    started: now,
                }
            }
            Decision::Abandon => {
                transaction
                    .execute(ABANDON, &[&claim.name, &slot, &now])
                    .await
                    .map_err(driver)?;
                ClaimAnswer::Settled(Outcome::Abandoned)
            }
            Decision::RecordMissed => {
                transaction
                    .execute(
                        INSERT,
                        &[
                            &claim.name,
                            &slot,
                            &holder,
                            &0_i32,
                            &now,
                            &Some(now),
                            &"missed",
                        ],
                    )
                    .await
                    .map_err(driver)?;
                ClaimAnswer::Settled(Outcome::Missed)
            }
        };
        transaction.commit().await.map_err(driver)?;
        Ok(answer)
    }
}

fn parse_outcome(text: &str) -> Result<Outcome, LedgerError> {
    Outcome::from_name(text).ok_or_else(|| {
        LedgerError::new(format!("unknown outcome {text:?} in {LEDGER_TABLE}"), None)
    })
}

impl Ledger for PostgresLedger {
    async fn now(&self) -> Result<OffsetDateTime, LedgerError> {
        const WHAT: &str = "reading the database's clock";
        self.bounded(WHAT, async {
            let client = self.client(WHAT).await?;
            let row = client
                .query_one("SELECT clock_timestamp()", &[])
                .await
                .map_err(|error| errors::driver(WHAT, error))?;
            row.try_get(0).map_err(|error| errors::driver(WHAT, error))
        })
        .await
    }

    async fn claim(&self, claim: &Claim<'_>) -> Result<ClaimAnswer, LedgerError> {
        // A name `text` or the key's index cannot hold fails as on every ledger, before
        // anything is asked of the server (likewise in each method that takes a name).
        LedgerError::check_name(claim.name)?;
        LedgerError::check_holder(claim.name, claim.holder)?;
        self.bounded("claiming a slot", self.claim_in_transaction(claim))
            .await
    }

    async fn finish(
        &self,
        attempt: &Attempt<'_>,
        outcome: Outcome,
        detail: Option<&str>,
    ) -> Result<bool, LedgerError> {
        const WHAT: &str = "recording a run's outcome";
        LedgerError::check_name(attempt.name)?;
        LedgerError::check_holder(attempt.name, attempt.holder)?;
        // The job's error as every ledger records it (a NUL, which `text` cannot hold,
        // as U+FFFD): recording a run never fails because of its words.
        let detail = detail.map(recorded_detail);
        self.bounded(WHAT, async {
            let client = self.client(WHAT).await?;
            let number = i32::try_from(attempt.attempt).unwrap_or(i32::MAX);
            let updated = client
                .execute(
                    FINISH,
                    &[
                        &attempt.name,
                        &attempt.slot,
                        &number,
                        &attempt.holder,
                        &outcome.as_str(),
                        &detail.as_deref(),
                    ],
                )
                .await
                .map_err(|error| errors::driver(WHAT, error))?;
            Ok(updated == 1)
        })
        .await
    }

    async fn running_before(
        &self,
        name: &str,
        before: OffsetDateTime,
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        const WHAT: &str = "reading earlier runs still running";
        LedgerError::check_name(name)?;
        self.slots(WHAT, RUNNING_BEFORE, &[&name, &before]).await
    }

    async fn abandon_stale(
        &self,
        name: &str,
        slots: &[OffsetDateTime],
    ) -> Result<Vec<OffsetDateTime>, LedgerError> {
        const WHAT: &str = "abandoning earlier runs of dead runners";
        LedgerError::check_name(name)?;
        self.slots(WHAT, ABANDON_STALE, &[&name, &slots]).await
    }

    async fn runs(&self, name: Option<&str>, limit: u32) -> Result<Vec<RunRecord>, LedgerError> {
        const WHAT: &str = "reading runs";
        name.map_or(Ok(()), LedgerError::check_name)?;
        self.bounded(WHAT, async {
            let client = self.client(WHAT).await?;
            let driver = |error| errors::driver(WHAT, error);
            let rows = client
                .query(RUNS, &[&name, &i64::from(limit)])
                .await
                .map_err(driver)?;
            rows.iter()
                .map(|row| {
                    let name: String = row.try_get(0).map_err(driver)?;
                    let attempt: i32 = row.try_get(3).map_err(driver)?;
                    let outcome: String = row.try_get(6).map_err(driver)?;
                    let holder: String = row.try_get(2).map_err(driver)?;
                    let mut record = RunRecord::new(
                        &name,
                        row.try_get(1).map_err(driver)?,
                        &holder,
                        u32::try_from(attempt).unwrap_or(0),
                        row.try_get(4).map_err(driver)?,
                        parse_outcome(&outcome)?,
                    );
                    record.finished = row.try_get(5).map_err(driver)?;
                    record.detail = row.try_get(7).map_err(driver)?;
                    Ok(record)
                })
                .collect()
        })
        .await
    }

    async fn prune(&self, before: OffsetDateTime) -> Result<u64, LedgerError> {
        const WHAT: &str = "pruning the ledger";
        self.bounded(WHAT, async {
            let client = self.client(WHAT).await?;
            client
                .execute(PRUNE, &[&before])
                .await
                .map_err(|error| errors::driver(WHAT, error))
        })
        .await
    }
}
