//! The lease's settings on real connections, a lease that cannot hold, and connection
//! opening held to the caller's deadline. The lease's bounds under a real network
//! partition are in `tests/partition.rs`.

use std::time::{Duration, Instant};

use locks_port::{AcquisitionErrorKind, DistributedLock, LockGuard};
use locks_postgres::PostgresLockManager;

use crate::support::{admin, pool, server_version_num, unique_key};

/// The server timers a session carries, in their base units (`pg_settings.setting`):
/// `tcp_keepalives_idle`, `_interval` (s), `_count`, `tcp_user_timeout` (ms) and
/// `client_connection_check_interval` (ms; absent before PostgreSQL 14).
async fn timers(client: &locks_postgres::tokio_postgres::Client) -> Vec<(String, String)> {
    client
        .query(
            "SELECT name, setting FROM pg_settings WHERE name IN ('tcp_keepalives_idle', \
             'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout', \
             'client_connection_check_interval') ORDER BY name",
            &[],
        )
        .await
        .expect("the timers")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Every connection the manager uses carries the lease's timers, set in the set-up it
/// already makes; `lease(None)` leaves the server's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_carries_the_lease_timers() {
    let admin = admin().await;
    let version = server_version_num(&admin).await;
    let over_tcp: bool = admin
        .query_one("SELECT inet_client_addr() IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    for lease in [
        Some(Duration::from_secs(60)),
        Some(Duration::from_secs(12)),
        None,
    ] {
        let pool = pool(1);
        let manager = PostgresLockManager::builder(pool.clone())
            .lease(lease)
            .try_build()
            .expect("a lease that holds");
        let guard = manager
            .acquire(&unique_key("lease-timers"), Duration::from_secs(5))
            .await;
        guard.expect("acquire").release().await;
        // The pool's one connection: the session the lock was taken on.
        let client = pool.get().await.expect("the manager's connection");
        // Over a Unix socket the server ignores the TCP timers (they read 0).
        let tcp = |value: String| if over_tcp { value } else { "0".to_owned() };
        let mut expected = match manager.lease() {
            Some(lease) => {
                let server = lease.server;
                vec![
                    (
                        "client_connection_check_interval".to_owned(),
                        server
                            .client_connection_check_interval
                            .as_millis()
                            .to_string(),
                    ),
                    (
                        "tcp_keepalives_count".to_owned(),
                        tcp(server.keepalives_count.to_string()),
                    ),
                    (
                        "tcp_keepalives_idle".to_owned(),
                        tcp(server.keepalives_idle.as_secs().to_string()),
                    ),
                    (
                        "tcp_keepalives_interval".to_owned(),
                        tcp(server.keepalives_interval.as_secs().to_string()),
                    ),
                    (
                        "tcp_user_timeout".to_owned(),
                        tcp(server.user_timeout.as_millis().to_string()),
                    ),
                ]
            }
            // The server's own, as a connection of ours finds them.
            None => timers(&admin).await,
        };
        if version < 140_000 && lease.is_some() {
            expected.remove(0);
        }
        assert_eq!(timers(&client).await, expected, "lease {lease:?}");
    }
}

/// A lease that cannot hold is refused: by `try_build` at once, and by `build` on
/// every acquisition, with a `Configuration` error that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_hold_is_refused_with_the_reason() {
    let builder = || {
        PostgresLockManager::builder(pool(1))
            .lease(Some(Duration::from_secs(15)))
            .keepalive(Some(Duration::from_secs(10)))
    };
    let refused = builder()
        .try_build()
        .expect_err("a 10 s keepalive in a 15 s lease");
    assert!(
        refused.to_string().contains("lease of 15s is too short"),
        "{refused}"
    );
    let manager = builder().build();
    assert!(manager.lease().is_none());
    let key = unique_key("lease-refused");
    let error = manager
        .acquire(&key, Duration::from_secs(1))
        .await
        .expect_err("refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
    assert!(
        error.to_string().contains("lease of 15s is too short"),
        "{error}"
    );
    let error = manager.try_acquire(&key).await.expect_err("refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
    let default_off = PostgresLockManager::builder(pool(1))
        .keepalive(None)
        .try_build();
    let default_off = default_off.expect("keepalives off turn the default lease off");
    assert!(default_off.lease().is_none());
    let off = PostgresLockManager::builder(pool(1))
        .lease(Some(Duration::from_secs(60)))
        .keepalive(None)
        .try_build();
    assert!(
        off.expect_err("keepalives off")
            .to_string()
            .contains("needs keepalives")
    );
    let without = PostgresLockManager::builder(pool(1))
        .keepalive(None)
        .lease(None)
        .try_build();
    assert!(
        without
            .expect("no lease, no keepalive: allowed")
            .lease()
            .is_none()
    );
}

/// Stall patience is in the bound the holder is told within, and the server timers on
/// each connection are derived from that larger bound (the margin stays whole); a lease
/// that cannot fit the patience is refused with a message that names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_patience_is_told_within_and_sets_the_server_timers_later() {
    let patience = Duration::from_millis(2500);
    let lease_of = |patience| {
        let pool = pool(1);
        let manager = PostgresLockManager::builder(pool.clone())
            .stall_patience(patience)
            .try_build()
            .expect("the default lease with patience");
        let lease = manager.lease().expect("on by default");
        (pool, manager, lease)
    };
    let (_, _, without) = lease_of(Duration::ZERO);
    let (used, manager, with) = lease_of(patience);
    assert_eq!(
        with.holder_told_within,
        without.holder_told_within + patience
    );
    assert_eq!(
        with.server.user_timeout,
        without.server.user_timeout + patience
    );
    assert!(with.holder_told_within + with.margin <= with.server_frees_after);
    manager
        .acquire(&unique_key("patience-timers"), Duration::from_secs(5))
        .await
        .expect("acquire")
        .release()
        .await;
    let client = used.get().await.expect("the manager's connection");
    let over_tcp: bool = client
        .query_one("SELECT inet_client_addr() IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    if over_tcp {
        let user_timeout = timers(&client)
            .await
            .into_iter()
            .find(|(name, _)| name == "tcp_user_timeout")
            .map(|(_, setting)| setting);
        assert_eq!(
            user_timeout,
            Some(with.server.user_timeout.as_millis().to_string()),
            "the connection's tcp_user_timeout includes the patience"
        );
    }
    let refused = PostgresLockManager::builder(pool(1))
        .lease(Some(Duration::from_secs(20)))
        .stall_patience(Duration::from_secs(10))
        .try_build()
        .expect_err("10 s of patience do not fit a 20 s lease");
    let text = refused.to_string();
    assert!(text.contains("stall patience 10s"), "{text}");
    assert!(text.contains("lease of 20s is too short"), "{text}");
}

/// Opening a connection to a server that accepts and never answers (a stopped
/// postmaster) is held to the caller's deadline, not the deadline plus the margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_a_connection_is_held_to_the_deadline() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a silent listener");
    let port = silent.local_addr().unwrap().port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=30");
    let manager = PostgresLockManager::new(locks_postgres::plain_pool(&url, 1).unwrap());
    for timeout in [Duration::from_millis(300), Duration::from_millis(1000)] {
        let started = Instant::now();
        let error = manager
            .acquire("opening", timeout)
            .await
            .expect_err("nobody answers");
        let took = started.elapsed();
        assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable, "{error}");
        assert!(
            took < timeout + Duration::from_millis(700),
            "returned after {took:?} for a {timeout:?} timeout"
        );
    }
    drop(silent);
}
