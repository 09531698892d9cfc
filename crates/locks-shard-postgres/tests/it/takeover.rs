//! The order of a takeover after a loss told late: the previous owner's every session is
//! ended by the server, and the next owner's task must start only after the previous
//! owner's task was dropped. The next owner waits the bound the previous owner recorded
//! in its term (its manager's `loss_notice_bound()`), or its own takeover delay when
//! none was recorded; and a term that lost its lock, or whose owner died, inside that
//! wait does not cut it short for the owner after it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_postgres::PostgresLockManager;
use locks_shard::locks_port::DistributedLock;
use locks_shard::{ShardGroup, ShardMember, ShardTerms as _};
use locks_shard_postgres::PostgresShardTerms;
use locks_shard_postgres::deadpool_postgres::{
    Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
};

use crate::support::{admin, database_url, manager, pool, terms, unique};

/// One task's life: its member, and when it started and was dropped.
#[derive(Debug, Clone)]
struct Life {
    member: &'static str,
    start: Instant,
    stop: Option<Instant>,
}

type Lives = Arc<Mutex<Vec<Life>>>;

struct Alive(Lives, usize);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)[self.1].stop = Some(Instant::now());
    }
}

/// A login role of its own for the previous owner, so that once its sessions are ended
/// it cannot come back (`NOLOGIN`) and join again before the next owner takes over.
async fn owner_role() -> String {
    let role = unique("owner").replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    admin()
        .await
        .batch_execute(&format!("CREATE ROLE {role} LOGIN SUPERUSER"))
        .await
        .expect("a role");
    role
}

fn config_as(role: &str) -> locks_shard_postgres::tokio_postgres::Config {
    let mut config: locks_shard_postgres::tokio_postgres::Config =
        database_url().parse().expect("the test server's URL");
    config.user(role);
    config
}

/// A pool on deadpool's own connector: its connections do not announce their end, so
/// only the manager's health check tells a holder.
fn unannounced_pool(role: &str, size: usize) -> Pool {
    let config = config_as(role);
    let manager = Manager::from_config(
        config,
        locks_shard_postgres::tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .build()
        .expect("a pool")
}

/// Runs `member` as `name`, recording each task's life in `lives`.
fn run(
    member: ShardMember<PostgresLockManager, PostgresShardTerms>,
    name: &'static str,
    lives: &Lives,
) -> tokio::task::JoinHandle<()> {
    let lives = Arc::clone(lives);
    tokio::spawn(async move {
        let _ = member
            .run(move |_owned, _stop| {
                let alive = {
                    let mut all = lives.lock().unwrap_or_else(PoisonError::into_inner);
                    all.push(Life {
                        member: name,
                        start: Instant::now(),
                        stop: None,
                    });
                    Alive(Arc::clone(&lives), all.len() - 1)
                };
                async move {
                    let _alive = alive;
                    std::future::pending::<()>().await;
                }
            })
            .await;
    })
}

async fn wait_for(lives: &Lives, what: &str, done: impl Fn(&[Life]) -> bool) {
    let started = Instant::now();
    while !done(&lives.lock().unwrap_or_else(PoisonError::into_inner)) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The previous owner `a` (on `a_manager`, logged in as `role`) owns the group's one shard;
/// its sessions are terminated and `b` takes the shard over. Returns the gap from the
/// drop of a's task to the start of b's (negative: they overlapped).
async fn takeover(a_manager: PostgresLockManager, role: &str, b_delay: Duration) -> f64 {
    let group = ShardGroup::new(unique("takeover"), ["only"]).expect("a group");
    let lives: Lives = Arc::default();
    let a = ShardMember::new(a_manager, terms().await, group.clone())
        .tick(Duration::from_millis(5))
        .backoff(Duration::from_secs(30))
        .renewal(None);
    let a = run(a, "a", &lives);
    wait_for(&lives, "a's task started", |l| !l.is_empty()).await;
    let b_manager = PostgresLockManager::builder(pool(4))
        .holder_id(unique("b"))
        .build();
    let b = ShardMember::new(b_manager, terms().await, group)
        .tick(Duration::from_millis(2))
        .takeover_delay(b_delay)
        .renewal(None);
    let b = run(b, "b", &lives);
    // Let b join and see that the shard is a's.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // a's every session ends (its reads' too, which do not carry its holder id), and it
    // cannot open new ones: it neither joins again nor takes the shard back, so b takes
    // it over. Two statements, two transactions: in one batch they are one transaction,
    // the terminations signalled before NOLOGIN commits, and a member reconnecting in
    // between logs in and joins again (its share then b's, b never took the shard).
    let server = admin().await;
    server
        .batch_execute(&format!("ALTER ROLE {role} NOLOGIN"))
        .await
        .expect("a's role can no longer log in");
    server
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"
        ))
        .await
        .expect("end a's sessions");
    wait_for(&lives, "b's task started", |l| {
        l.iter().any(|l| l.member == "b")
    })
    .await;
    wait_for(&lives, "a's task dropped", |l| l[0].stop.is_some()).await;
    a.abort();
    b.abort();
    let _ = admin()
        .await
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'; \
             DROP ROLE IF EXISTS {role}"
        ))
        .await;
    let all = lives.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let b_start = all.iter().find(|l| l.member == "b").expect("b ran").start;
    let a_stop = all[0].stop.expect("a stopped");
    if b_start >= a_stop {
        (b_start - a_stop).as_secs_f64()
    } else {
        -(a_stop - b_start).as_secs_f64()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_owner_starts_after_the_previous_owner_was_told_of_its_loss() {
    // An owner on an announcing pool records 100 ms; the next owner waits that, not its
    // own (here very long) takeover delay, and still starts after the owner stopped.
    let holder = unique("announced");
    let role = owner_role().await;
    let announced = PostgresLockManager::builder(
        locks_postgres::plain_pool_with_config(config_as(&role), 4).expect("a pool"),
    )
    .holder_id(&holder)
    .build();
    assert_eq!(
        announced.loss_notice_bound(),
        Some(locks_postgres::ANNOUNCED_LOSS_NOTICE)
    );
    let gap = takeover(announced, &role, Duration::from_secs(600)).await;
    eprintln!("announced pool: b started {gap:.3} s after a's task was dropped");
    assert!(
        gap >= 0.0,
        "b started {:.3} s before a's task was dropped",
        -gap
    );

    // An owner whose pool does not announce (told by a 300 ms health check) records its
    // takeover delay (500 ms by default), and the next owner waits that.
    let holder = unique("unannounced");
    let role = owner_role().await;
    let unannounced = PostgresLockManager::builder(unannounced_pool(&role, 4))
        .holder_id(&holder)
        .health_check_interval(Duration::from_millis(300))
        .build();
    assert_eq!(unannounced.loss_notice_bound(), None);
    let gap = takeover(unannounced, &role, locks_shard::DEFAULT_TAKEOVER_DELAY).await;
    eprintln!("unannounced pool: b started {gap:.3} s after a's task was dropped");
    assert!(
        gap >= 0.0,
        "b started {:.3} s before a's task was dropped",
        -gap
    );
}

/// How long the dead owner of [`AfterADeadOwner`] may run after its session ended.
const DEAD_NOTICE: Duration = Duration::from_secs(1);

/// A one-shard group whose latest term is a dead owner's, not ended, recording
/// [`DEAD_NOTICE`]; with it, [`AfterADeadOwner::new`] starts the member `s` (on an
/// announcing pool: its own notice is 100 ms), holding the shard's lock and waiting that
/// notice.
struct AfterADeadOwner {
    group: ShardGroup,
    store: PostgresShardTerms,
    /// When the dead owner's term began (its session had ended by then).
    begun: Instant,
    lives: Lives,
    server: locks_shard_postgres::tokio_postgres::Client,
}

impl AfterADeadOwner {
    /// The group, and `s` running.
    async fn new(name: &str) -> (Self, tokio::task::JoinHandle<()>) {
        let group = ShardGroup::new(unique(name), ["only"]).expect("a group");
        let store = terms().await;
        let begun = Instant::now();
        (store.begin_with_notice(group.name(), "only", 0, Some("gone"), Some(DEAD_NOTICE)))
            .await
            .expect("a term its owner never ends");
        let fleet = Self {
            group,
            store,
            begun,
            lives: Lives::default(),
            server: admin().await,
        };
        let s = manager(&unique("s"), 4);
        assert_eq!(s.loss_notice_bound(), Some(Duration::from_millis(100)));
        let s = run(fleet.member(s), "s", &fleet.lives);
        fleet.until_held(true, "s took the shard late").await;
        (fleet, s)
    }

    fn member(
        &self,
        locks: PostgresLockManager,
    ) -> ShardMember<PostgresLockManager, PostgresShardTerms> {
        ShardMember::new(locks, self.store.clone(), self.group.clone())
            .tick(Duration::from_millis(5))
            .renewal(None)
    }

    /// The backend holding the shard's lock.
    async fn holder(&self) -> Option<i32> {
        let id = locks_shard::locks_port::lock_id(&self.group.shard_key("only"));
        let held = throwaway_pg::testing::advisory_lock(&self.server, id).await;
        held.iter().find(|lock| lock.granted).map(|lock| lock.pid)
    }

    /// Waits until the shard's lock is `held` (or free), within half the dead owner's
    /// notice: `late` says what went wrong otherwise.
    async fn until_held(&self, held: bool, late: &str) {
        while self.holder().await.is_some() != held {
            assert!(self.begun.elapsed() < DEAD_NOTICE / 2, "{late}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The first task to start, once one did; asserts it started after the dead owner's
    /// notice ran out.
    async fn first_start(&self) -> Life {
        wait_for(&self.lives, "a task started", |l| !l.is_empty()).await;
        let life = self.lives.lock().unwrap_or_else(PoisonError::into_inner)[0].clone();
        let not_before = self.begun + DEAD_NOTICE;
        assert!(
            life.start >= not_before,
            "{} started {:?} before the dead owner's notice ran out",
            life.member,
            not_before - life.start
        );
        life
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_session_ended_in_its_takeover_wait_lets_the_next_start_only_after_it() {
    // s takes a dead owner's shard and waits; its lock's session is terminated inside the
    // wait, and s takes the shard back. Had the lost term been ended then, s would have
    // started its task at once, inside the dead owner's notice.
    let (fleet, s) = AfterADeadOwner::new("inwait").await;
    let holder = fleet.holder().await.expect("s holds the shard's lock");
    let ended: bool = (fleet.server)
        .query_one("SELECT pg_terminate_backend($1)", &[&holder])
        .await
        .expect("end s's shard lock session")
        .get(0);
    assert!(
        ended && fleet.begun.elapsed() < DEAD_NOTICE,
        "terminated inside the wait"
    );
    assert_eq!(fleet.first_start().await.member, "s");
    s.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_whose_owner_died_in_its_takeover_wait_holds_the_next_owner_to_the_notice_before() {
    // s takes a dead owner's shard and, inside the wait, dies itself: its `run` dropped,
    // its term left unended, its lock freed. n takes the shard. Had s's term recorded only
    // s's 100 ms, n would start 100 ms after its grant, inside the first owner's notice.
    let (fleet, s) = AfterADeadOwner::new("diedinwait").await;
    s.abort();
    fleet.until_held(false, "s's lock was not freed").await;
    let listed = fleet
        .store
        .terms(fleet.group.name())
        .await
        .expect("the terms");
    assert_eq!(
        (listed[0].token, listed[0].ended, listed[0].loss_notice),
        (2, false, Some(DEAD_NOTICE)),
        "s's term, not ended, recording the notice before it"
    );
    let n = run(fleet.member(manager(&unique("n"), 4)), "n", &fleet.lives);
    assert_eq!(fleet.first_start().await.member, "n", "s never started");
    n.abort();
}
