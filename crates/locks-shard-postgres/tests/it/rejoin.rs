//! A member whose membership session alone ends (its membership permit's backend
//! terminated, its shard locks still held): it joins again and keeps its shards, their
//! terms and their tasks; nothing moves, and the fleet is balanced after. It joins again
//! under another slot (a lower one is free), so the store must record the kept terms
//! under the new slot for observers to name their owner.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use locks_shard::locks_port::PermitDerivation;

use crate::fleet::{Fleet, holders};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_membership_session_ends_keeps_its_shards_and_their_tasks() {
    let mut fleet = Fleet::new().await;
    // r0 takes the first slot and leaves it free for r2's new membership.
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
    let slot_of = |owners: &locks_shard::Shards| {
        owners
            .shards
            .iter()
            .filter_map(|(_, owner)| owner.as_ref())
            .find(|owner| owner.holder_id.as_deref() == Some("r2"))
            .map(|owner| owner.member)
            .expect("r2 owns shards")
    };
    let kept: BTreeMap<String, i64> = before
        .shards
        .iter()
        .filter_map(|(shard, owner)| {
            let owner = owner.as_ref()?;
            (owner.holder_id.as_deref() == Some("r2")).then(|| (shard.clone(), owner.token))
        })
        .collect();
    assert_eq!(kept.len(), 8, "r2 owns its share of 24 over 3");
    let lives_before = fleet.lives();

    // Only r2's membership session ends; its 8 shard sessions go on.
    let old = membership_backend(&fleet, "r2")
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
    // r2 holds a membership permit again, on another session.
    loop {
        if membership_backend(&fleet, "r2")
            .await
            .is_some_and(|pid| pid != old)
        {
            break;
        }
        assert!(from.elapsed() < SETTLE, "r2 never joined again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
        let owner = after
            .shards
            .iter()
            .find(|(name, _)| name == shard)
            .and_then(|(_, owner)| owner.clone())
            .expect("owned");
        assert_eq!(owner.token, *token, "{shard} began a new term");
    }

    fleet.leave_all().await;
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!(
        (interleaved, refused),
        (0, 0),
        "two owners of a shard wrote in between each other, or a write was refused"
    );
}
