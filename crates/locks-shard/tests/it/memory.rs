use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use locks_port::{
    AcquisitionErrorKind, LockAcquisitionError, LostReason, LostSignal, PermitHolder,
    Semaphore as _,
};
use locks_shard::{
    Begun, MemoryTerms, Owned, ShardGroup, ShardMember, ShardTerms, Term, target_share,
};

use crate::support::{Drain, Fleet, moved};

const SETTLE: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_leaves_stay_balanced_move_only_what_must_and_never_overlap() {
    let mut fleet = Fleet::new(24);
    fleet.drain = Drain::Slow(Duration::from_millis(60));
    fleet.join("m1");
    fleet.settled(SETTLE).await;
    // 1 → 3 → 5 → 2 → 4, one change at a time.
    let changes: [(&str, bool); 10] = [
        ("m2", true),
        ("m3", true),
        ("m4", true),
        ("m5", true),
        ("m3", false),
        ("m4", false),
        ("m5", false),
        ("m6", true),
        ("m7", true),
        ("m1", false),
    ];
    for (name, joins) in changes {
        let before = fleet.recorder.running();
        let lives_before = fleet.recorder.snapshot().len();
        let left_with = before.values().filter(|m| *m == name).count();
        if joins {
            fleet.join(name);
        } else {
            fleet.leave(name).await;
        }
        let (owners, took) = fleet.settled(SETTLE).await;
        let after = fleet.recorder.running();
        let moves = moved(&before, &after);
        // Tasks started by the change: a shard restarted on its own member counts too.
        let restarts = fleet.recorder.snapshot().len() - lives_before;
        let counts = owners.counts();
        eprintln!(
            "{} {name}: {} members, moves {moves}, restarts {restarts}, settled in {took:?}, \
             counts {counts:?}",
            if joins { "join" } else { "leave" },
            owners.members.len()
        );
        if joins {
            let share = after.values().filter(|m| *m == name).count();
            assert!(
                moves <= share,
                "the join of {name} moved {moves} shards, its share is {share}"
            );
            assert_eq!(restarts, moves, "only the moved shards restarted");
        } else {
            assert_eq!(moves, left_with, "a leave moves only the leaver's shards");
            assert_eq!(restarts, moves, "only the moved shards restarted");
        }
    }
    assert_eq!(
        fleet.recorder.overlaps(),
        Vec::new(),
        "two tasks of one shard at once"
    );
    for name in fleet.names() {
        fleet.leave(&name).await;
    }
    assert!(fleet.table.is_empty(), "every lock and permit released");
    assert!(fleet.recorder.running().is_empty());
}

/// A member killed and started again takes the same membership slot back, so a shed
/// order fixed per slot (the score alone) moved the same shards at every join. Shedding
/// the longest held spreads the moves: 6 joins of 8 shards each over 24 shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_killed_and_started_again_are_handed_different_shards_each_time() {
    let mut fleet = Fleet::new(24);
    for name in ["a", "b", "c0"] {
        fleet.join(name);
        fleet.settled(SETTLE).await;
    }
    let mut handed: BTreeMap<usize, usize> = BTreeMap::new();
    for round in 1..=6 {
        fleet.abort(&format!("c{}", round - 1)).await;
        fleet.settled(SETTLE).await;
        let before = fleet.recorder.running();
        let joiner = format!("c{round}");
        fleet.join(&joiner);
        fleet.settled(SETTLE).await;
        for (shard, member) in fleet.recorder.running() {
            if member == joiner && before.get(&shard) != Some(&member) {
                *handed.entry(shard).or_default() += 1;
            }
        }
    }
    let most = handed.values().copied().max().unwrap_or(0);
    eprintln!("shards handed to a member started again, by shard: {handed:?}");
    assert_eq!(
        handed.values().sum::<usize>(),
        48,
        "each join took its share of 8"
    );
    assert!(
        most <= 3,
        "one shard was handed to a member started again {most} times in 6 joins \
         (48 moves over 24 shards): {handed:?}"
    );
    assert_eq!(
        fleet.recorder.overlaps(),
        Vec::new(),
        "two tasks of one shard at once"
    );
}

/// A clean hand-off ends its term before the lock is released, so the next owner starts
/// at once, not after a takeover delay (here ten minutes, which only a term left open
/// would make anyone wait): a join's moves and a leave's. And a clean leave of the whole
/// fleet leaves no term open, so a fresh member takes every shard at once, not after its
/// rejoin wait (2 s) for a fleet that is not coming back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_hand_offs_end_their_terms_so_nobody_waits_a_takeover_delay() {
    let mut fleet = Fleet::new(6);
    fleet.takeover = Duration::from_secs(600);
    fleet.join("a");
    fleet.settled(SETTLE).await;
    fleet.join("b");
    let (_, took) = fleet.settled(SETTLE).await;
    eprintln!("b's share moved in {took:?}");
    fleet.leave("a").await;
    let (_, took) = fleet.settled(SETTLE).await;
    eprintln!("a's shards moved in {took:?}");
    fleet.leave("b").await;
    let joined = Instant::now();
    fleet.join("c");
    let (_, took) = fleet.settled(SETTLE).await;
    assert!(
        joined.elapsed() < Duration::from_secs(1),
        "a fresh member waited for a fleet that left cleanly: {took:?}"
    );
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

/// A member that lost everything (its session ended, as in a server restart) joins again
/// expecting the fleet it saw: it takes only its share among them (8 of 24 with three)
/// until they are back or its rejoin wait (2 s) ran out, so the first one back does not
/// take every shard only to hand most of them over again. Here the others never come
/// back, so it then takes them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_first_takes_its_share_until_its_rejoin_wait_ran_out() {
    let mut fleet = Fleet::new(24);
    // a ticks slowly, so that none of its ticks falls between the others' end and its
    // own: its last member list is the three of them.
    fleet.tick = Duration::from_millis(500);
    fleet.join("a");
    fleet.tick = crate::support::TICK;
    fleet.join("b");
    fleet.join("c");
    fleet.settled(SETTLE).await;
    fleet.abort("b").await;
    fleet.abort("c").await;
    let lost = fleet
        .get("a")
        .manager
        .end_session(LostReason::ConnectionClosed);
    assert!(lost > 8, "its shards and its membership: {lost}");
    let gone = Instant::now();
    let owned_by_a = |fleet: &Fleet| {
        (fleet.recorder.running().values())
            .filter(|m| *m == "a")
            .count()
    };
    let mut most = 0;
    while gone.elapsed() < Duration::from_millis(1500) {
        most = most.max(owned_by_a(&fleet));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        most <= 8,
        "a took {most} of 24 before its rejoin wait ran out"
    );
    fleet.settled(SETTLE).await;
    assert_eq!(owned_by_a(&fleet), 24);
    eprintln!(
        "a ran at most {most} shards, then all 24 after {:?}",
        gone.elapsed()
    );
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_stops_its_task_at_once_and_moves_under_a_newer_token() {
    let mut fleet = Fleet::new(6);
    fleet.join("a");
    fleet.join("b");
    let (owners, _) = fleet.settled(SETTLE).await;
    let (shard, owner) = owners.shards[0].clone();
    let owner = owner.expect("owned");
    let holder = owner.holder_id.clone().expect("a holder id");
    let manager = &fleet.get(&holder).manager;
    assert!(manager.lose(&fleet.group.shard_key(&shard), LostReason::ConnectionClosed));
    let started = Instant::now();
    loop {
        let lives = fleet.recorder.snapshot();
        let old = lives
            .iter()
            .find(|life| life.shard == 0 && life.token == owner.token)
            .expect("the old life");
        let newer = lives
            .iter()
            .find(|life| life.shard == 0 && life.token > owner.token);
        if let Some(newer) = newer {
            assert!(old.stop.is_some_and(|stop| stop < newer.start));
            break;
        }
        assert!(started.elapsed() < SETTLE, "shard 0 never ran again");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        !fleet.terms.is_latest("projections", &shard, owner.token),
        "the old term's writes are refused"
    );
    fleet.settled(SETTLE).await;
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

/// The README's second fault for a user's tests: `end_session` on one member's manager
/// ends every lock it holds and its membership, as a killed process's sessions end. Each
/// of its shards runs again under a newer term only after its old task stopped, and the
/// member, still running, joins again and gets its share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_session_ends_loses_every_shard_and_the_fleet_settles_again() {
    let mut fleet = Fleet::new(6);
    fleet.join("a");
    fleet.join("b");
    let (owners, _) = fleet.settled(SETTLE).await;
    let held: Vec<(String, i64)> = (owners.shards.iter())
        .filter_map(|(shard, owner)| {
            let owner = owner
                .as_ref()
                .filter(|o| o.holder_id.as_deref() == Some("a"))?;
            Some((shard.clone(), owner.token))
        })
        .collect();
    assert_eq!(held.len(), 3, "{owners:?}");
    let ended = (fleet.get("a").manager).end_session(LostReason::ConnectionClosed);
    assert_eq!(ended, 4, "its three shard locks and its membership permit");
    let started = Instant::now();
    while (held.iter()).any(|(shard, token)| fleet.terms.is_latest("projections", shard, *token)) {
        assert!(started.elapsed() < SETTLE, "a's shards never ran again");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (owners, _) = fleet.settled(SETTLE).await;
    assert_eq!(owners.members.len(), 2, "a joined again: {owners:?}");
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

// Two threads: the woken tick may run at once; the double frees a lost key before it
// tells the guard (as PostgreSQL does), so the retake finds it free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_takes_a_lost_shard_back_at_once_not_on_its_next_tick() {
    let fleet = Fleet::new(2);
    let manager = fleet.table.manager_with_holder_id("a");
    // A tick far longer than the test may take: only the wake on the lost term can
    // bring the shard back in time.
    let member = ShardMember::new(manager.clone(), fleet.terms.clone(), fleet.group.clone())
        .tick(Duration::from_secs(600));
    let recorder = fleet.recorder.clone();
    let run = tokio::spawn(async move {
        let _ = member
            .run(move |owned, stop| {
                let alive = recorder.start("a", &owned);
                async move {
                    let _alive = alive;
                    stop.await;
                }
            })
            .await;
    });
    let started = Instant::now();
    while fleet.recorder.running().len() < 2 {
        assert!(
            started.elapsed() < SETTLE,
            "the first tick took both shards"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first = fleet.recorder.snapshot()[0].clone();
    let shard = fleet.group.shard(first.shard).expect("a shard").to_owned();
    assert!(manager.lose(&fleet.group.shard_key(&shard), LostReason::ConnectionClosed));
    let lost = Instant::now();
    loop {
        let lives = fleet.recorder.snapshot();
        if lives.iter().any(|life| {
            life.shard == first.shard && life.token > first.token && life.stop.is_none()
        }) {
            break;
        }
        assert!(
            lost.elapsed() < SETTLE,
            "the lost shard waited for the next tick (600 s): {lives:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!("the lost shard ran again after {:?}", lost.elapsed());
    run.abort();
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ignores_its_stop_is_dropped_when_the_grace_runs_out() {
    let mut fleet = Fleet::new(4);
    fleet.drain = Drain::Never;
    fleet.grace = Duration::from_millis(150);
    fleet.join("a");
    fleet.settled(SETTLE).await;
    fleet.join("b");
    let leaving = Instant::now();
    fleet.leave("a").await;
    let took = leaving.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(2),
        "left in {took:?}"
    );
    fleet.settled(SETTLE).await;
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_member_s_shards_are_taken_after_the_takeover_delay_without_overlap() {
    let mut fleet = Fleet::new(8);
    fleet.join("a");
    fleet.join("b");
    fleet.settled(SETTLE).await;
    fleet.abort("a").await;
    let (owners, took) = fleet.settled(SETTLE).await;
    eprintln!("after a's death: {:?} in {took:?}", owners.counts());
    assert_eq!(owners.counts().len(), 1);
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
    fleet.abort("b").await;
    // Dropping `run` releases everything: the tasks stop, then the locks are freed.
    let started = Instant::now();
    while !fleet.table.is_empty() || !fleet.recorder.running().is_empty() {
        assert!(
            started.elapsed() < SETTLE,
            "left held after run was dropped"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// How long after the previous term (not ended) began the next owner's task started,
/// when that term recorded `notice` and the member's own takeover delay is `delay`.
async fn takeover_after(notice: Option<Duration>, delay: Duration) -> Duration {
    let fleet = Fleet::new(1);
    let begun = Instant::now();
    fleet
        .terms
        .begin_with_notice("projections", "tenant-0", 0, Some("gone"), notice)
        .await
        .expect("a term its owner never ends");
    let member = fleet.member("next").takeover_delay(delay);
    let (started, mut start) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let run = tokio::spawn(async move {
        let _ = member
            .run(move |_owned, _stop| {
                let _ = started.send(Instant::now());
                std::future::pending::<()>()
            })
            .await;
    });
    let at = tokio::time::timeout(Duration::from_secs(30), start.recv())
        .await
        .expect("the shard's task started")
        .expect("a start");
    run.abort();
    at - begun
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_owner_waits_the_previous_owner_s_recorded_loss_notice_or_its_own_delay() {
    // The previous owner recorded how soon it is told of a loss: that, not the member's
    // (here very long) takeover delay.
    let notice = Duration::from_millis(80);
    let took = takeover_after(Some(notice), Duration::from_secs(600)).await;
    eprintln!("with a recorded notice of {notice:?}: started after {took:?}");
    assert!(took >= notice, "started {took:?} after, before the notice");
    // Nothing recorded (a manager that does not know, an older member): its own delay.
    let delay = Duration::from_millis(300);
    let took = takeover_after(None, delay).await;
    eprintln!("with nothing recorded and a delay of {delay:?}: started after {took:?}");
    assert!(took >= delay, "started {took:?} after, before the delay");
}

/// A fleet of `shards` whose every shard's latest term is a dead owner's, not ended,
/// recording `notice`, and the member `s`, joined, waiting that notice on every shard;
/// returns the fleet and when the dead owner's terms began (its sessions had ended by
/// then: its tasks may run until `notice` after it, no later).
async fn s_waiting_after_a_dead_owner(shards: usize, notice: Duration) -> (Fleet, Instant) {
    let mut fleet = Fleet::new(shards);
    let begun = Instant::now();
    for shard in fleet.group.shards() {
        fleet
            .terms
            .begin_with_notice("projections", shard, 0, Some("gone"), Some(notice))
            .await
            .expect("a term its owner never ends");
    }
    fleet.join("s");
    let joined = Instant::now();
    loop {
        let terms = fleet.terms.terms("projections").await.expect("the terms");
        if terms.len() == shards
            && (terms.iter()).all(|t| t.token == 2 && t.holder_id.as_deref() == Some("s"))
        {
            return (fleet, begun);
        }
        assert!(joined.elapsed() < SETTLE, "s never took every shard");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// No task of the fleet started before `not_before`.
fn none_started_before(fleet: &Fleet, not_before: Instant) {
    for life in fleet.recorder.snapshot() {
        assert!(
            life.started_at >= not_before,
            "{} started shard {} (token {}) {:?} before the dead owner's notice ran out",
            life.member,
            life.shard,
            life.token,
            not_before - life.started_at
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_handed_off_in_its_takeover_wait_is_not_ended_before_the_wait_ran_out() {
    // s takes both shards of a dead owner and waits its 400 ms notice; n joins at once,
    // and s hands one shard over while still waiting. Ended then, the term would let n
    // start at once, while the dead owner (if only its session was ended) may still run.
    let notice = Duration::from_millis(400);
    let (mut fleet, begun) = s_waiting_after_a_dead_owner(2, notice).await;
    fleet.join("n");
    let (owners, took) = fleet.settled(SETTLE).await;
    eprintln!("settled {:?} in {took:?}", owners.counts());
    assert_eq!(fleet.recorder.running().len(), 2);
    none_started_before(&fleet, begun + notice);
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_that_lost_its_lock_in_its_takeover_wait_is_not_ended_before_the_wait_ran_out() {
    // s takes a dead owner's shard and waits its 1 s notice; its lock is lost in the
    // wait, and s takes the shard back at once. Had the lost term been ended then, s
    // would start the task at once, inside the dead owner's notice. (1 s: the loss must
    // land inside the wait however slow the machine.)
    let notice = Duration::from_secs(1);
    let (fleet, begun) = s_waiting_after_a_dead_owner(1, notice).await;
    let key = fleet.group.shard_key("tenant-0");
    assert!(
        fleet
            .get("s")
            .manager
            .lose(&key, LostReason::ConnectionClosed)
    );
    fleet.settled(SETTLE).await;
    let lives = fleet.recorder.snapshot();
    assert!(
        lives.iter().all(|life| life.token > 2),
        "the lost term's task never starts: {lives:?}"
    );
    none_started_before(&fleet, begun + notice);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_owner_died_in_its_takeover_wait_holds_the_next_owner_to_the_notice_before() {
    // s takes a dead owner's shard and waits its 1 s notice, then dies itself (its run
    // dropped: the term left as it is, the lock freed), and n takes the shard. s's own
    // notice is the fleet's 20 ms takeover delay: had s's term recorded only that, n would
    // start 20 ms after its grant, inside the first owner's notice.
    let notice = Duration::from_secs(1);
    let (mut fleet, begun) = s_waiting_after_a_dead_owner(1, notice).await;
    fleet.abort("s").await;
    let terms = fleet.terms.terms("projections").await.expect("the terms");
    assert_eq!(
        (terms[0].token, terms[0].ended, terms[0].loss_notice),
        (2, false, Some(notice)),
        "s's term, not ended, recording the notice before it"
    );
    fleet.join("n");
    fleet.settled(SETTLE).await;
    none_started_before(&fleet, begun + notice);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_another_shard_list_are_refused_with_a_configuration_error() {
    let mut fleet = Fleet::new(3);
    fleet.join("a");
    fleet.settled(SETTLE).await;
    let other = ShardGroup::new("projections", ["tenant-0", "tenant-1"]).expect("a group");
    let member = ShardMember::new(fleet.table.manager(), MemoryTerms::new(), other);
    let error = member
        .run(|_owned, _stop| async {})
        .await
        .expect_err("refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
    assert!(
        error.to_string().contains("disagree on its shard list"),
        "{error}"
    );
    let reordered =
        ShardGroup::new("projections", ["tenant-2", "tenant-1", "tenant-0"]).expect("a group");
    let member = ShardMember::new(fleet.table.manager(), MemoryTerms::new(), reordered);
    let error = member.run(|_, _| async {}).await.expect_err("refused");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
}

/// The term store's contract (`locks_shard::conformance`), in memory.
#[tokio::test]
async fn the_memory_store_keeps_the_term_store_contract() {
    locks_shard::conformance::terms_contract(&MemoryTerms::new(), "g").await;
}

#[test]
fn target_shares_of_the_test_fleet() {
    assert_eq!(target_share(24, &[1, 2, 3, 4, 5], 1), Some(5));
    assert_eq!(target_share(24, &[1, 2, 3, 4, 5], 5), Some(4));
}

/// A store that keeps a roster of the entries members write (by `enter`, or by a
/// renewal, as the PostgreSQL store's row) and counts both kinds of write; its renewals
/// fail while `renewals_fail`.
#[derive(Debug, Clone, Default)]
struct Counting {
    terms: MemoryTerms,
    rows: Arc<Mutex<BTreeMap<u32, Option<String>>>>,
    enters: Arc<AtomicUsize>,
    renewals: Arc<AtomicUsize>,
    renewals_fail: Arc<AtomicBool>,
    terms_fail: Arc<AtomicBool>,
    /// `end` fails with this kind, if any.
    ends_fail: Arc<Mutex<Option<AcquisitionErrorKind>>>,
    ends: Arc<AtomicUsize>,
}

impl Counting {
    fn write(&self, member: u32, holder_id: Option<&str>) {
        let mut rows = self.rows.lock().expect("rows");
        rows.insert(member, holder_id.map(str::to_owned));
    }

    fn counts(&self) -> (usize, usize) {
        (
            self.enters.load(Ordering::SeqCst),
            self.renewals.load(Ordering::SeqCst),
        )
    }
}

impl ShardTerms for Counting {
    async fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> Result<Begun, LockAcquisitionError> {
        self.terms.begin(group, shard, member, holder_id).await
    }

    async fn end(&self, group: &str, shard: &str, token: i64) -> Result<(), LockAcquisitionError> {
        self.ends.fetch_add(1, Ordering::SeqCst);
        let failing = *self.ends_fail.lock().expect("ends_fail");
        if let Some(kind) = failing {
            return Err(LockAcquisitionError::new(
                group,
                kind,
                "Database error: refused",
            ));
        }
        self.terms.end(group, shard, token).await
    }

    async fn terms(&self, group: &str) -> Result<Vec<Term>, LockAcquisitionError> {
        if self.terms_fail.load(Ordering::SeqCst) {
            return Err(LockAcquisitionError::new(
                group,
                AcquisitionErrorKind::ConnectionLost,
                "Database error: connection closed",
            ));
        }
        self.terms.terms(group).await
    }

    async fn enter(
        &self,
        _: &str,
        member: u32,
        holder_id: Option<&str>,
        _: Option<Duration>,
    ) -> Result<(), LockAcquisitionError> {
        self.enters.fetch_add(1, Ordering::SeqCst);
        self.write(member, holder_id);
        Ok(())
    }

    async fn roster(
        &self,
        _: &str,
        _: &str,
    ) -> Result<Option<Vec<PermitHolder>>, LockAcquisitionError> {
        let rows = self.rows.lock().expect("rows");
        Ok(Some(
            rows.iter()
                .map(|(slot, holder)| PermitHolder::new(*slot, holder.clone(), None))
                .collect(),
        ))
    }

    async fn renew(
        &self,
        _: &str,
        member: u32,
        holder_id: &str,
        _: Duration,
    ) -> Result<u64, LockAcquisitionError> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        if self.renewals_fail.load(Ordering::SeqCst) {
            return Err(LockAcquisitionError::new(
                "g",
                AcquisitionErrorKind::ConnectionLost,
                "cut off",
            ));
        }
        self.write(member, Some(holder_id));
        Ok(0)
    }
}

/// A term whose end failed when its task stopped is ended before its member joins again,
/// and the member joins only once it is: while the store refuses for a passing reason the
/// member stays out; once it answers, the term is ended and the member joins. A refusal
/// that retrying cannot fix (`Configuration`) ends `run` as a refused join does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_left_unended_is_ended_before_the_member_joins_again() {
    let table = locks_memory::InMemoryLockTable::new();
    let manager = table.manager_with_holder_id("m");
    let group = ShardGroup::new("g", ["a"]).expect("a group");
    let store = Counting::default();
    let member = ShardMember::new(manager.clone(), store.clone(), group.clone())
        .tick(Duration::from_millis(5))
        .backoff(Duration::from_millis(20))
        .renewal(None);
    let (started, mut runs) = tokio::sync::mpsc::unbounded_channel();
    let run = tokio::spawn(async move {
        member
            .run(move |owned: Owned, _stop: LostSignal| {
                started.send(owned.token).expect("the test listens");
                std::future::pending::<()>()
            })
            .await
    });
    let first = runs.recv().await.expect("a first term");
    // The store goes away for ends; the shard's lock and the membership are lost.
    *store.ends_fail.lock().expect("ends_fail") = Some(AcquisitionErrorKind::ConnectionLost);
    assert!(manager.lose(&group.shard_key("a"), LostReason::ConnectionClosed));
    manager.lose_permits(&group.members_name(), LostReason::ConnectionClosed);
    let members = group.members_name();
    let out_for = Instant::now();
    while out_for.elapsed() < Duration::from_millis(200) {
        let holders = manager.permit_holders(&members).await.expect("holders");
        assert!(holders.held.is_empty(), "joined with a term left unended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The store answers again: the old term is ended, then the member joins and takes
    // the shard under a new term, whose previous term reads as ended.
    *store.ends_fail.lock().expect("ends_fail") = None;
    let second = tokio::time::timeout(SETTLE, runs.recv())
        .await
        .expect("the shard taken again")
        .expect("a second term");
    assert!(second > first);
    let terms = store.terms.terms("g").await.expect("terms");
    assert_eq!(terms.len(), 1);
    // Refused for good: ends `run`.
    *store.ends_fail.lock().expect("ends_fail") = Some(AcquisitionErrorKind::Configuration);
    assert!(manager.lose(&group.shard_key("a"), LostReason::ConnectionClosed));
    manager.lose_permits(&group.members_name(), LostReason::ConnectionClosed);
    let ended = tokio::time::timeout(SETTLE, run)
        .await
        .expect("run ended")
        .expect("no panic");
    let error = ended.expect_err("a Configuration error");
    assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
}

/// A read of who owns a group's shards that fails says it was a read, not "Failed to
/// acquire lock", and keeps the backend's kind and reason.
#[tokio::test]
async fn a_failed_read_of_the_owners_says_it_was_a_read() {
    let store = Counting {
        terms_fail: Arc::new(AtomicBool::new(true)),
        ..Counting::default()
    };
    let manager = locks_memory::InMemoryLockTable::new().manager_with_holder_id("m");
    let group = ShardGroup::new("g", ["a", "b"]).expect("a group");
    let by_group = locks_shard::owners(&manager, &store, &group).await;
    let by_name = locks_shard::owners_by_name(&manager, &store, "g").await;
    for error in [by_group.expect_err("a read"), by_name.expect_err("a read")] {
        assert_eq!(
            error.to_string(),
            "Failed to read who owns the shards of group 'g': Database error: connection closed"
        );
        assert!(error.is_read());
        assert_eq!(error.kind(), AcquisitionErrorKind::ConnectionLost);
    }
}

/// A member joins a store that keeps a roster, owns every shard, and is listed: what it
/// wrote to get there, as (entries, renewals).
async fn writes_to_join(renewal: Option<Duration>, renewals_fail: bool) -> (usize, usize) {
    let store = Counting {
        renewals_fail: Arc::new(AtomicBool::new(renewals_fail)),
        ..Counting::default()
    };
    let table = locks_memory::InMemoryLockTable::new();
    let group = ShardGroup::new("g", ["a", "b", "c"]).expect("a group");
    let member = ShardMember::new(table.manager_with_holder_id("m"), store.clone(), group)
        .tick(Duration::from_millis(5))
        .renewal(renewal);
    let recorder = crate::support::Recorder::default();
    let lives = recorder.clone();
    let run = tokio::spawn(async move {
        member
            .run(move |owned: Owned, stop: LostSignal| {
                let alive = lives.start("m", &owned);
                async move {
                    let _alive = alive;
                    let _ = stop.await;
                }
            })
            .await
    });
    let from = Instant::now();
    while recorder.running().len() < 3 || store.rows.lock().expect("rows").is_empty() {
        assert!(
            from.elapsed() < SETTLE,
            "the member never owned every shard"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A few ticks more: nothing writes the entry again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    run.abort();
    store.counts()
}

/// A member that renews is entered in the roster by its first renewal, which writes its
/// entry: one write to join, not an entry and a renewal. One that does not renew enters;
/// one whose first renewal failed is entered by its first tick (it finds itself not
/// listed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_writes_the_member_s_entry_once() {
    // Renewals every 2 s: the join sees the first alone.
    let renewing = writes_to_join(Some(Duration::from_secs(10)), false).await;
    assert_eq!(renewing, (0, 1), "(entries, renewals) of a renewing member");
    let not_renewing = writes_to_join(None, false).await;
    assert_eq!(not_renewing, (1, 0), "(entries, renewals) without renewals");
    let (entries, renewals) = writes_to_join(Some(Duration::from_secs(10)), true).await;
    assert_eq!(
        (entries, renewals),
        (1, 1),
        "(entries, renewals) when the first renewal failed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_renew_stops_its_tasks_before_its_renewal_expires() {
    // Long enough that the bound below (0.8 × expiry + 60 ms) is short of the expiry.
    let expiry = Duration::from_millis(500);
    let table = locks_memory::InMemoryLockTable::new();
    let group = ShardGroup::new("g", ["a", "b", "c"]).expect("a group");
    let member = ShardMember::new(
        table.manager_with_holder_id("cut-off"),
        // Cut off from the database.
        Counting {
            renewals_fail: Arc::new(AtomicBool::new(true)),
            ..Counting::default()
        },
        group,
    )
    .tick(Duration::from_millis(5))
    .backoff(Duration::from_millis(100))
    .renewal(Some(expiry));
    let recorder = crate::support::Recorder::default();
    let lives = recorder.clone();
    let task = move |owned: Owned, stop: LostSignal| {
        let alive = lives.start("cut-off", &owned);
        async move {
            let _alive = alive;
            // Ignores its stop: only a drop ends it.
            let _ = stop;
            std::future::pending::<()>().await;
        }
    };
    let mut seen: BTreeMap<usize, (Instant, Option<Instant>)> = BTreeMap::new();
    let watch = async {
        let until = Instant::now() + Duration::from_millis(1200);
        while Instant::now() < until {
            for (i, life) in recorder.snapshot().iter().enumerate() {
                let entry = seen.entry(i).or_insert((Instant::now(), None));
                if life.stop.is_some() && entry.1.is_none() {
                    entry.1 = Some(Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::select! {
        _ = member.run(task) => panic!("run returned"),
        () = watch => {}
    }
    let stopped: Vec<Duration> = seen
        .values()
        .filter_map(|(start, stop)| stop.map(|stop| stop - *start))
        .collect();
    eprintln!("lives {}, stopped after {stopped:?}", seen.len());
    assert!(
        stopped.len() >= 3,
        "the tasks ran and were stopped: {seen:?}"
    );
    let longest = stopped.iter().max().expect("a life");
    assert!(
        *longest < expiry.mul_f64(0.8) + Duration::from_millis(60),
        "a task outlived the renewal deadline: {longest:?}"
    );
}

/// ADR 0027's gap: a member whose membership permit alone is lost keeps its shard locks
/// and tasks while it joins again; if it cannot join again (the rejoin fails, the next
/// try is a back-off away) and cannot renew, its kept tasks are dropped at 0.8 × the
/// renewal expiry after its last confirmed renewal, before the others may end its
/// sessions, not kept until the rejoin comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_lost_its_membership_and_cannot_renew_drops_its_kept_tasks_in_time() {
    let expiry = Duration::from_millis(500);
    let table = locks_memory::InMemoryLockTable::new();
    let manager = table.manager_with_holder_id("gap");
    let group = ShardGroup::new("g", ["a", "b", "c"]).expect("a group");
    let store = Counting::default();
    let member = ShardMember::new(manager.clone(), store.clone(), group.clone())
        .tick(Duration::from_millis(5))
        // The rejoin that fails is not tried again within the test.
        .backoff(Duration::from_secs(30))
        .renewal(Some(expiry));
    let recorder = crate::support::Recorder::default();
    let lives = recorder.clone();
    let task = move |owned: Owned, stop: LostSignal| {
        let alive = lives.start("gap", &owned);
        async move {
            let _alive = alive;
            // Ignores its stop: only a drop ends it.
            let _ = stop;
            std::future::pending::<()>().await;
        }
    };
    let mut stopped: BTreeMap<usize, Duration> = BTreeMap::new();
    let check = async {
        while recorder.running().len() < 3 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Renewals have been confirmed; from now on the member is cut off from the store
        // and its membership is gone, its shard locks kept.
        let renewed = store.counts().1;
        while store.counts().1 == renewed {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        store.renewals_fail.store(true, Ordering::SeqCst);
        let cut = Instant::now();
        manager.fail_next_acquire(AcquisitionErrorKind::ConnectionLost);
        assert_eq!(
            manager.lose_permits(&group.members_name(), LostReason::ConnectionClosed),
            1,
            "its membership permit"
        );
        while cut.elapsed() < expiry.mul_f64(2.0) {
            for (i, life) in recorder.snapshot().iter().enumerate() {
                if life.stop.is_some() {
                    stopped.entry(i).or_insert_with(|| cut.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::select! {
        _ = member.run(task) => panic!("run returned"),
        () = check => {}
    }
    eprintln!("stopped after the cut: {stopped:?}");
    assert_eq!(stopped.len(), 3, "every kept task was dropped: {stopped:?}");
    for took in stopped.values() {
        // Its last renewal was confirmed just before the cut: the deadline is 0.8 × the
        // expiry after it, not sooner (the tasks were kept) and not later.
        assert!(
            *took >= expiry.mul_f64(0.6) && *took < expiry.mul_f64(0.8) + Duration::from_millis(60),
            "a kept task stopped {took:?} after the cut (expiry {expiry:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_member_takes_only_its_share_among_the_fleet_its_term_table_names() {
    let mut fleet = Fleet::new(24);
    // The fleet a, b and c ended uncleanly (an outage, a crash): the table holds their
    // terms, not ended. Written here rather than by running and aborting three members:
    // an abort is not one instant for a tokio task, and a member aborted last could take
    // the others' freed shards first (under terms of its own), so the table would name
    // fewer members than the test is about.
    let shards: Vec<String> = fleet.group.shards().map(str::to_owned).collect();
    for (i, shard) in shards.iter().enumerate() {
        let holder = ["a", "b", "c"][i % 3];
        let slot = u32::try_from(i % 3 + 1).expect("small");
        locks_shard::ShardTerms::begin(&fleet.terms, "projections", shard, slot, Some(holder))
            .await
            .expect("a term");
    }
    // A process started again (a new holder id) finds a, b and c in the term table: it
    // stands in for one of them and takes 8 of 24 until the others are back or its
    // rejoin wait (the default 2 s) ran out.
    let joined = Instant::now();
    fleet.join("c2");
    let owned = |fleet: &Fleet| {
        fleet
            .recorder
            .running()
            .values()
            .filter(|m| *m == "c2")
            .count()
    };
    let mut most = 0;
    while joined.elapsed() < Duration::from_millis(1500) {
        let now = owned(&fleet);
        assert!(
            now <= 8,
            "a fresh member took {now} shards of 24 while the fleet its terms name was \
             expected back"
        );
        most = most.max(now);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(most, 8, "it took its share among the expected three");
    // Nobody else came: once the wait ran out it takes the rest.
    fleet.settled(SETTLE).await;
    assert_eq!(owned(&fleet), 24);
    assert_eq!(fleet.recorder.overlaps(), Vec::new());
    fleet.leave("c2").await;
}
