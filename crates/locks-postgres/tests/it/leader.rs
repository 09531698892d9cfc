//! Leader election on a real server: failover after a killed leader process, and the
//! order of stop and start when the leader's session is terminated.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use locks_leader::{LeaderElection, Leadership};
use locks_postgres::PostgresLockManager;

use crate::support::{admin, pool, unique_key};
use throwaway_pg::testing::child::say;

const NAME: &str = "LOCKS_CHILD_LEADER";

fn unix_ms(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// Says `stopped {unix ms}` when dropped: the task's future was dropped.
struct SayStopped;

impl Drop for SayStopped {
    fn drop(&mut self) {
        say(&format!("stopped {}", unix_ms(SystemTime::now())));
    }
}

/// The child role `lead`: campaigns for the leadership of `NAME`, says
/// `leading {unix ms}` when its task starts, and leads until killed.
pub(crate) async fn child_lead() {
    let name = std::env::var(NAME).expect("child needs a name");
    let manager = PostgresLockManager::builder(pool(2))
        .holder_id(format!("child-{}", std::process::id()))
        .build();
    let election = LeaderElection::new(manager, name);
    say("campaigning");
    let _never = election
        .run(|_lost| async {
            let _stopped = SayStopped;
            say(&format!("leading {}", unix_ms(SystemTime::now())));
            std::future::pending::<()>().await;
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_process_takes_over_within_one_second_of_the_leader_being_killed() {
    let name = unique_key("leader-kill");
    let mut first = crate::processes::spawn("lead", &[(NAME, &name)]);
    first.expect("campaigning").await;
    first.expect("leading").await;
    let mut standby = crate::processes::spawn("lead", &[(NAME, &name)]);
    standby.expect("campaigning").await;
    // Let the standby queue behind the leader.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let observer = LeaderElection::new(PostgresLockManager::new(pool(1)), name.clone());
    let leader = observer
        .who_leads()
        .await
        .expect("who leads")
        .expect("a leader");
    assert!(leader.holder_id.is_some_and(|id| id.starts_with("child-")));
    assert!(leader.since.is_some());

    let killed = SystemTime::now();
    first.kill();
    let started: u128 = standby.expect("leading").await.parse().expect("ms");
    let gap = started.saturating_sub(unix_ms(killed));
    println!("the standby led {gap} ms after the leader process was killed");
    assert!(gap < 1000, "failover took {gap} ms, more than 1 s");
}

/// When an observer asked `who_leads`, and the holder id it was told.
type Look = (SystemTime, Option<String>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_leader_stops_its_task_before_the_standby_starts_its_own() {
    terminated_leader_stops_first("leader-terminate", None, Cut::ElectionPermit).await;
}

/// Every session of the leader ended at once (its leading permit's too, so that permit
/// no longer holds the successor back): only the takeover delay keeps the order. On a pool
/// whose connections announce their end (`plain_pool`) the leader is told within
/// milliseconds, so 100 ms is enough (`locks_leader::DEFAULT_TAKEOVER_DELAY` says so).
/// With deadpool's own connector (no announcement: the old leader is told at the 200 ms
/// check) the same test fails: the successor starts at about 110 ms, while the old
/// leader's task still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100_ms_takeover_delay_keeps_the_order_on_a_pool_that_announces_its_end() {
    let takeover = Some(Duration::from_millis(100));
    terminated_leader_stops_first("leader-all-sessions", takeover, Cut::EverySession).await;
}

/// The slowest monitor there is: on a pool that does not announce a connection's end
/// (deadpool's own connector) a leader learns its sessions ended at the 200 ms health
/// check. Every session of the leader ends at once, so only the takeover delay keeps the
/// order: the default (`locks_leader::DEFAULT_TAKEOVER_DELAY`, set from the worst told
/// time measured in `told.rs` with a margin) must still make the old leader stop first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_takeover_delay_keeps_the_order_on_a_pool_that_does_not_announce_its_end() {
    for round in 0..3 {
        terminated_leader_stops_first(
            &format!("leader-unannounced-{round}"),
            None,
            Cut::EverySessionUnannounced,
        )
        .await;
    }
}

/// What the test ends of the leader's.
#[derive(Clone, Copy, Debug)]
enum Cut {
    /// The session holding the election's permit (the leading permit holds on).
    ElectionPermit,
    /// Every session of the leader's manager.
    EverySession,
    /// Every session of the leader's manager, the candidates on pools that do not
    /// announce a connection's end.
    EverySessionUnannounced,
}

/// Two candidates on `plain_pool`s (with `takeover`, else the default delay); `cut` ends
/// the leader's sessions: the old leader's task stops before the new one's starts, and an
/// observer never names a leader whose task is not running.
async fn terminated_leader_stops_first(key: &str, takeover: Option<Duration>, cut: Cut) {
    let admin = admin().await;
    let name = unique_key(key);
    let events: Arc<Mutex<Vec<(&'static str, SystemTime)>>> = Arc::default();
    let record = |events: &Arc<Mutex<Vec<(&'static str, SystemTime)>>>, what| {
        events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((what, SystemTime::now()));
    };
    struct Recorder(Arc<Mutex<Vec<(&'static str, SystemTime)>>>, &'static str);
    impl Drop for Recorder {
        fn drop(&mut self) {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.1, SystemTime::now()));
        }
    }
    let elect = |holder: &'static str| {
        // The election's permit, the leading permit and a `who_leads` look.
        let pool = match cut {
            Cut::EverySessionUnannounced => crate::support::unannounced_pool(3),
            _ => pool(3),
        };
        let manager = PostgresLockManager::builder(pool).holder_id(holder).build();
        let election = LeaderElection::new(manager, name.clone());
        Arc::new(match takeover {
            Some(delay) => election.takeover_delay(delay),
            None => election,
        })
    };
    // Holder ids of this test's own: `Cut::EverySession` ends sessions by holder.
    let (one_id, two_id): (&'static str, &'static str) = match cut {
        Cut::ElectionPermit => ("one", "two"),
        Cut::EverySession => ("all-one", "all-two"),
        Cut::EverySessionUnannounced => ("unannounced-one", "unannounced-two"),
    };
    let (one, two) = (elect(one_id), elect(two_id));
    let mut one_state = one.subscribe();
    let mut two_state = two.subscribe();
    let run = |election: Arc<LeaderElection<PostgresLockManager>>, started, stopped| {
        let events = Arc::clone(&events);
        tokio::spawn(async move {
            election
                .run(|_lost| {
                    let events = Arc::clone(&events);
                    async move {
                        record(&events, started);
                        let _stopped = Recorder(events, stopped);
                        std::future::pending::<()>().await;
                    }
                })
                .await
        })
    };
    let one_task = run(Arc::clone(&one), "one started", "one stopped");
    one_state
        .wait_for(Leadership::is_leading)
        .await
        .expect("one leads");
    let two_task = run(Arc::clone(&two), "two started", "two stopped");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = two.who_leads().await.expect("who leads").expect("a leader");
    assert_eq!(leader.holder_id.as_deref(), Some(one_id));

    // An observer, not a candidate: who it is told leads, and when it asked.
    let observer = Arc::new(LeaderElection::new(
        PostgresLockManager::new(pool(1)),
        name.clone(),
    ));
    let seen: Arc<Mutex<Vec<Look>>> = Arc::default();
    let watching = tokio::spawn({
        let (observer, seen) = (Arc::clone(&observer), Arc::clone(&seen));
        async move {
            loop {
                let asked = SystemTime::now();
                let leader = observer.who_leads().await.expect("who leads");
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((asked, leader.and_then(|leader| leader.holder_id)));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });

    let class = PostgresLockManager::new(pool(1)).semaphore_class(&name);
    let terminated_at = SystemTime::now();
    match cut {
        Cut::ElectionPermit => crate::semaphores::terminate_slot_holder(&admin, class, 0).await,
        Cut::EverySession | Cut::EverySessionUnannounced => {
            let ended: i64 = admin
                .query_one(
                    // OFFSET 0 keeps the filter below the terminate.
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM \
                     (SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
                      OFFSET 0) AS s",
                    &[&format!("locks:{one_id}")],
                )
                .await
                .expect("terminate")
                .get(0);
            assert!(
                ended >= 2,
                "the election's and the leading permit's sessions: {ended}"
            );
        }
    }
    two_state
        .wait_for(Leadership::is_leading)
        .await
        .expect("two leads");
    // The state says "leading" as the task is handed over; it starts when first polled.
    crate::faults::wait_for("two's task to start", || async {
        let events = events.lock().unwrap_or_else(PoisonError::into_inner);
        events.iter().any(|(what, _)| *what == "two started")
    })
    .await;
    let events = events
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    for (what, at) in &events {
        let relative = i128::try_from(unix_ms(*at)).unwrap_or(0)
            - i128::try_from(unix_ms(terminated_at)).unwrap_or(0);
        println!(
            "{what:>12} at {} ({relative:+} ms from the termination; takeover {takeover:?})",
            unix_ms(*at)
        );
    }
    let at = |what: &str| {
        events
            .iter()
            .find(|(event, _)| *event == what)
            .map(|(_, at)| *at)
            .unwrap_or_else(|| panic!("no {what:?} in {events:?}"))
    };
    assert!(
        at("one stopped") < at("two started"),
        "the old leader must stop before the new one starts: {events:?}"
    );
    assert!(!one_state.borrow().is_leading());
    tokio::time::sleep(Duration::from_millis(50)).await;
    watching.abort();
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    // A look names a leader while its task runs: "two" not before its task started,
    // "one" not after its task stopped (20 ms for the look's own round trip).
    let slack = Duration::from_millis(20);
    let named = |who: &str| -> Vec<SystemTime> {
        seen.iter()
            .filter(|(_, leader)| leader.as_deref() == Some(who))
            .map(|(asked, _)| *asked)
            .collect()
    };
    let first_two = named(two_id).into_iter().min();
    let last_one = named(one_id).into_iter().max();
    println!(
        "{} looks; two first named {:?} ms, one last named {:?} ms after the termination",
        seen.len(),
        first_two.map(|at| unix_ms(at).saturating_sub(unix_ms(terminated_at))),
        last_one.map(|at| unix_ms(at).saturating_sub(unix_ms(terminated_at))),
    );
    let first_two = first_two.expect("two named once leading");
    assert!(
        first_two + slack >= at("two started"),
        "two was named before its task started: {seen:?}"
    );
    if let Some(last_one) = last_one {
        assert!(
            last_one <= at("one stopped") + slack,
            "one was named after its task stopped: {seen:?}"
        );
    }
    one_task.abort();
    two_task.abort();
}

/// An election name the PostgreSQL board refuses (a NUL, which `text` cannot hold, or
/// past `MAX_BOARD_NAME` bytes) is a `Configuration` error that `run` returns at once,
/// before the campaign takes the election's permit (the takeover delay is an hour here),
/// not a failure it retries after the back-off. As on the memory board (`locks-leader`'s
/// test of the same name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_the_board_refuses_ends_the_campaign_at_once() {
    use locks_port::{AcquisitionErrorKind, MAX_BOARD_NAME, PermitGuard, Semaphore};

    let manager = PostgresLockManager::new(pool(2));
    let nul = format!("{}\0v2", unique_key("board-nul"));
    let long = format!("{}{}", unique_key("board-long"), "n".repeat(MAX_BOARD_NAME));
    for name in [nul, long] {
        let shown: String = name.chars().take(40).collect();
        let election = LeaderElection::new(&manager, name.clone())
            .board(&manager)
            .takeover_delay(Duration::from_secs(3600));
        let error = tokio::time::timeout(Duration::from_secs(10), election.run(|_lost| async {}))
            .await
            .unwrap_or_else(|_| panic!("{shown:?}: refused at once, not after the takeover delay"))
            .expect_err("refused");
        assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
        let permit = manager
            .try_acquire_permit(&name, 1)
            .await
            .expect("a permit")
            .unwrap_or_else(|| panic!("{shown:?}: the election's permit is free"));
        permit.release().await;
    }
}
