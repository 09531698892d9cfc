use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, ReleaseOutcome,
};
use locks_postgres::PostgresLockManager;

use crate::support::{admin, admin_with_fencing, holders, pool, unique_key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_holds_on_the_server_and_release_frees() {
    let manager = PostgresLockManager::builder(pool(4))
        .holder_id("it-1")
        .build();
    let admin = admin().await;
    let key = unique_key("basic");
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    assert_eq!(guard.info().key(), key);
    assert_eq!(guard.info().lock_id(), locks_port::lock_id(&key));
    assert_eq!(guard.info().holder_id(), Some("it-1"));
    assert_eq!(holders(&admin, guard.info().lock_id()).await, 1);
    assert!(manager.is_held(&key));
    assert_eq!(manager.held_lock_count(), 1);
    let id = guard.info().lock_id();
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, id).await, 0);
    assert!(!manager.is_held(&key));
}

/// `key` acquired by `holder`, then `waiter`'s acquire of it with a timeout of `ms`
/// milliseconds: the holder's guard and the waiter's timeout error.
async fn held_then_timed_out(
    holder: &PostgresLockManager,
    waiter: &PostgresLockManager,
    key: &str,
    ms: u64,
) -> (
    locks_postgres::PostgresLockGuard,
    locks_port::LockAcquisitionError,
) {
    let guard = holder
        .acquire(key, AcquireOptions::new())
        .await
        .expect("acquire");
    let error = waiter
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_millis(ms)),
        )
        .await
        .expect_err("held elsewhere");
    assert_eq!(error.kind(), AcquisitionErrorKind::Timeout);
    (guard, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_wait_times_out_with_the_original_message() {
    let holder = PostgresLockManager::new(pool(2));
    let waiter = PostgresLockManager::new(pool(2));
    let key = unique_key("timeout");
    let (_guard, error) = held_then_timed_out(&holder, &waiter, &key, 200).await;
    assert_eq!(
        error.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.2s")
    );
    assert_eq!(waiter.held_lock_count(), 0);
    assert!(
        waiter
            .try_acquire(&key)
            .await
            .expect("no db error")
            .is_none()
    );
    assert_eq!(holder.release_all().await, 1);
}

/// After a timed-out wait the session frees whatever the server may have granted as the
/// wait ended without reading `pg_locks` (which copies the server's whole lock table
/// under every lock partition: at a million held locks, a stall of every lock request
/// on the server per timeout). What the waiter's backend ran last says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_wait_settles_its_session_without_reading_pg_locks() {
    let holder = PostgresLockManager::new(pool(2));
    let waiter_id = throwaway_pg::testing::unique("settle");
    let waiter = PostgresLockManager::builder(pool(1))
        .holder_id(&waiter_id)
        .build();
    let admin = admin().await;
    let key = unique_key("settle");
    let (guard, _) = held_then_timed_out(&holder, &waiter, &key, 100).await;
    let last: Vec<String> = admin
        .query(
            "SELECT query FROM pg_stat_activity WHERE application_name = $1",
            &[&locks_postgres::holder_application_name(&waiter_id)],
        )
        .await
        .expect("pg_stat_activity")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(last.len(), 1, "the waiter's one session, kept: {last:?}");
    assert!(
        last[0].contains("pg_advisory_unlock_all") && !last[0].contains("pg_locks"),
        "the waiter's session last ran {:?}",
        last[0]
    );
    // Nothing held on it, and the lock still the holder's alone.
    assert_eq!(holders(&admin, guard.info().lock_id()).await, 1);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert!(
        waiter
            .try_acquire(&key)
            .await
            .expect("no db error")
            .is_some(),
        "the waiter's kept session takes the lock once it is free"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_an_exhausted_pool_fails_at_once_instead_of_waiting() {
    let manager = PostgresLockManager::new(pool(1));
    let first = unique_key("exhausted-a");
    let second = unique_key("exhausted-b");
    let guard = manager
        .acquire(&first, AcquireOptions::new())
        .await
        .expect("acquire");
    let error = tokio::time::timeout(Duration::from_secs(10), manager.try_acquire(&second))
        .await
        .expect("try_acquire must not wait for a connection")
        .expect_err("no connection is free");
    assert_eq!(error.kind(), AcquisitionErrorKind::PoolUnavailable);
    assert!(
        error.reason().contains("no pool connection was free"),
        "{error}"
    );
    assert!(!manager.is_held(&second));
    guard.release().await;
    let guard = manager
        .try_acquire(&second)
        .await
        .expect("no error")
        .expect("free again");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborting_the_holding_task_releases_the_lock() {
    let holder = PostgresLockManager::new(pool(2));
    let other = PostgresLockManager::new(pool(2));
    let admin = admin().await;
    let key = unique_key("aborted-holder");
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let holder = holder.clone();
        let key = key.clone();
        async move {
            let _guard = holder
                .acquire(&key, AcquireOptions::new())
                .await
                .expect("acquire");
            held_tx.send(()).expect("test is listening");
            std::future::pending::<()>().await;
        }
    });
    held_rx.await.expect("the task took the lock");
    assert!(
        other
            .try_acquire(&key)
            .await
            .expect("no db error")
            .is_none()
    );
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    // The guard's drop spawns the unlock; the other manager then gets the lock.
    let guard = other
        .acquire(
            &key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await
        .expect("released after the holding task was cancelled");
    assert_eq!(holder.held_lock_count(), 0);
    assert_eq!(holders(&admin, guard.info().lock_id()).await, 1);
    guard.release().await;
}

/// A lock statement's answer is read as its row arrives, and the statement's end (its
/// command tag, the server's ready-for-query) is left to the connection: a connection
/// given back to the pool at once must still answer its next user's statements in
/// order, with their own rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_given_back_at_its_unlocks_answer_serves_the_next_user_in_order() {
    let manager = PostgresLockManager::new(pool(1));
    let key = unique_key("given-back");
    for round in 0..50_i32 {
        let guard = manager
            .acquire(&key, AcquireOptions::new())
            .await
            .expect("acquire");
        let busy = manager.try_acquire(&key).await;
        assert!(
            matches!(busy, Err(ref error) if error.kind() == AcquisitionErrorKind::PoolUnavailable),
            "round {round}: the one connection holds the lock: {busy:?}"
        );
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        // The same connection, straight after the unlock's row.
        let client = manager.pool().get().await.expect("the one connection");
        let row = client
            .query_one("SELECT $1::int4 + 1", &[&round])
            .await
            .expect("the next user's statement");
        assert_eq!(row.get::<_, i32>(0), round + 1, "round {round}");
        let rows = client
            .query("SELECT generate_series(1, $1::int4)", &[&(round % 3 + 1)])
            .await
            .expect("a statement of several rows");
        assert_eq!(rows.len(), (round % 3 + 1) as usize, "round {round}");
        drop(client);
        let tried = manager.try_acquire(&key).await.expect("try");
        let guard = tried.expect("free again");
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    }
    let admin = admin().await;
    assert_eq!(holders(&admin, locks_port::lock_id(&key)).await, 0);
}

/// A fencing token is handed out only once its row is committed: the token statement
/// writes, and its commit can fail after its row was sent. Here a deferred constraint
/// trigger (fired at commit, for this test's lock id only) makes the commit fail; the
/// acquisition must fail with the server's words, hold nothing, and the next token must
/// not skip the one rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_whose_commit_fails_is_not_handed_out() {
    let admin = admin_with_fencing().await;
    let manager = PostgresLockManager::builder(pool(2)).fencing(true).build();
    let key = unique_key("token-commit");
    let lock_id = locks_port::lock_id(&key);
    let first = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    let before = first.info().fencing_token().expect("a token");
    first.release().await;

    let (function, trigger) = (
        format!("it_refuse_commit_{}", lock_id.unsigned_abs()),
        format!("it_refuse_commit_{}", lock_id.unsigned_abs()),
    );
    admin
        .batch_execute(&format!(
            "CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'commit refused for the test'; END $$; \
             CREATE CONSTRAINT TRIGGER {trigger} AFTER INSERT OR UPDATE \
             ON advisory_lock_fencing_tokens DEFERRABLE INITIALLY DEFERRED \
             FOR EACH ROW WHEN (NEW.lock_id = {lock_id}) EXECUTE FUNCTION {function}()"
        ))
        .await
        .expect("the trigger");
    let refused = manager.acquire(&key, AcquireOptions::new()).await;
    admin
        .batch_execute(&format!(
            "DROP TRIGGER {trigger} ON advisory_lock_fencing_tokens; DROP FUNCTION {function}()"
        ))
        .await
        .expect("drop the trigger");
    let error = refused.expect_err("the token's commit failed");
    assert!(
        error.to_string().contains("commit refused for the test"),
        "the server's words: {error}"
    );
    assert!(!manager.is_held(&key));
    // The failed grant's session is closed, not reused; the server frees its lock as that
    // backend exits, a few milliseconds after the error (under load, after the check).
    crate::faults::wait_for("nothing held after the failure", || async {
        holders(&admin, lock_id).await == 0
    })
    .await;

    let again = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    assert_eq!(
        again.info().fencing_token(),
        Some(before + 1),
        "the rolled-back token was never handed out, so the next one follows {before}"
    );
    again.release().await;
}

/// A URL the driver cannot read is refused with the parser's words and the two forms a
/// connection string takes, so a misspelt scheme (`postgress:`) is seen at a glance.
#[test]
fn a_malformed_url_shows_the_expected_forms() {
    let forms = "expected postgres://user:password@host:port/dbname (or postgresql://…) or \
                 key=value settings such as host=localhost user=app dbname=app";
    for url in ["postgress:/oops", "post gres://x", "host=h port=notaport"] {
        let error = locks_postgres::plain_pool(url, 4).expect_err(url);
        let text = error.to_string();
        assert!(text.starts_with("invalid PostgreSQL URL: "), "{text}");
        assert!(text.ends_with(forms), "{url}: {text}");
    }
    let error = locks_postgres::plain_pool("postgress:/oops", 4).expect_err("misspelt");
    assert_eq!(
        error.to_string(),
        format!("invalid PostgreSQL URL: unexpected EOF; {forms}")
    );
}
