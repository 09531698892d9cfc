//! The roster: members read their group's members from the member table and a probe of
//! each listed slot, never from `pg_locks`. It names the members the lock table shows; a
//! member missing from it (its row deleted) enters again on its next tick, and nothing
//! moves meanwhile; a member without a holder id or renewals is listed too.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_shard::locks_port::Semaphore;
use locks_shard::{ShardMember, ShardTerms};

use crate::fleet::{Fleet, holders};
use crate::record::{SHARDS, Watcher, group};
use crate::support::{admin, pool, unique};

const WITHIN: Duration = Duration::from_secs(20);

/// How soon a member whose row is gone is listed again: its next tick (50 ms here), with
/// room for a loaded machine; its renewals come every 12 s in that test.
const ENTERED_AGAIN: Duration = Duration::from_secs(2);

/// The group's members as (slot, holder id): from the roster, and from `pg_locks`.
async fn both(
    watcher: &Watcher,
) -> (
    BTreeSet<(u32, Option<String>)>,
    BTreeSet<(u32, Option<String>)>,
) {
    let members = watcher.group.members_name();
    let roster = watcher
        .terms
        .roster(watcher.group.name(), &members)
        .await
        .expect("the roster")
        .expect("the PostgreSQL store keeps a roster");
    let locks = watcher
        .observer
        .permit_holders(&members)
        .await
        .expect("the permit holders")
        .held;
    let pairs = |held: Vec<locks_shard::locks_port::PermitHolder>| {
        held.into_iter().map(|h| (h.slot, h.holder_id)).collect()
    };
    (pairs(roster), pairs(locks))
}

/// Waits until the roster names what `pg_locks` shows, with `count` members.
async fn agree(watcher: &Watcher, count: usize) -> BTreeSet<(u32, Option<String>)> {
    let from = Instant::now();
    loop {
        let (roster, locks) = both(watcher).await;
        if roster == locks && roster.len() == count {
            return roster;
        }
        assert!(
            from.elapsed() < WITHIN,
            "the roster {roster:?} never named the {count} members the lock table shows: {locks:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Members `o0`, `o1` and `o2` joining, and when they began to. Their renewals (which
/// write a member's row too) come every 12 s: what brings a row back within
/// [`ENTERED_AGAIN`] is a member's tick.
async fn three_members() -> (Fleet, Instant) {
    let mut fleet = Fleet::new().await;
    fleet.renewal = Some(Duration::from_secs(60));
    let from = Instant::now();
    for name in ["o0", "o1", "o2"] {
        fleet.join(name);
    }
    (fleet, from)
}

/// Waits until the roster names `listed` again, each member under its own slot and
/// name, after `what` at `from`: within [`ENTERED_AGAIN`], the members' next ticks.
async fn listed_again(
    watcher: &Watcher,
    listed: &BTreeSet<(u32, Option<String>)>,
    from: Instant,
    what: &str,
) {
    assert_eq!(
        &agree(watcher, listed.len()).await,
        listed,
        "each member under its slot and name again"
    );
    let took = from.elapsed();
    eprintln!("every member listed again {took:?} after {what}");
    assert!(
        took < ENTERED_AGAIN,
        "listed again {took:?} after {what}, not on the members' next tick (50 ms)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_roster_names_the_members_and_one_whose_row_is_gone_enters_again_with_nothing_moved() {
    let (mut fleet, from) = three_members().await;
    let (before, _) = fleet.settled(3, from).await;
    let listed = agree(&fleet.watcher, 3).await;
    assert_eq!(
        listed
            .iter()
            .filter_map(|(_, h)| h.as_deref())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from(["o0", "o1", "o2"])
    );
    let lives_before = fleet.lives().len();

    // Every row goes (an operator's mistake, a restore): each member finds itself
    // missing on its next tick and enters again.
    let deleted = admin()
        .await
        .execute(
            "DELETE FROM locks_shard_members WHERE group_name = $1",
            &[&fleet.watcher.group.name()],
        )
        .await
        .expect("delete the rows");
    assert_eq!(deleted, 3, "a row per member");
    let back = Instant::now();
    listed_again(&fleet.watcher, &listed, back, "every member's row deleted").await;
    let (after, _) = fleet.settled(3, back).await;
    assert_eq!(holders(&after), holders(&before), "a shard moved");
    assert_eq!(
        fleet.lives().len(),
        lives_before,
        "a task started: a shard moved"
    );

    // A member that left is not listed, though its row stays.
    let o1_slot = listed
        .iter()
        .find(|(_, h)| h.as_deref() == Some("o1"))
        .map(|(slot, _)| *slot)
        .expect("o1 listed");
    let from = Instant::now();
    fleet.leave("o1").await;
    fleet.settled(2, from).await;
    let rows: i64 = admin()
        .await
        .query_one(
            "SELECT count(*) FROM locks_shard_members WHERE group_name = $1 AND member_slot = $2",
            &[&fleet.watcher.group.name(), &(o1_slot as i32)],
        )
        .await
        .expect("o1's row")
        .get(0);
    assert_eq!(rows, 1, "o1's row stays until it expires");
    let listed = agree(&fleet.watcher, 2).await;
    assert!(
        !listed.iter().any(|(slot, _)| *slot == o1_slot),
        "o1 listed after it left"
    );

    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!((interleaved, refused), (0, 0));
}

/// A row that names another member under a member's slot: the write of a member's row for
/// the slot it held before (a renewal sent before a network cut, delivered after it),
/// reaching the server after the slot's new holder entered. Every member then counted one
/// member too few (seen in a soak: three members each computing a share of 12 of 24, and
/// none taking a killed member's shards while it expected three back). The slot's holder
/// enters again on its next tick, and when a member leaves the other two share its shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_naming_another_member_under_a_held_slot_is_written_again_by_its_holder() {
    let (mut fleet, from) = three_members().await;
    fleet.settled(3, from).await;
    let listed = agree(&fleet.watcher, 3).await;
    let slots: Vec<(u32, String)> = listed
        .iter()
        .map(|(slot, holder)| (*slot, holder.clone().expect("a holder id")))
        .collect();
    let (lowest, highest) = (&slots[0], &slots[2]);

    // The highest slot's row names the lowest slot's member, as its late renewal would.
    let written = admin()
        .await
        .execute(
            "UPDATE locks_shard_members SET application_name = $3 \
             WHERE group_name = $1 AND member_slot = $2",
            &[
                &fleet.watcher.group.name(),
                &(highest.0 as i32),
                &locks_postgres::holder_application_name(&lowest.1),
            ],
        )
        .await
        .expect("the late write");
    assert_eq!(written, 1);
    listed_again(&fleet.watcher, &listed, Instant::now(), "a late write").await;

    // The member in the middle leaves: the other two share its shards, 12 and 12.
    let from = Instant::now();
    fleet.leave(&slots[1].1).await;
    fleet.settled(2, from).await;
    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!((interleaved, refused), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_a_holder_id_or_renewals_is_listed_and_keeps_its_row() {
    let watcher = Watcher::new(group(&unique("anonymous"))).await;
    let anonymous = ShardMember::new(
        PostgresLockManager::builder(pool(SHARDS + 4)).build(),
        watcher.terms.clone(),
        watcher.group.clone(),
    )
    .tick(Duration::from_millis(50))
    .renewal(None);
    let run = tokio::spawn(async move {
        anonymous
            .run(|_, stop| async move {
                let _ = stop.await;
            })
            .await
    });
    let listed = agree(&watcher, 1).await;
    assert_eq!(
        listed.into_iter().next().map(|(_, holder)| holder),
        Some(None),
        "listed without a holder id"
    );
    let never: bool = admin()
        .await
        .query_one(
            "SELECT expires = 'infinity' FROM locks_shard_members WHERE group_name = $1",
            &[&watcher.group.name()],
        )
        .await
        .expect("its row")
        .get(0);
    assert!(
        never,
        "a member that does not renew has a row that does not expire"
    );
    let from = Instant::now();
    loop {
        if watcher.owners().await.is_balanced() {
            break;
        }
        assert!(
            from.elapsed() < WITHIN,
            "the lone member never owned every shard"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.abort();
}

/// Holder ids longer than the server keeps of an `application_name` (63 bytes with the
/// `locks:` prefix), alike in their first 57 bytes: a pod name and a UUID are as long.
/// The roster named each member by its cut application name, so `owners` named no owner
/// (the terms carry the whole id), each member found itself named wrong and entered again
/// on every tick, and the two counted as one on the lists of others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_whose_holder_ids_are_longer_than_an_application_name_are_named_whole() {
    let mut fleet = Fleet::new().await;
    let prefix = "projections-worker-eu-west-1-7c9f8d6b5-x2x4z-0123456789abcdef";
    assert!(prefix.len() > 63 - "locks:".len());
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    let from = Instant::now();
    fleet.join(&a);
    fleet.join(&b);
    let (owners, _) = fleet.settled(2, from).await;
    let named: BTreeSet<Option<String>> = holders(&owners).into_values().collect();
    assert_eq!(named, BTreeSet::from([Some(a.clone()), Some(b.clone())]));
    let roster: BTreeSet<Option<String>> = fleet
        .watcher
        .terms
        .roster(
            fleet.watcher.group.name(),
            &fleet.watcher.group.members_name(),
        )
        .await
        .expect("the roster")
        .expect("a roster")
        .into_iter()
        .map(|h| h.holder_id)
        .collect();
    assert_eq!(
        roster,
        BTreeSet::from([Some(a), Some(b)]),
        "each named whole"
    );
    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!((interleaved, refused), (0, 0));
}

/// A renewal expiry too long for the server's clock (`Duration::MAX`, which
/// `ShardMember::renewal` accepts and whose self-stop never comes due): the member's row
/// could not be written (`make_interval` out of range), by its renewal or by its entry,
/// so the roster never listed it and `owners` named no owner of its shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_renewal_expiry_is_too_long_for_the_clock_is_listed_and_never_expires() {
    let watcher = Watcher::new(group(&unique("endless"))).await;
    let member = ShardMember::new(
        crate::support::manager("endless", SHARDS + 4),
        watcher.terms.clone(),
        watcher.group.clone(),
    )
    .tick(Duration::from_millis(50))
    .renewal(Some(Duration::MAX));
    let run = tokio::spawn(async move {
        member
            .run(|_, stop| async move {
                let _ = stop.await;
            })
            .await
    });
    let from = Instant::now();
    loop {
        let owners = watcher.owners().await;
        if owners.is_balanced() {
            break;
        }
        assert!(
            from.elapsed() < WITHIN,
            "the lone member was never named the owner of every shard: {:?}",
            owners.counts()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let never: bool = admin()
        .await
        .query_one(
            "SELECT expires = 'infinity' FROM locks_shard_members WHERE group_name = $1",
            &[&watcher.group.name()],
        )
        .await
        .expect("its row")
        .get(0);
    assert!(never, "its row never expires");
    run.abort();
}

/// A holder id with a NUL, which the roster's and the terms' `text` cannot hold, ends
/// `run` with a `Configuration` error once the member has joined, before any task runs,
/// and leaves its place: as on the memory store (`locks-shard`'s
/// `a_holder_id_no_store_can_keep_ends_the_run_at_once`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_id_no_store_can_keep_ends_the_run_at_once() {
    let name = unique("nul-holder");
    let member = ShardMember::new(
        crate::support::manager(&format!("{}\0-7", unique("pod")), SHARDS + 4),
        crate::support::terms().await,
        group(&name),
    )
    .tick(Duration::from_millis(50))
    .backoff(Duration::from_millis(200));
    let starts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = starts.clone();
    let run = member.run(move |_, stop| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async move {
            let _ = stop.await;
        }
    });
    let ended = tokio::time::timeout(Duration::from_secs(3), run).await;
    let started = starts.load(std::sync::atomic::Ordering::SeqCst);
    let error = ended
        .unwrap_or_else(|_| panic!("not refused: {started} task starts in 3 s"))
        .expect_err("run never returns Ok");
    assert_eq!(
        error.kind(),
        locks_shard::locks_port::AcquisitionErrorKind::Configuration,
        "{error}"
    );
    assert!(error.to_string().contains("NUL"), "{error}");
    assert_eq!(started, 0, "no task ran");
    let watcher = Watcher::new(group(&name)).await;
    assert!(agree(&watcher, 0).await.is_empty(), "it left its place");
}
