//! Session locks behind a real PgBouncer.

use std::time::Duration;

use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, LockGuard, LockRegistry, LostReason,
    ReleaseOutcome, Semaphore,
};
use locks_postgres::PostgresLockManager;
use throwaway_pg::{PgBouncer, PoolMode};

use crate::faults::{holder_pids, wait_for};
use crate::support::{admin, database_url, holders, unique_key};

/// Session pooling carries session locks: one client, one server session. Another
/// client through the same PgBouncer is excluded, and when an operator terminates the
/// server session under a held lock, PgBouncer drops the client and the guard is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_carries_session_locks_and_their_loss() {
    let bouncer =
        tokio::task::block_in_place(|| PgBouncer::start(&database_url(), PoolMode::Session))
            .unwrap_or_else(|error| panic!("PgBouncer for the session-pooling test: {error}"));
    let url = bouncer.url();
    let manager = PostgresLockManager::new(locks_postgres::plain_pool(&url, 2).expect("pool"));
    let other = PostgresLockManager::new(locks_postgres::plain_pool(&url, 2).expect("pool"));
    let key = unique_key("pgbouncer-session");
    let lock_id = locks_port::lock_id(&key);
    let admin = admin().await;

    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire through PgBouncer");
    assert_eq!(holders(&admin, lock_id).await, 1, "held on the real server");
    assert!(
        other.try_acquire(&key).await.unwrap().is_none(),
        "another client is excluded"
    );
    let error = other
        .acquire(&key, Duration::from_millis(200))
        .await
        .expect_err("a bounded wait through PgBouncer times out");
    assert!(error.is_timeout(), "{error}");

    let [pid] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one server session holds the lock");
    };
    crate::faults::terminate_backend(&admin, pid).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss of the server session reaches the guard through PgBouncer");
    assert!(
        matches!(
            reason,
            LostReason::ConnectionClosed | LostReason::KeepaliveFailed
        ),
        "{reason:?}"
    );
    assert_eq!(manager.held_lock_count(), 0);
    assert_eq!(guard.release().await, ReleaseOutcome::Lost(reason));
    let taken = other
        .acquire(&key, Duration::from_secs(5))
        .await
        .expect("the key is free again");
    assert_eq!(taken.release().await, ReleaseOutcome::Unlocked);
    wait_for("the lock to be gone on the server", || async {
        holders(&admin, lock_id).await == 0
    })
    .await;
    drop(bouncer);
}

/// A PgBouncer in transaction mode with at most two server sessions.
fn transaction_pooler() -> PgBouncer {
    tokio::task::block_in_place(|| {
        PgBouncer::builder()
            .pool_mode(PoolMode::Transaction)
            .setting("default_pool_size", "2")
            .start(&database_url())
    })
    .unwrap_or_else(|error| panic!("PgBouncer for the transaction-pooling test: {error}"))
}

/// Occupies both server sessions of `bouncer` with clients in open transactions, then
/// frees the one whose backend is (or, with `keep_pid` false, is not) `pid`: the next
/// statement through the bouncer reaches the other one. Returns the occupying client
/// (its transaction stays open until it is dropped).
async fn occupy_all_but(bouncer: &PgBouncer, pid: i32, keep_pid: bool) -> tokio_postgres::Client {
    let mut occupied = Vec::new();
    for _ in 0..2 {
        let client = throwaway_pg::testing::connect(&bouncer.url()).await;
        client.batch_execute("BEGIN").await.expect("begin");
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        occupied.push((backend, client));
    }
    assert_ne!(occupied[0].0, occupied[1].0, "two server sessions");
    let (free, kept): (Vec<_>, Vec<_>) = occupied
        .into_iter()
        .partition(|(backend, _)| (*backend == pid) != keep_pid);
    for (_, client) in free {
        client.batch_execute("COMMIT").await.expect("commit");
    }
    let [(_, client)]: [_; 1] = kept
        .try_into()
        .unwrap_or_else(|kept: Vec<_>| panic!("one server session to keep, not {}", kept.len()));
    client
}

/// Behind transaction pooling one client connection's statements can run on any
/// server session, and a session advisory lock taken on one excludes nothing for
/// another client whose statements land on that same session (advisory locks are
/// re-entrant per session). Every lock statement checks the server session's marker,
/// so a second client reaching the holder's server session is refused with a clear
/// `Configuration` error instead of being granted the lock a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_refuses_a_second_grant_on_the_holders_server_session() {
    let bouncer = transaction_pooler();
    let url = bouncer.url();
    let first = PostgresLockManager::builder(locks_postgres::plain_pool(&url, 1).expect("pool"))
        .keepalive(None)
        .build();
    let second = PostgresLockManager::new(locks_postgres::plain_pool(&url, 1).expect("pool"));
    let key = unique_key("pgbouncer-transaction");
    let lock_id = locks_port::lock_id(&key);
    let admin = admin().await;

    let guard = first
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("the first acquisition lands on one server session");
    let [holder] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one server session holds the lock");
    };
    // The only free server session is now the holder's.
    let occupant = occupy_all_but(&bouncer, holder, false).await;
    let error = second
        .acquire(&key, Duration::from_secs(2))
        .await
        .expect_err("refused, not granted on the holder's session");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert!(
        error.to_string().contains("different server sessions"),
        "{error}"
    );
    // Never granted to another server session. (PgBouncer may close the holder's
    // server session when the refused client leaves mid-exchange, freeing the lock:
    // the holder learns that from its keepalive, see the next test.)
    let pids = holder_pids(&admin, lock_id).await;
    assert!(
        pids.iter().all(|pid| *pid == holder),
        "{pids:?} vs {holder}"
    );
    assert_eq!(second.held_lock_count(), 0);
    drop(occupant);
    drop(guard);
    terminate_and_wait(&admin, holder, lock_id).await;
    drop(bouncer);
}

/// A pool's recycling (deadpool's `RecyclingMethod::Clean` runs `RESET ALL`) can reset
/// the settings of a connection the manager has set up. Its next try then reaches a
/// server session without the connection's marker: the try must answer "not my
/// session" and do nothing, and the manager sets the session up again before it takes
/// the lock; otherwise the lock would be held on an unmarked session, and the next
/// keepalive (which checks the marker) would report it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_on_a_connection_whose_settings_were_reset_sets_it_up_again() {
    let pool = crate::support::pool(1);
    let manager = PostgresLockManager::builder(pool.clone())
        .health_check_interval(Duration::from_millis(20))
        .keepalive(Some(Duration::from_millis(50)))
        .build();
    let key = unique_key("reset-settings");
    let lock_id = locks_port::lock_id(&key);
    let admin = admin().await;
    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    // The pool's one connection, set up by the manager, has its settings reset.
    let object = pool.get().await.expect("the idle connection");
    object.batch_execute("RESET ALL").await.expect("RESET ALL");
    drop(object);

    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("granted after a fresh set-up");
    assert_eq!(holders(&admin, lock_id).await, 1);
    tokio::time::sleep(Duration::from_millis(400)).await; // several keepalives
    assert!(!guard.is_lost(), "lost: {:?}", guard.lost().reason());
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(holders(&admin, lock_id).await, 0);
}

/// A holder whose keepalive reaches another server session is told its lock is lost:
/// behind transaction pooling the session that took the lock is no longer its own.
/// (The lock itself stays on that server session until PgBouncer closes it; here the
/// test terminates it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_is_reported_to_the_holder_as_a_loss() {
    let bouncer = transaction_pooler();
    let url = bouncer.url();
    let manager = PostgresLockManager::builder(locks_postgres::plain_pool(&url, 1).expect("pool"))
        .keepalive(Some(Duration::from_millis(200)))
        .build();
    let key = unique_key("pgbouncer-transaction-loss");
    let lock_id = locks_port::lock_id(&key);
    let admin = admin().await;

    let guard = manager
        .acquire(&key, AcquireOptions::new())
        .await
        .expect("acquire through pgbouncer");
    let [holder] = holder_pids(&admin, lock_id).await[..] else {
        panic!("one server session holds the lock");
    };
    // Keep the holder's server session busy: the keepalive goes to the other one.
    let occupant = occupy_all_but(&bouncer, holder, true).await;
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder is told");
    assert!(
        matches!(
            reason,
            LostReason::KeepaliveFailed | LostReason::ConnectionClosed
        ),
        "{reason:?}"
    );
    assert_eq!(guard.release().await, ReleaseOutcome::Lost(reason));
    drop(occupant);
    terminate_and_wait(&admin, holder, lock_id).await;
    drop(bouncer);
}

/// The permit's statements check the server session's marker as the lock statements
/// do: a second client whose semaphore entry reaches the permit holder's server session
/// (where a slot lock is re-entrant, so the slot would look free) is refused instead of
/// being granted the one permit a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_pooling_refuses_a_second_permit_on_the_holders_server_session() {
    let bouncer = transaction_pooler();
    let url = bouncer.url();
    let first = PostgresLockManager::builder(locks_postgres::plain_pool(&url, 1).expect("pool"))
        .keepalive(None)
        .build();
    let second = PostgresLockManager::builder(locks_postgres::plain_pool(&url, 1).expect("pool"))
        .keepalive(None)
        .build();
    let name = unique_key("pgbouncer-transaction-permit");
    let class = first.semaphore_class(&name);
    let admin = admin().await;
    let slot_holders = || async {
        admin
            .query(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND objsubid = 2 AND classid = $1::int4::oid AND objid::int8 < 2147483648",
                &[&class],
            )
            .await
            .expect("pg_locks")
            .iter()
            .map(|row| row.get::<_, i32>(0))
            .collect::<Vec<_>>()
    };

    let permit = first
        .acquire_permit(&name, 1, AcquireOptions::new())
        .await
        .expect("the first permit lands on one server session");
    let [holder] = slot_holders().await[..] else {
        panic!("one server session holds the permit");
    };
    // The second client's connection is set up on the other server session...
    let occupant = occupy_all_but(&bouncer, holder, true).await;
    let key = unique_key("pgbouncer-transaction-permit-lock");
    let guard = second
        .acquire(&key, Duration::from_secs(2))
        .await
        .expect("a lock on the other server session");
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    occupant.batch_execute("COMMIT").await.expect("commit");
    // ...and its semaphore entry reaches the holder's, the only free one.
    let occupant = occupy_all_but(&bouncer, holder, false).await;
    // The entry finds another marker there and does nothing; the set-up tried again
    // then fails as well: its statement was prepared on the other server session
    // (26000 from a PgBouncer without prepared-statement support), or finds the
    // holder's marker. Either way it is the same `Configuration` refusal.
    let error = second
        .acquire_permit(&name, 1, Duration::from_secs(2))
        .await
        .expect_err("refused, not granted on the holder's session");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert!(!error.is_timeout(), "{error}");
    assert!(
        error.reason().contains("different server sessions"),
        "{error}"
    );
    assert_eq!(slot_holders().await, [holder], "one permit, the holder's");
    occupant.batch_execute("COMMIT").await.expect("commit");
    // Behind transaction pooling the release may reach the other server session too:
    // the permit goes with the holder's server session.
    drop(permit);
    crate::faults::terminate_backend(&admin, holder).await;
    wait_for("the permit to be gone on the server", || async {
        slot_holders().await.is_empty()
    })
    .await;
    drop(bouncer);
}

/// Terminates the server session `pid` and waits until the lock is gone.
async fn terminate_and_wait(admin: &tokio_postgres::Client, pid: i32, lock_id: i64) {
    admin
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .expect("terminate");
    wait_for("the lock to be gone on the server", || async {
        holders(admin, lock_id).await == 0
    })
    .await;
}
