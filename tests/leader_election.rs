//! `LeaderElection` is generic over the port's `Semaphore`: the same campaign, hand-over
//! and errors on the in-memory manager, without a server.

use std::time::Duration;

use locks_leader::{LeaderElection, Leadership};
use locks_memory::InMemoryLockTable;
use locks_port::{AcquisitionErrorKind, PermitGuard, Semaphore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_on_the_in_memory_manager_leads_when_the_leader_stops() {
    let table = InMemoryLockTable::new();
    let first = LeaderElection::new(table.manager_with_holder_id("first"), "scheduler")
        .takeover_delay(Duration::from_millis(50));
    let second = LeaderElection::new(table.manager_with_holder_id("second"), "scheduler")
        .takeover_delay(Duration::from_millis(50));
    let (mut first_state, second_state) = (first.subscribe(), second.subscribe());
    assert_eq!(*first_state.borrow(), Leadership::Following);
    let leading =
        tokio::spawn(async move { first.run(|_lost| std::future::pending::<()>()).await });
    first_state
        .wait_for(Leadership::is_leading)
        .await
        .expect("first leads");
    let standing = tokio::spawn(async move {
        let output = second.run(|_lost| async { "second's task finished" }).await;
        (output, second.who_leads().await)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second_state.borrow().is_leading(), "one leader at a time");
    let observer = LeaderElection::new(table.manager(), "scheduler");
    let leader = observer
        .who_leads()
        .await
        .expect("who leads")
        .expect("a leader");
    assert_eq!(leader.holder_id.as_deref(), Some("first"));
    assert!(leader.since.is_some());

    leading.abort();
    let (output, after) = tokio::time::timeout(Duration::from_secs(5), standing)
        .await
        .expect("the standby took over")
        .expect("the standby's task");
    assert_eq!(output.expect("led"), "second's task finished");
    assert_eq!(
        after.expect("who leads"),
        None,
        "a finished term gives the leadership up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_on_a_name_used_with_more_permits_is_a_configuration_error() {
    let table = InMemoryLockTable::new();
    let other = table.manager();
    let permit = other
        .acquire_permit("reports", 3, Duration::ZERO)
        .await
        .expect("a permit of three");
    let election = LeaderElection::new(table.manager(), "reports");
    let error = tokio::time::timeout(Duration::from_secs(5), election.run(|_lost| async {}))
        .await
        .expect("a configuration error ends the campaign at once")
        .expect_err("a leader needs a semaphore of one");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
    assert!(error.to_string().contains("3 permits"), "{error}");
    assert!(permit.info().slot() < 3);
}
