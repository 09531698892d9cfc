//! The install steps, run at once from many sessions into a schema where their tables do
//! not exist yet: every one succeeds. (Two concurrent `CREATE TABLE IF NOT EXISTS` of a
//! new table can fail with a unique violation in the server's catalog; each install holds
//! a transaction lock of its own meanwhile.)

use locks_postgres::{install_fencing, install_leader_board, install_under_lock, server_words};
use throwaway_pg::testing::{admin, unique};

/// Sessions that install at once.
const SESSIONS: usize = 8;
/// Fresh schemas tried, each a new race.
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installs_run_at_once_from_many_sessions() {
    for round in 0..ROUNDS {
        let schema = unique("installs");
        admin()
            .await
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await
            .expect("schema");
        let mut sessions = Vec::new();
        for _ in 0..SESSIONS {
            let client = admin().await;
            client
                .batch_execute(&format!("SET search_path = {schema}"))
                .await
                .expect("search_path");
            sessions.push(client);
        }
        let installs = sessions.iter().map(|client| async move {
            (
                install_fencing(client).await,
                install_leader_board(client).await,
                install_under_lock(
                    client,
                    "installs-test:install",
                    "CREATE TABLE IF NOT EXISTS installs_a (k text PRIMARY KEY); \
                     CREATE TABLE IF NOT EXISTS installs_b (k text PRIMARY KEY)",
                )
                .await,
            )
        });
        for (session, (fencing, board, own)) in futures_util::future::join_all(installs)
            .await
            .into_iter()
            .enumerate()
        {
            fencing.unwrap_or_else(|error| {
                panic!("round {round} session {session}: fencing: {error:?}")
            });
            board.unwrap_or_else(|error| {
                panic!("round {round} session {session}: board: {error:?}")
            });
            own.unwrap_or_else(|error| {
                panic!("round {round} session {session}: install_under_lock: {error:?}")
            });
        }
        admin()
            .await
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .expect("drop schema");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_install_leaves_the_session_usable_and_says_the_server_s_words() {
    let client = admin().await;
    let error = install_under_lock(
        &client,
        "installs-test:failing",
        "CREATE TABLE IF NOT EXISTS installs_c (k text PRIMARY KEY); \
         CREATE TABLE installs_c (k text PRIMARY KEY)",
    )
    .await
    .expect_err("the second CREATE TABLE fails");
    assert_eq!(
        server_words("installing", &error),
        "installing: relation \"installs_c\" already exists (42P07)"
    );
    let exists: bool = client
        .query_one("SELECT to_regclass('installs_c') IS NOT NULL", &[])
        .await
        .expect("the session is usable after the failed install")
        .get(0);
    assert!(!exists, "the failed install was rolled back whole");
}
