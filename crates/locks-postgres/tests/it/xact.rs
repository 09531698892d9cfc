//! Transaction-scoped locks: released by COMMIT and ROLLBACK, bounded waits that leave the
//! transaction and its settings as they were, deadlocks, shared holders, PgBouncer.

use std::time::{Duration, Instant};

use locks_postgres::tokio_postgres::{Client, Transaction};
use locks_postgres::{LockMode, TransactionLockError, TransactionLocks};
use throwaway_pg::testing::connect;
use throwaway_pg::{PgBouncer, PoolMode};

use crate::support::{admin, database_url, holders, unique_key};

const EXCLUSIVE: LockMode = LockMode::Exclusive;
const SHARED: LockMode = LockMode::Shared;

async fn client() -> Client {
    connect(&database_url()).await
}

async fn show(tx: &Transaction<'_>, setting: &str) -> String {
    tx.query_one(&format!("SHOW {setting}"), &[])
        .await
        .expect("SHOW")
        .get(0)
}

/// A transaction on its own connection (to `url`) that holds `key` until released.
struct Holder {
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Holder {
    async fn start(url: String, key: String) -> Self {
        let (locked_tx, locked) = tokio::sync::oneshot::channel();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut client = connect(&url).await;
            let tx = client.transaction().await.expect("begin");
            TransactionLocks::new()
                .lock(&tx, &key, EXCLUSIVE)
                .await
                .expect("the holder's lock");
            let _ = locked_tx.send(());
            let _ = released.await;
            tx.commit().await.expect("the holder's commit");
        });
        locked.await.expect("the holder locked");
        Self { release, task }
    }

    /// Commits after `delay`, from a task of its own; await the handle to see it done.
    fn commit_after(self, delay: Duration) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = self.release.send(());
            self.task.await.expect("holder task");
        })
    }
}

/// Whether a fresh session could take `key` now; it takes nothing.
async fn free(key: &str) -> bool {
    let mut probe = client().await;
    let tx = probe.transaction().await.expect("begin");
    let free = TransactionLocks::new()
        .try_lock(&tx, key, EXCLUSIVE)
        .await
        .expect("try_lock");
    tx.rollback().await.expect("rollback");
    free
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_releases_the_lock() {
    let locks = TransactionLocks::new();
    let admin = admin().await;
    let key = unique_key("xact-commit");
    let mut holder = client().await;
    let tx = holder.transaction().await.expect("begin");
    locks.lock(&tx, &key, EXCLUSIVE).await.expect("lock");
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 1);
    assert!(!free(&key).await, "another transaction took a held lock");
    tx.commit().await.expect("commit");
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 0);
    assert!(free(&key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_releases_the_lock() {
    let locks = TransactionLocks::new();
    let admin = admin().await;
    let key = unique_key("xact-rollback");
    let mut holder = client().await;
    let tx = holder.transaction().await.expect("begin");
    assert!(
        locks
            .try_lock(&tx, &key, EXCLUSIVE)
            .await
            .expect("try_lock")
    );
    assert!(!free(&key).await);
    tx.rollback().await.expect("rollback");
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 0);
    assert!(free(&key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_leaves_the_transaction_usable_and_its_settings_as_before() {
    let locks = TransactionLocks::new();
    let key = unique_key("xact-timeout");
    let holder = Holder::start(database_url(), key.clone()).await;

    let mut waiter = client().await;
    let tx = waiter.transaction().await.expect("begin");
    tx.batch_execute(
        "SET LOCAL lock_timeout = '4321ms'; SET LOCAL statement_timeout = '9876ms'; \
         CREATE TEMP TABLE xact_work (n int) ON COMMIT DROP; INSERT INTO xact_work VALUES (1)",
    )
    .await
    .expect("set up the transaction");
    let error = locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_millis(200))
        .await
        .expect_err("the lock is held");
    assert!(error.is_timeout(), "{error}");
    assert!(matches!(error, TransactionLockError::Timeout { .. }));
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.2s")
    );
    // Usable: earlier work is still there, new statements run, settings are the caller's.
    let count: i64 = tx
        .query_one("SELECT count(*) FROM xact_work", &[])
        .await
        .expect("the transaction is usable")
        .get(0);
    assert_eq!(count, 1);
    assert_eq!(show(&tx, "lock_timeout").await, "4321ms");
    assert_eq!(show(&tx, "statement_timeout").await, "9876ms");

    // A wait that succeeds restores them too.
    let release = holder.commit_after(Duration::from_millis(300));
    locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_secs(20))
        .await
        .expect("granted when the holder commits");
    release.await.expect("holder task");
    assert_eq!(show(&tx, "lock_timeout").await, "4321ms");
    assert_eq!(show(&tx, "statement_timeout").await, "9876ms");
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_statement_timeout_or_lock_timeout_does_not_end_a_bounded_wait() {
    let locks = TransactionLocks::new();
    let key = unique_key("xact-statement-timeout");
    let holder = Holder::start(database_url(), key.clone()).await;

    let mut waiter = client().await;
    let tx = waiter.transaction().await.expect("begin");
    tx.batch_execute("SET LOCAL statement_timeout = '100ms'; SET LOCAL lock_timeout = '50ms'")
        .await
        .expect("SET");
    let release = holder.commit_after(Duration::from_millis(800));
    let started = Instant::now();
    locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_secs(20))
        .await
        .expect("the wait outlasts statement_timeout and lock_timeout");
    assert!(started.elapsed() >= Duration::from_millis(500));
    release.await.expect("holder task");
    assert_eq!(show(&tx, "statement_timeout").await, "100ms");
    assert_eq!(show(&tx, "lock_timeout").await, "50ms");
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_wait_outlasts_the_sessions_own_timeouts() {
    let key = unique_key("xact-unbounded");
    let holder = Holder::start(database_url(), key.clone()).await;
    let mut waiter = client().await;
    let tx = waiter.transaction().await.expect("begin");
    tx.batch_execute("SET LOCAL statement_timeout = '50ms'; SET LOCAL lock_timeout = '50ms'")
        .await
        .expect("SET");
    let release = holder.commit_after(Duration::from_millis(500));
    TransactionLocks::new()
        .lock(&tx, &key, EXCLUSIVE)
        .await
        .expect("waits until the holder commits");
    release.await.expect("holder task");
    assert_eq!(show(&tx, "statement_timeout").await, "50ms");
    assert_eq!(show(&tx, "lock_timeout").await, "50ms");
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_dropped_midway_still_ends_with_the_lock_and_the_settings_restored() {
    let locks = TransactionLocks::new();
    let admin = admin().await;
    let key = unique_key("xact-dropped");
    let holder = Holder::start(database_url(), key.clone()).await;
    let mut waiter = client().await;
    let tx = waiter.transaction().await.expect("begin");
    tx.batch_execute("SET LOCAL lock_timeout = '4321ms'")
        .await
        .expect("SET");
    let waiting = locks.lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_secs(20));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "the lock is held: the wait cannot finish yet"
    );
    holder.commit_after(Duration::ZERO).await.expect("holder");
    // The server finished the dropped wait: granted, settings back.
    assert_eq!(show(&tx, "lock_timeout").await, "4321ms");
    assert_eq!(show(&tx, "statement_timeout").await, "0");
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 1);
    assert!(!free(&key).await);
    tx.commit().await.expect("commit");
    assert!(free(&key).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_locking_in_opposite_order_get_a_deadlock_on_one_side() {
    let first = unique_key("xact-deadlock-a");
    let second = unique_key("xact-deadlock-b");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let side = |mine: String, theirs: String, barrier: std::sync::Arc<tokio::sync::Barrier>| async move {
        let locks = TransactionLocks::new();
        let mut client = client().await;
        let tx = client.transaction().await.expect("begin");
        locks.lock(&tx, &mine, EXCLUSIVE).await.expect("own key");
        barrier.wait().await;
        match locks
            .lock_with_timeout(&tx, &theirs, EXCLUSIVE, Duration::from_secs(30))
            .await
        {
            Ok(()) => {
                tx.commit().await.expect("commit");
                None
            }
            Err(error) => {
                // The deadlocked transaction is still usable; rolling it back frees the
                // other side.
                tx.query_one("SELECT 1", &[]).await.expect("usable");
                tx.rollback().await.expect("rollback");
                Some(error)
            }
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(side(first.clone(), second.clone(), barrier.clone())),
        tokio::spawn(side(second, first, barrier)),
    );
    let errors: Vec<TransactionLockError> = [a.expect("task a"), b.expect("task b")]
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    assert!(error.is_deadlock(), "{error}");
    assert!(!error.is_timeout());
    let text = error.to_string();
    assert!(text.contains("deadlock detected"), "{text}");
    assert!(text.contains("40P01"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_locks_admit_two_readers_and_exclude_a_writer() {
    let locks = TransactionLocks::new();
    let admin = admin().await;
    let key = unique_key("xact-shared");
    let (mut one, mut two, mut writer) = (client().await, client().await, client().await);
    let reader_one = one.transaction().await.expect("begin");
    let reader_two = two.transaction().await.expect("begin");
    locks
        .lock(&reader_one, &key, SHARED)
        .await
        .expect("reader 1");
    assert!(
        locks
            .try_lock(&reader_two, &key, SHARED)
            .await
            .expect("reader 2")
    );
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 2);

    let tx = writer.transaction().await.expect("begin");
    assert!(!locks.try_lock(&tx, &key, EXCLUSIVE).await.expect("try"));
    let error = locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_millis(200))
        .await
        .expect_err("readers hold it");
    assert!(error.is_timeout(), "{error}");
    reader_one.commit().await.expect("commit");
    assert!(!locks.try_lock(&tx, &key, EXCLUSIVE).await.expect("try"));
    reader_two.commit().await.expect("commit");
    assert!(locks.try_lock(&tx, &key, EXCLUSIVE).await.expect("try"));
    tx.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_in_transaction_mode_it_excludes_across_two_clients() {
    let bouncer = PgBouncer::start(&database_url(), PoolMode::Transaction)
        .unwrap_or_else(|error| panic!("PgBouncer for the transaction-pooling test: {error}"));
    let pool = locks_postgres::plain_pool(&bouncer.url(), 4).expect("pool");
    let locks = TransactionLocks::new();
    let key = unique_key("xact-pgbouncer");
    let admin = admin().await;

    // One client a plain connection, the other a deadpool one, both through PgBouncer.
    let holder = Holder::start(bouncer.url(), key.clone()).await;
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 1);
    let mut second = pool.get().await.expect("client through pgbouncer");

    let tx = second.transaction().await.expect("begin");
    assert!(!locks.try_lock(&tx, &key, EXCLUSIVE).await.expect("try"));
    let error = locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_millis(200))
        .await
        .expect_err("held by the other client");
    assert!(error.is_timeout(), "{error}");
    tx.query_one("SELECT 1", &[]).await.expect("usable");

    let release = holder.commit_after(Duration::from_millis(200));
    locks
        .lock_with_timeout(&tx, &key, EXCLUSIVE, Duration::from_secs(20))
        .await
        .expect("granted after the other client commits");
    release.await.expect("holder task");
    tx.commit().await.expect("commit");
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_empty_key_is_refused_and_the_transaction_stays_usable() {
    let locks = TransactionLocks::new();
    let mut client = client().await;
    let tx = client.transaction().await.expect("begin");
    for error in [
        locks.try_lock(&tx, "", EXCLUSIVE).await.map(|_| ()),
        locks.lock(&tx, "", SHARED).await,
        locks
            .lock_with_timeout(&tx, "", EXCLUSIVE, Duration::from_millis(200))
            .await,
    ] {
        let error = error.expect_err("the empty key must be refused");
        assert!(
            matches!(error, TransactionLockError::InvalidKey { .. }),
            "{error:?}"
        );
        assert_eq!(error.kind(), locks_port::AcquisitionErrorKind::InvalidKey);
        assert_eq!(
            error.to_string(),
            "Failed to acquire lock '': the key is empty; a lock needs a non-empty key"
        );
    }
    let one: i32 = tx.query_one("SELECT 1", &[]).await.expect("usable").get(0);
    assert_eq!(one, 1);
    tx.rollback().await.expect("rollback");
}

/// The batched statements (what the migration cutover sends after its own `BEGIN`) take the
/// same lock as the calls, wait for it, and end the wait at their timeout with 55P03.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_statements_take_the_same_lock_and_time_out_with_lock_not_available() {
    let locks = TransactionLocks::new();
    let key = unique_key("xact-batched");
    let id = locks.lock_id(&key);
    let holder = Holder::start(database_url(), key.clone()).await;

    let waiter = client().await;
    let timeout = Duration::from_millis(150);
    let started = Instant::now();
    let batch = format!(
        "BEGIN; {}",
        TransactionLocks::statements(id, SHARED, Some(timeout))
    );
    let error = waiter
        .batch_execute(&batch)
        .await
        .expect_err("the holder's exclusive lock excludes the batched shared one");
    let waited = started.elapsed();
    assert_eq!(
        error.code(),
        Some(&locks_postgres::tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{error:?}"
    );
    assert!(
        waited >= timeout && waited < timeout + Duration::from_secs(2),
        "waited {waited:?} for a {timeout:?} timeout"
    );
    waiter.batch_execute("ROLLBACK").await.expect("rollback");

    // Granted once the holder commits, and then held against the calls' lock.
    let committed = holder.commit_after(Duration::from_millis(100));
    let batch = format!(
        "BEGIN; {}",
        TransactionLocks::statements(id, EXCLUSIVE, Some(Duration::from_secs(10)))
    );
    waiter
        .batch_execute(&batch)
        .await
        .expect("granted after the commit");
    committed.await.expect("holder");
    assert!(
        !free(&key).await,
        "the batched lock excludes the calls' lock"
    );
    waiter.batch_execute("COMMIT").await.expect("commit");
    assert!(free(&key).await, "COMMIT releases the batched lock");
}
