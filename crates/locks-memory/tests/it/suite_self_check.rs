//! The contract suite must fail adapters that break the contract: run some of its
//! cases against deliberately wrong harnesses and expect the named failure.

use locks_conformance::Harness;
use locks_memory::InMemoryLockManager;

/// Every manager on a table of its own: nothing excludes anything.
struct NoExclusion;

impl Harness for NoExclusion {
    type Manager = InMemoryLockManager;

    fn manager(&self) -> InMemoryLockManager {
        InMemoryLockManager::new()
    }
}

/// Every "new" manager is the same one: bookkeeping is shared.
struct SharedBookkeeping(InMemoryLockManager);

impl Harness for SharedBookkeeping {
    type Manager = InMemoryLockManager;

    fn manager(&self) -> InMemoryLockManager {
        self.0.clone()
    }
}

fn run(case: impl Future<Output = ()>) {
    locks_conformance::__private::run_case("self-check", case);
}

#[test]
#[should_panic(expected = "try_acquire of a key another manager holds must give None")]
fn try_acquire_case_catches_missing_exclusion() {
    run(locks_conformance::try_acquire_takes_free_and_refuses_held(
        &NoExclusion,
    ));
}

#[test]
#[should_panic(expected = "acquire of a held key must not succeed while it is held")]
fn timeout_case_catches_missing_exclusion() {
    run(locks_conformance::acquire_times_out_on_held_key(
        &NoExclusion,
    ));
}

#[test]
#[should_panic(expected = "two holders were inside the critical section at once")]
fn contenders_case_catches_missing_exclusion() {
    run(locks_conformance::contenders_never_overlap(&NoExclusion));
}

#[test]
#[should_panic(expected = "concurrent try_acquires of a free key must win")]
fn concurrent_try_case_catches_missing_exclusion() {
    run(locks_conformance::concurrent_try_acquire_has_one_winner(
        &NoExclusion,
    ));
}

#[test]
#[should_panic(expected = "a waiter got the lock while another manager held it")]
fn waiters_case_catches_missing_exclusion() {
    run(locks_conformance::every_waiter_gets_a_turn(&NoExclusion));
}

#[test]
#[should_panic(expected = "an acquire of a held key must still be waiting")]
fn cancel_case_catches_missing_exclusion() {
    run(locks_conformance::cancelled_acquire_leaves_nothing_held(
        &NoExclusion,
    ));
}

#[test]
#[should_panic(expected = "is_held must answer for this manager only")]
fn per_manager_case_catches_shared_bookkeeping() {
    run(locks_conformance::bookkeeping_is_per_manager(
        &SharedBookkeeping(InMemoryLockManager::new()),
    ));
}

#[test]
#[should_panic(expected = "held_lock_count must count this manager's locks only")]
fn release_all_case_catches_shared_bookkeeping() {
    run(locks_conformance::release_all_returns_count_and_empties(
        &SharedBookkeeping(InMemoryLockManager::new()),
    ));
}

#[test]
fn cases_can_run_in_a_spawned_task() {
    // A case future is Send + 'static once it owns its harness, so adapters may spawn it.
    run(async {
        let harness = crate::conformance::MemoryHarness::new();
        tokio::spawn(async move { locks_conformance::contenders_never_overlap(&harness).await })
            .await
            .unwrap();
    });
}

#[test]
#[should_panic(expected = "more than 3 permit holders were inside at once")]
fn permits_case_catches_a_permit_that_does_not_exclude() {
    run(locks_conformance::permits_admit_at_most_n(&NoExclusion));
}

#[test]
#[should_panic(expected = "a different N must be caught")]
fn disagreeing_permits_case_catches_a_silent_max() {
    run(locks_conformance::bad_or_disagreeing_permits_are_configuration_errors(&NoExclusion));
}
