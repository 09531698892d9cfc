//! How the pool's connections are opened, how the manager hears that one has ended, and
//! how a statement in flight on one is cancelled: with the TLS connector the connection
//! was opened with.
//!
//! - [`LockConnect`] is this crate's [`deadpool_postgres::Connect`]: it opens a connection
//!   with the pool's TLS connector and runs its I/O task, which announces its own end on
//!   a process-wide signal ([`connection_ended`]). The lost-lock monitors wake on it, so a
//!   terminated backend is noticed the moment its socket closes, not at the next check.
//! - [`Canceller`] sends a cancel request with that TLS connector. A pool made by
//!   [`plain_pool`](crate::plain_pool) or [`tls_pool`](crate::tls_pool) registers its
//!   canceller here; a manager finds it from its pool ([`canceller_of`]). For a pool built
//!   by hand, [`tls`](crate::PostgresLockManagerBuilder::tls) tells the manager.

use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use deadpool_postgres::{Pool, WeakPool};
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{CancelToken, Client, NoTls, Socket};

/// The [`deadpool_postgres::Connect`] of the pools this crate builds: connections opened
/// with `tls`, whose end is announced to the lost-lock monitors at once.
///
/// [`tls_pool`](crate::tls_pool) builds a pool on it; to build one by hand, give it to
/// [`deadpool_postgres::Manager::from_connect`] and tell the lock manager the TLS
/// connector with [`PostgresLockManagerBuilder::tls`](crate::PostgresLockManagerBuilder::tls).
#[derive(Clone)]
pub struct LockConnect<T> {
    tls: T,
}

impl<T> LockConnect<T> {
    /// Connections opened with `tls` (`tokio_postgres::NoTls` for none).
    pub fn new(tls: T) -> Self {
        Self { tls }
    }
}

impl<T> fmt::Debug for LockConnect<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockConnect").finish_non_exhaustive()
    }
}

impl<T> deadpool_postgres::Connect for LockConnect<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(
        &self,
        pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        let tls = self.tls.clone();
        let pg_config = pg_config.clone();
        Box::pin(async move {
            let (client, connection) = pg_config.connect(tls).await?;
            // The connection's I/O runs in a task of its own, unwrapped (no layer on its
            // every poll); a second task, polled only at its start and at the
            // connection's end, announces the end. Deadpool aborts the second one when
            // it discards the connection: a discarded connection wakes no monitor (its
            // I/O task then ends by itself, its client being gone).
            let io = tokio::spawn(connection);
            let task = tokio::spawn(async move {
                if let Ok(Err(error)) = io.await {
                    tracing::debug!(%error, "PostgreSQL connection ended with an error");
                }
                announce_connection_ended();
            });
            Ok((client, task))
        })
    }
}

/// The process-wide count of connections opened by [`LockConnect`] that ended on their
/// own (the server closed them, or the socket failed).
static ENDED: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::Sender::new(0));

fn announce_connection_ended() {
    ENDED.send_modify(|ended| *ended = ended.wrapping_add(1));
}

/// A receiver that changes whenever a [`LockConnect`] connection ends on its own.
pub(crate) fn connection_ended() -> watch::Receiver<u64> {
    ENDED.subscribe()
}

/// Sends cancel requests for one pool's connections, with its TLS connector.
#[derive(Clone)]
pub(crate) struct Canceller {
    send: Arc<
        dyn Fn(CancelToken) -> BoxFuture<'static, Result<(), tokio_postgres::Error>> + Send + Sync,
    >,
    /// Whether the TLS connector is known (not the plain-text fallback).
    known: bool,
    /// With the fallback: whether a cancel request that could not be sent was said
    /// already (at WARN once per manager, then at DEBUG).
    said: Arc<AtomicBool>,
}

impl fmt::Debug for Canceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canceller")
            .field("known", &self.known)
            .finish_non_exhaustive()
    }
}

impl Canceller {
    /// Cancel requests with `tls`.
    pub(crate) fn with<T>(tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        Self {
            send: Arc::new(move |token: CancelToken| {
                let tls = tls.clone();
                Box::pin(async move { token.cancel_query(tls).await })
            }),
            known: true,
            said: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Plain-text cancel requests, for a pool whose TLS connector nobody told us.
    fn fallback() -> Self {
        Self {
            known: false,
            ..Self::with(NoTls)
        }
    }

    /// Cancels whatever `client` runs, then drops it (closing the connection), on the
    /// current runtime; without one, only drops it. Best effort: if the request cannot
    /// be sent, closing the socket still frees what the session held once the server
    /// notices.
    pub(crate) fn cancel_and_close(&self, client: deadpool_postgres::ClientWrapper) {
        let token = client.cancel_token();
        self.spawn(token, Some(client));
    }

    fn spawn(&self, token: CancelToken, client: Option<deadpool_postgres::ClientWrapper>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(client);
            return;
        };
        let send = Arc::clone(&self.send);
        let unknown_tls = (!self.known).then(|| Arc::clone(&self.said));
        runtime.spawn(async move {
            if let Err(error) = send(token).await {
                match unknown_tls {
                    // Once per manager: a pool built by hand over TLS, whose connector
                    // the manager was not told, cannot send a single cancel request.
                    Some(said) if !said.swap(true, Ordering::Relaxed) => tracing::warn!(
                        %error,
                        "cancel request could not be sent: the pool's TLS connector is \
                         unknown (a pool built by hand), so a dropped wait stays in the \
                         server's lock queue until its lock_timeout, or until the server's \
                         connection check (client_connection_check_interval, set by the \
                         lease) finds the connection closed; build the pool with \
                         locks_postgres::tls_pool, or give the builder .tls(..)"
                    ),
                    _ => tracing::debug!(%error, "cancel request failed"),
                }
            }
            drop(client);
        });
    }
}

/// The cancel path of a pool's connections, for code that runs its own statements on
/// them (the cutover's transactions): a cancel request with the TLS connector the pool
/// was built with (see [`tls_pool`](crate::tls_pool)), then the connection closed.
///
/// ```
/// let pool = locks_postgres::plain_pool("postgres://app@localhost/app", 2)?;
/// let cancel = locks_postgres::CancelPath::of(&pool);
/// // ... on a path that gives up on a statement in flight:
/// // cancel.cancel_and_close(object);
/// # drop(cancel);
/// # Ok::<(), locks_postgres::PoolConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CancelPath(Canceller);

impl CancelPath {
    /// The cancel path of `pool`'s connections: the one [`plain_pool`](crate::plain_pool)
    /// or [`tls_pool`](crate::tls_pool) registered, or plain text.
    #[must_use]
    pub fn of(pool: &Pool) -> Self {
        Self(canceller_of(pool))
    }

    /// Detaches `object` from its pool, cancels what runs on it (in a task on the
    /// current Tokio runtime; without one, nothing is sent) and closes it.
    pub fn cancel_and_close(&self, object: deadpool_postgres::Object) {
        self.0
            .cancel_and_close(deadpool_postgres::Object::take(object));
    }
}

/// The cancellers of the pools this crate built, by pool (held weakly: a pool dropped is
/// forgotten at the next registration).
static POOLS: LazyLock<Mutex<Vec<(WeakPool, Canceller)>>> = LazyLock::new(Mutex::default);

/// Records that `pool`'s connections are opened with `canceller`'s TLS connector.
pub(crate) fn register(pool: &Pool, canceller: Canceller) {
    let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools.retain(|(weak, _)| weak.upgrade().is_some());
    pools.push((pool.weak(), canceller));
}

/// The canceller of `pool`: the one registered for it, or plain text.
pub(crate) fn canceller_of(pool: &Pool) -> Canceller {
    registered(pool).unwrap_or_else(Canceller::fallback)
}

/// Whether `pool` was built by [`plain_pool`](crate::plain_pool) or
/// [`tls_pool`](crate::tls_pool): its connections are [`LockConnect`]'s, which announce
/// their end. (A pool built by hand on `LockConnect` announces too, but nothing says so.)
pub(crate) fn announces_end(pool: &Pool) -> bool {
    registered(pool).is_some()
}

fn registered(pool: &Pool) -> Option<Canceller> {
    let pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    pools
        .iter()
        .find(|(weak, _)| {
            // A live pool's manager never moves, and no other pool's can be at its place.
            weak.upgrade()
                .is_some_and(|live| ptr::eq(live.manager(), pool.manager()))
        })
        .map(|(_, canceller)| canceller.clone())
}
