//! `pglock jobs [KEY] [--json]`: the latest runs of scheduled jobs (`run --once-per`) from
//! the ledger, and with `--schedule` each job's next slot by the server's clock;
//! `--install` creates the ledger table once.

use locks_schedule_postgres::locks_schedule::time::OffsetDateTime;
use locks_schedule_postgres::locks_schedule::{Ledger, RunRecord, Schedule};
use locks_schedule_postgres::{LEDGER_TABLE, PostgresLedger, install_ledger};

use crate::connect::{self, Target};
use crate::exit::{Failure, SOFTWARE, USAGE};
use crate::inspect::rfc3339;
use crate::text::{Say, out};

/// How many rows `pglock jobs` shows.
const ROWS: u32 = 50;

/// What `pglock jobs` shows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Show<'a> {
    /// Only this job.
    pub(crate) key: Option<&'a str>,
    /// One JSON array instead of a table.
    pub(crate) json: bool,
    /// The jobs' schedule, for the next slot.
    pub(crate) schedule: Option<&'a str>,
}

/// `pglock jobs`.
pub(crate) async fn run(
    target: &Target,
    say: Say,
    show: Show<'_>,
    install: bool,
) -> Result<u8, Failure> {
    let schedule = show
        .schedule
        .map(|spec| {
            spec.parse::<Schedule>()
                .map_err(|error| Failure::new(USAGE, format!("--schedule: {error}")))
        })
        .transpose()?;
    let pool = connect::pool(target, 1, "pglock-jobs")?;
    let client = pool
        .get()
        .await
        .map_err(|error| connect::pool_failure(&error, target))?;
    if install {
        install_ledger(&client)
            .await
            .map_err(|error| crate::exit::creation_failure(LEDGER_TABLE, &error, &target.config))?;
        say.say("the ledger table is installed");
        return Ok(0);
    }
    let next = match &schedule {
        Some(schedule) => {
            let now = server_now(&client).await?;
            let slot = schedule
                .slot_at(now)
                .map_err(|error| Failure::new(USAGE, format!("--schedule: {error}")))?;
            Some(slot.next())
        }
        None => None,
    };
    let ledger = connect::table_exists(&client, LEDGER_TABLE).await?;
    drop(client);
    // No ledger table: no job has run on this database (the first run creates it).
    let runs = if ledger {
        PostgresLedger::new(pool)
            .runs(show.key, ROWS)
            .await
            .map_err(|error| crate::once_per::ledger_failure(&error))?
    } else {
        Vec::new()
    };
    if show.json {
        let rows: Vec<serde_json::Value> = runs.iter().map(|run| json_row(run, next)).collect();
        out(format_args!("{}\n", serde_json::Value::Array(rows)))?;
    } else {
        out(table(&runs, next))?;
    }
    Ok(0)
}

/// The server's clock, which names the slots.
async fn server_now(
    client: &locks_schedule_postgres::tokio_postgres::Client,
) -> Result<OffsetDateTime, Failure> {
    let micros: i64 = client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
            &[],
        )
        .await
        .map_err(|error| Failure::new(SOFTWARE, crate::exit::chain(&error)))?
        .get(0);
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .map_err(|error| Failure::new(SOFTWARE, format!("the server's clock: {error}")))
}

fn seconds(run: &RunRecord) -> Option<f64> {
    run.finished
        .map(|finished| (finished - run.started).as_seconds_f64())
}

fn json_row(run: &RunRecord, next: Option<OffsetDateTime>) -> serde_json::Value {
    serde_json::json!({
        "name": run.name,
        "slot": rfc3339(run.slot),
        "outcome": run.outcome.as_str(),
        "attempt": run.attempt,
        "holder": run.holder,
        "started": rfc3339(run.started),
        "finished": run.finished.map(rfc3339),
        "seconds": seconds(run),
        "detail": run.detail,
        "next": next.map(rfc3339),
    })
}

fn table(runs: &[RunRecord], next: Option<OffsetDateTime>) -> String {
    let next = next.map_or_else(|| "?".to_owned(), rfc3339);
    let mut rows = vec![
        [
            "JOB", "SLOT", "OUTCOME", "ATTEMPT", "SECONDS", "NEXT", "HOLDER",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for run in runs {
        rows.push(vec![
            run.name.clone(),
            rfc3339(run.slot),
            run.outcome.as_str().to_owned(),
            run.attempt.to_string(),
            seconds(run).map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            next.clone(),
            run.holder.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| {
            rows.iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
