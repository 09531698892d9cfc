//! A member's renewals: on a tokio task of their own, so that a tick that waits (a term's
//! begin behind a frozen writer's row lock, a slow server) never lets the member expire;
//! and the deadline by which a member that could not renew stops its own tasks, before the
//! others may end its sessions. The deadline outlives a membership: a member that joins
//! again keeping its shards (its membership session ended, its shard locks did not) is
//! still bound by the renewal its previous membership last confirmed.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::terms::ShardTerms;

/// The share of the expiry after the last successful renewal was sent at which a member
/// stops its own tasks: the others end its sessions no sooner than the whole expiry after
/// the server wrote that renewal, which was after it was sent.
const SELF_STOP: f64 = 0.8;

/// A member renews every this-many-th of its expiry.
const RENEWALS_PER_EXPIRY: u32 = 5;

/// How long each renewal has to be answered in for a member with `expiry` not to stop
/// itself: two answers in a row and the pause between them fit in [`SELF_STOP`] of the
/// expiry (0.3 of it).
pub(crate) fn answer_budget(expiry: Duration) -> Duration {
    expiry
        .mul_f64(SELF_STOP)
        .saturating_sub(expiry / RENEWALS_PER_EXPIRY)
        / 2
}

/// When a member's last confirmed renewal was sent, across its memberships, and the
/// deadline that follows from it.
#[derive(Debug, Clone)]
pub(crate) struct SelfStop {
    expiry: Duration,
    last_sent: Arc<Mutex<Instant>>,
}

impl SelfStop {
    /// A deadline `SELF_STOP` of `expiry` from now.
    pub(crate) fn new(expiry: Duration) -> Self {
        Self {
            expiry,
            last_sent: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Starts the deadline again from now: a member that joins owning nothing has no
    /// task to stop.
    pub(crate) fn restart(&self) {
        self.confirm(Instant::now());
    }

    fn confirm(&self, sent: Instant) {
        *self
            .last_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = sent;
    }

    /// Ready once no renewal was confirmed for [`SELF_STOP`] of the expiry.
    pub(crate) async fn overdue(&self) {
        loop {
            let last = *self
                .last_sent
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // An expiry too long for the clock never comes due.
            let Some(deadline) = last.checked_add(self.expiry.mul_f64(SELF_STOP)) else {
                return std::future::pending().await;
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)).await;
        }
    }
}

/// The renewals of one membership; dropped, they stop.
#[derive(Debug)]
pub(crate) struct Renewals {
    handle: JoinHandle<()>,
    /// Answered once the first renewal was tried (confirmed or not).
    first: Option<oneshot::Receiver<()>>,
}

impl Renewals {
    /// Renews every fifth of the expiry of `deadline` from now on, moving the deadline
    /// on with each confirmed renewal. The first renewal writes the member's row, so it
    /// is what enters the member in the roster ([`first_tried`](Self::first_tried)).
    pub(crate) fn start<T: ShardTerms + 'static>(
        terms: T,
        group: String,
        slot: u32,
        holder: String,
        deadline: SelfStop,
    ) -> Self {
        let expiry = deadline.expiry;
        let (tried, first) = oneshot::channel();
        let handle = tokio::spawn(async move {
            let mut tried = Some(tried);
            loop {
                let sent = Instant::now();
                let renewed = terms.renew(&group, slot, &holder, expiry).await;
                if let Some(tried) = tried.take() {
                    let _ = tried.send(());
                }
                match renewed {
                    Ok(ended) => {
                        deadline.confirm(sent);
                        if ended > 0 {
                            tracing::warn!(
                                sessions = ended,
                                "ended the lock sessions of shard group members whose \
                                 renewal expired"
                            );
                        }
                    }
                    Err(error) => tracing::warn!(error = %error, "renewing this member failed"),
                }
                tokio::time::sleep(expiry / RENEWALS_PER_EXPIRY).await;
            }
        });
        Self {
            handle,
            first: Some(first),
        }
    }

    /// Ready once the first renewal was tried: confirmed, it wrote the member's row;
    /// failed, the member's first tick that does not find itself listed enters it.
    pub(crate) async fn first_tried(&mut self) {
        if let Some(first) = self.first.take() {
            // An error only says the task ended (aborted with the membership).
            let _ = first.await;
        }
    }
}

impl Drop for Renewals {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
