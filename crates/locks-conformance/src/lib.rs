#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

use std::future::Future;
use std::time::Duration;

use locks_port::{DistributedLock, LockRegistry};

mod basics;
mod board;
mod cleanup;
mod contention;
mod fixtures;
mod health;
mod many;
mod modes;
mod random;
mod release;
mod semaphore;
mod waiting;

pub use basics::{
    acquire_yields_info_for_the_key, bookkeeping_is_per_manager, different_keys_are_independent,
    empty_key_is_refused, is_held_inside_and_not_after, try_acquire_takes_free_and_refuses_held,
    try_with_lock_skips_a_held_key,
};
pub use board::leader_board_contract;
pub use cleanup::{
    aborted_holder_task_releases, dropped_guard_releases,
    with_lock_releases_on_error_and_returns_it, with_lock_releases_when_body_panics,
};
pub use contention::{
    concurrent_try_acquire_has_one_winner, contenders_never_overlap, every_waiter_gets_a_turn,
};
pub use health::{
    huge_timeouts_saturate, poll_without_timeout_waits_in_queue, release_all_tells_every_guard,
    release_by_key_tells_the_guard, with_lock_until_lost_stops_the_body,
};
pub use many::{
    acquire_many_is_all_or_nothing, acquire_many_names_a_key_this_manager_holds,
    acquire_many_of_nothing_holds_nothing, acquire_many_refuses_an_empty_key,
    acquire_many_takes_all_in_lock_id_order, acquire_many_tells_of_a_member_taken_away,
    dropped_acquire_many_leaves_nothing_held,
};
pub use modes::{
    downgrade_keeps_a_queued_writer_waiting, downgrade_lets_readers_in_and_keeps_writers_out,
    downgrade_of_a_lock_no_longer_held_fails, downgrade_with_a_writer_queued_keeps_the_lock,
    exclusive_excludes_shared, one_manager_holds_a_key_shared_twice, queued_writer_is_not_starved,
    shared_holders_coexist, try_upgrade_beside_another_reader_says_no,
    try_upgrade_of_a_lock_no_longer_held_fails, try_upgrade_of_a_lone_reader_makes_it_exclusive,
    try_upgrade_with_a_writer_queued_never_waits,
};
pub use random::Lcg;
pub use release::{
    guard_release_reports_outcome, release_all_returns_count_and_empties,
    release_makes_key_acquirable_again, release_of_unheld_key_fails,
};
pub use semaphore::{
    bad_or_disagreeing_permits_are_configuration_errors, dropped_permit_acquisition_leaves_nothing,
    permit_held_says_whether_a_slot_is_held, permit_times_out_like_a_lock, permits_admit_at_most_n,
    semaphore_and_lock_of_one_name_are_apart, try_acquire_permit_takes_up_to_n,
    waiters_are_served_in_arrival_order,
};
pub use waiting::{
    a_key_this_manager_holds_is_named_in_the_timeout, acquire_times_out_on_held_key,
    cancelled_acquire_leaves_nothing_held, poll_strategy_acquires_after_release,
    queue_timeout_returns_and_leaves_nothing, second_acquire_by_same_manager_waits,
    zero_timeout_makes_one_attempt,
};

/// How an adapter plugs into the suite.
///
/// [`manager`](Harness::manager) gives a NEW manager with its own bookkeeping that
/// contends with every other manager of the same harness on the same locks, as two
/// processes on one database do. For PostgreSQL: a new manager on the same pool or
/// database; for memory: a new manager on one shared lock table.
pub trait Harness: Send + Sync + 'static {
    /// The lock manager under test. Cloning it must share its bookkeeping (the cases
    /// move clones into spawned tasks).
    type Manager: DistributedLock<Guard: 'static> + LockRegistry + Clone + Send + Sync + 'static;

    /// A new manager that contends with this harness's other managers.
    fn manager(&self) -> Self::Manager;

    /// How many acquisitions of permits of `name` stand in the queue that serves them in
    /// order, for an adapter where a waiter shows in
    /// [`permit_holders`](locks_port::Semaphore::permit_holders) a step before it joins
    /// that queue (PostgreSQL: the server's queue on the semaphore's turnstile). A case
    /// that orders its waiters waits for this state, not for a sleep. `None`, the
    /// default: a waiter `permit_holders` counts is in the queue already.
    fn queued_permit_waiters(&self, name: &str) -> impl Future<Output = Option<usize>> + Send {
        let _ = name;
        async { None }
    }
}

/// How long one case built by [`conformance_suite!`](crate::conformance_suite) may run
/// before it fails as deadlocked.
pub const CASE_TIME_LIMIT: Duration = Duration::from_secs(60);

/// How long a case waits for a release that may happen asynchronously (drop, abort,
/// cancelled acquire) before it reports a leaked lock.
pub const RELEASE_GRACE: Duration = Duration::from_secs(5);

/// The most locks one case holds or waits for at the same time.
pub const MAX_CONCURRENT_ACQUISITIONS: usize = contention::HAMMER_TASKS;

/// Support for [`conformance_suite!`](crate::conformance_suite); not a public API.
#[doc(hidden)]
pub mod __private {
    use super::{CASE_TIME_LIMIT, Future};

    /// Runs one case on a fresh two-worker runtime, failing it after
    /// [`CASE_TIME_LIMIT`].
    pub fn run_case(name: &str, case: impl Future<Output = ()>) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|error| panic!("cannot build a Tokio runtime for {name}: {error}"));
        runtime.block_on(async {
            if tokio::time::timeout(CASE_TIME_LIMIT, case).await.is_err() {
                panic!(
                    "conformance case {name} did not finish within {CASE_TIME_LIMIT:?}: the adapter may be deadlocked"
                );
            }
        });
    }
}

/// Stamps out one `#[test]` per case of this crate (the single lock's contract).
///
/// Takes an expression that builds the [`Harness`](crate::Harness). Each
/// test evaluates it once, inside its own multi-threaded Tokio runtime (two workers,
/// time and I/O enabled), so the expression may `.await`. Each test fails after
/// [`CASE_TIME_LIMIT`](crate::CASE_TIME_LIMIT).
///
/// The tests are plain functions named after the cases; invoke the macro inside a
/// module of the adapter's integration tests:
///
/// ```text
/// mod conformance {
///     locks_conformance::conformance_suite!(crate::MemoryHarness::new());
/// }
/// ```
///
/// The adapter needs only `locks-conformance` as a dev-dependency; the macro brings its
/// own runtime.
#[macro_export]
macro_rules! conformance_suite {
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__private::run_case(stringify!($case), async {
                    let harness = $harness;
                    $crate::$case(&harness).await;
                });
            }
        )*
    };
    ($harness:expr $(,)?) => {
        $crate::conformance_suite!(@cases $harness;
            acquire_yields_info_for_the_key,
            is_held_inside_and_not_after,
            with_lock_releases_on_error_and_returns_it,
            try_acquire_takes_free_and_refuses_held,
            release_makes_key_acquirable_again,
            release_of_unheld_key_fails,
            acquire_times_out_on_held_key,
            different_keys_are_independent,
            release_all_returns_count_and_empties,
            dropped_guard_releases,
            with_lock_releases_when_body_panics,
            aborted_holder_task_releases,
            zero_timeout_makes_one_attempt,
            contenders_never_overlap,
            concurrent_try_acquire_has_one_winner,
            every_waiter_gets_a_turn,
            guard_release_reports_outcome,
            second_acquire_by_same_manager_waits,
            a_key_this_manager_holds_is_named_in_the_timeout,
            bookkeeping_is_per_manager,
            poll_strategy_acquires_after_release,
            queue_timeout_returns_and_leaves_nothing,
            cancelled_acquire_leaves_nothing_held,
            release_by_key_tells_the_guard,
            release_all_tells_every_guard,
            with_lock_until_lost_stops_the_body,
            huge_timeouts_saturate,
            poll_without_timeout_waits_in_queue,
            shared_holders_coexist,
            one_manager_holds_a_key_shared_twice,
            exclusive_excludes_shared,
            queued_writer_is_not_starved,
            downgrade_lets_readers_in_and_keeps_writers_out,
            downgrade_keeps_a_queued_writer_waiting,
            downgrade_of_a_lock_no_longer_held_fails,
            downgrade_with_a_writer_queued_keeps_the_lock,
            try_upgrade_of_a_lone_reader_makes_it_exclusive,
            try_upgrade_beside_another_reader_says_no,
            try_upgrade_with_a_writer_queued_never_waits,
            try_upgrade_of_a_lock_no_longer_held_fails,
            empty_key_is_refused,
            try_with_lock_skips_a_held_key,
        );
    };
}

/// Stamps out one `#[test]` per case of [`AcquireMany`](locks_port::AcquireMany), for a
/// harness whose manager offers it; like [`conformance_suite!`](crate::conformance_suite)
/// (use both in one module: the test names differ).
#[macro_export]
macro_rules! acquire_many_suite {
    ($harness:expr $(,)?) => {
        $crate::conformance_suite!(@cases $harness;
            acquire_many_takes_all_in_lock_id_order,
            acquire_many_is_all_or_nothing,
            dropped_acquire_many_leaves_nothing_held,
            acquire_many_of_nothing_holds_nothing,
            acquire_many_tells_of_a_member_taken_away,
            acquire_many_refuses_an_empty_key,
            acquire_many_names_a_key_this_manager_holds,
        );
    };
}

/// Stamps out one `#[test]` per case of [`Semaphore`](locks_port::Semaphore), for a harness
/// whose manager offers it; like [`conformance_suite!`](crate::conformance_suite).
#[macro_export]
macro_rules! semaphore_suite {
    ($harness:expr $(,)?) => {
        $crate::conformance_suite!(@cases $harness;
            permits_admit_at_most_n,
            try_acquire_permit_takes_up_to_n,
            permit_held_says_whether_a_slot_is_held,
            permit_times_out_like_a_lock,
            bad_or_disagreeing_permits_are_configuration_errors,
            dropped_permit_acquisition_leaves_nothing,
            waiters_are_served_in_arrival_order,
            semaphore_and_lock_of_one_name_are_apart,
        );
    };
}
