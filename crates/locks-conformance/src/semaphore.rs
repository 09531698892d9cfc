//! Cases of [`Semaphore`]: at most N at a time, fairness, the lock's options and
//! errors, cancel safety (stamped out by [`semaphore_suite!`](crate::semaphore_suite)).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Harness;
use super::fixtures::{WAIT, assert_permit_timeout_error, bounded, join, unique_key};
use locks_port::{
    AcquireOptions, AcquisitionErrorKind, DistributedLock, MAX_PERMITS, PermitGuard,
    ReleaseOutcome, Semaphore,
};

/// Tasks and acquisitions per task of the at-most-N case.
const TASKS: usize = 8;
const ROUNDS: usize = 12;
const PERMITS: u32 = 3;

async fn must_permit<S: Semaphore>(
    semaphores: &S,
    name: &str,
    permits: u32,
    why: &str,
) -> S::Permit {
    match semaphores
        .acquire_permit(name, permits, bounded(WAIT))
        .await
    {
        Ok(permit) => permit,
        Err(error) => panic!("{why}: acquire_permit({name:?}, {permits}) failed: {error}"),
    }
}

async fn try_permit<S: Semaphore>(
    semaphores: &S,
    name: &str,
    permits: u32,
    why: &str,
) -> Option<S::Permit> {
    semaphores
        .try_acquire_permit(name, permits)
        .await
        .unwrap_or_else(|error| panic!("{why}: try_acquire_permit({name:?}) failed: {error}"))
}

/// Waits until `name` shows `waiting` waiters (for up to [`WAIT`]).
/// Waits until `waiting` acquisitions stand in the adapter's ordered queue
/// ([`Harness::queued_permit_waiters`]), when the adapter has such a step.
async fn until_queued<H: Harness>(harness: &H, name: &str, waiting: usize) {
    let deadline = Instant::now() + WAIT;
    while let Some(queued) = harness.queued_permit_waiters(name).await {
        if queued >= waiting {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} waiters never stood in the queue: {queued} did"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn until_waiting<S: Semaphore>(semaphores: &S, name: &str, waiting: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let holders = semaphores
            .permit_holders(name)
            .await
            .unwrap_or_else(|error| panic!("permit_holders({name:?}) failed: {error}"));
        if holders.waiting >= waiting {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} waiters never showed in permit_holders: {holders:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Many tasks, each with its own manager, never have more than N permits at once, and
/// every task gets all its turns.
pub async fn permits_admit_at_most_n<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("permits_admit_at_most_n");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let served = Arc::new(Mutex::new(vec![0usize; TASKS]));
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let manager = harness.manager();
            let name = name.clone();
            let (inside, most, served) =
                (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&served));
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = must_permit(&manager, &name, PERMITS, "a contended permit").await;
                    assert!(permit.info().slot() < PERMITS, "a slot beyond N");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    served.lock().unwrap_or_else(PoisonError::into_inner)[task] += 1;
                    assert_eq!(permit.release().await, ReleaseOutcome::Unlocked);
                }
            })
        })
        .collect();
    for task in tasks {
        join(task).await;
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "more than {PERMITS} permit holders were inside at once: {most}"
    );
    assert!(
        most >= 2,
        "the permits never overlapped: the case proves nothing"
    );
    let served = served
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert!(
        served.iter().all(|&turns| turns == ROUNDS),
        "every task must get every turn: {served:?}"
    );
}

/// `try_acquire_permit` takes up to N, then gives `None`, and a released permit can be
/// taken again.
pub async fn try_acquire_permit_takes_up_to_n<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("try_acquire_permit_takes_up_to_n");
    let (first, second) = (harness.manager(), harness.manager());
    let a = try_permit(&first, &name, 2, "the first of two")
        .await
        .expect("free");
    let b = try_permit(&second, &name, 2, "the second of two")
        .await
        .expect("free");
    assert_ne!(a.info().slot(), b.info().slot(), "two holders of one slot");
    assert!(
        try_permit(&harness.manager(), &name, 2, "a third")
            .await
            .is_none(),
        "try_acquire_permit beyond N must give None"
    );
    assert!(!a.is_lost());
    assert_eq!(a.info().permits(), 2);
    assert_eq!(a.info().name(), name);
    assert_eq!(a.release().await, ReleaseOutcome::Unlocked);
    let again = try_permit(&first, &name, 2, "after a release").await;
    assert!(again.is_some(), "a released permit must be free again");
    drop((again, b));
}

/// `permit_held` answers for one slot whether it is held, by anyone: true for a held
/// slot, from the holder's manager and from another, false for a free one; and the
/// question takes nothing (both slots can still be taken after it, and a released slot
/// reads free again).
pub async fn permit_held_says_whether_a_slot_is_held<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("permit_held_says_whether_a_slot_is_held");
    let (holder, observer) = (harness.manager(), harness.manager());
    let held = try_permit(&holder, &name, 2, "a permit of two")
        .await
        .expect("free");
    let slot = held.info().slot();
    let other = 1 - slot;
    let asks = |manager: &H::Manager, slot: u32| {
        let name = name.clone();
        let manager = manager.clone();
        async move {
            manager
                .permit_held(&name, slot)
                .await
                .unwrap_or_else(|error| panic!("permit_held({name:?}, {slot}) failed: {error}"))
        }
    };
    assert!(
        asks(&observer, slot).await,
        "the held slot, asked by another manager"
    );
    assert!(
        asks(&holder, slot).await,
        "the held slot, asked by its holder's manager"
    );
    assert!(!asks(&observer, other).await, "the free slot");
    let second = try_permit(&observer, &name, 2, "the free slot after the question")
        .await
        .expect("asking must leave the free slot free");
    assert_eq!(second.info().slot(), other);
    assert!(asks(&holder, other).await, "the second slot, now held");
    assert_eq!(held.release().await, ReleaseOutcome::Unlocked);
    assert!(!asks(&observer, slot).await, "a released slot reads free");
    drop(second);
}

/// A full semaphore times out as a lock does (its message speaks of a permit); a zero timeout is one try.
pub async fn permit_times_out_like_a_lock<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("permit_times_out_like_a_lock");
    let holder = must_permit(&harness.manager(), &name, 1, "the only permit").await;
    let manager = harness.manager();
    for timeout in [Duration::from_millis(200), Duration::ZERO] {
        let started = Instant::now();
        let error = manager
            .acquire_permit(&name, 1, bounded(timeout))
            .await
            .expect_err("a full semaphore must not grant");
        assert_permit_timeout_error(&error, &name, timeout, "a full semaphore");
        assert!(started.elapsed() >= timeout);
    }
    drop(holder);
}

/// 0 permits, more than [`MAX_PERMITS`], and a number that differs from the one in use
/// are `Configuration` errors naming the semaphore; the empty name is refused
/// (`InvalidKey`); every one of these errors speaks of a permit, not a lock.
pub async fn bad_or_disagreeing_permits_are_configuration_errors<H: Harness<Manager: Semaphore>>(
    harness: &H,
) {
    let name = unique_key("bad_or_disagreeing_permits");
    let manager = harness.manager();
    for bad in [0, MAX_PERMITS + 1, u32::MAX] {
        let error = manager
            .acquire_permit(&name, bad, AcquireOptions::new())
            .await
            .expect_err("a bad number of permits");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
        assert_eq!(error.key(), name);
        assert!(
            error.is_permit(),
            "a semaphore's error speaks of a permit: {error}"
        );
        let error = manager
            .try_acquire_permit(&name, bad)
            .await
            .expect_err("bad");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    }
    let holder = must_permit(&manager, &name, 2, "a permit of two").await;
    for other in [1, 3] {
        let error = harness
            .manager()
            .acquire_permit(&name, other, bounded(WAIT))
            .await
            .expect_err("a different N must be caught, not silently admitted");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
        assert!(
            error.to_string().contains("2 permits"),
            "the error must name the N in use: {error}"
        );
    }
    drop(holder);
    let error = manager
        .acquire_permit("", 1, bounded(WAIT))
        .await
        .expect_err("the empty name must be refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey, "{error}");
    let error = manager
        .try_acquire_permit("", 1)
        .await
        .expect_err("the empty name must be refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey, "{error}");
    assert!(
        error
            .to_string()
            .starts_with("Failed to acquire a permit of semaphore '':"),
        "a semaphore's error speaks of a permit: {error}"
    );
}

/// A dropped acquisition leaves nothing held and no wait queued; a dropped permit is
/// free again.
pub async fn dropped_permit_acquisition_leaves_nothing<H: Harness<Manager: Semaphore>>(
    harness: &H,
) {
    let name = unique_key("dropped_permit_acquisition");
    let holder = must_permit(&harness.manager(), &name, 1, "the only permit").await;
    let manager = harness.manager();
    let waited = tokio::time::timeout(
        Duration::from_millis(300),
        manager.acquire_permit(&name, 1, AcquireOptions::new()),
    )
    .await;
    assert!(
        waited.is_err(),
        "the permit is held: the call must still wait"
    );
    drop(holder);
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(permit) = try_permit(&harness.manager(), &name, 1, "after drops").await {
            drop(permit);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a dropped acquisition or a dropped permit left the permit held"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let holders = manager.permit_holders(&name).await.expect("permit_holders");
    assert_eq!(
        holders.waiting, 0,
        "a dropped call left a wait: {holders:?}"
    );
}

/// Waiters get a freed permit in arrival order, before a later `try_acquire_permit`;
/// `permit_holders` shows the held permit and the waiters.
pub async fn waiters_are_served_in_arrival_order<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("waiters_in_arrival_order");
    let holder = must_permit(&harness.manager(), &name, 1, "the only permit").await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for waiter in 0..3 {
        let manager = harness.manager();
        let (queued, order) = (name.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let permit = must_permit(&manager, &queued, 1, "a queued waiter").await;
            order
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(waiter);
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(permit);
        }));
        until_waiting(&harness.manager(), &name, waiter + 1).await;
        until_queued(harness, &name, waiter + 1).await;
    }
    let holders = harness
        .manager()
        .permit_holders(&name)
        .await
        .expect("holders");
    assert_eq!(holders.held.len(), 1, "one permit held: {holders:?}");
    assert_eq!(holders.held[0].slot, 0);
    assert_eq!(holders.waiting, 3, "three waiters: {holders:?}");
    assert_eq!(holders.permits, vec![1]);
    assert_eq!(holder.release().await, ReleaseOutcome::Unlocked);
    assert!(
        try_permit(&harness.manager(), &name, 1, "a late try")
            .await
            .is_none(),
        "a freed permit must go to a waiter, not to a later try"
    );
    for waiter in waiters {
        join(waiter).await;
    }
    let order = order.lock().unwrap_or_else(PoisonError::into_inner).clone();
    assert_eq!(
        order,
        vec![0, 1, 2],
        "waiters must be served in arrival order"
    );
}

/// A semaphore never contends with the lock of the same name.
pub async fn semaphore_and_lock_of_one_name_are_apart<H: Harness<Manager: Semaphore>>(harness: &H) {
    let name = unique_key("semaphore_and_lock_apart");
    let manager = harness.manager();
    let lock = manager
        .try_acquire(&name)
        .await
        .expect("try_acquire")
        .expect("a free lock");
    let permit = try_permit(&harness.manager(), &name, 1, "beside the lock").await;
    assert!(
        permit.is_some(),
        "the lock of the same name must not hold the permit"
    );
    drop((lock, permit));
}
