//! The waiters curve: N tasks (4 → 1,000), each on its own connection, acquire / hold
//! [`HOLD`] / release one key, the library (`Queue`) against raw `pg_advisory_lock`:
//! handoff p99 (release → next grant) and fairness (most ÷ fewest turns).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use locks_port::{AcquireOptions, DistributedLock, LockGuard, lock_id};
use locks_postgres::PostgresLockManager;
use serde_json::{Value, json};

use super::{BLUE, OPENING, RED, curve, x};
use crate::chart::{Panel, Unit};
use crate::db::{Database, Raw};
use crate::harness::cells;
use crate::stats::{Latencies, as_f64, fairness, finite, fmt_ns, nanos};
use crate::{BoxError, Plan};

/// Waiter counts.
pub(super) const WAITERS: [usize; 4] = [4, 32, 256, 1000];
/// How long a waiter holds the lock.
pub(super) const HOLD: Duration = Duration::from_millis(1);
pub(super) const APP: &str = "lock-bench-scale-waiters";

/// Handoffs among the waiters: every gap from a release to the next grant, and each
/// waiter's turns.
#[derive(Debug, Default)]
struct Turns {
    last_release: Option<Instant>,
    gaps: Vec<u64>,
    turns: Vec<u64>,
}

/// Handoff p99 and fairness of the library and of raw, at `waiters` waiters.
#[derive(Debug)]
pub(super) struct Waiters {
    pub(super) waiters: usize,
    pub(super) library: (u64, f64),
    pub(super) raw: (u64, f64),
}

/// One window of `waiters` tasks looping acquire / hold [`HOLD`] / release on one key;
/// the gaps' p99 and most ÷ fewest turns.
pub(super) async fn window(
    db: &Database,
    plan: &Plan,
    waiters: usize,
    library: bool,
) -> Result<(u64, f64), BoxError> {
    let key = "bench:scale:waiters";
    let id = lock_id(key);
    let mut opening = tokio::task::JoinSet::new();
    let opening_at_once = Arc::new(tokio::sync::Semaphore::new(OPENING));
    for _ in 0..waiters {
        let (db, at_once) = (db.clone(), Arc::clone(&opening_at_once));
        opening.spawn(async move {
            let _turn = at_once.acquire().await?;
            if library {
                let pool = db.pool(1, APP);
                db.warm(&pool, 1).await?;
                Ok::<_, BoxError>(Ok(PostgresLockManager::new(pool)))
            } else {
                Ok(Err(Raw::connect(&db, APP, false).await?))
            }
        });
    }
    let mut takers = Vec::new();
    while let Some(joined) = opening.join_next().await {
        takers.push(joined??);
    }
    let state = Arc::new(Mutex::new(Turns {
        turns: vec![0; waiters],
        ..Turns::default()
    }));
    // Every waiter gets several turns in a window, at 2-4 ms a handoff.
    let length = plan
        .scale_window
        .max(HOLD * u32::try_from(waiters * 12).unwrap_or(12_000));
    let end = Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for (index, taker) in takers.into_iter().enumerate() {
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            let with = |f: &mut dyn FnMut(&mut Turns)| {
                f(&mut state.lock().unwrap_or_else(PoisonError::into_inner));
            };
            while Instant::now() < end {
                let guard = match &taker {
                    Ok(manager) => Some(manager.acquire(key, AcquireOptions::new()).await?),
                    Err(raw) => {
                        raw.lock(id).await?;
                        None
                    }
                };
                let at = Instant::now();
                with(&mut |turns| {
                    if at < end {
                        if let Some(released) = turns.last_release.take() {
                            turns.gaps.push(nanos(at - released));
                        }
                        turns.turns[index] += 1;
                    }
                });
                tokio::time::sleep(HOLD).await;
                with(&mut |turns| turns.last_release = Some(Instant::now()));
                match (guard, &taker) {
                    (Some(guard), _) => drop(guard.release().await),
                    (None, Err(raw)) => raw.unlock(id).await?,
                    (None, Ok(_)) => {}
                }
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    let turns = std::mem::take(&mut *state.lock().unwrap_or_else(PoisonError::into_inner));
    Ok((Latencies::of(&turns.gaps).p99(), fairness(&turns.turns)))
}

pub(super) fn row(w: &Waiters) -> Vec<String> {
    cells![
        format!("{} waiters, one key", w.waiters),
        format!(
            "handoff p99 {} (raw {})",
            fmt_ns(w.library.0),
            fmt_ns(w.raw.0)
        ),
        format!("fairness {:.2} (raw {:.2})", w.library.1, w.raw.1),
        "",
    ]
}

pub(super) fn json(w: &Waiters) -> Value {
    json!({
        "waiters": w.waiters,
        "library_handoff_p99_ns": w.library.0, "library_fairness": finite(w.library.1),
        "raw_handoff_p99_ns": w.raw.0, "raw_fairness": finite(w.raw.1),
    })
}

pub(super) fn panel(waiters: &[Waiters]) -> Panel {
    let points = |f: fn(&Waiters) -> u64| waiters.iter().map(move |w| (x(w.waiters), as_f64(f(w))));
    Panel {
        title: "handoff p99, waiters on one key".to_owned(),
        x_desc: "waiters",
        y_desc: "release → grant",
        y_unit: Unit::Nanos,
        curves: vec![
            curve(
                "library (Queue)",
                BLUE,
                false,
                points(|w| w.library.0).collect(),
            ),
            curve("raw", RED, true, points(|w| w.raw.0).collect()),
        ],
    }
}
