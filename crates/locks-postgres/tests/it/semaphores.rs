//! Semaphores between OS processes and under faults: at most N inside (a counter kept in
//! SQL), every process served, a terminated holder told, its permit passed on.

use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, LostReason, PermitGuard, ReleaseOutcome, Semaphore};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres;

use crate::faults::wait_for;
use crate::support::{admin, admin_with_fencing, database_url, pool, unique_key};
use throwaway_pg::testing::child::{Child, command, say};

const NAME: &str = "LOCKS_CHILD_SEMAPHORE";
const TABLE: &str = "LOCKS_CHILD_TABLE";
/// Set in the negative control: each process uses a semaphore of its own, so a permit
/// excludes nobody.
const BROKEN: &str = "LOCKS_CHILD_SEMAPHORE_BROKEN";
const PROCESSES: usize = 8;
const ROUNDS: u32 = 50;
const PERMITS: u32 = 3;

/// The child role `permits`: says `ready`, waits for `go`, then `ROUNDS` times takes a
/// permit, counts itself in and out of the shared row in SQL (keeping the most seen
/// inside), and says `done {rounds}`.
pub(crate) async fn child_permits() {
    let name = std::env::var(NAME).expect("child needs a semaphore name");
    let table = std::env::var(TABLE).expect("child needs a table");
    let name = match std::env::var(BROKEN) {
        Ok(_) => format!("{name}:{}", std::process::id()),
        Err(_) => name,
    };
    let manager = PostgresLockManager::builder(pool(2))
        .holder_id(format!("child-{}", std::process::id()))
        .build();
    let client = throwaway_pg::testing::connect(&database_url()).await;
    let enter = format!(
        "UPDATE {table} SET inside = inside + 1, most = greatest(most, inside + 1) WHERE id = 1"
    );
    let leave = format!("UPDATE {table} SET inside = inside - 1, served = served + 1 WHERE id = 1");
    say("ready");
    let go = tokio::task::spawn_blocking(command).await.expect("stdin");
    assert_eq!(go.as_deref(), Some("go"), "the parent's start signal");
    for _ in 0..ROUNDS {
        let permit = manager
            .acquire_permit(&name, PERMITS, Duration::from_secs(60))
            .await
            .expect("child acquires a permit");
        client.execute(&enter, &[]).await.expect("enter");
        tokio::time::sleep(Duration::from_millis(2)).await;
        client.execute(&leave, &[]).await.expect("leave");
        assert_eq!(permit.release().await, ReleaseOutcome::Unlocked);
    }
    say(&format!("done {ROUNDS}"));
}

/// Runs the eight processes and reads the row: `(most inside at once, served)`.
async fn eight_processes(broken: bool) -> (i32, i32) {
    let admin = admin().await;
    let name = unique_key("permits-8x50");
    let table = format!("sem_counter_{}", std::process::id());
    let table = format!("{table}_{}", u8::from(broken));
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; \
             CREATE TABLE {table} (id int PRIMARY KEY, inside int NOT NULL, \
                                   most int NOT NULL, served int NOT NULL); \
             INSERT INTO {table} VALUES (1, 0, 0, 0)"
        ))
        .await
        .expect("counter table");
    let mut vars = vec![(NAME, name.as_str()), (TABLE, table.as_str())];
    if broken {
        vars.push((BROKEN, "1"));
    }
    let mut children: Vec<Child> = (0..PROCESSES)
        .map(|_| crate::processes::spawn("permits", &vars))
        .collect();
    for child in &mut children {
        child.expect("ready").await;
    }
    for child in &mut children {
        child.send("go");
    }
    for child in &mut children {
        assert_eq!(
            child.expect("done").await,
            ROUNDS.to_string(),
            "every process served"
        );
        assert!(child.exit_status().await.success());
    }
    let row = admin
        .query_one(&format!("SELECT most, served, inside FROM {table}"), &[])
        .await
        .expect("the counter row");
    admin
        .batch_execute(&format!("DROP TABLE {table}"))
        .await
        .expect("drop the counter table");
    assert_eq!(row.get::<_, i32>(2), 0, "everyone left");
    (row.get(0), row.get(1))
}

/// The check both runs make: at most N inside.
fn at_most_permits(most: i32) -> Result<(), String> {
    if most > PERMITS as i32 {
        Err(format!(
            "{most} processes were inside at once, more than {PERMITS}"
        ))
    } else {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_never_have_more_than_three_permits() {
    let (most, served) = eight_processes(false).await;
    println!("8 processes x {ROUNDS} on N = {PERMITS}: at most {most} inside, {served} served");
    at_most_permits(most).expect("a semaphore of 3");
    assert!(
        most >= 2,
        "the permits never overlapped: the test proves nothing"
    );
    assert_eq!(served, (PROCESSES as i32) * ROUNDS as i32);
}

/// The negative control: with a permit that excludes nobody, the same check fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_fails_when_a_permit_does_not_exclude() {
    let (most, _) = eight_processes(true).await;
    assert!(
        at_most_permits(most).is_err(),
        "8 processes on semaphores of their own must be seen more than 3 inside (saw {most})"
    );
}

/// How many advisory locks of `class` (any slot) the server has, held or waited for.
pub(crate) async fn locks_of_class(admin: &tokio_postgres::Client, class: i32) -> i64 {
    admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
             AND classid IN ($1::int4::oid, ($1::int4 + 1)::oid)",
            &[&class],
        )
        .await
        .expect("pg_locks")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_permit_holder_is_told_and_its_permit_goes_to_a_waiter() {
    let admin = admin().await;
    let holder = PostgresLockManager::builder(pool(2))
        .holder_id("holder")
        .build();
    let waiter = PostgresLockManager::builder(pool(2))
        .holder_id("waiter")
        .build();
    let name = unique_key("terminated-permit");
    let class = holder.semaphore_class(&name);

    let permit = holder
        .acquire_permit(&name, 1, AcquireOptions::new())
        .await
        .expect("a free permit");
    let queued = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let permit = waiter
                .acquire_permit(&name, 1, Duration::from_secs(30))
                .await;
            (permit, Instant::now())
        }
    });
    wait_for("the waiter to queue", || async {
        waiter.permit_holders(&name).await.expect("holders").waiting == 1
    })
    .await;
    let holders = waiter.permit_holders(&name).await.expect("holders");
    assert_eq!(holders.held.len(), 1);
    assert_eq!(holders.held[0].holder_id.as_deref(), Some("holder"));
    assert!(
        holders.held[0].since.is_some(),
        "the grant's second is recorded"
    );

    let terminated_at = Instant::now();
    terminate_slot_holder(&admin, class, 0).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), permit.lost())
        .await
        .expect("the holder is told within 5 s");
    assert_eq!(reason, LostReason::ConnectionClosed);
    println!(
        "holder told {:?} after the termination",
        terminated_at.elapsed()
    );
    let (granted, at) = queued.await.expect("waiter task");
    let granted = granted.expect("the waiter gets the freed permit");
    println!(
        "waiter granted {:?} after the termination",
        at - terminated_at
    );
    assert!(matches!(
        permit.release().await,
        ReleaseOutcome::Lost(LostReason::ConnectionClosed)
    ));
    assert_eq!(granted.release().await, ReleaseOutcome::Unlocked);
    wait_for("nothing of the semaphore left on the server", || async {
        locks_of_class(&admin, class).await == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_waits_and_permits_leave_no_advisory_lock() {
    let admin = admin().await;
    let manager = PostgresLockManager::new(pool(4));
    let name = unique_key("dropped-permits");
    let class = manager.semaphore_class(&name);
    let held = manager
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("one");
    let also = manager
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("two");
    // A waiter polling the slots holding the turnstile, and one in the turnstile's queue.
    for _ in 0..2 {
        let waited = tokio::time::timeout(
            Duration::from_millis(300),
            manager.acquire_permit(&name, 2, AcquireOptions::new()),
        )
        .await;
        assert!(waited.is_err(), "both permits are held");
    }
    drop((held, also));
    wait_for("every lock of the semaphore freed", || async {
        locks_of_class(&admin, class).await == 0
    })
    .await;
}

/// Terminates the backend that holds permit `slot` of `class`.
pub(crate) async fn terminate_slot_holder(admin: &tokio_postgres::Client, class: i32, slot: i32) {
    let terminated: bool = admin
        .query_one(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND objsubid = 2 AND classid = $1::int4::oid AND objid = $2::int4::oid AND granted",
            &[&class, &slot],
        )
        .await
        .expect("terminate the permit holder's backend")
        .get(0);
    assert!(terminated, "the holder of ({class}, {slot}) was terminated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_carry_fencing_tokens_that_grow_with_every_grant() {
    admin_with_fencing().await;
    let manager = PostgresLockManager::builder(pool(3)).fencing(true).build();
    let name = unique_key("fenced-permits");
    let first = manager
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("a permit");
    let second = manager
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("another");
    let (a, b) = (first.info().fencing_token(), second.info().fencing_token());
    assert!(
        a.is_some() && b > a,
        "tokens grow across the permits: {a:?} then {b:?}"
    );
    drop(first);
    let third = manager
        .acquire_permit(&name, 2, Duration::from_secs(10))
        .await
        .expect("a freed permit");
    assert!(third.info().fencing_token() > b);
    // A lock of the same name keeps its own tokens (its id is never negative).
    let lock = locks_port::DistributedLock::acquire(&manager, &name, AcquireOptions::new())
        .await
        .expect("the lock of the same name");
    assert_eq!(locks_port::LockGuard::info(&lock).fencing_token(), Some(1));
}

/// `permit_held` answers from a probe of the slot (never `pg_locks`): held exactly while a
/// permit holds the slot, on a plain and on a multiplexed manager; probes in a loop never
/// let two hold a permit of one, never stop a waiter getting it, and leave no lock behind.
/// Failed as it should against a planted probe that answered "not held" when refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_held_probes_the_slot_and_leaves_nothing_held() {
    let admin = admin().await;
    let plain = PostgresLockManager::new(pool(4));
    let multiplexed = PostgresLockManager::builder(pool(4)).multiplex(4).build();
    let name = unique_key("permit-held");
    let class = plain.semaphore_class(&name);
    for observer in [&plain, &multiplexed] {
        assert!(!observer.permit_held(&name, 0).await.expect("a probe"));
    }
    let held = plain
        .acquire_permit(&name, 2, AcquireOptions::new())
        .await
        .expect("a permit");
    let slot = held.info().slot();
    for observer in [&plain, &multiplexed] {
        assert!(observer.permit_held(&name, slot).await.expect("a probe"));
        assert!(
            !observer
                .permit_held(&name, 1 - slot)
                .await
                .expect("a probe")
        );
        assert!(
            !observer
                .permit_held(&name, u32::MAX)
                .await
                .expect("a probe")
        );
    }
    drop(held);
    wait_for("the permit freed", || async {
        !multiplexed.permit_held(&name, slot).await.expect("a probe")
    })
    .await;
    // One permit, handed between two tasks while a third probes its slot back to back.
    let one = unique_key("permit-held-one");
    let probing = {
        let (observer, one) = (multiplexed.clone(), one.clone());
        tokio::spawn(async move {
            loop {
                observer.permit_held(&one, 0).await.expect("a probe");
            }
        })
    };
    let inside = std::sync::atomic::AtomicUsize::new(0);
    let turns = (0..2).map(|_| async {
        for _ in 0..10 {
            let permit = plain
                .acquire_permit(&one, 1, Duration::from_secs(10))
                .await
                .expect("a permit despite the probes");
            assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
            tokio::time::sleep(Duration::from_millis(2)).await;
            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            permit.release().await;
        }
    });
    futures_util::future::join_all(turns).await;
    probing.abort();
    let _ = probing.await;
    let one_class = plain.semaphore_class(&one);
    wait_for("no lock of either semaphore left", || async {
        locks_of_class(&admin, class).await == 0 && locks_of_class(&admin, one_class).await == 0
    })
    .await;
}
