//! Settings at their limits: a member given `Duration::MAX` for its tick, takeover delay
//! or rejoin wait (each accepted by its setter) runs and waits as long as it was told,
//! and never panics; nor does a member that takes a shard whose unended term recorded
//! such a delay as its loss notice. A renewal expiry below the floor is refused.

use std::time::{Duration, Instant};

use locks_memory::InMemoryLockManager;
use locks_port::AcquisitionErrorKind;
use locks_shard::{MemoryTerms, ShardMember, ShardTerms};
use tokio::sync::mpsc;

use crate::support::Fleet;

const WITHIN: Duration = Duration::from_secs(30);

/// Runs `member` until `done` says so (given the store and how many tasks started), then
/// drops its `run`; panics if `run` panicked (or ended) first. Returns how many tasks
/// started.
async fn run_until(
    member: ShardMember<InMemoryLockManager, MemoryTerms>,
    terms: &MemoryTerms,
    done: impl AsyncFn(&MemoryTerms, usize) -> bool,
) -> usize {
    let (started, mut starts) = mpsc::unbounded_channel::<()>();
    let run = tokio::spawn(async move {
        let _ = member
            .run(move |_owned, _stop| {
                let _ = started.send(());
                std::future::pending::<()>()
            })
            .await;
    });
    let from = Instant::now();
    let mut count = 0;
    loop {
        while starts.try_recv().is_ok() {
            count += 1;
        }
        if run.is_finished() || done(terms, count).await {
            break;
        }
        assert!(
            from.elapsed() < WITHIN,
            "neither done nor ended: {count} started"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    run.abort();
    match run.await {
        Err(error) if error.is_panic() => {
            let panic = error.into_panic();
            let said = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("?");
            panic!("the member's run panicked: {said}")
        }
        Err(_) => count,
        Ok(()) => panic!("the member's run ended"),
    }
}

/// Whether `shard`'s latest term is `token`.
async fn term_is(terms: &MemoryTerms, shard: &str, token: i64) -> bool {
    let terms = terms.terms("projections").await.expect("the terms");
    terms.iter().any(|t| t.shard == shard && t.token == token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_delay_of_duration_max_waits_and_never_panics() {
    // A dead owner's term that recorded no notice: the next owner waits its own delay.
    let fleet = Fleet::new(1);
    fleet
        .terms
        .begin("projections", "tenant-0", 0, Some("gone"))
        .await
        .expect("a term its owner never ends");
    let member = fleet.member("next").takeover_delay(Duration::MAX);
    let started = run_until(member, &fleet.terms, async |terms, _| {
        term_is(terms, "tenant-0", 2).await
    })
    .await;
    assert_eq!(
        started, 0,
        "the task started inside an endless takeover delay"
    );

    // A dead owner's term that recorded Duration::MAX (its member's delay, as the memory
    // store keeps it): a next owner with the default delay waits it too.
    let fleet = Fleet::new(1);
    fleet
        .terms
        .begin_with_notice(
            "projections",
            "tenant-0",
            0,
            Some("gone"),
            Some(Duration::MAX),
        )
        .await
        .expect("a term its owner never ends");
    let member = fleet
        .member("next")
        .takeover_delay(locks_shard::DEFAULT_TAKEOVER_DELAY);
    let started = run_until(member, &fleet.terms, async |terms, _| {
        term_is(terms, "tenant-0", 2).await
    })
    .await;
    assert_eq!(started, 0, "the task started inside the recorded notice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_of_duration_max_ticks_once_at_the_join_and_never_panics() {
    let fleet = Fleet::new(1);
    let member = fleet.member("solo").tick(Duration::MAX);
    let started = run_until(member, &fleet.terms, async |_, started| started > 0).await;
    assert_eq!(started, 1, "the first tick, at the join, takes the shard");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_wait_of_duration_max_waits_for_the_fleet_and_never_panics() {
    // The terms name two members that did not leave cleanly: a fresh member expects them
    // back, for as long as its wait, and takes its share among two meanwhile.
    let fleet = Fleet::new(2);
    for (shard, holder) in [("tenant-0", "a"), ("tenant-1", "b")] {
        fleet
            .terms
            .begin("projections", shard, 1, Some(holder))
            .await
            .expect("a term");
    }
    let member = fleet.member("c").rejoin_wait(Duration::MAX);
    let started = run_until(member, &fleet.terms, async |_, started| started > 0).await;
    assert_eq!(started, 1, "its share among the two expected");
}

/// A renewal expiry below `MIN_RENEWAL_EXPIRY` (zero among them) ends `run` at once with
/// a `Configuration` error that names the floor, before the member joins; one at the
/// floor runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_expiry_below_the_floor_is_refused_at_once() {
    let floor = locks_shard::MIN_RENEWAL_EXPIRY;
    let mut not_refused = Vec::new();
    for expiry in [
        Duration::ZERO,
        Duration::from_millis(1),
        floor - Duration::from_nanos(1),
    ] {
        let fleet = Fleet::new(1);
        let member = fleet.member("m").renewal(Some(expiry));
        let (started, mut starts) = mpsc::unbounded_channel::<()>();
        let run = member.run(move |_owned, _stop| {
            let _ = started.send(());
            std::future::pending::<()>()
        });
        let Ok(ended) = tokio::time::timeout(Duration::from_secs(1), run).await else {
            let mut count = 0;
            while starts.try_recv().is_ok() {
                count += 1;
            }
            not_refused.push(format!("{expiry:?} ({count} task starts in 1 s)"));
            continue;
        };
        let error = ended.expect_err("run never returns Ok");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
        assert!(
            error.to_string().contains("at least 500ms"),
            "{expiry:?}: {error}"
        );
        assert!(
            fleet
                .member("observer")
                .owners()
                .await
                .expect("owners")
                .members
                .is_empty(),
            "{expiry:?}: it joined"
        );
    }
    assert!(
        not_refused.is_empty(),
        "renewal expiries not refused: {not_refused:?}"
    );
    let fleet = Fleet::new(1);
    let member = fleet.member("m").renewal(Some(floor));
    let started = run_until(member, &fleet.terms, async |_, started| started > 0).await;
    assert_eq!(started, 1, "a member at the floor runs");
}

/// A holder id with a NUL (which PostgreSQL's `text` cannot hold: its terms and roster
/// keep the holder id) ends `run` with a `Configuration` error once the member learns it
/// from its join, on every store alike, before any task runs; the member leaves its
/// place. (`locks-shard-postgres` runs the same case on PostgreSQL.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_id_no_store_can_keep_ends_the_run_at_once() {
    let fleet = Fleet::new(1);
    let member = fleet.member("pod\0-7");
    let (started, mut starts) = mpsc::unbounded_channel::<()>();
    let run = member.run(move |_owned, _stop| {
        let _ = started.send(());
        std::future::pending::<()>()
    });
    let ended = tokio::time::timeout(Duration::from_secs(1), run).await;
    let mut count = 0;
    while starts.try_recv().is_ok() {
        count += 1;
    }
    let error = ended
        .unwrap_or_else(|_| panic!("not refused: {count} task starts in 1 s"))
        .expect_err("run never returns Ok");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
    assert!(error.to_string().contains("NUL"), "{error}");
    assert_eq!(count, 0, "no task ran");
    let owners = fleet.member("observer").owners().await.expect("owners");
    assert!(owners.members.is_empty(), "it left: {owners:?}");
}
