//! Cases of many managers at once on one key: mutual exclusion under load, one winner
//! among concurrent `try_acquire`s, a turn for every waiter.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::Harness;
use super::fixtures::{WAIT, bounded, join, must_acquire, must_release, unique_key};
use locks_port::{AcquireOptions, DistributedLock, LockRegistry};

/// Tasks and iterations of the mutual-exclusion case.
pub(super) const HAMMER_TASKS: usize = 8;
const HAMMER_ITERATIONS: usize = 25;
/// Waiters of the every-waiter-gets-a-turn case.
const WAITERS: usize = 5;

/// Many tasks, each with its own manager, hammering one key never overlap inside the
/// critical section, and every acquisition happens exactly once.
pub async fn contenders_never_overlap<H: Harness>(harness: &H) {
    let key = unique_key("contenders_never_overlap");
    let in_section = Arc::new(AtomicUsize::new(0));
    let most_inside = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let critical_section = {
        let in_section = Arc::clone(&in_section);
        let most_inside = Arc::clone(&most_inside);
        let entries = Arc::clone(&entries);
        move || {
            let in_section = Arc::clone(&in_section);
            let most_inside = Arc::clone(&most_inside);
            let entries = Arc::clone(&entries);
            async move {
                let inside = in_section.fetch_add(1, Ordering::SeqCst) + 1;
                most_inside.fetch_max(inside, Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                in_section.fetch_sub(1, Ordering::SeqCst);
                entries.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let tasks: Vec<_> = (0..HAMMER_TASKS)
        .map(|_| {
            let manager = harness.manager();
            let key = key.clone();
            let critical_section = critical_section.clone();
            tokio::spawn(async move {
                for iteration in 0..HAMMER_ITERATIONS {
                    if iteration % 2 == 0 {
                        let guard = must_acquire(&manager, &key, "a contended acquire").await;
                        critical_section().await;
                        must_release(guard, "contenders").await;
                    } else {
                        let body = critical_section.clone();
                        manager
                            .with_lock(&key, bounded(WAIT), move |_| body())
                            .await
                            .unwrap_or_else(|error| {
                                panic!("a contended with_lock failed to acquire: {error}")
                            });
                    }
                }
                assert_eq!(manager.held_lock_count(), 0);
            })
        })
        .collect();
    for task in tasks {
        join(task).await;
    }
    assert_eq!(
        most_inside.load(Ordering::SeqCst),
        1,
        "two holders were inside the critical section at once: the lock does not exclude"
    );
    assert_eq!(
        entries.load(Ordering::SeqCst),
        HAMMER_TASKS * HAMMER_ITERATIONS,
        "every acquisition must enter the critical section exactly once"
    );
}

/// Concurrent `try_acquire`s of one free key from several managers: exactly one wins.
pub async fn concurrent_try_acquire_has_one_winner<H: Harness>(harness: &H) {
    let key = unique_key("concurrent_try_acquire_has_one_winner");
    let start = Arc::new(tokio::sync::Barrier::new(HAMMER_TASKS));
    let tasks: Vec<_> = (0..HAMMER_TASKS)
        .map(|_| {
            let manager = harness.manager();
            let key = key.clone();
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                start.wait().await;
                match manager.try_acquire(&key).await {
                    Ok(guard) => guard,
                    Err(error) => panic!("try_acquire({key:?}) failed: {error}"),
                }
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        winners.extend(join(task).await);
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {HAMMER_TASKS} concurrent try_acquires of a free key must win"
    );
    for guard in winners {
        must_release(guard, "concurrent try_acquire").await;
    }
}

/// Tasks waiting (without a timeout) on one key all get their turn once the holder
/// releases, each exactly once, and none gets it while it is held.
pub async fn every_waiter_gets_a_turn<H: Harness>(harness: &H) {
    let holder = harness.manager();
    let key = unique_key("every_waiter_gets_a_turn");
    let guard = must_acquire(&holder, &key, "acquire of a free key").await;
    let turns = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|waiter| {
            let manager = harness.manager();
            let key = key.clone();
            let turns = Arc::clone(&turns);
            tokio::spawn(async move {
                let guard = match manager.acquire(&key, AcquireOptions::new()).await {
                    Ok(guard) => guard,
                    Err(error) => panic!("a waiter without a timeout failed: {error}"),
                };
                turns
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(waiter);
                tokio::task::yield_now().await;
                must_release(guard, "waiter").await;
            })
        })
        .collect();
    // Give the waiters time to start waiting (not a timing assertion).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty(),
        "a waiter got the lock while another manager held it"
    );
    must_release(guard, "holder").await;
    for task in tasks {
        join(task).await;
    }
    let mut turns = std::mem::take(&mut *turns.lock().unwrap_or_else(PoisonError::into_inner));
    turns.sort_unstable();
    assert_eq!(
        turns,
        (0..WAITERS).collect::<Vec<_>>(),
        "every waiter must get the lock exactly once"
    );
}
