//! What a manager's clones share: the pool, the settings, the bookkeeping, the monitor's
//! state, the shared connections and the instruments. Its fields are private: a narrow
//! handle, read through the methods here, with the book's operations that tell the
//! guards. The monitor (`monitor.rs`, just above on the same floor) adds
//! the losing of a session and what it held. A primitive (a lock, a group, a permit, a
//! mode change, fencing tokens, the board, ...) is its statements plus what its guard
//! does, written as free functions over `&Inner` in its own module, as tokio-postgres
//! writes `query(&InnerClient, ..)`: no other room adds an `impl Inner` block.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use locks_port::LostReason;

use locks_port::KeyDerivation;
use opentelemetry::metrics::Meter;

use crate::pool::Pool;
use crate::pool::connect::{Canceller, canceller_of};

use crate::bookkeeping::{Book, Entries, Held};
use crate::connection::{Connections, SetupValues};
use crate::health::Health;
use crate::lease::{Lease, LeaseError};
use crate::lock_ids::LockIds;
use crate::metrics::Metrics;
use crate::multiplex::Multiplexer;
use crate::settings::{KeyVisibility, Settings, published_holder_id};

/// What the manager's clones share. Its fields are private: the rooms of the adapter
/// reach them through the methods below, as free functions over `&Inner`.
pub(crate) struct Inner {
    pool: Pool,
    holder_id: Option<String>,
    key_visibility: KeyVisibility,
    /// The key derivation, and the ids of recently used keys.
    lock_ids: LockIds,
    settings: Settings,
    /// The lease in force, or why the one asked for cannot hold.
    lease: Result<Option<Lease>, LeaseError>,
    /// The lease's server timers as the set-up binds them.
    server_timers: Option<[Option<String>; 6]>,
    /// `locks:<holder id>`, set on every connection the manager uses when it has a
    /// holder id (else the connection's own `application_name` is left alone).
    application_name: Option<String>,
    book: Mutex<Book>,
    /// What is known of the pool's idle connections (set up, prepared statements).
    connections: Arc<Connections>,
    /// The number of the next bookkeeping ticket (one per acquisition).
    next_ticket: AtomicU64,
    /// The lost-lock monitor's state and the per-reason counts of lost locks.
    health: Health,
    /// The shared connections, when multiplexing is on.
    multiplexer: Option<Multiplexer>,
    /// The instruments (the book holds them too, for the locks-held count).
    metrics: Arc<Metrics>,
}

impl Inner {
    /// The shared state of a manager over `pool` (whose cancel path is `canceller`, or
    /// the one its connector registered), as the builder gathered it. Does no I/O.
    pub(crate) fn new(
        pool: Pool,
        canceller: Option<Canceller>,
        holder_id: Option<String>,
        key_visibility: KeyVisibility,
        derivation: KeyDerivation,
        settings: Settings,
        meter: Option<&Meter>,
    ) -> Self {
        let (settings, lease) = settings.with_lease();
        let server_timers = match &lease {
            Ok(Some(lease)) => Some(lease.server.as_settings()),
            _ => None,
        };
        let canceller = canceller.unwrap_or_else(|| canceller_of(&pool));
        let connections = Arc::new(Connections::new(pool.status().max_size, canceller));
        let metrics = Arc::new(Metrics::new(
            settings.metrics,
            meter,
            settings.metrics_lock_id,
        ));
        Self {
            application_name: holder_id.as_deref().map(published_holder_id),
            pool,
            holder_id,
            key_visibility,
            lock_ids: LockIds::new(derivation),
            settings,
            lease,
            server_timers,
            book: Mutex::new(Book::new(Arc::clone(&metrics))),
            connections,
            next_ticket: AtomicU64::new(1),
            health: Health::default(),
            multiplexer: Multiplexer::new(settings.locks_per_connection, settings.answer_timeout),
            metrics,
        }
    }

    /// What the manager holds.
    pub(crate) fn book(&self) -> MutexGuard<'_, Book> {
        // The book stays consistent even if a holder panicked: every change is one call.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn holder_id(&self) -> Option<&String> {
        self.holder_id.as_ref()
    }

    pub(crate) fn lock_ids(&self) -> &LockIds {
        &self.lock_ids
    }

    pub(crate) fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }

    /// The manager's instruments.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The shared connections, when multiplexing is on.
    pub(crate) fn multiplexer(&self) -> Option<&Multiplexer> {
        self.multiplexer.as_ref()
    }

    /// The lease in force, or why the one asked for cannot hold.
    pub(crate) fn lease(&self) -> Result<Option<&Lease>, &LeaseError> {
        self.lease.as_ref().map(Option::as_ref)
    }

    /// The lease's `idle_session_timeout`, when it holds stopped holders too: the server
    /// ends a session of the manager's that sent nothing for that long.
    pub(crate) fn idle_session_limit(&self) -> Option<std::time::Duration> {
        let lease = self.lease.as_ref().ok().and_then(Option::as_ref);
        lease.and_then(|lease| lease.server.idle_session_timeout)
    }

    /// A new bookkeeping ticket: the number that tells one acquisition's entry from
    /// another's of the same lock id.
    pub(crate) fn next_ticket(&self) -> u64 {
        self.next_ticket.fetch_add(1, Ordering::Relaxed)
    }

    /// The lost-lock monitor's state (see [`crate::health`]).
    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// What the set-up gives each of the manager's sessions.
    pub(crate) fn setup_values(&self) -> SetupValues<'_> {
        SetupValues {
            application_name: self.application_name.as_deref(),
            timers: self.server_timers.as_ref(),
            identify: self.settings.stall_patience.is_some(),
        }
    }

    pub(crate) fn key_visibility(&self) -> KeyVisibility {
        self.key_visibility
    }

    /// The key as spans and events may show it.
    pub(crate) fn shown<'k>(&self, key: &'k str) -> Option<&'k str> {
        self.key_visibility.shown(key)
    }
}

/// The book's operations that tell the guards: an entry taken out fires its signal.
impl Inner {
    /// Takes the entry of the acquisition with `ticket` of `lock_id` out of the
    /// bookkeeping; its guard's signal fires ([`LostReason::Released`]).
    pub(crate) fn take_one(&self, lock_id: i64, ticket: u64) -> Option<Held> {
        let taken = self.book().remove_one(lock_id, ticket)?;
        taken.notifier().notify(LostReason::Released);
        Some(taken)
    }

    /// Takes every entry of `key` out of the bookkeeping; their guards' signals fire.
    pub(crate) fn take_all_of(&self, key: &str, lock_id: i64) -> Entries {
        let taken = self.book().remove_all(key, lock_id);
        for held in &taken {
            held.notifier().notify(LostReason::Released);
        }
        taken
    }

    /// Takes every entry out (a shutdown): every guard's signal fires.
    pub(crate) fn take_all(&self) -> Vec<Held> {
        let drained = self.book().drain();
        for held in &drained {
            held.notifier().notify(LostReason::Released);
        }
        drained
    }
}
