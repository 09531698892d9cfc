//! Keys and holder ids no SQL should ever see: non-ASCII, quotes and SQL, NUL, a
//! mebibyte; each locks by its derived id. The empty key is refused (the conformance
//! suite's `empty_key_is_refused`), though its id is still derived as Python derives it.

use std::time::Duration;

use locks_port::{DistributedLock, LockGuard, ReleaseOutcome};
use locks_postgres::{KeyVisibility, PostgresLockManager};

use super::timeout;
use crate::support::{admin, holders, pool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusual_keys_and_holder_ids_lock_by_their_derived_id() {
    let admin = admin().await;
    // These keys are fixed, not unique to this run: two test processes on one server
    // (two checkouts, CI next to a developer) would fight over them. The admin session
    // holds a test-wide lock so that such runs take turns; it ends with the session.
    let turn = locks_port::lock_id("locks-postgres it: unusual keys (one test run at a time)");
    admin
        .batch_execute(&format!(
            "SET lock_timeout = '60s'; SELECT pg_advisory_lock({turn}); RESET lock_timeout"
        ))
        .await
        .expect("this test's turn on the server");
    let mebibyte: String = "ключ🔒é".chars().cycle().take(1 << 20).collect();
    assert!(mebibyte.len() >= 1 << 20);
    let keys = [
        ":".to_owned(),
        "é".to_owned(),
        "🔒".to_owned(),
        "ключ".to_owned(),
        "it's a \"key\"; SELECT pg_advisory_unlock_all(); --".to_owned(),
        "back\\slash\\".to_owned(),
        "nul\0inside".to_owned(),
        mebibyte,
    ];
    let holder_ids = [
        "o'brien",
        "\"quoted\"",
        "back\\slash",
        "'); DROP TABLE pg_locks; --",
        "держатель-🔒",
        "nul\0",
    ];
    // The golden vectors of the Python library.
    assert_eq!(locks_port::lock_id(""), 7_183_457_195_969_485_844);
    assert_eq!(locks_port::lock_id("é"), 5_375_421_630_974_772_051);

    let other = PostgresLockManager::new(pool(1));
    for (index, key) in keys.iter().enumerate() {
        let lock_id = locks_port::lock_id(key);
        let holder_id = holder_ids[index % holder_ids.len()];
        let visibility = if index % 2 == 0 {
            KeyVisibility::Shown
        } else {
            KeyVisibility::Hidden
        };
        let manager = PostgresLockManager::builder(pool(1))
            .holder_id(holder_id)
            .key_visibility(visibility)
            .build();
        assert_eq!(manager.lock_id(key), lock_id);

        let guard = manager
            .acquire(key, timeout(Duration::from_secs(5)))
            .await
            .unwrap_or_else(|error| panic!("key #{index}: {error}"));
        assert_eq!(guard.info().key(), key.as_str());
        assert_eq!(guard.info().lock_id(), lock_id);
        assert_eq!(guard.info().holder_id(), Some(holder_id));
        assert_eq!(holders(&admin, lock_id).await, 1, "key #{index}");
        assert!(manager.is_held(key));
        assert!(other.try_acquire(key).await.unwrap().is_none());
        let error = other
            .acquire(key, timeout(Duration::ZERO))
            .await
            .expect_err("held");
        assert_eq!(error.key(), key.as_str());
        assert_eq!(
            error.to_string(),
            format!("Failed to acquire lock '{key}': Timeout after 0.0s")
        );
        assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
        assert_eq!(holders(&admin, lock_id).await, 0, "key #{index}");

        // try_acquire and the manager's release(key) take the same path.
        let info = manager
            .try_acquire(key)
            .await
            .unwrap()
            .expect("free")
            .into_held();
        assert_eq!(info.lock_id(), lock_id);
        assert_eq!(holders(&admin, lock_id).await, 1, "key #{index}");
        manager.release(key).await.expect("held by this manager");
        assert_eq!(holders(&admin, lock_id).await, 0, "key #{index}");
        let error = manager.release(key).await.expect_err("no longer held");
        assert_eq!(
            error.to_string(),
            format!("Lock '{key}' is not held by this session")
        );
    }
}
