//! Stall patience (`stall_patience`): a held lock whose backend stops answering for a
//! while (SIGSTOP) but whose session lives is not declared lost while the server shows
//! the backend alive; it is lost once the patience is spent, or at once when nobody can
//! look or the server has the backend no more. Each case runs on a cluster of its own (a
//! stopped backend must not touch the shared server). Without patience, see `health.rs`
//! (`a_stopped_backend_under_a_held_lock_is_noticed_by_keepalive`).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, LostReason, ReleaseOutcome};
use locks_postgres::{PostgresLockGuard, PostgresLockManager, tokio_postgres};

use super::server::{Continue, signal};
use super::{Mode, Watched, admin_at, drop_cluster, own_cluster, pool_from};
use crate::support::unique_key;

/// The keepalive cadence `K` and the answer timeout `A` of these tests.
const K: Duration = Duration::from_millis(300);
const A: Duration = Duration::from_millis(300);
/// The monitor's health-check interval (the default).
const H: Duration = Duration::from_millis(200);
/// What a busy machine may add to a bound on when a holder is told (scheduling).
const ALLOWANCE: Duration = Duration::from_millis(1500);

/// A manager in `mode` on a pool of `size` connections to `url`, with keepalives every
/// [`K`], answer timeout [`A`] and `patience`.
fn patient(mode: Mode, url: &str, size: usize, patience: Duration) -> PostgresLockManager {
    let mut config = tokio_postgres::Config::from_str(url).expect("URL");
    config.application_name("it-stalled");
    mode.builder(pool_from(config, size))
        .keepalive(Some(K))
        .answer_timeout(A)
        .stall_patience(patience)
        .build()
}

/// A lock held by a test's manager whose backend was then SIGSTOPped.
struct Stopped {
    lock: Watched,
    guard: PostgresLockGuard,
    pid: i32,
    /// Continues the backend when dropped.
    stop: Continue,
    at: Instant,
}

impl Stopped {
    /// `manager` takes `lock`, then its backend is stopped.
    async fn hold(manager: &PostgresLockManager, lock: Watched) -> Self {
        let guard = manager
            .acquire(&lock.key, AcquireOptions::new())
            .await
            .unwrap();
        let pid = lock.the_holder().await;
        let stop = Continue(pid);
        signal(pid, "STOP");
        Self {
            lock,
            guard,
            pid,
            stop,
            at: Instant::now(),
        }
    }

    /// Waits (10 s at most) for the guard to be told: why, and how long after the stop.
    async fn told(&self) -> (LostReason, Duration) {
        let reason = tokio::time::timeout(Duration::from_secs(10), self.guard.lost())
            .await
            .expect("the guard is told");
        (reason, self.at.elapsed())
    }

    /// Continues the backend and waits for it to exit with the lock (its session was
    /// closed when the lock was lost).
    async fn continue_until_freed(self) -> Watched {
        drop(self.stop);
        self.lock
            .until_free("the continued backend to exit with its lock")
            .await;
        self.lock
    }
}

in_both_modes!(a_lock_outlives_a_backend_stopped_within_the_patience);
/// Patience 3 s: the held lock's backend is SIGSTOPped for 1 s (over 3 × the answer
/// timeout, so keepalives go unanswered past it), then continued. The guard is never
/// told lost, the lock stays held all along (another manager's `try_acquire` fails while
/// the backend is stopped), and afterwards the guard releases it cleanly and the key is
/// free. Multiplexed, the stopped backend is the neighbours' shared connection: they are
/// untouched too.
async fn a_lock_outlives_a_backend_stopped_within_the_patience(mode: Mode) {
    let cluster = own_cluster("the stall-patience test");
    let manager = patient(mode, &cluster.url(), 3, Duration::from_secs(3));
    let other = PostgresLockManager::new(pool_from(
        tokio_postgres::Config::from_str(&cluster.url()).expect("URL"),
        1,
    ));
    let lock = Watched::on(admin_at(&cluster.url()).await, unique_key("stalled"));
    let neighbours = mode.neighbours(&manager, &lock.admin).await;
    let Stopped {
        lock,
        guard,
        pid,
        stop,
        at,
    } = Stopped::hold(&manager, lock).await;
    neighbours.assert_joined_by(&lock).await;
    let mut tries = 0;
    while at.elapsed() < Duration::from_secs(1) {
        let tried = other.try_acquire(&lock.key).await.expect("a try answers");
        assert!(
            tried.is_none(),
            "the key was free while its holder's backend was stopped"
        );
        tries += 1;
        assert!(!guard.is_lost(), "told lost after {:?}", at.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(stop); // SIGCONT
    // Keepalives answered again for a while: nothing is told.
    tokio::time::sleep(K * 4).await;
    assert!(
        !guard.is_lost(),
        "told lost after the backend was continued"
    );
    assert!(manager.is_held(&lock.key));
    assert_eq!(lock.the_holder().await, pid, "held by the same session");
    neighbours.assert_untouched(&lock.admin).await;
    assert_eq!(manager.lost_lock_counts().keepalive_failed, 0);
    assert_eq!(guard.release().await, ReleaseOutcome::Unlocked);
    assert_eq!(lock.holders().await, 0, "the key is free");
    neighbours.release().await;
    eprintln!("{mode:?}: {tries} tries failed while the holder's backend was stopped");
    drop((lock, manager, other));
    drop_cluster(cluster);
}

in_both_modes!(a_backend_stopped_past_the_patience_is_told_lost_within_its_bound);
/// Patience 1 s, the backend stopped for good: the guard is told `KeepaliveFailed`, not
/// before the patience has passed (the server shows the backend alive all along) and
/// within `K + A + P + 2h` plus a scheduling allowance.
async fn a_backend_stopped_past_the_patience_is_told_lost_within_its_bound(mode: Mode) {
    let patience = Duration::from_secs(1);
    let cluster = own_cluster("the spent-patience test");
    let manager = patient(mode, &cluster.url(), 3, patience);
    let lock = Watched::on(admin_at(&cluster.url()).await, unique_key("stalled-long"));
    let stopped = Stopped::hold(&manager, lock).await;
    let (reason, told) = stopped.told().await;
    eprintln!("{mode:?}: told {reason:?} {told:?} after the stop (patience {patience:?})");
    assert_eq!(reason, LostReason::KeepaliveFailed);
    assert!(
        told >= A + patience,
        "told before the patience was spent: {told:?}"
    );
    let bound = K + A + patience + H * 2;
    assert!(told < bound + ALLOWANCE, "{told:?}, bound {bound:?}");
    assert!(!manager.is_held(&stopped.lock.key));
    let lock = stopped.continue_until_freed().await;
    drop((lock, manager));
    drop_cluster(cluster);
}

/// Patience 3 s on a pool of one connection, which the held lock itself holds: no
/// connection is free to look at the backend with, so the lock is lost at once then, at
/// about `A` plus the look's checkout bound (`A`), long before `A + P`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_connection_to_look_with_loses_the_lock_without_waiting_the_patience() {
    let patience = Duration::from_secs(3);
    let cluster = own_cluster("the no-look test");
    let manager = patient(Mode::Plain, &cluster.url(), 1, patience);
    let lock = Watched::on(
        admin_at(&cluster.url()).await,
        unique_key("stalled-no-look"),
    );
    let stopped = Stopped::hold(&manager, lock).await;
    let (reason, told) = stopped.told().await;
    eprintln!("no connection to look with: told {reason:?} {told:?} after the stop");
    assert_eq!(reason, LostReason::KeepaliveFailed);
    assert!(told >= A, "{told:?}");
    assert!(told < A + patience, "waited the patience: {told:?}");
    let bound = K + A + A + H * 2;
    assert!(told < bound + ALLOWANCE, "{told:?}, bound {bound:?}");
    let lock = stopped.continue_until_freed().await;
    drop((lock, manager));
    drop_cluster(cluster);
}

/// Patience 3 s, the held lock's session silenced by the network (a proxy that stops
/// forwarding its traffic), then its backend terminated from the server's side: the
/// look, on a new connection, finds the backend gone, and the lock is lost at once with
/// `ConnectionClosed`, long before `A + P`. (A stopped backend cannot be terminated: it
/// would exit only when continued.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_the_server_has_no_more_is_lost_without_waiting_the_patience() {
    let patience = Duration::from_secs(3);
    let cluster = own_cluster("the gone-backend test");
    let proxy = FreezingProxy::to(cluster.port()).await;
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port);
    let manager = patient(Mode::Plain, &url, 3, patience);
    let lock = Watched::on(admin_at(&cluster.url()).await, unique_key("stalled-gone"));
    let guard = manager
        .acquire(&lock.key, AcquireOptions::new())
        .await
        .unwrap();
    let pid = lock.the_holder().await;
    proxy.freeze();
    lock.terminate(pid).await;
    let started = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("told");
    let told = started.elapsed();
    eprintln!("a backend gone under a silent session: told {reason:?} {told:?} after");
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert!(told < A + patience, "waited the patience: {told:?}");
    assert!(!manager.is_held(&lock.key));
    drop((lock, manager, proxy));
    drop_cluster(cluster);
}

/// A TCP proxy to a local port that can freeze the connections it carries: a frozen
/// one forwards nothing more either way (a silent network for that session alone);
/// connections made later pass.
struct FreezingProxy {
    port: u16,
    carried: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl FreezingProxy {
    async fn to(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let carried: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let list = Arc::clone(&carried);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let frozen = Arc::new(AtomicBool::new(false));
                list.lock().unwrap().push(Arc::clone(&frozen));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(forward(client_read, server_write, Arc::clone(&frozen)));
                tokio::spawn(forward(server_read, client_write, frozen));
            }
        });
        Self {
            port,
            carried,
            accepting,
        }
    }

    /// Freezes every connection carried now.
    fn freeze(&self) {
        for frozen in self.carried.lock().unwrap().iter() {
            frozen.store(true, Ordering::SeqCst);
        }
    }
}

impl Drop for FreezingProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to` until either ends, or forever silent once `frozen`.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            () = until(&frozen) => std::future::pending().await,
        };
        let Ok(count @ 1..) = read else { return };
        if frozen.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        if to.write_all(&buffer[..count]).await.is_err() {
            return;
        }
    }
}

/// Returns once `flag` is set (polled every 10 ms).
async fn until(flag: &AtomicBool) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
