//! Who holds a key: a foreign session holding and two waiting, seen from the server.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use locks_port::DistributedLock;
use locks_postgres::tokio_postgres::{self, Client, NoTls};
use locks_postgres::{
    AdvisoryLockId, LockHolder, LockMode, PostgresLockManager, all_lock_holders, lock_holders,
};
use time::OffsetDateTime;

use crate::support::{admin, database_url, pool, unique_key};

/// What an inspection read says of a pool of `{n}` whose every connection holds a lock.
const FULL_POOL_READ: &str = "could not ask who holds advisory locks: no pool connection was \
     free to look with (all {n} in use; each held lock keeps one)";

/// A plain session with `application_name` set, and its backend pid.
async fn session(application_name: &str) -> (Client, i32) {
    let mut config: tokio_postgres::Config = database_url().parse().expect("URL");
    config.application_name(application_name);
    let (client, connection) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(connection);
    let pid = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    (client, pid)
}

/// Starts `sql` on a session of its own, which blocks; returns once the server shows the
/// session waiting for `lock_id`.
async fn start_waiting(
    admin: &Client,
    application_name: &str,
    sql: String,
    lock_id: i64,
) -> (i32, tokio::task::JoinHandle<()>) {
    let (client, pid) = session(application_name).await;
    let task = tokio::spawn(async move {
        client.batch_execute(&sql).await.expect("the waiter's lock");
    });
    for _ in 0..200 {
        let waiting = lock_holders(admin, lock_id)
            .await
            .expect("holders")
            .iter()
            .any(|holder| holder.pid == Some(pid) && !holder.granted);
        if waiting {
            return (pid, task);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("session {pid} never waited for {lock_id}");
}

fn assert_session(holder: &LockHolder, pid: i32, application_name: &str) {
    assert_eq!(holder.pid, Some(pid));
    assert_eq!(holder.application_name.as_deref(), Some(application_name));
    assert_eq!(
        holder.client_addr,
        Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        "{holder:?}"
    );
    assert!(holder.client_port.is_some());
    let started = holder.backend_start.expect("backend_start");
    assert!(started <= OffsetDateTime::now_utc() + Duration::from_secs(5));
    assert!(started > OffsetDateTime::now_utc() - Duration::from_secs(600));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_holder_and_two_waiters_in_queue_order() {
    let manager = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("inspect");
    let id = manager.lock_id(&key);

    let (holder, holder_pid) = session("foreign-app").await;
    holder
        .batch_execute(&format!("SELECT pg_advisory_lock({id})"))
        .await
        .expect("the foreign lock");
    assert!(
        manager
            .holders(&unique_key("nobody"))
            .await
            .expect("holders")
            .is_empty()
    );

    let (first_pid, first) = start_waiting(
        &admin,
        "waiter-1",
        format!("SELECT pg_advisory_lock({id}); SELECT pg_advisory_unlock_all()"),
        id,
    )
    .await;
    let (second_pid, second) = start_waiting(
        &admin,
        "waiter-2",
        format!("BEGIN; SELECT pg_advisory_xact_lock_shared({id}); COMMIT"),
        id,
    )
    .await;

    let holders = manager.holders(&key).await.expect("holders");
    assert_eq!(holders.len(), 3, "{holders:#?}");
    let [held, waiting_first, waiting_second] = &holders[..] else {
        unreachable!()
    };
    assert_session(held, holder_pid, "foreign-app");
    assert!(held.granted);
    assert_eq!(held.mode, LockMode::Exclusive);
    assert_eq!(held.waiting_since, None);
    assert!(!held.ours);
    assert_eq!(held.holder_id, None);

    assert_session(waiting_first, first_pid, "waiter-1");
    assert!(!waiting_first.granted);
    assert_eq!(waiting_first.mode, LockMode::Exclusive);
    assert_session(waiting_second, second_pid, "waiter-2");
    assert!(!waiting_second.granted);
    assert_eq!(waiting_second.mode, LockMode::Shared);
    // Version-gated: `pg_locks.waitstart` exists from PostgreSQL 14; before, a waiter has no
    // start time and the queue order comes from pg_blocking_pids alone (checked above).
    if crate::support::server_version_num(&admin).await >= 140_000 {
        let since_first = waiting_first
            .waiting_since
            .expect("waitstart (PostgreSQL 14+)");
        let since_second = waiting_second.waiting_since.expect("waitstart");
        assert!(since_first <= since_second);
    } else {
        assert_eq!(waiting_first.waiting_since, None, "no waitstart before 14");
        assert_eq!(waiting_second.waiting_since, None, "no waitstart before 14");
    }
    for holder in &holders {
        assert_eq!(holder.lock, AdvisoryLockId::Int8(id));
    }

    // The free function on a plain client says the same; every lock lists them too.
    assert_eq!(lock_holders(&admin, id).await.expect("holders"), holders);
    let all = manager.holders_of_all().await.expect("all");
    let of_key: Vec<&LockHolder> = all
        .iter()
        .filter(|holder| holder.lock.as_int8() == Some(id))
        .collect();
    assert_eq!(of_key, holders.iter().collect::<Vec<_>>());
    let all_on_client = all_lock_holders(&admin).await.expect("all");
    assert!(holders.iter().all(|holder| all_on_client.contains(holder)));

    // The holder lets go: the first waiter gets it, then the second.
    holder
        .batch_execute("SELECT pg_advisory_unlock_all()")
        .await
        .expect("unlock");
    first.await.expect("first waiter");
    second.await.expect("second waiter");
    assert!(manager.holders(&key).await.expect("holders").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_sessions_are_told_apart_by_application_name() {
    let admin = admin().await;
    let key = unique_key("inspect-ours");
    let id = locks_port::lock_id(&key);
    let (ours, pid) = session("locks:worker-7").await;
    ours.batch_execute(&format!("SELECT pg_advisory_lock_shared({id})"))
        .await
        .expect("lock");
    let (anonymous, anonymous_pid) = session("locks:").await;
    anonymous
        .batch_execute(&format!("SELECT pg_advisory_lock_shared({id})"))
        .await
        .expect("lock");
    let holders = lock_holders(&admin, id).await.expect("holders");
    assert_eq!(holders.len(), 2, "{holders:#?}");
    let by_pid = |pid| {
        holders
            .iter()
            .find(|holder| holder.pid == Some(pid))
            .expect("listed")
    };
    assert!(by_pid(pid).ours);
    assert_eq!(by_pid(pid).holder_id.as_deref(), Some("worker-7"));
    assert_eq!(by_pid(pid).mode, LockMode::Shared);
    assert!(by_pid(anonymous_pid).ours);
    assert_eq!(by_pid(anonymous_pid).holder_id, None);
    assert!(holders.iter().all(|holder| holder.granted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_integer_locks_are_listed_with_their_own_ids() {
    let admin = admin().await;
    let (session, pid) = session("pair").await;
    session
        .batch_execute("SELECT pg_advisory_lock(-7, 2147483647)")
        .await
        .expect("lock");
    let all = all_lock_holders(&admin).await.expect("all");
    let mine: Vec<&LockHolder> = all.iter().filter(|h| h.pid == Some(pid)).collect();
    assert_eq!(mine.len(), 1, "{all:#?}");
    assert_eq!(mine[0].lock, AdvisoryLockId::Int4Pair(-7, i32::MAX));
    assert_eq!(mine[0].lock.as_int8(), None);
}

/// Every read of a manager whose every pool connection holds a lock answers within the
/// connect timeout, with the documented pool error, instead of waiting for a release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_on_a_full_pool_answer_within_the_connect_timeout() {
    use locks_leader::LeaderElection;
    use locks_port::{AcquireOptions, AcquisitionErrorKind, DistributedLock, Semaphore};
    use locks_postgres::InspectError;
    use locks_postgres::deadpool_postgres::{PoolError, TimeoutType};

    let bound = Duration::from_millis(500);
    // Generous: the bound plus a loaded machine's scheduling.
    let within = bound + Duration::from_secs(3);
    let manager = PostgresLockManager::builder(pool(2))
        .connect_timeout(bound)
        .build();
    let mut guards = Vec::new();
    for n in 0..2 {
        let key = unique_key(&format!("full-pool-{n}"));
        let guard = manager.acquire(&key, AcquireOptions::new()).await;
        guards.push(guard.expect("a lock per pool connection"));
    }
    let key = unique_key("full-pool-read");

    let started = std::time::Instant::now();
    let read = tokio::time::timeout(within, manager.holders(&key)).await;
    let error = read
        .expect("holders answered in time")
        .expect_err("no connection");
    assert!(
        matches!(
            error,
            InspectError::PoolFull {
                source: PoolError::Timeout(TimeoutType::Wait),
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(error.to_string(), FULL_POOL_READ.replace("{n}", "2"));
    assert!(started.elapsed() >= bound, "waited {:?}", started.elapsed());

    let read = tokio::time::timeout(within, manager.holders_of_all()).await;
    let error = read
        .expect("holders_of_all answered in time")
        .expect_err("no connection");
    assert!(matches!(error, InspectError::PoolFull { .. }), "{error:?}");
    assert_eq!(error.to_string(), FULL_POOL_READ.replace("{n}", "2"));

    let read = tokio::time::timeout(within, manager.permit_holders(&key)).await;
    let error = read
        .expect("permit_holders answered in time")
        .expect_err("no connection");
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::PoolUnavailable,
        "{error}"
    );

    let election = LeaderElection::new(manager.clone(), key.clone());
    let read = tokio::time::timeout(within, election.who_leads()).await;
    let error = read
        .expect("who_leads answered in time")
        .expect_err("no connection");
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::PoolUnavailable,
        "{error}"
    );

    // Once a lock is released, the reads work again.
    drop(guards.pop());
    let answered = tokio::time::timeout(within, manager.holders(&key)).await;
    assert!(answered.expect("in time").expect("a connection").is_empty());
}

/// A read on a pool of 1 whose connection holds a lock says what an acquisition says of
/// that pool (`all 1 in use; each held lock keeps one`), for every inspection read: the
/// text comes from one place. Once the lock is released the same reads answer (the
/// control: the error is the full pool's, not the reads').
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_on_a_full_pool_says_what_an_acquisition_says() {
    use locks_port::{AcquisitionErrorKind, DistributedLock, LockGuard, Semaphore};
    use locks_postgres::InspectError;

    let full_pool = "(all 1 in use; each held lock keeps one)";
    let manager = PostgresLockManager::builder(pool(1))
        .connect_timeout(Duration::from_millis(300))
        .build();
    let key = unique_key("full-pool-of-one");
    let guard = manager.acquire(&key, Duration::from_secs(5)).await.unwrap();

    let acquisition = manager
        .try_acquire(&unique_key("full-pool-of-one-other"))
        .await
        .expect_err("no connection is free");
    assert_eq!(acquisition.kind(), AcquisitionErrorKind::PoolUnavailable);
    assert!(acquisition.reason().ends_with(full_pool), "{acquisition}");

    let expected = FULL_POOL_READ.replace("{n}", "1");
    let error = manager.holders(&key).await.expect_err("the pool is full");
    assert!(matches!(error, InspectError::PoolFull { .. }), "{error:?}");
    assert_eq!(error.to_string(), expected);
    assert!(std::error::Error::source(&error).is_some());
    let error = manager
        .holders_of_all()
        .await
        .expect_err("the pool is full");
    assert_eq!(error.to_string(), expected);
    let error = manager
        .lock_table_usage()
        .await
        .expect_err("the pool is full");
    assert_eq!(error.to_string(), expected);
    let error = manager
        .permit_holders("full-pool-of-one")
        .await
        .expect_err("the pool is full");
    assert_eq!(error.kind(), AcquisitionErrorKind::PoolUnavailable);
    assert_eq!(
        error.reason(),
        format!("no pool connection was free to look with {full_pool}")
    );

    guard.release().await;
    let holders = manager.holders(&key).await.expect("a free connection");
    assert!(holders.is_empty(), "{holders:?}");
    manager.lock_table_usage().await.expect("a free connection");
}

/// A lock-table gauge asks the server at most once per its interval (and per 100 times
/// its last read's duration): within it every call answers the last reading, after it a
/// new read. Failed as it should against a planted gauge that read on every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_table_gauge_reads_at_most_once_per_interval() {
    let manager = PostgresLockManager::new(pool(8));
    let hourly = manager.lock_table_gauge(Duration::from_secs(3600));
    let eager = manager.lock_table_gauge(Duration::ZERO);
    let (first, eager_first) = (
        hourly.usage().await.expect("a read"),
        eager.usage().await.expect("a read"),
    );
    let mut held = Vec::new();
    for n in 0..5 {
        let key = unique_key(&format!("gauge-{n}"));
        held.push(
            manager
                .try_acquire(&key)
                .await
                .expect("a lock")
                .expect("free"),
        );
    }
    for _ in 0..3 {
        assert_eq!(
            hourly.usage().await.expect("the last reading"),
            first,
            "asked the server again within the hour"
        );
    }
    assert_eq!(hourly.clone().usage().await.expect("shared"), first);
    crate::faults::wait_for("a new reading after the bound", || async {
        eager.usage().await.expect("a read") != eager_first
    })
    .await;
    drop(held);
}

/// A read whose connection the server refuses says why in the server's words, as an
/// acquisition on the same pool does (`role "…" does not exist (28000)`), for every
/// inspection read; the pool's error stays the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_server_refuses_says_why_in_its_words() {
    use locks_postgres::InspectError;

    let mut config: tokio_postgres::Config = database_url().parse().expect("URL");
    config.user("no_such_role_for_reads");
    let manager =
        PostgresLockManager::new(locks_postgres::plain_pool_with_config(config, 1).expect("pool"));
    let words = "role \"no_such_role_for_reads\" does not exist (28000)";
    let acquired = manager
        .acquire("k", Duration::from_secs(5))
        .await
        .expect_err("no such role");
    assert!(acquired.to_string().contains(words), "{acquired}");

    let reads = [
        manager.holders("k").await.expect_err("no such role"),
        manager.holders_of_all().await.expect_err("no such role"),
        manager.lock_table_usage().await.expect_err("no such role"),
    ];
    for error in reads {
        assert!(matches!(error, InspectError::Pool(_)), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!("could not ask who holds advisory locks: no connection: {words}")
        );
        assert!(std::error::Error::source(&error).is_some(), "{error:?}");
    }
}

/// The semaphore's and the leader board's reads (`permit_holders`, `permit_held`,
/// `latest`) acquire nothing: a failed one says it was a read, with what it read, and
/// keeps the server's words (the role it refused) and the kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_permit_or_board_read_says_it_was_a_read() {
    use locks_port::{AcquisitionErrorKind, LeaderBoard, Semaphore};

    let mut config: tokio_postgres::Config = database_url().parse().expect("URL");
    config.user("no_such_role_for_permit_reads");
    let manager =
        PostgresLockManager::new(locks_postgres::plain_pool_with_config(config, 1).expect("pool"));
    let words = "role \"no_such_role_for_permit_reads\" does not exist (28000)";
    let reads = [
        (
            manager
                .permit_holders("exports")
                .await
                .expect_err("no such role"),
            "Failed to read who holds the permits of semaphore 'exports': ",
        ),
        (
            manager
                .permit_held("exports", 2)
                .await
                .expect_err("no such role"),
            "Failed to read whether permit 2 of semaphore 'exports' is held: ",
        ),
        (
            manager.latest("api").await.expect_err("no such role"),
            "Failed to read the latest term of 'api' on the leader board: ",
        ),
    ];
    for (error, starts) in reads {
        let shown = error.to_string();
        assert!(shown.starts_with(starts), "{shown}");
        assert!(shown.contains(words), "the server's words: {shown}");
        assert!(error.is_read(), "{error:?}");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{shown}");
    }
}

/// A read on a pool none of whose connections is in use, against a server that takes
/// the TCP connection and never answers, fails as a connection that could not be opened
/// in time ([`InspectError::Pool`], kind `Unreachable`), as an acquisition does: not as
/// a full pool (`all 1 in use; each held lock keeps one`), which would send the
/// operator to resize a pool that is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_cannot_open_a_connection_does_not_blame_a_full_pool() {
    use locks_port::{AcquisitionErrorKind, LeaderBoard, Semaphore};
    use locks_postgres::InspectError;

    // Takes connections and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let port = silent.local_addr().expect("its address").port();
    let keeper = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            kept.push(socket);
        }
    });
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres");
    let pool = locks_postgres::plain_pool_with_config(config, 1).expect("pool");
    let manager = PostgresLockManager::builder(pool.clone())
        .connect_timeout(Duration::from_millis(300))
        .build();

    let acquired = manager
        .acquire("k", Duration::from_millis(300))
        .await
        .expect_err("a silent server");
    assert_eq!(
        acquired.kind(),
        AcquisitionErrorKind::Unreachable,
        "{acquired}"
    );

    let reads = [
        manager.holders("k").await.expect_err("a silent server"),
        manager.holders_of_all().await.expect_err("a silent server"),
        manager
            .lock_table_usage()
            .await
            .expect_err("a silent server"),
    ];
    for error in reads {
        assert!(matches!(error, InspectError::Pool(_)), "{error}");
    }
    let reads = [
        manager
            .permit_holders("k")
            .await
            .expect_err("a silent server"),
        manager
            .permit_held("k", 0)
            .await
            .expect_err("a silent server"),
        manager.latest("k").await.expect_err("a silent server"),
    ];
    for error in reads {
        assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
        assert!(!error.to_string().contains("in use"), "{error}");
    }
    assert_eq!(pool.status().available, 0, "no connection was ever opened");
    keeper.abort();
}
