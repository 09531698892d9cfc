//! A member's renewals: on a tokio task of their own, so that a tick that waits (a term's
//! begin behind a frozen writer's row lock, a slow server) never lets the member expire;
//! and the deadline by which a member that could not renew stops its own tasks, before the
//! others may end its sessions.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::terms::ShardTerms;

/// The share of the expiry after the last successful renewal was sent at which a member
/// stops its own tasks: the others end its sessions no sooner than the whole expiry after
/// the server wrote that renewal, which was after it was sent.
const SELF_STOP: f64 = 0.8;

/// The renewals of one membership; dropped, they stop.
#[derive(Debug)]
pub(crate) struct Renewals {
    expiry: Duration,
    /// When the last renewal the store confirmed was sent.
    last_sent: Arc<Mutex<Instant>>,
    handle: JoinHandle<()>,
}

impl Renewals {
    /// Renews every fifth of `expiry` from now on.
    pub(crate) fn start<T: ShardTerms + 'static>(
        terms: T,
        group: String,
        slot: u32,
        holder: String,
        expiry: Duration,
    ) -> Self {
        let last_sent = Arc::new(Mutex::new(Instant::now()));
        let confirmed = Arc::clone(&last_sent);
        let handle = tokio::spawn(async move {
            loop {
                let sent = Instant::now();
                match terms.renew(&group, slot, &holder, expiry).await {
                    Ok(ended) => {
                        *confirmed.lock().unwrap_or_else(PoisonError::into_inner) = sent;
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
                tokio::time::sleep(expiry / 5).await;
            }
        });
        Self {
            expiry,
            last_sent,
            handle,
        }
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

impl Drop for Renewals {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
