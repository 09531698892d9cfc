//! The ledger's errors and bounds.

use std::time::Duration;

use locks_schedule::{JobContext, Ledger, RunError, ScheduledJob};
use locks_schedule_postgres::PostgresLedger;

use crate::support::{database_url, ledger, manager, pool_on, unique};

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
    // The remedy is in the message the user sees first, not only down the chain.
    let shown = error.to_string();
    assert!(
        shown.contains("create the ledger once with locks_schedule_postgres::install_ledger"),
        "{shown}"
    );
    assert!(
        shown.contains(r#"relation "scheduled_job_runs" does not exist (42P01)"#),
        "the server's words: {shown}"
    );
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
    assert!(
        error
            .to_string()
            .contains("if it is only slow, raise PostgresLedger::answer_timeout"),
        "{error}"
    );
}

/// A role without privileges on the ledger is told the grant it needs, with the server's
/// words and SQLSTATE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_privileges_is_told_the_grant() {
    let _installed = ledger().await;
    let role = unique("no_grant");
    throwaway_pg::testing::admin()
        .await
        .batch_execute(&format!("CREATE ROLE {role} NOLOGIN"))
        .await
        .expect("a role");
    let separator = if database_url().contains('?') {
        '&'
    } else {
        '?'
    };
    let url = format!("{}{separator}options=-crole%3D{role}", database_url());
    let ledger = PostgresLedger::new(pool_on(&url, 1));
    let error = ledger.runs(None, 1).await.expect_err("no privilege");
    let shown = error.to_string();
    assert!(
        shown.contains("permission denied for table scheduled_job_runs (42501)"),
        "{shown}"
    );
    assert!(
        shown.contains(
            "the ledger's role needs: GRANT SELECT, INSERT, UPDATE, DELETE ON \
             scheduled_job_runs TO <role>"
        ),
        "{shown}"
    );
    let job = ScheduledJob::new("no-grant", "1s".parse().expect("1s"));
    let error = job
        .run_once_per_slot(&manager(), &ledger, |_: JobContext| async {
            Ok::<(), String>(())
        })
        .await
        .expect_err("no privilege");
    assert!(
        error.to_string().contains("GRANT SELECT, INSERT"),
        "{error}"
    );
}

/// A pool whose every connection is in use (and that gives up waiting) names the remedy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_names_its_size_and_the_remedy() {
    let _installed = ledger().await;
    let mut config = deadpool_postgres::Config::new();
    config.url = Some(database_url());
    let mut pool = deadpool_postgres::PoolConfig::new(1);
    pool.timeouts.wait = Some(Duration::from_millis(50));
    config.pool = Some(pool);
    let pool = config
        .create_pool(
            Some(deadpool_postgres::Runtime::Tokio1),
            tokio_postgres::NoTls,
        )
        .expect("a pool");
    let held = pool.get().await.expect("the one connection");
    let error = PostgresLedger::new(pool.clone())
        .now()
        .await
        .expect_err("no connection free");
    assert!(
        error.to_string().contains(
            "all 1 connections of the ledger's pool are in use: give the ledger a larger pool"
        ),
        "{error}"
    );
    drop(held);
}

/// A period too short for a round trip says to lengthen it.
#[test]
fn a_racing_clock_says_to_lengthen_the_period() {
    assert!(
        RunError::ClockRacing
            .to_string()
            .ends_with("give the schedule a longer period"),
        "{}",
        RunError::ClockRacing
    );
}
