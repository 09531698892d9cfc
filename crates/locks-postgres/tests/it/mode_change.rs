//! A held lock's mode changed, as the server sees it.
//!
//! `LockGuard::downgrade`: one shared hold where the exclusive one was, on the same
//! session, and nothing left after the release; a downgrade the server refuses, in its
//! own words, frees the lock and tells the guard; a downgrade dropped part-way closes the
//! session and tells the guard, as one a stalled server never answers does after the
//! answer timeout; multiplexed, a release of a downgraded lock cancelled before it was
//! sent leaves nothing held on the shared connection.
//!
//! `LockGuard::try_upgrade`: one exclusive hold where the shared one was, on the same
//! session, or, refused, the holds as they were; two readers that both try never wait
//! for each other; an upgrade dropped part-way, or not answered, closes the session and
//! tells the guard; multiplexed, a cancelled release of an upgraded lock leaves nothing.
//! (The contract is in the conformance suite, plain and multiplexed.)

use std::future::Future;
use std::str::FromStr;
use std::task::Poll;
use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockError, LockGuard, LockMode,
    LockRegistry, LostReason, ReleaseOutcome,
};
use locks_postgres::deadpool_postgres::Pool;
use locks_postgres::tokio_postgres::{self, Client};
use locks_postgres::{
    LockHolder, PostgresLockGuard, PostgresLockManager, lock_holders, plain_pool_with_config,
};

use crate::faults::server::{Continue, signal};
use crate::faults::{drop_cluster, own_cluster, wait_for};
use crate::recorded::{Recorded, total};
use crate::support::{admin, database_url, pool, unique_key};

/// The granted holds of `lock_id`, as (backend pid, mode).
async fn holds(admin: &Client, lock_id: i64) -> Vec<(Option<i32>, LockMode)> {
    let mut holds: Vec<_> = lock_holders(admin, lock_id)
        .await
        .expect("lock_holders")
        .into_iter()
        .filter(|holder: &LockHolder| holder.granted)
        .map(|holder| (holder.pid, holder.mode))
        .collect();
    holds.sort_by_key(|(pid, mode)| (*pid, *mode == LockMode::Shared));
    holds
}

/// A manager of its own on `pool` takes `key` at once (`why` it must be free), and
/// releases it.
async fn assert_free(pool: Pool, key: &str, why: &str) {
    let other = PostgresLockManager::builder(pool).build();
    let writer = other
        .try_acquire(key)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{why}"));
    assert_eq!(writer.release().await, ReleaseOutcome::Unlocked);
}

/// After the last release: the server holds nothing of `lock_id`, the manager books
/// nothing, its held gauge is back to zero, and its connections are back in the pool.
async fn left_nothing(
    admin: &Client,
    manager: &PostgresLockManager,
    recorded: &Recorded,
    lock_id: i64,
) {
    assert_eq!(holds(admin, lock_id).await, []);
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(total(&recorded.points(), "eventsource.lock.held", &[]), 0.0);
    let status = manager.pool().status();
    assert_eq!(
        status.available, status.size,
        "the connections went back to the pool: {status:?}"
    );
}

fn within(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(timeout)
}

/// The exclusive hold becomes one shared hold of the same backend (the session never
/// let go), the manager's gauge of held locks by mode follows, a second reader of the
/// same manager is booked beside it, and the release leaves nothing held and gives the
/// connection back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_lock_is_one_shared_hold_of_its_session_and_its_release_leaves_nothing() {
    const HELD: &str = "eventsource.lock.held";
    let (exclusive, shared) = (("lock.mode", "exclusive"), ("lock.mode", "shared"));
    let admin = admin().await;
    let recorded = Recorded::new();
    let manager = recorded.manager(2).build();
    let key = unique_key("downgrade_on_the_server");
    let lock_id = locks_port::lock_id(&key);
    let mut guard = manager
        .acquire(&key, within(Duration::from_secs(5)))
        .await
        .expect("acquire");
    let before = holds(&admin, lock_id).await;
    let [(Some(pid), LockMode::Exclusive)] = before[..] else {
        panic!("one exclusive hold before the downgrade, got {before:?}");
    };
    guard.downgrade().await.expect("downgrade");
    assert_eq!(guard.info().mode(), LockMode::Shared);
    assert_eq!(
        holds(&admin, lock_id).await,
        [(Some(pid), LockMode::Shared)],
        "the same session holds the lock shared, and only shared"
    );
    assert_eq!(manager.held_lock_count(), 1);
    let points = recorded.points();
    assert_eq!(total(&points, HELD, &[exclusive]), 0.0, "{points:#?}");
    assert_eq!(total(&points, HELD, &[shared]), 1.0, "{points:#?}");
    // A second reader of the same manager (on a connection of its own) is booked beside
    // the downgraded lock: neither is taken for a second grant of an exclusive lock.
    let reader = manager
        .try_acquire_with(&key, LockMode::Shared)
        .await
        .expect("try_acquire_with")
        .expect("a reader of the same manager gets in");
    assert!(!guard.is_lost(), "the second reader displaced nothing");
    assert_eq!(manager.held_lock_count(), 2);
    assert_eq!(reader.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    left_nothing(&admin, &manager, &recorded, lock_id).await;
}

/// A downgrade the server refuses (EXECUTE on `pg_advisory_lock_shared` revoked, in
/// a database of this test alone) fails with the server's own message; the session is
/// closed, which frees the lock (another session gets it at once), and the guard's lost
/// signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_the_server_refuses_fails_in_its_words_and_frees_the_lock() {
    let admin = admin().await;
    let name = unique_key("downgrade_refused")
        .replace([':', '-'], "_")
        .to_lowercase();
    for statement in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("CREATE DATABASE {name} OWNER {name}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .expect("a role and a database of this test");
    }
    let mut config = tokio_postgres::Config::from_str(&database_url()).expect("URL");
    config.dbname(&name);
    let owner = {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
    };
    owner
        .batch_execute("REVOKE EXECUTE ON FUNCTION pg_advisory_lock_shared(bigint) FROM PUBLIC")
        .await
        .expect("revoke");
    let superuser =
        PostgresLockManager::builder(plain_pool_with_config(config.clone(), 1).expect("pool"))
            .build();
    config.user(&name);
    let manager =
        PostgresLockManager::builder(plain_pool_with_config(config, 1).expect("pool")).build();

    let key = unique_key("downgrade_refused");
    let mut guard = manager
        .acquire(&key, within(Duration::from_secs(5)))
        .await
        .expect("acquire");
    let error = match guard.downgrade().await {
        Err(LockError::Acquisition(error)) => error,
        other => panic!("a refused downgrade must fail as an acquisition error, got {other:?}"),
    };
    assert!(
        error
            .to_string()
            .contains("permission denied for function pg_advisory_lock_shared"),
        "the server's own words: {error}"
    );
    assert_ne!(error.kind(), AcquisitionErrorKind::Timeout);
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the guard is told the lock is gone");
    assert_eq!(reason, LostReason::ConnectionClosed);
    // The server frees the lock once it sees the socket closed: a moment, not a wait.
    let taken = superuser
        .acquire(&key, within(Duration::from_secs(2)))
        .await
        .expect("the closed session freed the lock");
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Lost(LostReason::ConnectionClosed)
    );
    drop((taken, manager, superuser, owner));
    for statement in [
        format!("DROP DATABASE {name} WITH (FORCE)"),
        format!("DROP ROLE {name}"),
    ] {
        admin
            .batch_execute(&statement)
            .await
            .expect("drop the test's database and role");
    }
}

/// A downgrade dropped once it began (one poll: the slot taken, the statement on its
/// way) closes the session, since what it held is not known: the lock is lost, the
/// guard is told, and the key is free for another session.
#[tokio::test]
async fn a_downgrade_dropped_part_way_closes_the_session_and_the_guard_is_told() {
    dropped_part_way("downgrade_dropped", LockMode::Exclusive, async |guard| {
        guard.downgrade().await
    })
    .await;
}

/// A mode change (`change` of a lock held in `mode`) dropped after one poll closes the
/// session and tells the guard. On one thread (the tests' runtime), so that the
/// connection's task cannot run (and the server's answer cannot arrive) during the poll.
async fn dropped_part_way(
    case: &str,
    mode: LockMode,
    change: impl AsyncFnOnce(&mut PostgresLockGuard) -> Result<(), LockError>,
) {
    let admin = admin().await;
    let key = unique_key(case);
    // Nothing else uses the connection (no keepalive, no periodic look), so the one
    // poll finds it free.
    let manager = PostgresLockManager::builder(pool(2))
        .keepalive(None)
        .health_check_interval(Duration::from_secs(3600))
        .build();
    let lock_id = locks_port::lock_id(&key);
    let mut guard = manager
        .acquire(&key, within(Duration::from_secs(5)).with_mode(mode))
        .await
        .expect("acquire");
    assert_eq!(holds(&admin, lock_id).await.len(), 1);
    let mut changing = Box::pin(change(&mut guard));
    let first = std::future::poll_fn(|cx| Poll::Ready(changing.as_mut().poll(cx))).await;
    assert!(
        first.is_pending(),
        "one poll cannot see the server's answer: {first:?}"
    );
    drop(changing);
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the guard is told the lock is gone");
    assert_eq!(reason, LostReason::ConnectionClosed);
    wait_for("the closed session to free the lock", || async {
        holds(&admin, lock_id).await.is_empty()
    })
    .await;
    assert_eq!(
        guard.release().await,
        ReleaseOutcome::Lost(LostReason::ConnectionClosed)
    );
    assert_free(pool(1), &key, "the key is free").await;
}

/// Multiplexed: a downgraded lock and a neighbour share a connection. The neighbour's
/// release holds the connection (its backend SIGSTOPped) while the downgraded lock's
/// release is cancelled before it could be sent; a task then makes sure the session
/// does not hold the lock, checking for the shared hold the downgrade left. Nothing
/// stays held on the connection, which goes back to the pool. (Checking for an
/// exclusive hold, as before the downgrade, leaves the shared hold on a pooled
/// connection: this test fails so.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_of_a_downgraded_multiplexed_lock_leaves_nothing_held() {
    let changed = LockMode::Shared;
    cancelled_multiplexed_release("downgraded", LockMode::Exclusive, changed, async |guard| {
        guard.downgrade().await
    })
    .await;
}

/// Multiplexed, the other way: the release of an upgraded lock, cancelled while its
/// connection is busy, leaves nothing held (the task checks for the exclusive hold the
/// upgrade left, not the shared one it replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_release_of_an_upgraded_multiplexed_lock_leaves_nothing_held() {
    let changed = LockMode::Exclusive;
    cancelled_multiplexed_release("upgraded", LockMode::Shared, changed, async |guard| {
        assert!(guard.try_upgrade().await?, "a lone reader upgrades");
        Ok(())
    })
    .await;
}

/// A lock taken in `mode` and changed (`change`) to `changed` shares a multiplexed
/// connection with a neighbour; its release is cancelled while the neighbour's holds
/// the connection (the backend SIGSTOPped). Nothing stays held on the connection.
async fn cancelled_multiplexed_release(
    case: &str,
    mode: LockMode,
    changed: LockMode,
    change: impl AsyncFnOnce(&mut PostgresLockGuard) -> Result<(), LockError>,
) {
    let cluster = own_cluster("the mode change's stopped-backend test");
    let admin = crate::faults::admin_at(&cluster.url()).await;
    let config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    let manager =
        PostgresLockManager::builder(plain_pool_with_config(config.clone(), 2).expect("pool"))
            .multiplex(4)
            .answer_timeout(Duration::from_secs(30))
            .keepalive(None)
            .build();
    let (first, second) = (unique_key(case), unique_key("neighbour"));
    let (first_id, second_id) = (locks_port::lock_id(&first), locks_port::lock_id(&second));
    let mut changing = manager
        .acquire(&first, within(Duration::from_secs(5)).with_mode(mode))
        .await
        .expect("acquire the first key");
    let neighbour = manager
        .acquire(&second, within(Duration::from_secs(5)))
        .await
        .expect("acquire the second key");
    let pid = holds(&admin, first_id).await[0].0.expect("a backend");
    assert_eq!(
        holds(&admin, second_id).await,
        [(Some(pid), LockMode::Exclusive)],
        "both locks share one connection"
    );
    change(&mut changing).await.expect("the mode change");
    assert_eq!(holds(&admin, first_id).await, [(Some(pid), changed)]);

    signal(pid, "STOP");
    let stopped = Continue(pid);
    let releasing = tokio::spawn(neighbour.release());
    // The neighbour's unlock is sent and holds the connection until the backend runs.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled = tokio::time::timeout(Duration::from_millis(100), changing.release()).await;
    assert!(
        cancelled.is_err(),
        "the release waits for the busy connection"
    );
    signal(pid, "CONT");
    drop(stopped);
    assert_eq!(
        releasing.await.expect("the neighbour's release"),
        ReleaseOutcome::Unlocked
    );
    wait_for("the shared connection to hold nothing", || async {
        holds(&admin, first_id).await.is_empty() && holds(&admin, second_id).await.is_empty()
    })
    .await;
    assert_free(
        plain_pool_with_config(config, 1).expect("pool"),
        &first,
        "nothing holds the changed key",
    )
    .await;
    drop((manager, admin));
    drop_cluster(cluster);
}

/// A downgrade on a server that stops answering (its backend SIGSTOPped) fails after
/// the answer timeout with `ConnectionLost`; the session is closed (the lock is freed
/// once the backend runs again) and the guard is told at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_on_a_server_that_stops_answering_fails_after_the_answer_timeout() {
    stalled("downgrade_stalled", LockMode::Exclusive, async |guard| {
        guard.downgrade().await
    })
    .await;
}

/// An upgrade on a server that stops answering fails the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_on_a_server_that_stops_answering_fails_after_the_answer_timeout() {
    stalled("upgrade_stalled", LockMode::Shared, async |guard| {
        guard.try_upgrade().await.map(|_| ())
    })
    .await;
}

/// A mode change (`change` of a lock held in `mode`) on a server that stops answering
/// fails after the answer timeout with `ConnectionLost`, the guard told at once, and
/// the lock is freed once the backend runs again.
async fn stalled(
    case: &str,
    mode: LockMode,
    change: impl AsyncFnOnce(&mut PostgresLockGuard) -> Result<(), LockError>,
) {
    let cluster = own_cluster("the mode change's stalled-server test");
    let admin = crate::faults::admin_at(&cluster.url()).await;
    let config = tokio_postgres::Config::from_str(&cluster.url()).expect("URL");
    let answer_timeout = Duration::from_millis(300);
    let manager =
        PostgresLockManager::builder(plain_pool_with_config(config.clone(), 1).expect("pool"))
            .answer_timeout(answer_timeout)
            .keepalive(None)
            .build();
    let key = unique_key(case);
    let lock_id = locks_port::lock_id(&key);
    let mut guard = manager
        .acquire(&key, within(Duration::from_secs(5)).with_mode(mode))
        .await
        .expect("acquire");
    let pid = holds(&admin, lock_id).await[0].0.expect("a backend");

    signal(pid, "STOP");
    let stopped = Continue(pid);
    let started = std::time::Instant::now();
    let outcome = change(&mut guard).await;
    let took = started.elapsed();
    let error = match outcome {
        Err(LockError::Acquisition(error)) => error,
        other => panic!("{case}: a change nobody answers must fail, got {other:?}"),
    };
    assert_eq!(
        error.kind(),
        AcquisitionErrorKind::ConnectionLost,
        "{error}"
    );
    assert!(
        error.to_string().contains("within the answer timeout"),
        "{error}"
    );
    assert!(
        took >= answer_timeout && took < Duration::from_secs(5),
        "failed after {took:?}"
    );
    assert_eq!(guard.lost().reason(), Some(LostReason::ConnectionClosed));
    signal(pid, "CONT");
    drop(stopped);
    wait_for("the closed session to free the lock", || async {
        holds(&admin, lock_id).await.is_empty()
    })
    .await;
    assert_free(
        plain_pool_with_config(config, 1).expect("pool"),
        &key,
        "the key is free",
    )
    .await;
    drop((guard, manager, admin));
    drop_cluster(cluster);
}

/// The shared hold becomes one exclusive hold of the same backend, and the manager's
/// gauge of held locks by mode follows. Beside another reader of the same manager (on
/// a connection of its own), the upgrade is refused and both shared holds stay as they
/// were. The release leaves nothing held and gives the connections back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgraded_lock_is_one_exclusive_hold_of_its_session_and_a_refused_one_changes_nothing() {
    const HELD: &str = "eventsource.lock.held";
    let (exclusive, shared) = (("lock.mode", "exclusive"), ("lock.mode", "shared"));
    let admin = admin().await;
    let recorded = Recorded::new();
    let manager = recorded.manager(2).build();
    let key = unique_key("upgrade_on_the_server");
    let lock_id = locks_port::lock_id(&key);
    let reading = || within(Duration::from_secs(5)).with_mode(LockMode::Shared);
    let mut guard = manager.acquire(&key, reading()).await.expect("acquire");
    let other = manager
        .acquire(&key, reading())
        .await
        .expect("a second reader");
    let before = holds(&admin, lock_id).await;
    let [
        (Some(first), LockMode::Shared),
        (Some(second), LockMode::Shared),
    ] = before[..]
    else {
        panic!("two shared holds before the upgrade, got {before:?}");
    };
    assert!(
        !guard
            .try_upgrade()
            .await
            .expect("try_upgrade beside a reader")
    );
    assert_eq!(guard.info().mode(), LockMode::Shared);
    assert_eq!(
        holds(&admin, lock_id).await,
        before,
        "a refused upgrade changes nothing"
    );
    assert_eq!(total(&recorded.points(), HELD, &[shared]), 2.0);

    assert_eq!(other.release().await, ReleaseOutcome::Unlocked);
    let pid = holds(&admin, lock_id).await[0].0;
    assert!(pid == Some(first) || pid == Some(second));
    assert!(guard.try_upgrade().await.expect("try_upgrade alone"));
    assert_eq!(guard.info().mode(), LockMode::Exclusive);
    assert_eq!(
        holds(&admin, lock_id).await,
        [(pid, LockMode::Exclusive)],
        "the same session holds the lock exclusive, and only exclusive"
    );
    let points = recorded.points();
    assert_eq!(total(&points, HELD, &[exclusive]), 1.0, "{points:#?}");
    assert_eq!(total(&points, HELD, &[shared]), 0.0, "{points:#?}");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    left_nothing(&admin, &manager, &recorded, lock_id).await;
}

/// Two readers that both try to upgrade at once are both refused, and neither waits
/// for the other (a waiting upgrade would: PostgreSQL would end it as a deadlock after
/// `deadlock_timeout`). Once one has left, the other upgrades.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_readers_that_both_try_to_upgrade_are_both_refused_and_neither_waits() {
    let (a, b) = (
        PostgresLockManager::builder(pool(1)).build(),
        PostgresLockManager::builder(pool(1)).build(),
    );
    let key = unique_key("upgrade_two_readers");
    let reading = || within(Duration::from_secs(5)).with_mode(LockMode::Shared);
    let mut first = a.acquire(&key, reading()).await.expect("first reader");
    let mut second = b.acquire(&key, reading()).await.expect("second reader");
    for round in 0..20 {
        let (one, two) = tokio::time::timeout(
            Duration::from_secs(5),
            futures_util::future::join(first.try_upgrade(), second.try_upgrade()),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: the two upgrades waited for each other"));
        assert_eq!(
            (one.expect("first"), two.expect("second")),
            (false, false),
            "round {round}: neither reader may upgrade beside the other"
        );
    }
    assert!(!first.is_lost() && !second.is_lost());
    assert_eq!(second.release().await, ReleaseOutcome::Unlocked);
    assert!(first.try_upgrade().await.expect("the reader left alone"));
    assert_eq!(first.release().await, ReleaseOutcome::Unlocked);
}

/// With a writer queued for the key, the server's version decides the try-upgrade:
/// PostgreSQL 13 to 16 refuse it (a new request is checked against the waiters first,
/// and a try never waits); PostgreSQL 17 and later grant a request that would go ahead
/// of a waiter that waits for the requester, when nothing held conflicts. Either way the
/// writer gets the key after the reader, and nothing waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_writer_queued_the_server_version_decides_the_upgrade() {
    let admin = admin().await;
    let version: i32 = admin
        .query_one("SELECT current_setting('server_version_num')::int", &[])
        .await
        .expect("server_version_num")
        .get(0);
    let manager = PostgresLockManager::builder(pool(2)).build();
    let writers = PostgresLockManager::builder(pool(1)).build();
    let key = unique_key("upgrade_writer_queued");
    let lock_id = locks_port::lock_id(&key);
    let mut guard = manager
        .acquire(
            &key,
            within(Duration::from_secs(5)).with_mode(LockMode::Shared),
        )
        .await
        .expect("acquire shared");
    let writer = {
        let key = key.clone();
        tokio::spawn(async move {
            let guard = writers
                .acquire(&key, within(Duration::from_secs(10)))
                .await
                .expect("the queued writer");
            guard.release().await
        })
    };
    wait_for("the writer to queue", || async {
        lock_holders(&admin, lock_id)
            .await
            .expect("lock_holders")
            .iter()
            .any(|holder| !holder.granted)
    })
    .await;
    let upgraded = guard.try_upgrade().await.expect("try_upgrade");
    assert_eq!(
        upgraded,
        version >= 170_000,
        "server_version_num {version}: upgraded {upgraded}"
    );
    let pid = holds(&admin, lock_id).await[0].0;
    let mode = if upgraded {
        LockMode::Exclusive
    } else {
        LockMode::Shared
    };
    assert_eq!(holds(&admin, lock_id).await, [(pid, mode)]);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(
        writer.await.expect("the writer's task"),
        ReleaseOutcome::Unlocked
    );
}

/// An upgrade dropped once it began closes the session and tells the guard, as a
/// downgrade does.
#[tokio::test]
async fn an_upgrade_dropped_part_way_closes_the_session_and_the_guard_is_told() {
    dropped_part_way("upgrade_dropped", LockMode::Shared, async |guard| {
        guard.try_upgrade().await.map(|_| ())
    })
    .await;
}
