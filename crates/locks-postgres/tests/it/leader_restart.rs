//! Leader election across a server restart, on a cluster of the test's own (a restart
//! of the shared server would end every other test's sessions): the leader is told and
//! stops, nobody leads while the server is down, and once it is back exactly one
//! candidate leads again, under a newer term and fencing token.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_leader::{DEFAULT_BACKOFF, DEFAULT_TAKEOVER_DELAY, LeaderElection, Leadership};
use locks_port::{LostReason, LostSignal, Semaphore};
use locks_postgres::{
    ANNOUNCED_LOSS_NOTICE, PostgresLockManager, install_fencing, install_leader_board, plain_pool,
};

use crate::faults::{admin_at, drop_cluster, own_cluster};
use crate::support::unique_key;

/// How long the server stays down: long enough that every candidate's campaign fails
/// and backs off at least once.
const OUTAGE: Duration = Duration::from_secs(1);

/// What a candidate's campaign costs on a loaded 2-core machine once the server is back,
/// beyond the back-off and the takeover delay: opening its pool's connections, the
/// permit with its fencing token, the retire of the dead leader's term, the leading
/// permit and the proclamation: a few round trips, each on a new connection.
const CAMPAIGN: Duration = Duration::from_secs(1);

/// One leader's task: who ran it, under which term and token, when it started and was
/// dropped, and its lost signal (the election permit's).
#[derive(Debug, Clone)]
struct Task {
    who: &'static str,
    term: Option<u64>,
    token: Option<i64>,
    started: Instant,
    stopped: Option<Instant>,
    lost: LostSignal,
}

type Tasks = Arc<Mutex<Vec<Task>>>;

fn tasks(tasks: &Tasks) -> Vec<Task> {
    tasks.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// Marks a task stopped when its future is dropped.
struct Stopped(Tasks, usize);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)[self.1].stopped =
            Some(Instant::now());
    }
}

type Election = LeaderElection<PostgresLockManager, PostgresLockManager>;

/// A candidate `who` on a pool of its own on `url`, with fencing tokens and the board,
/// and the default back-off and takeover delay; its campaign runs on a tokio task and
/// records each leader task it runs in `record`.
fn candidate(
    url: &str,
    name: &str,
    who: &'static str,
    record: &Tasks,
) -> (Arc<Election>, tokio::task::JoinHandle<()>) {
    // The election's permit, the leading permit and the board's statements.
    let manager = PostgresLockManager::builder(plain_pool(url, 3).expect("a pool"))
        .holder_id(who)
        .fencing(true)
        .build();
    let election = Arc::new(
        LeaderElection::new(manager.clone(), name)
            .board(manager)
            .publish(who),
    );
    let state = election.subscribe();
    let record = Arc::clone(record);
    let running = Arc::clone(&election);
    let handle = tokio::spawn(async move {
        let _never = running
            .run(|lost: LostSignal| {
                let (term, token) = match &*state.borrow() {
                    Leadership::Leading {
                        term,
                        fencing_token,
                        ..
                    } => (*term, *fencing_token),
                    Leadership::Following => panic!("{who}'s task started while following"),
                    _ => (None, None),
                };
                let stopped = {
                    let mut all = record.lock().unwrap_or_else(PoisonError::into_inner);
                    all.push(Task {
                        who,
                        term,
                        token,
                        started: Instant::now(),
                        stopped: None,
                        lost,
                    });
                    Stopped(Arc::clone(&record), all.len() - 1)
                };
                async move {
                    let _stopped = stopped;
                    std::future::pending::<()>().await;
                }
            })
            .await;
    });
    (election, handle)
}

/// Polls `check` every 5 ms until it is true; fails after `within`. Returns when it
/// became true.
async fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Instant {
    let started = Instant::now();
    loop {
        if check() {
            return Instant::now();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ms(duration: Duration) -> u128 {
    duration.as_millis()
}

/// Three candidates, each on its own pool, one leading and two queued, and the server
/// restarts (`pg_ctl stop -m fast`, down for 1 s, `pg_ctl start`). The promise:
/// - the leader is told (the lost signal its task was handed fires, and it says it
///   follows) and its task is dropped within `ANNOUNCED_LOSS_NOTICE` (100 ms, the
///   manager's loss-notice bound on `plain_pool`) of `pg_ctl stop` returning, and nobody
///   leads while the server is down;
/// - exactly one candidate leads again within `DEFAULT_BACKOFF` + `DEFAULT_TAKEOVER_DELAY`
///   + 1 s (2.5 s) of the server accepting connections again: each candidate campaigns
///   again at most a back-off (1 s) after the server is back (its last campaign failed
///   while it was down), the winner waits the takeover delay (0.5 s) before its task
///   starts, and the campaign's connections and round trips take the rest;
/// - no two leader tasks ever ran at once, and the new leader's term and fencing token
///   are greater than the old leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_candidate_leads_again_within_2_5_s_of_a_server_restart() {
    let cluster = own_cluster("the leader restart test");
    let url = cluster.url();
    {
        let admin = admin_at(&url).await;
        install_leader_board(&admin).await.expect("the board");
        install_fencing(&admin).await.expect("the fencing table");
    }
    let name = unique_key("leader-restart");
    let record: Tasks = Arc::default();
    let mut candidates = Vec::new();
    for who in ["restart-a", "restart-b", "restart-c"] {
        candidates.push(candidate(&url, &name, who, &record));
    }
    until("a first leader", Duration::from_secs(10), || {
        tasks(&record).len() == 1
    })
    .await;
    // The other two wait for the election's permit (the state, not a sleep).
    let looker = PostgresLockManager::new(plain_pool(&url, 1).expect("a pool"));
    let started = Instant::now();
    while looker
        .permit_holders(&name)
        .await
        .expect("the permit's holders")
        .waiting
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the two standbys did not queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let old = tasks(&record).remove(0);
    let observer = LeaderElection::new(looker.clone(), name.clone()).board(looker.clone());
    let named = observer
        .who_leads()
        .await
        .expect("who leads")
        .expect("a leader");
    assert_eq!(named.holder_id.as_deref(), Some(old.who));
    assert_eq!(named.term, old.term);
    let (old_term, old_token) = (
        old.term.expect("a term on the board"),
        old.token.expect("a fencing token"),
    );

    // Down.
    let stopping = Instant::now();
    tokio::task::block_in_place(|| cluster.stop()).expect("pg_ctl stop -m fast");
    let down = Instant::now();
    let stopped = until(
        "the old leader's task dropped",
        ANNOUNCED_LOSS_NOTICE + Duration::from_secs(5),
        || tasks(&record)[0].stopped.is_some(),
    )
    .await;
    let stopped = tasks(&record)[0].stopped.unwrap_or(stopped);
    println!(
        "pg_ctl stop took {} ms; the leader's task was dropped {} ms after it was called",
        ms(down - stopping),
        ms(stopped.saturating_duration_since(stopping))
    );
    assert!(
        stopped <= down + ANNOUNCED_LOSS_NOTICE,
        "the old leader's task was dropped {} ms after pg_ctl stop returned, more than {} ms",
        ms(stopped - down),
        ms(ANNOUNCED_LOSS_NOTICE)
    );
    // Told: the signal its task was handed fired, with the loss's reason whichever
    // permit's session was seen to end first (it said `Released` when the leading
    // permit's was: the election permit given up after it).
    let told = old.lost.reason();
    assert_eq!(
        told,
        Some(LostReason::ConnectionClosed),
        "the old leader's task was dropped but its signal says {told:?}"
    );
    // It says so as its task is dropped (the same poll, on the candidate's own thread).
    until(
        "the old leader to say it follows",
        ANNOUNCED_LOSS_NOTICE,
        || {
            !candidates
                .iter()
                .any(|(election, _)| election.subscribe().borrow().is_leading())
        },
    )
    .await;
    tokio::time::sleep(OUTAGE).await;
    for (election, _) in &candidates {
        assert!(
            !election.subscribe().borrow().is_leading(),
            "a candidate leads while the server is down"
        );
    }
    assert_eq!(
        tasks(&record).len(),
        1,
        "a task started while the server was down"
    );

    // Back.
    tokio::task::block_in_place(|| cluster.start_again()).expect("pg_ctl start");
    let up = Instant::now();
    let bound = DEFAULT_BACKOFF + DEFAULT_TAKEOVER_DELAY + CAMPAIGN;
    let again = until("a leader again", bound, || tasks(&record).len() >= 2).await;
    let new = tasks(&record).remove(1);
    println!(
        "a leader again {} ms after the server was back ({} ms after it went down; bound {} ms)",
        ms(new.started - up),
        ms(new.started - down),
        ms(bound)
    );
    assert!(again - up < bound);

    // Exactly one leads, and stays the only one: a second winner would start its task
    // within a back-off and a takeover delay.
    tokio::time::sleep(DEFAULT_BACKOFF + DEFAULT_TAKEOVER_DELAY).await;
    let all = tasks(&record);
    assert_eq!(
        all.len(),
        2,
        "one task before the restart, one after: {all:?}"
    );
    let leaders = candidates
        .iter()
        .filter(|(election, _)| election.subscribe().borrow().is_leading())
        .count();
    assert_eq!(leaders, 1, "exactly one candidate leads again");
    let named = observer
        .who_leads()
        .await
        .expect("who leads")
        .expect("a leader");
    assert_eq!(named.holder_id.as_deref(), Some(new.who));
    assert!(all[1].stopped.is_none(), "the new leader's task runs");
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            let a_end = a.stopped.unwrap_or_else(Instant::now);
            assert!(
                a_end <= b.started,
                "{} started while {}'s task still ran: {all:?}",
                b.who,
                a.who
            );
        }
    }
    let (new_term, new_token) = (
        new.term.expect("a term on the board"),
        new.token.expect("a fencing token"),
    );
    println!(
        "{} led term {old_term} (token {old_token}), {} leads term {new_term} (token {new_token})",
        old.who, new.who
    );
    assert!(new_term > old_term, "term {new_term} after {old_term}");
    assert!(new_token > old_token, "token {new_token} after {old_token}");

    for (_, handle) in candidates {
        handle.abort();
        let _ = handle.await;
    }
    drop((observer, looker));
    drop_cluster(cluster);
}
