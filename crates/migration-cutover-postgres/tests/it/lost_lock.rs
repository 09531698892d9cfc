//! The cutover lock's session ended in the paused window, on PostgreSQL: the cutover
//! rolls back instead of flipping the tenant without its lock, and a retry completes.

use std::time::Duration;

use migration_cutover::locks_port::{LockRegistry, lock_id, migration_lock_key};
use migration_cutover::uuid::Uuid;
use migration_cutover::{
    CutoverFailureReason, CutoverOutcome, Event, EventStore, Phase, RoutingRepository, RoutingState,
};
use throwaway_pg::testing::advisory_lock;

use crate::fleet::prepare;
use crate::support::{Fleet, SOURCE, TARGET, connect, test_config, until};

/// Three events written to the source alone (a lag of 3 allowed) give the cutover's
/// catch-up something to copy; a transaction holding the target table in `EXCLUSIVE` mode (reads go on, inserts
/// wait) keeps that copy waiting inside the paused window, before the flip. The test ends
/// the cutover lock's session with `pg_terminate_backend`, waits until the lock manager
/// has been told, then lets the copy go on. Before the fix the cutover copied, checked the
/// target and flipped the tenant with no lock held (completed); now it rolls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cutover_whose_lock_session_is_terminated_before_the_flip_rolls_back() {
    let fleet = Fleet::create("lostlock").await;
    let config = test_config().with_max_lag(10);
    let config = config
        .with_pause_budget(Duration::from_secs(10))
        .expect("budget");
    let instance = fleet.instance(config, Duration::from_secs(1));
    let tenant = Uuid::new_v4();
    let migration = prepare(&instance.coordinator, tenant).await;
    let events: Vec<Event> = (0..3).map(|i| Event::new("A", format!("{i}"))).collect();
    let source = instance.source.append(tenant, None, &events).await;
    source.expect("append to the source alone");
    let target = connect(Some(&fleet.b)).await;
    let hold = "BEGIN; LOCK TABLE dedicated.events IN EXCLUSIVE MODE";
    target
        .batch_execute(hold)
        .await
        .expect("hold the target table");

    let key = migration_lock_key(tenant, Some("cutover"));
    let locks = instance.coordinator.lock_manager().expect("a lock manager");
    let (result, ()) = tokio::join!(instance.coordinator.cutover(migration), async {
        until("the route cutover_paused", async || {
            let route = instance.routing.get(tenant).await.expect("read the route");
            route.is_some_and(|route| route.state == RoutingState::CutoverPaused)
        })
        .await;
        let admin = connect(None).await;
        let holders = advisory_lock(&admin, lock_id(&key)).await;
        let [holder] = holders.as_slice() else {
            panic!("one session holds the cutover lock: {holders:?}");
        };
        let terminate = "SELECT pg_terminate_backend($1)";
        let ended = admin.query_one(terminate, &[&holder.pid]).await;
        assert!(ended.expect("terminate").get::<_, bool>(0));
        until("the manager told of the loss", async || {
            locks.held_lock_count() == 0
        })
        .await;
        target
            .batch_execute("ROLLBACK")
            .await
            .expect("let the copy go on");
    });
    let result = result.expect("the cutover ran");
    let CutoverOutcome::RolledBack(error) = result.outcome() else {
        panic!(
            "the cutover went on without its lock: {:?} ({})",
            result.outcome(),
            result.message()
        );
    };
    assert_eq!(error.reason(), CutoverFailureReason::LockLost, "{error}");
    assert!(error.to_string().contains(&key), "{error}");
    let route = async || {
        let route = instance.routing.get(tenant).await.expect("read");
        let route = route.expect("a route");
        (route.state, route.store_id.as_str().to_owned())
    };
    assert_eq!(route().await, (RoutingState::DualWrite, SOURCE.to_owned()));
    let record = instance
        .coordinator
        .migration(migration)
        .await
        .expect("record");
    assert_eq!(record.phase, Phase::DualWrite);

    // Nothing is left stuck: the same coordinator's retry completes.
    let retry = instance
        .coordinator
        .cutover(migration)
        .await
        .expect("retry");
    assert!(retry.success(), "{}", retry.message());
    assert_eq!(route().await, (RoutingState::Migrated, TARGET.to_owned()));
    let copied = crate::fleet::all_events(&instance.target, tenant).await;
    assert_eq!(copied.len(), 3, "every event on the target once");
    drop(instance);
    fleet.drop_databases().await;
}
