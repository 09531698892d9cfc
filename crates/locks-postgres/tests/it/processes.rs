//! Exclusion between managers and between OS processes: what a fleet of workers
//! sharing one database relies on.
//!
//! # How the child processes are made
//!
//! This test binary re-executes itself through `throwaway_pg::testing::child` (see there):
//! [`spawn`] starts it running only [`child_entry`] with the role in `LOCKS_CHILD_ROLE`;
//! in a normal test run `child_entry` finds no role and passes at once.

use std::time::{Duration, Instant};

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;
use throwaway_pg::testing::child::{Child, command, env, say};

use crate::faults::{wait_for, waiting_pids};
use crate::support::{admin, database_url, holders, pool, unique_key};

const ROLE: &str = "LOCKS_CHILD_ROLE";
const KEY: &str = "LOCKS_CHILD_KEY";
const TABLE: &str = "LOCKS_CHILD_TABLE";
const ITERATIONS: &str = "LOCKS_CHILD_ITERATIONS";

// ---------------------------------------------------------------------------------
// The child side.

/// The entry point of child processes; a no-op in a normal test run (see the module
/// documentation).
#[test]
fn child_entry() {
    throwaway_pg::testing::child::entry(ROLE, |role, runtime| match role {
        "hold" => child_hold(runtime),
        "counter" => runtime.block_on(child_counter()),
        "permits" => runtime.block_on(crate::semaphores::child_permits()),
        "permit-wait" => runtime.block_on(crate::semaphore_waits::child_permit_wait()),
        "lead" => runtime.block_on(crate::leader::child_lead()),
        "lead-board" => runtime.block_on(crate::leader_board::child_lead_board()),
        "observe" => runtime.block_on(crate::leader_board::child_observe()),
        other => panic!("unknown {ROLE} {other:?}"),
    });
}

/// Takes the key, says `held {lock_id}`, then on `release` releases it and says
/// `released {outcome:?}`; on `exit` (or end of input) exits still holding it.
fn child_hold(runtime: &tokio::runtime::Runtime) {
    let key = env(KEY);
    let manager = PostgresLockManager::builder(pool(1))
        .holder_id(format!("child-{}", std::process::id()))
        .build();
    let guard = runtime
        .block_on(manager.acquire(
            &key,
            AcquireOptions::new().with_timeout(Duration::from_secs(30)),
        ))
        .expect("child acquires");
    say(&format!("held {}", guard.info().lock_id()));
    match command().as_deref() {
        Some("release") => {
            let outcome = runtime.block_on(guard.release());
            say(&format!("released {outcome:?}"));
        }
        // `exit` or the parent went away: leave without releasing.
        _ => std::process::exit(0),
    }
}

/// Says `ready`, waits for `go`, then increments the counter row `ITERATIONS` times
/// under the lock with a read, a pause and a write (a lost update without the lock).
async fn child_counter() {
    let key = env(KEY);
    let table = env(TABLE);
    let iterations: u32 = env(ITERATIONS).parse().expect("a number of iterations");
    let manager = PostgresLockManager::new(pool(2));
    let client = throwaway_pg::testing::connect(&database_url()).await;
    let read = format!("SELECT value FROM {table} WHERE id = 1");
    let write = format!("UPDATE {table} SET value = $1 WHERE id = 1");
    say("ready");
    let go = tokio::task::spawn_blocking(command).await.expect("stdin");
    assert_eq!(go.as_deref(), Some("go"), "the parent's start signal");
    for _ in 0..iterations {
        let guard = manager
            .acquire(
                &key,
                AcquireOptions::new().with_timeout(Duration::from_secs(60)),
            )
            .await
            .expect("child acquires the counter lock");
        let value: i64 = client.query_one(&read, &[]).await.expect("read").get(0);
        tokio::time::sleep(Duration::from_millis(2)).await;
        client
            .execute(&write, &[&(value + 1)])
            .await
            .expect("write");
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }
    say(&format!("done {iterations}"));
}

// ---------------------------------------------------------------------------------
// The parent side.

/// A child process of this test binary playing `role`, with `vars` in its environment.
pub(crate) fn spawn(role: &str, vars: &[(&str, &str)]) -> Child {
    let role_var = [(ROLE, role)];
    Child::spawn(
        format!("{role} child"),
        "processes::child_entry",
        role_var.iter().chain(vars).copied(),
    )
}

fn timeout(duration: Duration) -> AcquireOptions {
    AcquireOptions::new().with_timeout(duration)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_on_separate_pools_exclude_each_other() {
    let first = PostgresLockManager::builder(pool(2)).holder_id("a").build();
    let second = PostgresLockManager::builder(pool(2)).holder_id("b").build();
    let admin = admin().await;
    let key = unique_key("two-managers");
    let lock_id = locks_port::lock_id(&key);

    let guard = first.acquire(&key, AcquireOptions::new()).await.unwrap();
    assert!(second.try_acquire(&key).await.unwrap().is_none());
    let error = second
        .acquire(&key, timeout(Duration::from_millis(100)))
        .await
        .expect_err("held by the first manager");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
    // The holder's own second acquisition contends like anyone else's.
    assert!(first.try_acquire(&key).await.unwrap().is_none());
    assert_eq!(first.held_lock_count(), 1);
    assert_eq!(second.held_lock_count(), 0);
    assert_eq!(holders(&admin, lock_id).await, 1);

    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    let guard = second
        .try_acquire(&key)
        .await
        .unwrap()
        .expect("free once the first released");
    assert_eq!(guard.info().holder_id(), Some("b"));
    assert!(first.try_acquire(&key).await.unwrap().is_none());
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, lock_id).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_by_another_process_excludes_until_it_releases() {
    let admin = admin().await;
    let manager = PostgresLockManager::new(pool(2));
    let key = unique_key("process-release");
    let lock_id = locks_port::lock_id(&key);

    let mut child = spawn("hold", &[(KEY, &key)]);
    assert_eq!(child.expect("held").await, lock_id.to_string());
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert!(manager.try_acquire(&key).await.unwrap().is_none());
    let error = manager
        .acquire(&key, timeout(Duration::from_millis(100)))
        .await
        .expect_err("held by the child process");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);

    // Queue behind the child, then let it release: the lock passes to us.
    let waiter = tokio::spawn({
        let manager = manager.clone();
        let key = key.clone();
        async move {
            manager
                .acquire(&key, timeout(Duration::from_secs(30)))
                .await
        }
    });
    wait_for("our waiter to queue on the server", || async {
        waiting_pids(&admin, lock_id).await.len() == 1
    })
    .await;
    child.send("release");
    assert_eq!(child.expect("released").await, "Unlocked");
    let guard = waiter
        .await
        .expect("waiter task")
        .expect("acquired once the child released");
    assert!(child.exit_status().await.success());
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert!(manager.is_held(&key));
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, lock_id).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_freed_when_its_process_exits_without_releasing() {
    let admin = admin().await;
    let manager = PostgresLockManager::new(pool(2));
    let key = unique_key("process-exit");
    let lock_id = locks_port::lock_id(&key);

    let mut child = spawn("hold", &[(KEY, &key)]);
    child.expect("held").await;
    assert!(manager.try_acquire(&key).await.unwrap().is_none());
    child.send("exit");
    assert!(child.exit_status().await.success());
    let guard = manager
        .acquire(&key, timeout(Duration::from_secs(5)))
        .await
        .expect("the exited process's session ended, and its lock with it");
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_killed_with_sigkill_frees_its_lock() {
    let admin = admin().await;
    let manager = PostgresLockManager::new(pool(2));
    let key = unique_key("sigkill");
    let lock_id = locks_port::lock_id(&key);

    let mut child = spawn("hold", &[(KEY, &key)]);
    child.expect("held").await;
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert!(manager.try_acquire(&key).await.unwrap().is_none());
    let waiter = tokio::spawn({
        let manager = manager.clone();
        let key = key.clone();
        async move {
            let result = manager.acquire(&key, timeout(Duration::from_secs(5))).await;
            (result, Instant::now())
        }
    });
    wait_for("our waiter to queue on the server", || async {
        waiting_pids(&admin, lock_id).await.len() == 1
    })
    .await;

    let killed_at = Instant::now();
    child.kill();
    let (result, acquired_at) = waiter.await.expect("waiter task");
    let guard = result.expect("the lock of a SIGKILLed holder is freed within 5 s");
    println!(
        "lock passed from a SIGKILLed process to a queued waiter in {:?}",
        acquired_at - killed_at
    );
    assert_eq!(holders(&admin, lock_id).await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_incrementing_under_the_lock_lose_no_update() {
    const PROCESSES: usize = 3;
    const ITERATIONS_EACH: i64 = 30;
    let admin = admin().await;
    let key = unique_key("counter");
    let table = throwaway_pg::testing::unique("it_counter");
    admin
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (id int PRIMARY KEY, value bigint NOT NULL); \
             INSERT INTO {table} VALUES (1, 0)"
        ))
        .await
        .expect("counter table");

    let iterations = ITERATIONS_EACH.to_string();
    let mut children: Vec<Child> = (0..PROCESSES)
        .map(|_| {
            spawn(
                "counter",
                &[(KEY, &key), (TABLE, &table), (ITERATIONS, &iterations)],
            )
        })
        .collect();
    for child in &mut children {
        child.expect("ready").await;
    }
    let started = Instant::now();
    for child in &mut children {
        child.send("go");
    }
    for child in &mut children {
        assert_eq!(child.expect("done").await, iterations);
        assert!(child.exit_status().await.success());
    }
    let elapsed = started.elapsed();

    let value: i64 = admin
        .query_one(&format!("SELECT value FROM {table} WHERE id = 1"), &[])
        .await
        .expect("read the counter")
        .get(0);
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .expect("drop the counter table");
    println!(
        "{PROCESSES} processes x {ITERATIONS_EACH} locked read-modify-writes: {value} in {elapsed:?}"
    );
    assert_eq!(value, i64::try_from(PROCESSES).unwrap() * ITERATIONS_EACH);
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 0);
}
