//! The groups curve: `acquire_many` of 1 → 1,000 keys + release against one raw statement
//! that locks them all (`pg_advisory_lock` over `unnest`, in id order) and one that
//! unlocks them: p50, and the cost per key.

use std::time::Instant;

use locks_port::{AcquireOptions, lock_id};
use locks_postgres::PostgresLockManager;

use crate::chart::{BLUE, Panel, RED, Unit, curve, panel, x};
use crate::db::{Database, NOT_HELD};
use crate::harness::{self, cells};
use crate::stats::{Latencies, as_f64, fmt_ns, fmt_ratio, ratio};
use crate::turns::open_pool;
use crate::{BoxError, Plan};

/// Group sizes.
pub(super) const GROUPS: [usize; 4] = [1, 10, 100, 1000];
const APP: &str = "lock-bench-scale-groups";

/// The p50 of the library's and raw's group cycle of `keys` keys.
#[derive(Debug, serde::Serialize)]
pub(super) struct Group {
    keys: usize,
    library: u64,
    raw: u64,
}

pub(super) async fn point(db: &Database, plan: &Plan, size: usize) -> Result<Group, BoxError> {
    let manager = PostgresLockManager::new(open_pool(db, 1, APP).await?);
    let client = db.connect(APP).await?;
    let lock = client
        .prepare(
            "SELECT count(pg_advisory_lock(id)) FROM \
             (SELECT id FROM unnest($1::int8[]) AS id ORDER BY id) AS ordered",
        )
        .await?;
    let unlock = client
        .prepare("SELECT bool_and(pg_advisory_unlock(id)) FROM unnest($1::int8[]) AS id")
        .await?;
    let keys: Vec<String> = (0..size)
        .map(|n| format!("bench:scale:group:{n}"))
        .collect();
    let ids: Vec<i64> = keys.iter().map(|k| lock_id(k)).collect();
    let mut sides = [Latencies::new(), Latencies::new()];
    harness::rounds(plan.pick(2, 3), 2, async |_, side| {
        let end = Instant::now() + plan.window() / 2;
        let (_, measured) = harness::until(end, 3, true, async || {
            if side == 0 {
                let group = manager.acquire_many(&keys, AcquireOptions::new()).await?;
                group.release().await;
            } else {
                client.execute(&lock, &[&ids]).await?;
                let all: Option<bool> = client.query_one(&unlock, &[&ids]).await?.get(0);
                if all != Some(true) {
                    return Err(NOT_HELD.into());
                }
            }
            Ok(())
        })
        .await?;
        sides[side].merge(&measured);
        Ok(())
    })
    .await?;
    Ok(Group {
        keys: size,
        library: sides[0].p50(),
        raw: sides[1].p50(),
    })
}

pub(super) fn row(g: &Group) -> Vec<crate::harness::Cell> {
    let per = |total: u64| fmt_ns(total / g.keys.max(1) as u64);
    cells![
        format!("acquire_many of {}", g.keys),
        format!("p50 {} (raw {})", fmt_ns(g.library), fmt_ns(g.raw)),
        format!("{} a key (raw {})", per(g.library), per(g.raw)),
        fmt_ratio(ratio(as_f64(g.library), as_f64(g.raw))),
    ]
}

pub(super) fn chart(groups: &[Group]) -> Panel {
    let per_key = |label, color, dashed, f: fn(&Group) -> u64| {
        let points = groups.iter().map(|g| (x(g.keys), as_f64(f(g)) / x(g.keys)));
        curve(label, color, dashed, points.collect())
    };
    panel(
        "acquire_many + release, per key",
        ("keys in the group", "per key", Unit::Nanos),
        vec![
            per_key("library", BLUE, false, |g| g.library),
            per_key("raw (one statement)", RED, true, |g| g.raw),
        ],
    )
}
