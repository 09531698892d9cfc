//! A member whose membership session alone ends (its membership permit's backend
//! terminated, its shard locks still held): it joins again and keeps its shards, their
//! terms and their tasks; nothing moves, and the fleet is balanced after. It joins again
//! under another slot (a lower one is free), so the store must record the kept terms
//! under the new slot for observers to name their owner.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use locks_shard::locks_port::PermitDerivation;
use locks_shard::{ShardOwner, Shards};

use crate::fleet::{Fleet, holders, terms_of};
use crate::support::admin;

const SETTLE: Duration = Duration::from_secs(20);

/// The backend holding `holder`'s membership permit of the fleet's group, if any.
async fn membership_backend(fleet: &Fleet, holder: &str) -> Option<i32> {
    let class = PermitDerivation::CURRENT.class(&fleet.watcher.group.members_name());
    admin()
        .await
        .query_opt(
            "SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
               AND l.classid = $1::int4::oid AND a.application_name = $2",
            &[&class, &format!("locks:{holder}")],
        )
        .await
        .expect("the membership backend")
        .map(|row| row.get(0))
}

/// r1, r2 and r3 settled on 24 shards, with r2's membership on a slot above a free one
/// (r0 took the first slot and left), and the shards r2 owns with their tokens.
async fn three_members() -> (Fleet, Shards, BTreeMap<String, i64>) {
    let mut fleet = Fleet::new().await;
    let from = Instant::now();
    fleet.join("r0");
    fleet.settled(1, from).await;
    for name in ["r1", "r2", "r3"] {
        fleet.join(name);
    }
    fleet.settled(4, from).await;
    let from = Instant::now();
    fleet.leave("r0").await;
    let (before, _) = fleet.settled(3, from).await;
    let kept = terms_of(&before, "r2");
    assert_eq!(kept.len(), 8, "r2 owns its share of 24 over 3");
    (fleet, before, kept)
}

/// Ends r2's membership session alone (its shard sessions go on) and waits until r2
/// holds a membership permit again, on another session; returns when it was ended.
async fn end_r2_s_membership_session(fleet: &Fleet) -> Instant {
    let old = membership_backend(fleet, "r2")
        .await
        .expect("r2 holds a membership permit");
    let from = Instant::now();
    let ended: bool = admin()
        .await
        .query_one("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .expect("terminate")
        .get(0);
    assert!(ended, "the membership backend was terminated");
    loop {
        if membership_backend(fleet, "r2")
            .await
            .is_some_and(|pid| pid != old)
        {
            break;
        }
        assert!(from.elapsed() < SETTLE, "r2 never joined again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    from
}

fn owner_of<'a>(owners: &'a Shards, shard: &str) -> &'a ShardOwner {
    owners
        .shards
        .iter()
        .find(|(name, _)| name == shard)
        .and_then(|(_, owner)| owner.as_ref())
        .expect("owned")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_membership_session_ends_keeps_its_shards_and_their_tasks() {
    let (mut fleet, before, kept) = three_members().await;
    let slot_of = |owners: &Shards| {
        owners
            .shards
            .iter()
            .filter_map(|(_, owner)| owner.as_ref())
            .find(|owner| owner.holder_id.as_deref() == Some("r2"))
            .map(|owner| owner.member)
            .expect("r2 owns shards")
    };
    let lives_before = fleet.lives();

    // Only r2's membership session ends; its 8 shard sessions go on.
    let from = end_r2_s_membership_session(&fleet).await;
    let (after, took) = fleet.settled(3, from).await;
    eprintln!(
        "r2's membership session terminated: joined again (slot {} → {}), settled after \
         {took:?}, {:?}",
        slot_of(&before),
        slot_of(&after),
        after.counts()
    );

    // Nothing moved, no term began, no task stopped or started.
    let lives = fleet.lives();
    let stopped: Vec<_> = lives
        .iter()
        .zip(&lives_before)
        .filter(|(now, then)| now.stopped && !then.stopped)
        .map(|(now, _)| now)
        .collect();
    assert!(
        stopped.is_empty(),
        "tasks stopped after r2's membership session ended: {stopped:?}"
    );
    assert_eq!(
        lives.len(),
        lives_before.len(),
        "tasks started after r2's membership session ended: {:?}",
        &lives[lives_before.len()..]
    );
    assert_eq!(holders(&after), holders(&before), "a shard moved");
    assert_ne!(
        slot_of(&after),
        slot_of(&before),
        "r2 joined again under its old slot: the test did not see a kept term re-recorded"
    );
    for (shard, token) in &kept {
        assert_eq!(
            owner_of(&after, shard).token,
            *token,
            "{shard} began a new term"
        );
    }

    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!(
        (interleaved, refused),
        (0, 0),
        "two owners of a shard wrote in between each other, or a write was refused"
    );
}

/// A member that joins again after another member began a newer term of one of its
/// shards while it was away (after a partition: its lock of the shard lost, and the loss
/// not told yet) drops that term's task at once instead of counting the shard as its
/// own, keeps its other terms, and the shard is owned again. The newer term is written
/// into the table here as that other member's `begin` would write it: r2's lock of the
/// shard is in fact still held, so that nothing but the term store tells r2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_joins_again_drops_a_term_superseded_while_it_was_away() {
    let (mut fleet, _, kept) = three_members().await;
    let (gone, gone_token) = kept
        .iter()
        .next()
        .map(|(shard, token)| (shard.clone(), *token))
        .expect("a shard of r2");
    let superseded = admin()
        .await
        .execute(
            "UPDATE locks_shard_terms SET token = token + 1, member_slot = 999, \
               holder_id = 'elsewhere', since = clock_timestamp(), ended = false \
             WHERE group_name = $1 AND shard = $2 AND token = $3",
            &[&fleet.watcher.group.name(), &gone, &gone_token],
        )
        .await
        .expect("a newer term");
    assert_eq!(superseded, 1, "the newer term was written");

    let from = end_r2_s_membership_session(&fleet).await;
    loop {
        let stopped = fleet.lives().iter().any(|life| {
            life.member == "r2" && life.shard == gone && life.token == gone_token && life.stopped
        });
        if stopped {
            break;
        }
        assert!(
            from.elapsed() < SETTLE,
            "r2 joined again and kept running {gone} under token {gone_token}, superseded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dropped_after = from.elapsed();
    let (after, took) = fleet.settled(3, from).await;
    eprintln!(
        "r2 joined again: its superseded term of {gone} dropped after {dropped_after:?}, \
         settled after {took:?}, {:?}",
        after.counts()
    );
    assert!(
        owner_of(&after, &gone).token > gone_token + 1,
        "{gone} is owned again under a term after the superseding one"
    );
    for (shard, token) in kept.iter().filter(|(shard, _)| **shard != gone) {
        let owner = owner_of(&after, shard);
        assert_eq!(
            (owner.holder_id.as_deref(), owner.token),
            (Some("r2"), *token),
            "{shard}: r2's other terms go on"
        );
    }
    let stopped: Vec<_> = fleet
        .lives()
        .into_iter()
        .filter(|life| life.member == "r2" && life.stopped && life.shard != gone)
        .collect();
    assert!(stopped.is_empty(), "r2 stopped other tasks: {stopped:?}");

    fleet.leave_all().await;
    // r2's task of the superseded term wrote under the old token until it was dropped;
    // the guard refused those writes.
    let (interleaved, _) = fleet.watcher.interleaved_and_refused(&["r2"]).await;
    assert_eq!(
        interleaved, 0,
        "two owners of a shard wrote in between each other"
    );
}
