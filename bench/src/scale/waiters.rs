//! The waiters curve: N tasks (4 → 1,000), each on its own connection, acquire / hold
//! [`HOLD`] / release one key without a timeout ([`crate::turns`]), the library
//! (`Queue`) against raw `pg_advisory_lock`: handoff p99 (release → next grant) and
//! fairness (most ÷ fewest turns).

use std::time::Duration;

use locks_postgres::tokio_postgres::Client;

use crate::chart::{BLUE, Panel, RED, Unit, curve, panel, x};
use crate::db::Database;
use crate::harness::{self, cells};
use crate::stats::{Latencies, as_f64, fairness, fmt_ns};
use crate::turns::{Contender, Turns};
use crate::{BoxError, Plan};

/// Waiter counts.
pub(super) const WAITERS: [usize; 4] = [4, 32, 256, 1000];
/// How long a waiter holds the lock.
pub(super) const HOLD: Duration = Duration::from_millis(1);
const APP: &str = "lock-bench-scale-waiters";

/// Handoff p99 and fairness of the library and of raw, at `waiters` waiters.
#[derive(Debug, serde::Serialize)]
pub(super) struct Waiters {
    waiters: usize,
    library: (u64, f64),
    raw: (u64, f64),
}

/// One window a side (the order by count), each waiter its own connection, closed after.
pub(super) async fn point(
    db: &Database,
    plan: &Plan,
    admin: &Client,
    waiters: usize,
) -> Result<Waiters, BoxError> {
    // Every waiter gets several turns in a window, at 2-4 ms a handoff.
    let length = plan
        .window()
        .max(HOLD * u32::try_from(waiters * 12).unwrap_or(12_000));
    let mut sides = [(0, 0.0); 2];
    for side in harness::order(waiters, 2) {
        let mut turns = Turns::new([Contender::Queue, Contender::Raw][side], waiters);
        let key = "bench:scale:waiters".to_owned();
        turns
            .window(db, (APP, false), key, length, |_, _| HOLD)
            .await?;
        let gaps = Latencies::of(&turns.take().gaps);
        sides[side] = (gaps.p99(), fairness(&turns.windows[0]));
        db.sessions(admin, APP, 0).await?;
    }
    let [library, raw] = sides;
    Ok(Waiters {
        waiters,
        library,
        raw,
    })
}

pub(super) fn row(w: &Waiters) -> Vec<crate::harness::Cell> {
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

pub(super) fn chart(waiters: &[Waiters]) -> Panel {
    let p99 = |label, color, dashed, f: fn(&Waiters) -> u64| {
        let points = waiters.iter().map(|w| (x(w.waiters), as_f64(f(w))));
        curve(label, color, dashed, points.collect())
    };
    panel(
        "handoff p99, waiters on one key",
        ("waiters", "release → grant", Unit::Nanos),
        vec![
            p99("library (Queue)", BLUE, false, |w| w.library.0),
            p99("raw", RED, true, |w| w.raw.0),
        ],
    )
}
