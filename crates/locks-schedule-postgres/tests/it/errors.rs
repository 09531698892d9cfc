//! The ledger's errors and bounds.

use std::time::Duration;

use locks_schedule::{JobContext, Ledger, RunError, ScheduledJob};
use locks_schedule_postgres::PostgresLedger;

use crate::support::{database_url, ledger, manager, pool_on};

/// Without the table, a firing fails with the server's words, its SQLSTATE and the
/// install hint; nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_named_with_the_install_step() {
    let separator = if database_url().contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!(
        "{}{separator}options=-csearch_path%3Dno_such_schema",
        database_url()
    );
    let ledger = PostgresLedger::new(pool_on(&url, 1));
    let job = ScheduledJob::new("no-table", "1s".parse().expect("1s"));
    let error = job
        .run_once_per_slot(&manager(), &ledger, |_: JobContext| async {
            panic!("nothing runs without a ledger");
            #[allow(unreachable_code)]
            Ok::<(), String>(())
        })
        .await
        .expect_err("no table");
    let RunError::Ledger(error) = error else {
        panic!("{error:?}");
    };
    let message = error.message();
    assert!(message.contains("(42P01)"), "{message}");
    assert!(message.contains("scheduled_job_runs"), "{message}");
    assert!(message.contains("install_ledger"), "{message}");
    let source = std::error::Error::source(&error).expect("the driver's error");
    let driver = source
        .downcast_ref::<tokio_postgres::Error>()
        .expect("a tokio_postgres::Error");
    assert_eq!(
        driver.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
    );
}

/// The answer timeout accepts any duration: `Duration::MAX` means no limit, not an
/// overflow; a zero timeout fails as a timeout instead of hanging or panicking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_timeouts_saturate() {
    let ledger = ledger().await.answer_timeout(Duration::MAX);
    ledger.now().await.expect("no limit");
    let zero = PostgresLedger::new(pool_on(&database_url(), 1)).answer_timeout(Duration::ZERO);
    let error = zero.now().await.expect_err("no time to answer");
    assert!(
        error.message().contains("did not answer within 0ns"),
        "{}",
        error.message()
    );
}
