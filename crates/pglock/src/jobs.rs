//! `pglock jobs [KEY] [--json]`: the latest runs of scheduled jobs (`run --once-per`) from
//! the ledger; `--install` creates the ledger table once.

use locks_schedule_postgres::locks_schedule::{Ledger, RunRecord};
use locks_schedule_postgres::{PostgresLedger, install_ledger};

use crate::connect::{self, Target};
use crate::exit::{Failure, SOFTWARE};
use crate::inspect::rfc3339;
use crate::run::Say;

/// How many rows `pglock jobs` shows.
const ROWS: u32 = 50;

/// `pglock jobs`.
pub(crate) async fn run(
    target: &Target,
    say: Say,
    key: Option<&str>,
    json: bool,
    install: bool,
) -> Result<u8, Failure> {
    let pool = connect::pool(target, 1, "pglock-jobs")?;
    if install {
        let client = pool
            .get()
            .await
            .map_err(|error| connect::pool_failure(&error, target))?;
        install_ledger(&client)
            .await
            .map_err(|error| Failure::new(SOFTWARE, crate::exit::chain(&error)))?;
        say.say("the ledger table is installed");
        return Ok(0);
    }
    let runs = PostgresLedger::new(pool)
        .runs(key, ROWS)
        .await
        .map_err(|error| crate::once_per::ledger_failure(&error))?;
    if json {
        let rows: Vec<serde_json::Value> = runs.iter().map(json_row).collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        print!("{}", table(&runs));
    }
    Ok(0)
}

fn seconds(run: &RunRecord) -> Option<f64> {
    run.finished
        .map(|finished| (finished - run.started).as_seconds_f64())
}

fn json_row(run: &RunRecord) -> serde_json::Value {
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
    })
}

fn table(runs: &[RunRecord]) -> String {
    let mut rows = vec![
        ["JOB", "SLOT", "OUTCOME", "ATTEMPT", "SECONDS", "HOLDER"]
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
            run.holder.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..6)
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
