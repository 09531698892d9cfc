//! A fleet across a server restart, on a cluster of the test's own (a restart of the
//! shared server would end every other test's sessions): every task is dropped as its
//! lock goes, nothing runs while the server is down, and once it is back every shard is
//! owned again, balanced, under newer tokens, no shard's next task started before its
//! last one stopped.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use locks_postgres::ANNOUNCED_LOSS_NOTICE;
use locks_shard::{DEFAULT_REJOIN_WAIT, DEFAULT_TAKEOVER_DELAY, Shards};

use crate::fleet::{BACKOFF, Fleet, Life, TICK};
use crate::record::SHARDS;
use crate::support::{drop_cluster, own_cluster};

/// How long the server stays down: long enough that every member's join fails and backs
/// off several times.
const OUTAGE: Duration = Duration::from_secs(1);

/// What opening the fleet's connections again costs on a loaded 2-core machine once the
/// server is back, beyond the members' own waits: three members' memberships and 24
/// shard locks, 24 term begins, and the tasks' first guarded writes, each on a new
/// connection.
const RECONNECT: Duration = Duration::from_secs(1);

fn tokens(owners: &Shards) -> BTreeMap<String, i64> {
    owners
        .shards
        .iter()
        .map(|(shard, owner)| (shard.clone(), owner.as_ref().expect("owned").token))
        .collect()
}

/// The shards whose next task started before their previous one stopped.
fn overlaps(lives: &[Life]) -> Vec<(Life, Life)> {
    let mut by_shard: BTreeMap<&str, Vec<&Life>> = BTreeMap::new();
    for life in lives {
        by_shard.entry(&life.shard).or_default().push(life);
    }
    let mut overlaps = Vec::new();
    for lives in by_shard.values_mut() {
        lives.sort_by_key(|life| life.from);
        for pair in lives.windows(2) {
            if pair[0].until.is_none_or(|until| until > pair[1].from) {
                overlaps.push((pair[0].clone(), pair[1].clone()));
            }
        }
    }
    overlaps
}

/// Three members settled on 24 shards (8 each), and the server restarts (`pg_ctl stop
/// -m fast`, down for 1 s, `pg_ctl start`). The promise:
/// - every task is dropped as its lock goes: within `ANNOUNCED_LOSS_NOTICE` (100 ms, the
///   loss-notice bound of a manager on `plain_pool`) of `pg_ctl stop` returning, and no
///   task starts while the server is down;
/// - all 24 shards are owned again and balanced (max − min ≤ 1: 8 each), each owner's
///   task running (it wrote under its new token), within back-off + 2 ticks + the
///   takeover delay + 1 s of the server accepting connections again: 0.2 + 0.1 + 0.5 + 1
///   = 1.8 s. Each member joins again at most a back-off (200 ms) after the server is
///   back, its first tick comes within a tick (50 ms) of the join, a shard whose term did
///   not end starts after the bound its last owner recorded (100 ms on `plain_pool`) or
///   the takeover delay (500 ms), and 1 s covers opening the fleet's connections again.
///   The rejoin wait (2 s) does not add to it: the members are back within a back-off of
///   each other, and until then each takes only its share of 8;
/// - each shard began exactly one new term (so none was taken by the first member back
///   and handed over again, which the rejoin wait prevents), under a token greater than
///   its last; no shard's task started before its previous task stopped, and no guarded
///   write was refused or interleaved with another owner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_all_24_shards_run_again_balanced_within_1_8_s() {
    let cluster = own_cluster("the shard restart test").await;
    let mut fleet = Fleet::on(&cluster.url()).await;
    let from = Instant::now();
    for name in ["s1", "s2", "s3"] {
        fleet.join(name);
    }
    let (before, took) = fleet.settled(3, from).await;
    let counts: Vec<usize> = before.counts().into_iter().map(|(_, n)| n).collect();
    eprintln!("3 members settled after {took:?}: {counts:?}");
    assert_eq!(counts, [8, 8, 8], "three members own 8 shards each");
    let lives_before = fleet.lives().len();

    // Down.
    let stopping = Instant::now();
    tokio::task::block_in_place(|| cluster.stop()).expect("pg_ctl stop -m fast");
    let down = Instant::now();
    let deadline = down + ANNOUNCED_LOSS_NOTICE + Duration::from_secs(5);
    while fleet.lives().iter().any(|life| !life.stopped) {
        assert!(
            Instant::now() < deadline,
            "tasks still run: {:?}",
            fleet.lives()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let last_stop = fleet
        .lives()
        .iter()
        .filter_map(|life| life.until)
        .max()
        .expect("tasks stopped");
    eprintln!(
        "pg_ctl stop took {:?}; the last task was dropped {:?} after it was called",
        down - stopping,
        last_stop.saturating_duration_since(stopping)
    );
    assert!(
        last_stop <= down + ANNOUNCED_LOSS_NOTICE,
        "a task was dropped {:?} after pg_ctl stop returned, more than {ANNOUNCED_LOSS_NOTICE:?}",
        last_stop - down
    );
    tokio::time::sleep(OUTAGE).await;
    assert_eq!(
        fleet.lives().len(),
        lives_before,
        "a task started while the server was down"
    );

    // Back.
    tokio::task::block_in_place(|| cluster.start_again()).expect("pg_ctl start");
    let up = Instant::now();
    let bound = BACKOFF + 2 * TICK + DEFAULT_TAKEOVER_DELAY + RECONNECT;
    let old = tokens(&before);
    let (after, took) = fleet.watcher.settled_past(3, up, bound, &old).await;
    let counts: Vec<usize> = after.counts().into_iter().map(|(_, n)| n).collect();
    let lives = fleet.lives();
    let started_again = lives.len() - lives_before;
    eprintln!(
        "back: every shard running again, balanced {counts:?}, after {took:?} (bound \
         {bound:?}; rejoin wait {DEFAULT_REJOIN_WAIT:?}), {started_again} tasks started"
    );
    let (min, max) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    assert!(max - min <= 1, "balanced: {counts:?}");
    assert_eq!(counts.iter().sum::<usize>(), SHARDS, "every shard owned");
    for (shard, token) in &tokens(&after) {
        assert_eq!(
            *token,
            old[shard] + 1,
            "{shard}: one new term after the restart, under a greater token"
        );
    }
    assert_eq!(started_again, SHARDS, "one new task per shard");

    fleet.leave_all().await;
    let overlapping = overlaps(&fleet.lives());
    assert!(
        overlapping.is_empty(),
        "a shard's next task started before its last one stopped: {overlapping:?}"
    );
    let (interleaved, refused) = fleet.watcher.interleaved_and_refused(&[]).await;
    assert_eq!(
        (interleaved, refused),
        (0, 0),
        "two owners of a shard wrote in between each other, or a write was refused"
    );
    drop(fleet);
    drop_cluster(cluster);
}
