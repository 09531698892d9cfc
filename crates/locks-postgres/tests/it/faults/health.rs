//! The health model: a held lock whose server stops answering is noticed by keepalive;
//! deadlines hold against a silent server; session settings that would end waits or
//! holds do not; errors carry the server's words; fencing tokens only grow. The
//! keepalive, deadline and error cases run in both modes; session settings and fencing
//! tokens do not change with multiplexing (see the module doc of `faults`).

use std::str::FromStr;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    PermitGuard, ReleaseOutcome, Semaphore,
};
use locks_postgres::tokio_postgres;
use locks_postgres::{PostgresLockManager, install_fencing};

use super::{
    Mode, Watched, admin_at, assert_still_locks, drop_cluster, own_cluster, pool_from,
    test_server_config, timeout, wait_for,
};
use crate::support::{admin, pool, unique_key};

in_both_modes!(a_stopped_backend_under_a_held_lock_is_noticed_by_keepalive);
/// A SIGSTOPped backend under a held lock is noticed by the keepalive (cadence 300 ms,
/// answer timeout 300 ms here): the guard is told `KeepaliveFailed` within cadence +
/// answer timeout + check interval, the connection is closed, and the manager works.
/// Multiplexed, one keepalive serves the connection: its neighbours are told the same.
async fn a_stopped_backend_under_a_held_lock_is_noticed_by_keepalive(mode: Mode) {
    let cluster = own_cluster("the stopped-holder test");
    let mut config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    config.application_name("it-stopped-holder");
    let manager = mode
        .builder(pool_from(config, 2))
        .keepalive(Some(Duration::from_millis(300)))
        .answer_timeout(Duration::from_millis(300))
        .build();
    let lock = Watched::on(admin_at(&cluster.url()).await, unique_key("stopped-holder"));
    let neighbours = mode.neighbours(&manager, &lock.admin).await;
    let guard = manager
        .acquire(&lock.key, AcquireOptions::new())
        .await
        .unwrap();
    neighbours.assert_joined_by(&lock).await;
    // Keepalives answered for a while: the lock is not lost by them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!guard.is_lost(), "answered keepalives keep the lock");
    neighbours.assert_untouched(&lock.admin).await;
    let pid = lock.the_holder().await;
    let stopped = super::server::Continue(pid);
    super::server::signal(pid, "STOP");
    let started = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("a stopped backend is noticed");
    let detected = started.elapsed();
    eprintln!("{mode:?}: a SIGSTOPped holder's backend was noticed after {detected:?}");
    assert_eq!(reason, LostReason::KeepaliveFailed);
    // Bound: cadence + answer timeout + check interval, with slack for a busy machine.
    assert!(detected < Duration::from_secs(3), "{detected:?}");
    assert!(!manager.is_held(&lock.key));
    neighbours.assert_lost(LostReason::KeepaliveFailed).await;
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(
        manager.lost_lock_counts().keepalive_failed,
        1 + neighbours.count() as u64
    );
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Lost(LostReason::KeepaliveFailed)
    );
    drop(stopped);
    lock.until_free("the continued backend to exit with its lock")
        .await;
    assert_still_locks(&manager, &lock.key, "the manager works on a new connection").await;
    drop((lock, manager));
    drop_cluster(cluster);
}

in_both_modes!(a_silent_server_cannot_hold_a_deadline_hostage);
/// A listener that accepts TCP connections and never answers: a bounded acquire
/// returns within its timeout plus the 2 s margin, `try_acquire` within the connect
/// timeout, both with kind `Unreachable`.
async fn a_silent_server_cannot_hold_a_deadline_hostage(mode: Mode) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let accepted = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket); // held open, never answered
        }
    });
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=60");
    let manager = mode
        .builder(locks_postgres::plain_pool(&url, 2).expect("pool"))
        .connect_timeout(Duration::from_secs(1))
        .build();

    let started = Instant::now();
    let error = manager
        .acquire("silent", timeout(Duration::from_secs(1)))
        .await
        .expect_err("nobody answers");
    let elapsed = started.elapsed();
    eprintln!("a 1 s acquire on a silent server returned after {elapsed:?}: {error}");
    assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(error.timeout(), Some(Duration::from_secs(1)));

    let started = Instant::now();
    let error = manager
        .try_acquire("silent")
        .await
        .expect_err("nobody answers");
    let elapsed = started.elapsed();
    eprintln!("try_acquire on a silent server returned after {elapsed:?}: {error}");
    assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    assert_eq!(manager.held_lock_count(), 0);
    accepted.abort();
}

/// `statement_timeout = 1s` on the connection (URL options), and with `lock_timeout =
/// 1s` on the role: a 3 s wait granted at 2 s succeeds, an unbounded wait granted at 2 s
/// succeeds, for a lock and for a semaphore's permit, and a held lock survives 3 s idle.
/// The server's timeouts would cancel the waits at 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_timeout_neither_ends_waits_nor_holds() {
    let role = format!("it_st_{}", std::process::id());
    let admin = admin().await;
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN SUPERUSER; \
             ALTER ROLE {role} SET statement_timeout = '1s'; \
             ALTER ROLE {role} SET lock_timeout = '1s'"
        ))
        .await
        .expect("a role with statement_timeout");
    let mut on_role = test_server_config();
    on_role.user(&role);
    let mut on_url = test_server_config();
    on_url.options("-c statement_timeout=1000");
    let holder = PostgresLockManager::new(pool(1));
    for (what, config) in [("role", on_role), ("URL options", on_url)] {
        let waiter = PostgresLockManager::builder(pool_from(config, 2))
            .keepalive(None)
            .build();
        for options in [timeout(Duration::from_secs(3)), AcquireOptions::new()] {
            let key = unique_key("statement-timeout");
            let guard = holder.acquire(&key, AcquireOptions::new()).await.unwrap();
            let release_later = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
            });
            let started = Instant::now();
            let granted = waiter
                .acquire(&key, options)
                .await
                .unwrap_or_else(|error| panic!("{what}, {options:?}: {error}"));
            assert!(started.elapsed() >= Duration::from_millis(1500), "{what}");
            release_later.await.unwrap();
            // Held 3 s idle, still held.
            tokio::time::sleep(Duration::from_secs(3)).await;
            assert!(!granted.is_lost(), "{what}");
            assert!(holder.try_acquire(&key).await.unwrap().is_none(), "{what}");
            assert_eq!(granted.release().await, ReleaseOutcome::Unlocked, "{what}");
        }
        // A permit's wait likewise, the semaphore's turnstile and slots included.
        for options in [timeout(Duration::from_secs(3)), AcquireOptions::new()] {
            let name = unique_key("statement-timeout-permit");
            let permit = holder
                .acquire_permit(&name, 1, AcquireOptions::new())
                .await
                .unwrap();
            let release_later = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(2)).await;
                assert_eq!(permit.release().await, ReleaseOutcome::Unlocked);
            });
            let started = Instant::now();
            let granted = waiter
                .acquire_permit(&name, 1, options)
                .await
                .unwrap_or_else(|error| panic!("permit, {what}, {options:?}: {error}"));
            assert!(started.elapsed() >= Duration::from_millis(1500), "{what}");
            release_later.await.unwrap();
            assert_eq!(granted.release().await, ReleaseOutcome::Unlocked, "{what}");
        }
    }
    admin
        .batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
        .await
        .ok();
}

in_both_modes!(connection_errors_carry_the_servers_words);
/// A failed connection says why in the server's words, with its SQLSTATE, and a kind
/// that says what to do; the source is the driver's error, and no text repeats down
/// the chain.
async fn connection_errors_carry_the_servers_words(mode: Mode) {
    let mut config = test_server_config();
    config.user("nosuchuser");
    let manager = mode.manager(pool_from(config, 1));
    for result in [
        manager
            .acquire("k", timeout(Duration::from_secs(2)))
            .await
            .err(),
        manager.try_acquire("k").await.err(),
    ] {
        let error = result.expect("no such role");
        assert_eq!(
            error.to_string(),
            "Failed to acquire lock 'k': Database error: role \"nosuchuser\" does not exist (28000)"
        );
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
        let source = std::error::Error::source(&error).expect("a source");
        let driver = source
            .downcast_ref::<tokio_postgres::Error>()
            .expect("the driver's own error");
        assert_eq!(
            driver.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_AUTHORIZATION_SPECIFICATION)
        );
        let mut chain = vec![error.to_string()];
        let mut next = std::error::Error::source(&error);
        while let Some(cause) = next {
            chain.push(cause.to_string());
            next = cause.source();
        }
        assert!(
            !chain
                .iter()
                .any(|text| text.contains("creating a new object")),
            "{chain:?}"
        );
    }
    // Refused: nobody listens on the port.
    let port = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        socket.local_addr().expect("address").port()
    };
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let refused = mode.manager(locks_postgres::plain_pool(&url, 1).expect("pool"));
    let error = refused.try_acquire("k").await.expect_err("refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
    assert!(error.reason().contains("Connection refused"), "{error}");
    // An unknown database: a setting to fix, in the server's words (3D000).
    let mut config = test_server_config();
    config.dbname("no_such_database_here");
    let unknown = mode.manager(pool_from(config, 1));
    let error = unknown
        .try_acquire("k")
        .await
        .expect_err("no such database");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert!(
        error
            .reason()
            .contains("\"no_such_database_here\" does not exist (3D000)"),
        "{error}"
    );
}

/// Fencing: 4 managers (4 sessions, as 4 processes would be) take one key 50 times
/// each; the tokens, in grant order, strictly increase with no duplicate; a stale
/// holder's write carrying an old token is refused by the token check in SQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_and_stop_a_stale_holder() {
    let admin = admin().await;
    install_fencing(&admin)
        .await
        .expect("install the token table");
    install_fencing(&admin)
        .await
        .expect("installing twice is fine");
    let key = unique_key("fencing");
    let table = format!("it_fenced_{}", std::process::id());
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, value text, token bigint); \
             INSERT INTO {table} VALUES (1, 'none', 0) ON CONFLICT DO NOTHING"
        ))
        .await
        .unwrap();
    let grants = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let manager = PostgresLockManager::builder(pool(1)).fencing(true).build();
        let (key, grants) = (key.clone(), std::sync::Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let guard = manager
                    .acquire(&key, timeout(Duration::from_secs(30)))
                    .await
                    .expect("acquire");
                let token = guard.info().fencing_token().expect("fencing is on");
                grants.lock().unwrap().push((worker, token));
                assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let tokens: Vec<i64> = grants
        .lock()
        .unwrap()
        .iter()
        .map(|(_, token)| *token)
        .collect();
    assert_eq!(tokens.len(), 200);
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens in grant order must strictly increase: {tokens:?}"
    );

    // A stale holder: it took the lock, paused, lost it; a newer holder wrote.
    let manager = PostgresLockManager::builder(pool(1)).fencing(true).build();
    let stale = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    let stale_token = stale.info().fencing_token().unwrap();
    stale.release().await;
    let fresh = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    let fresh_token = fresh.info().fencing_token().unwrap();
    assert!(fresh_token > stale_token);
    let write = format!("UPDATE {table} SET value = $1, token = $2 WHERE id = 1 AND token < $2");
    let written = admin
        .execute(&write, &[&"fresh", &fresh_token])
        .await
        .unwrap();
    assert_eq!(written, 1, "the current holder's write goes in");
    let written = admin
        .execute(&write, &[&"stale", &stale_token])
        .await
        .unwrap();
    assert_eq!(written, 0, "the stale holder's write is refused");
    fresh.release().await;
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .unwrap();

    // Fencing on without the table: a clear configuration error, and nothing held.
    let mut config = test_server_config();
    config.options("-c search_path=nowhere_at_all");
    let lost = PostgresLockManager::builder(pool_from(config, 1))
        .fencing(true)
        .build();
    let error = lost
        .acquire(&unique_key("fencing-no-table"), AcquireOptions::new())
        .await
        .expect_err("no token table on this search_path");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert!(error.reason().contains("install_fencing"), "{error}");
    assert_eq!(lost.held_lock_count(), 0);
    wait_for("the failed grant's session to be closed", || async { true }).await;
}
