//! Multiplexing (`PostgresLockManagerBuilder::multiplex`): many locks on few connections,
//! as `pg_locks` and `pg_stat_activity` see them; one key never twice on one session;
//! waits on connections of their own; health per lock; cancelled acquisitions; no lost
//! update. (The port's contract suite runs multiplexed in `conformance::multiplexed`.)

use std::collections::BTreeMap;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, LostReason, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::Client;

use crate::counter::Counter;
use crate::faults::{assert_still_locks, holder_pids, terminate_backend, wait_for, waiting_pids};
use crate::support::{admin, admin_with_fencing, holders, pool, unique_key};

/// A multiplexing manager with `per_connection` locks on each of at most `connections`
/// connections, and the `application_name` its sessions publish.
fn multiplexed(per_connection: usize, connections: usize) -> (PostgresLockManager, String) {
    let holder = unique_key("mux").replace(':', "-");
    let manager = PostgresLockManager::builder(pool(connections))
        .holder_id(&holder)
        .multiplex(per_connection)
        .build();
    (manager, format!("locks:{holder}"))
}

fn within(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(timeout)
}

/// Per session of `application_name`, how many advisory locks it holds.
async fn locks_per_session(admin: &Client, application_name: &str) -> BTreeMap<i32, i64> {
    admin
        .query(
            "SELECT a.pid, count(l.pid) FROM pg_stat_activity a \
             LEFT JOIN pg_locks l ON l.pid = a.pid AND l.locktype = 'advisory' AND l.granted \
             WHERE a.application_name = $1 GROUP BY a.pid",
            &[&application_name],
        )
        .await
        .expect("pg_stat_activity and pg_locks")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// An exclusive acquire of `key` by `manager` times out after 300 ms (`what` says why).
async fn assert_excluded(manager: &PostgresLockManager, key: &str, what: &str) {
    let attempt = manager
        .acquire(key, within(Duration::from_millis(300)))
        .await;
    assert!(
        attempt.as_ref().is_err_and(|error| error.is_timeout()),
        "{what}: {attempt:?}"
    );
}

/// The one backend holding `key`.
async fn the_holder(admin: &Client, key: &str) -> i32 {
    let pids = holder_pids(admin, locks_port::lock_id(key)).await;
    let [pid] = pids[..] else {
        panic!("one holder of {key} expected, found {pids:?}");
    };
    pid
}

/// The last statement of the session `pid`, once it is idle (else empty).
async fn idle_statement(admin: &Client, pid: i32) -> String {
    let row = admin
        .query_one(
            "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'idle'",
            &[&pid],
        )
        .await;
    row.map(|row| row.get::<_, String>(0)).unwrap_or_default()
}

/// A lock held by a multiplexing manager, and its session's pid.
struct Anchor {
    guard: locks_postgres::PostgresLockGuard,
    pid: i32,
}

impl std::ops::Deref for Anchor {
    type Target = locks_postgres::PostgresLockGuard;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

/// An admin connection and a manager multiplexing 100 locks a connection on a pool of
/// `connections`, holding one lock (the anchor), whose connection is shared.
async fn anchored(connections: usize) -> (Client, PostgresLockManager, Anchor) {
    let admin = admin().await;
    let (manager, _) = multiplexed(100, connections);
    let key = unique_key("anchor");
    let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
    let pid = the_holder(&admin, &key).await;
    (admin, manager, Anchor { guard, pid })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_locks_share_four_connections_and_release_all_gives_them_back() {
    let admin = admin().await;
    let (manager, application_name) = multiplexed(10, 8);
    let keys: Vec<String> = (0..40).map(|n| unique_key(&format!("many-{n}"))).collect();
    for (n, key) in keys.iter().enumerate() {
        let guard = if n % 2 == 0 {
            manager.acquire(key, within(Duration::from_secs(5))).await
        } else {
            manager
                .try_acquire(key)
                .await
                .map(|guard| guard.expect("a free key"))
        };
        let _ = guard.expect("acquire").into_held();
    }
    let sessions = locks_per_session(&admin, &application_name).await;
    assert_eq!(
        sessions.values().copied().collect::<Vec<_>>(),
        [10, 10, 10, 10],
        "40 locks on 4 connections of 10: {sessions:?}"
    );
    assert_eq!(manager.pool().status().size, 4);

    // One release leaves the others on its connection alone.
    manager.release(&keys[0]).await.expect("held");
    assert_eq!(holders(&admin, locks_port::lock_id(&keys[0])).await, 0);
    for key in &keys[1..] {
        assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 1, "{key}");
    }

    let started = Instant::now();
    assert_eq!(manager.release_all().await, 39);
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "release_all took {elapsed:?}"
    );
    let sessions = locks_per_session(&admin, &application_name).await;
    assert!(
        sessions.values().all(|count| *count == 0),
        "nothing held after release_all: {sessions:?}"
    );
    let status = manager.pool().status();
    assert_eq!(
        (status.size, status.available),
        (4, 4),
        "the connections went back to the pool: {status:?}"
    );
}

/// The exclusion a caller relies on within one manager: a key it holds is not granted
/// to it again on another of its shared connections (advisory locks are re-entrant per
/// session, so a second try on the holder's session would succeed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_twice_goes_to_two_sessions_and_excludes() {
    let admin = admin().await;
    let (manager, _) = multiplexed(10, 6);
    let anchor = manager
        .acquire(&unique_key("anchor"), within(Duration::from_secs(5)))
        .await
        .expect("anchor");
    let key = unique_key("twice");
    let lock_id = locks_port::lock_id(&key);
    let first = manager
        .acquire(&key, within(Duration::from_secs(5)))
        .await
        .expect("first");
    assert_eq!(
        the_holder(&admin, &key).await,
        the_holder(&admin, anchor.info().key()).await,
        "an uncontended lock joins the shared connection"
    );
    assert_excluded(
        &manager,
        &key,
        "the same manager must not get a held key again",
    )
    .await;
    assert!(manager.try_acquire(&key).await.expect("try").is_none());
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert_eq!(first.release().await, ReleaseOutcome::Unlocked);

    // Shared twice: two readers of one manager, on two sessions.
    let reader = AcquireOptions::shared().with_timeout(Duration::from_secs(5));
    let one = manager.acquire(&key, reader).await.expect("reader one");
    let two = manager.acquire(&key, reader).await.expect("reader two");
    let pids = holder_pids(&admin, lock_id).await;
    assert_eq!(pids.len(), 2, "two sessions hold it shared: {pids:?}");
    assert_excluded(&manager, &key, "a writer waits for the readers").await;
    assert_eq!(one.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(two.release().await, ReleaseOutcome::Unlocked);
    assert_still_locks(&manager, &key, "the writer, once the readers are gone").await;
    assert_eq!(anchor.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, lock_id).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_does_not_hold_up_releases_on_a_shared_connection() {
    let admin = admin().await;
    let (manager, _) = multiplexed(10, 4);
    let other = PostgresLockManager::new(pool(1));
    let (a, b, contended) = (unique_key("a"), unique_key("b"), unique_key("contended"));
    let guard_a = manager.acquire(&a, AcquireOptions::new()).await.unwrap();
    let guard_b = manager.acquire(&b, AcquireOptions::new()).await.unwrap();
    let shared_pid = the_holder(&admin, &a).await;
    assert_eq!(the_holder(&admin, &b).await, shared_pid);
    let blocker = other
        .acquire(&contended, AcquireOptions::new())
        .await
        .unwrap();

    let waiting = tokio::spawn({
        let manager = manager.clone();
        let contended = contended.clone();
        async move { manager.acquire(&contended, AcquireOptions::new()).await }
    });
    let contended_id = locks_port::lock_id(&contended);
    wait_for("the contended acquire to queue", || async {
        !waiting_pids(&admin, contended_id).await.is_empty()
    })
    .await;
    let waiter_pid = waiting_pids(&admin, contended_id).await[0];
    assert_ne!(waiter_pid, shared_pid, "a wait has a connection of its own");

    // While it waits, a lock on the shared connection is released at once, and the
    // other lock there stays.
    let started = Instant::now();
    assert_eq!(guard_b.release().await, ReleaseOutcome::Unlocked);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(holders(&admin, locks_port::lock_id(&b)).await, 0);
    assert_eq!(the_holder(&admin, &a).await, shared_pid);
    assert!(!guard_a.is_lost());

    assert_eq!(blocker.release().await, ReleaseOutcome::Unlocked);
    let granted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once free")
        .unwrap()
        .expect("acquire");
    assert_eq!(the_holder(&admin, &contended).await, waiter_pid);
    // The wait's connection now takes further tries, like any shared one.
    let c = unique_key("c");
    let _ = manager
        .acquire(&c, AcquireOptions::new())
        .await
        .unwrap()
        .into_held();
    assert!([shared_pid, waiter_pid].contains(&the_holder(&admin, &c).await));
    drop(granted);
    drop(guard_a);
    manager.release_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_shared_connection_loses_exactly_its_locks() {
    let admin = admin().await;
    let (manager, _) = multiplexed(3, 4);
    let keys: Vec<String> = (0..6).map(|n| unique_key(&format!("lose-{n}"))).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(manager.acquire(key, AcquireOptions::new()).await.unwrap());
    }
    let mut by_pid: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    for (n, key) in keys.iter().enumerate() {
        by_pid
            .entry(the_holder(&admin, key).await)
            .or_default()
            .push(n);
    }
    assert_eq!(by_pid.len(), 2, "six locks on two connections: {by_pid:?}");
    let (&victim, lost) = by_pid.iter().next().unwrap();
    let lost = lost.clone();
    assert_eq!(lost.len(), 3);
    terminate_backend(&admin, victim).await;

    for &n in &lost {
        let reason = tokio::time::timeout(Duration::from_secs(5), guards[n].lost())
            .await
            .expect("each guard of the ended connection is told");
        assert_eq!(reason, LostReason::ConnectionClosed);
        assert!(!manager.is_held(&keys[n]));
    }
    assert_eq!(manager.lost_lock_counts().connection_closed, 3);
    assert_eq!(manager.held_lock_count(), 3);
    for (n, guard) in guards.into_iter().enumerate() {
        if lost.contains(&n) {
            assert_eq!(
                guard.release().await,
                ReleaseOutcome::Lost(LostReason::ConnectionClosed)
            );
        } else {
            assert!(
                !guard.is_lost(),
                "a lock on the other connection is unaffected"
            );
            assert_eq!(holders(&admin, locks_port::lock_id(&keys[n])).await, 1);
            assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        }
    }
    assert_eq!(manager.lost_lock_counts().total(), 3);
}

/// After `what` on `key` was dropped in flight on the shared session `shared_pid`: the
/// key comes free by a plain unlock on that session, its last statement, with no read
/// of `pg_locks` (a copy of the server's whole lock table, `docs/capacity.md`); and the
/// key's place there is free: `manager` takes the key again on the same session.
async fn unlocked_without_pg_locks(
    admin: &Client,
    manager: &PostgresLockManager,
    key: &str,
    shared_pid: i32,
    what: &str,
) {
    wait_for(&format!("{what} to end in an unlock"), || async {
        holders(admin, locks_port::lock_id(key)).await == 0
            && idle_statement(admin, shared_pid)
                .await
                .contains("pg_advisory_unlock")
    })
    .await;
    let last = idle_statement(admin, shared_pid).await;
    assert!(!last.contains("pg_locks"), "{what} ended with {last:?}");
    let guard = manager
        .acquire(key, within(Duration::from_secs(5)))
        .await
        .expect("the key is free, and its place too");
    assert_eq!(the_holder(admin, key).await, shared_pid);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

/// An acquisition dropped while its try on a shared connection is in flight: the try
/// goes on, and its grant is undone by a plain unlock, not by a read of `pg_locks` (a copy
/// of the server's whole lock table, `docs/capacity.md`), which the shared session's
/// statement after it shows. The place is freed, the key free, the host's lock untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_dropped_in_flight_on_a_shared_connection_is_undone_without_reading_pg_locks() {
    // A pool of one: every try goes to the one shared connection.
    let (admin, manager, anchor) = anchored(1).await;
    let (anchor_key, shared_pid) = (anchor.info().key().to_owned(), anchor.pid);
    let mut dropped = 0;
    for n in 0..50 {
        let key = unique_key(&format!("undone-{n}"));
        let mut acquire = Box::pin(manager.acquire(&key, AcquireOptions::new()));
        // Polled once: the try is on its way (answered at once only when this thread
        // was preempted for a round trip).
        let polled = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
        drop(acquire);
        if let Poll::Ready(guard) = polled {
            assert_eq!(
                guard.expect("acquire").release().await,
                ReleaseOutcome::Unlocked
            );
            continue;
        }
        dropped += 1;
        unlocked_without_pg_locks(&admin, &manager, &key, shared_pid, "the dropped try").await;
        if dropped == 5 {
            break;
        }
    }
    assert_eq!(
        dropped, 5,
        "five acquisitions dropped with their try in flight"
    );
    assert!(!anchor.is_lost());
    assert_eq!(the_holder(&admin, &anchor_key).await, shared_pid);
    assert_eq!(anchor.guard.release().await, ReleaseOutcome::Unlocked);
}

/// Releases dropped while their unlock on a shared connection is in flight, a guard's
/// `release` and the manager's `release(key)` in turn: the unlock goes on on a task of
/// its own, and its answer frees the place, with no read of `pg_locks` after it to ask
/// whether it ran (which the shared session's last statement shows). The key is free,
/// its place too, the host's lock untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_dropped_in_flight_on_a_shared_connection_ends_without_reading_pg_locks() {
    let (admin, manager, anchor) = anchored(1).await;
    let (anchor_key, shared_pid) = (anchor.info().key().to_owned(), anchor.pid);
    let mut dropped = 0;
    for n in 0..50 {
        let key = unique_key(&format!("released-{n}"));
        let guard = manager
            .acquire(&key, within(Duration::from_secs(5)))
            .await
            .expect("a free key");
        assert_eq!(the_holder(&admin, &key).await, shared_pid);
        let mut release: std::pin::Pin<Box<dyn Future<Output = bool> + Send>> = if n % 2 == 0 {
            Box::pin(async move { guard.release().await == ReleaseOutcome::Unlocked })
        } else {
            let _ = guard.into_held();
            Box::pin(async { manager.release(&key).await.is_ok() })
        };
        // Polled once: the unlock is on its way (answered at once only when this thread
        // was preempted for a round trip).
        let polled = std::future::poll_fn(|cx| Poll::Ready(release.as_mut().poll(cx))).await;
        drop(release);
        if let Poll::Ready(released) = polled {
            assert!(released, "released at once");
            continue;
        }
        dropped += 1;
        unlocked_without_pg_locks(&admin, &manager, &key, shared_pid, "the dropped release").await;
        if dropped == 6 {
            break;
        }
    }
    assert_eq!(
        dropped, 6,
        "six releases dropped with their unlock in flight"
    );
    assert!(!anchor.is_lost());
    assert_eq!(the_holder(&admin, &anchor_key).await, shared_pid);
    assert_eq!(manager.lost_lock_counts().total(), 0);
    assert_eq!(anchor.guard.release().await, ReleaseOutcome::Unlocked);
}

/// Acquisitions dropped at growing points of a try on a shared connection, and one
/// dropped while queued: nothing is left held, and the shared connection's own lock is
/// untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_leave_nothing_held() {
    let (admin, manager, anchor) = anchored(4).await;
    let (anchor_key, shared_pid) = (anchor.info().key().to_owned(), anchor.pid);

    let keys: Vec<String> = (0..30).map(|n| unique_key(&format!("drop-{n}"))).collect();
    let mut dropped = 0;
    for (n, key) in keys.iter().enumerate() {
        // Polled once (the try is sent), then (but for every third) again after a growing
        // pause, then dropped unless it finished: a timer cannot drop it this precisely.
        // Every third is dropped right after its first poll: on a loaded machine the
        // pause can outlast the round trip every time, and then nothing would be dropped
        // mid-flight.
        let mut acquire = Box::pin(manager.acquire(key, AcquireOptions::new()));
        let mut finished = None;
        let polls = if n % 3 == 0 {
            vec![None]
        } else {
            vec![None, Some(Duration::from_micros(20 * n as u64))]
        };
        for pause in polls {
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
            let polled = std::future::poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await;
            if let Poll::Ready(guard) = polled {
                finished = Some(guard.expect("acquire"));
                break;
            }
        }
        drop(acquire);
        match finished {
            Some(guard) => assert_eq!(guard.release().await, ReleaseOutcome::Unlocked),
            None => dropped += 1,
        }
    }
    assert!(dropped > 0, "some acquisitions were dropped mid-flight");
    for key in &keys {
        wait_for("a dropped acquisition to be undone", || async {
            holders(&admin, locks_port::lock_id(key)).await == 0
        })
        .await;
    }
    // Their places are free again: each key can be taken (and is really taken).
    for key in &keys {
        let guard = manager
            .acquire(key, within(Duration::from_secs(5)))
            .await
            .unwrap();
        assert_eq!(holders(&admin, locks_port::lock_id(key)).await, 1);
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }

    // Dropped while queued behind another manager's holder.
    let other = PostgresLockManager::new(pool(1));
    let contended = unique_key("queued");
    let contended_id = locks_port::lock_id(&contended);
    let blocker = other
        .acquire(&contended, AcquireOptions::new())
        .await
        .unwrap();
    {
        let acquire = manager.acquire(&contended, AcquireOptions::new());
        tokio::pin!(acquire);
        tokio::select! {
            result = &mut acquire => panic!("acquired a held lock: {result:?}"),
            () = wait_for("the acquire to queue", || async {
                !waiting_pids(&admin, contended_id).await.is_empty()
            }) => {}
        }
    }
    wait_for("the dropped waiter to leave the queue", || async {
        waiting_pids(&admin, contended_id).await.is_empty()
    })
    .await;
    assert_eq!(blocker.release().await, ReleaseOutcome::Unlocked);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        assert_eq!(holders(&admin, contended_id).await, 0, "nobody takes it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!anchor.is_lost());
    assert_eq!(the_holder(&admin, &anchor_key).await, shared_pid);
    assert_eq!(manager.held_lock_count(), 1);
    assert_eq!(anchor.guard.release().await, ReleaseOutcome::Unlocked);
}

/// Four tasks of ONE multiplexing manager (a few other locks held on its connections)
/// increment a counter under one key: no update is lost. With a key per task (a lock
/// that excludes nothing) updates are lost, so the check can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_multiplexed_manager_lose_no_update() {
    let counter = Counter::new("multiplexed").await;
    // Room on every connection: each try meets a connection that may hold the key.
    let (manager, _) = multiplexed(100, 8);
    for n in 0..3 {
        let key = unique_key(&format!("beside-{n}"));
        let _ = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .unwrap()
            .into_held();
    }
    for excluding in [true, false] {
        let tasks = vec![manager.clone(); 4];
        let run = counter.run(&tasks, 40, excluding).await;
        if excluding {
            assert_eq!(run.value, 160, "no lost update under the lock");
        } else {
            assert!(
                run.value < 160,
                "a lock that excludes nothing must lose updates (got {})",
                run.value
            );
        }
    }
    assert_eq!(manager.release_all().await, 3);
    counter.remove().await;
}

/// Fencing tokens are taken on the shared connection that holds the lock, and rise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_rise_on_shared_connections() {
    let admin = admin_with_fencing().await;
    let manager = PostgresLockManager::builder(pool(4))
        .multiplex(10)
        .fencing(true)
        .build();
    let (anchor, key) = (unique_key("fenced-anchor"), unique_key("fenced"));
    let anchor = manager
        .acquire(&anchor, AcquireOptions::new())
        .await
        .unwrap();
    let mut last = 0;
    for _ in 0..3 {
        let guard = manager.acquire(&key, AcquireOptions::new()).await.unwrap();
        assert_eq!(
            the_holder(&admin, &key).await,
            the_holder(&admin, anchor.info().key()).await
        );
        let token = guard.info().fencing_token().expect("a token");
        assert!(token > last, "{token} after {last}");
        last = token;
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }
    assert!(anchor.info().fencing_token().is_some());
    assert_eq!(anchor.release().await, ReleaseOutcome::Unlocked);
}

/// `count` distinct keys acquired at once (each within `timeout`), held.
async fn acquire_at_once(
    manager: &PostgresLockManager,
    name: &str,
    count: usize,
    timeout: Duration,
) -> Vec<locks_postgres::PostgresLockGuard> {
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..count {
        let (manager, key) = (manager.clone(), unique_key(&format!("{name}-{n}")));
        tasks.spawn(async move { manager.acquire(&key, within(timeout)).await });
    }
    let mut guards = Vec::with_capacity(count);
    while let Some(joined) = tasks.join_next().await {
        guards.push(joined.expect("task").expect("acquire"));
    }
    guards
}

/// `multiplex(k)` on a pool of `c` holds exactly `k × c` locks however many ask at
/// once: an acquisition that finds no connection free waits for room on a shared one
/// (before, it waited for a pool connection only, and failed with `PoolUnavailable`
/// while the shared ones had room). The next one waits and fails with
/// `PoolUnavailable` at its timeout; a release lets a waiter in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiplex_k_on_a_pool_of_c_holds_exactly_k_times_c_acquired_at_once() {
    let admin = admin().await;
    let (per_connection, connections) = (25, 4);
    let (manager, application_name) = multiplexed(per_connection, connections);
    let mut guards = acquire_at_once(
        &manager,
        "fit",
        per_connection * connections,
        Duration::from_secs(20),
    )
    .await;
    let sessions = locks_per_session(&admin, &application_name).await;
    assert_eq!(
        sessions.values().copied().collect::<Vec<_>>(),
        [25, 25, 25, 25],
        "100 locks on 4 connections of 25: {sessions:?}"
    );

    let started = Instant::now();
    let next = manager
        .acquire(&unique_key("fit-next"), within(Duration::from_millis(300)))
        .await;
    let error = next.expect_err("no room left: the next one waits and fails");
    assert_eq!(
        error.kind(),
        locks_port::AcquisitionErrorKind::PoolUnavailable,
        "{error}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for its timeout: {:?}",
        started.elapsed()
    );

    let waiter = {
        let (manager, key) = (manager.clone(), unique_key("fit-waiter"));
        tokio::spawn(async move {
            let granted = manager.acquire(&key, within(Duration::from_secs(20))).await;
            (granted, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter waits for room");
    let released_at = Instant::now();
    guards.pop().expect("a guard").release().await;
    let (granted, at) = waiter.await.expect("waiter");
    let _granted = granted.expect("the waiter takes the room a release freed");
    let after = at.saturating_duration_since(released_at);
    assert!(
        after < Duration::from_secs(1),
        "granted {after:?} after the release"
    );
    assert_eq!(manager.held_lock_count(), 100);
    drop(guards);
}

/// Acquisitions made at once spread over the connections instead of filling one
/// connection at a time (each statement costs more the more locks its session holds):
/// after `c × j` of them on a pool of `c` with room for far more, every connection holds
/// some and none more than `2 j`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_made_at_once_spread_over_the_connections() {
    let admin = admin().await;
    let (connections, each) = (4, 30);
    let (manager, application_name) = multiplexed(1000, connections);
    let guards = acquire_at_once(
        &manager,
        "spread",
        connections * each,
        Duration::from_secs(20),
    )
    .await;
    let sessions = locks_per_session(&admin, &application_name).await;
    let counts: Vec<i64> = sessions.values().copied().collect();
    assert_eq!(counts.len(), connections, "{sessions:?}");
    assert_eq!(counts.iter().sum::<i64>(), 120, "{sessions:?}");
    // Filling one connection at a time (as before) leaves ~117 on one. A connection
    // that opens late in the burst starts behind and is only caught up by later
    // acquisitions (least filled first), hence the loose bound.
    assert!(
        counts.iter().all(|count| (1..=60).contains(count)),
        "every connection takes some, none more than twice its share: {sessions:?}"
    );
    drop(guards);
}

/// Ten times more tasks than a multiplexed manager has places for, each taking and
/// releasing a key of its own in a loop for a while, with no timeout: every task gets
/// its turns and every loop ends. The bench's tasks curve once spun here for half an
/// hour: woken waiters fed each other wake-ups without a statement sent, and a loop that
/// never gave its worker back starved the runtime's timers too. So the test's own clock
/// is a thread outside the runtime: a spinning runtime fails the test instead of hanging.
#[test]
fn more_tasks_than_places_each_get_turns_and_finish() {
    const TASKS: usize = 400;
    const LIMIT: Duration = Duration::from_secs(120);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let turns = runtime.block_on(async {
            let (manager, _name) = multiplexed(10, 4);
            let end = Instant::now() + Duration::from_secs(2);
            let tasks: Vec<_> = (0..TASKS)
                .map(|task| {
                    let manager = manager.clone();
                    let key = unique_key(&format!("busy-{task}"));
                    tokio::spawn(async move {
                        let mut turns = 0_u32;
                        while Instant::now() < end || turns == 0 {
                            let guard = manager
                                .acquire(&key, AcquireOptions::new())
                                .await
                                .expect("acquire");
                            guard.release().await;
                            turns += 1;
                        }
                        turns
                    })
                })
                .collect();
            let mut turns = Vec::new();
            for task in tasks {
                turns.push(task.await.expect("task"));
            }
            assert_eq!(manager.held_lock_count(), 0);
            turns
        });
        // The test may have given up on it: nobody to tell then.
        let _ = done.send(turns);
    });
    let started = Instant::now();
    let turns = match finished.recv_timeout(LIMIT) {
        Ok(turns) => turns,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{TASKS} tasks on 40 places still looping after {LIMIT:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the runtime's thread failed (its panic is printed above)")
        }
    };
    eprintln!(
        "{TASKS} tasks on 40 places: {} turns in {:?}, fewest {:?}",
        turns.iter().sum::<u32>(),
        started.elapsed(),
        turns.iter().min()
    );
}
