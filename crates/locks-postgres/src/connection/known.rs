//! What the manager knows of its pooled connections: a connection's [`Known`] state
//! (set up or not, its marker, the statements prepared on it, its watch and the slot
//! kept for its next lock), carried with it while checked out, and the [`Connections`]
//! table that keeps it while the connection is idle in the pool.

use std::collections::VecDeque;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use locks_port::LossNotifier;

use crate::pool::connect::Canceller;
use crate::pool::{self, Pooled as Object, PooledId as ObjectId};
use crate::watchdog::Watch;

/// One pooled connection while checked out, and what the manager knows of it: whether
/// it is set up (see [`SESSION_SETUP`](crate::query::SESSION_SETUP)), the statements prepared on it, and its
/// session marker.
///
/// What is known travels with the connection: taken out of [`Connections`] at
/// checkout, put back (without the connection itself) when the session goes back to
/// the pool, and dropped with a closed connection. Boxed, so a session is small to
/// move, and reused, so a checkout allocates nothing.
#[derive(Debug)]
pub(crate) struct Known {
    /// The connection, while checked out.
    pub(super) object: Option<Object>,
    pub(super) set_up: bool,
    /// The value of `locks.session` the set-up gives the server session, the same for
    /// every manager of the process (see [`marker`]).
    pub(super) marker: Box<str>,
    /// The [`Query`](crate::query::Query)s prepared on it, by [`Query::index`](crate::query::Query::index) (a few dozen at most).
    pub(super) prepared: Vec<Option<tokio_postgres::Statement>>,
    /// What holds its statements to their limits (`None`: the watchdog could not be
    /// started, and each statement has a timer of its own).
    pub(super) watch: Option<Arc<Watch>>,
    /// The slot the connection's last lock was held in (`slot.rs`, a floor up: named
    /// here as `Any`), kept for its next lock so that a grant allocates no slot;
    /// empty of any session while kept.
    pub(super) spare: Option<Spare>,
    /// The loss notifier of the connection's last lock, kept as its slot is (renewed
    /// for the next lock when nothing shares it: `LossNotifier::renewed`).
    pub(super) spare_notifier: Option<LossNotifier>,
    /// Its server session, as the set-up read it (when asked to: stall patience).
    pub(super) backend: Option<Backend>,
}

/// A server session: its backend's pid and start. Pids are reused; the pair names one
/// session for the life of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backend {
    pub(crate) pid: i32,
    pub(crate) started: std::time::SystemTime,
}

/// A slot kept with its connection (see [`Known`]).
pub(crate) type Spare = Arc<dyn std::any::Any + Send + Sync>;

impl Known {
    fn of(object: &Object) -> Box<Self> {
        Box::new(Self {
            object: None,
            set_up: false,
            marker: marker(object),
            prepared: Vec::new(),
            watch: Watch::new(),
            spare: None,
            spare_notifier: None,
            backend: None,
        })
    }
}

/// The session marker of a connection: a hash, keyed once per process, of the pool's
/// object id and the instant the connection was made. Every manager sharing a pool
/// computes the same marker for one connection; two connections (of this process or any
/// other) share one only by a 64-bit hash collision.
fn marker(object: &Object) -> Box<str> {
    static KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    format!("{:016x}", KEYS.hash_one(pool::identity(object))).into_boxed_str()
}

/// The [`Known`] state of the manager's connections that are idle in the pool, in the
/// order they were given back: the pool hands out the oldest idle connection first
/// (FIFO, the pool's default) or the newest (LIFO), so the one asked for is nearly
/// always at one end.
#[derive(Debug)]
pub(crate) struct Connections {
    idle: Mutex<VecDeque<(ObjectId, Box<Known>)>>,
    /// More entries than this means some connections were closed by the pool while
    /// idle: the oldest are forgotten (those still alive are set up again at next use).
    limit: usize,
    /// The pool's cancel path, with its TLS connector.
    canceller: Canceller,
}

impl Connections {
    pub(crate) fn new(pool_size: usize, canceller: Canceller) -> Self {
        Self {
            idle: Mutex::default(),
            limit: pool_size.saturating_mul(2).max(16),
            canceller,
        }
    }

    /// The pool's cancel path.
    pub(crate) fn canceller(&self) -> &Canceller {
        &self.canceller
    }

    pub(super) fn take(&self, object: &Object) -> Box<Known> {
        let id = pool::id(object);
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let known = match (idle.front(), idle.back()) {
            (Some((front, _)), _) if *front == id => idle.pop_front(),
            (_, Some((back, _))) if *back == id => idle.pop_back(),
            _ => idle
                .iter()
                .position(|(idle_id, _)| *idle_id == id)
                .and_then(|index| idle.remove(index)),
        };
        drop(idle);
        known.map_or_else(|| Known::of(object), |(_, known)| known)
    }

    pub(super) fn give_back(&self, id: ObjectId, known: Box<Known>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() >= self.limit {
            idle.pop_front();
        }
        idle.push_back((id, known));
    }
}
