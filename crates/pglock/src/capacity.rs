//! `pglock capacity --locks N [--connections C] [--json]`: what a server needs to hold N
//! advisory locks at once (`max_locks_per_transaction`, and the shared memory that costs),
//! by arithmetic from measured constants; with `--url` (or `DATABASE_URL`), also what the
//! server has now and whether it is enough (exit 1 when it is not).
//!
//! It never reads `pg_locks` (a snapshot of the whole lock table, the very thing that is
//! large here): only `SHOW` of four settings.

use serde::Serialize;

use crate::connect::{Target, one_client};
use crate::exit::{Failure, SOFTWARE};
use crate::text::{Say, out};

/// Exit code when the server's lock table has less room than N locks need.
pub(crate) const TOO_SMALL: u8 = 1;

/// Shared memory one lock-table entry costs (one slot of `max_locks_per_transaction ×
/// (max_connections + max_prepared_transactions)`): measured on PostgreSQL 15.18 by
/// `postgres -C shared_memory_size` at `max_locks_per_transaction` 64 and 8192, 474.7
/// bytes an entry at `max_connections = 100` and 417.3 at 1100 (the server sizes its
/// background processes' slots too); the larger one, rounded up. See
/// `docs/capacity.md`.
pub(crate) const BYTES_PER_ENTRY: u64 = 475;
/// Room over the held locks for every other lock the server takes (each query's
/// relation locks, other applications), in percent.
pub(crate) const HEADROOM_PERCENT: u64 = 25;
/// PostgreSQL's defaults, what a plan is compared against.
const DEFAULT_MAX_LOCKS: u64 = 64;
const DEFAULT_CONNECTIONS: u64 = 100;

/// What N held locks need on a server of `max_connections + max_prepared_transactions`
/// slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Plan {
    pub(crate) locks: u64,
    pub(crate) max_connections: u64,
    pub(crate) max_prepared_transactions: u64,
    pub(crate) headroom_percent: u64,
    /// Lock-table entries: the locks and the headroom.
    pub(crate) entries_needed: u64,
    /// The setting to use: entries ÷ slots, rounded up to a multiple of 64.
    pub(crate) max_locks_per_transaction: u64,
    /// The lock table that setting gives.
    pub(crate) capacity: u64,
    pub(crate) bytes_per_entry: u64,
    /// Shared memory over the default `max_locks_per_transaction = 64`.
    pub(crate) shared_memory_bytes_over_default: u64,
}

impl Plan {
    pub(crate) fn new(locks: u64, max_connections: u64, max_prepared_transactions: u64) -> Self {
        let slots = (max_connections + max_prepared_transactions).max(1);
        let entries_needed =
            locks.saturating_add(locks.saturating_mul(HEADROOM_PERCENT).div_ceil(100));
        let max_locks = entries_needed
            .div_ceil(slots)
            .div_ceil(64)
            .saturating_mul(64)
            .max(DEFAULT_MAX_LOCKS);
        Self {
            locks,
            max_connections,
            max_prepared_transactions,
            headroom_percent: HEADROOM_PERCENT,
            entries_needed,
            max_locks_per_transaction: max_locks,
            capacity: max_locks.saturating_mul(slots),
            bytes_per_entry: BYTES_PER_ENTRY,
            shared_memory_bytes_over_default: (max_locks - DEFAULT_MAX_LOCKS)
                .saturating_mul(slots)
                .saturating_mul(BYTES_PER_ENTRY),
        }
    }
}

/// What the server has now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Server {
    pub(crate) max_locks_per_transaction: u64,
    pub(crate) max_connections: u64,
    pub(crate) max_prepared_transactions: u64,
    /// `SHOW shared_memory_size` (PostgreSQL 15 and later; `null` before).
    pub(crate) shared_memory_size: Option<String>,
    pub(crate) capacity: u64,
    pub(crate) enough: bool,
}

/// `pglock capacity --json`: the plan, and the server when one was asked.
#[derive(Debug, Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    plan: &'a Plan,
    server: Option<&'a Server>,
}

/// A byte count as people read it: `563 MiB`, `1.2 GiB`.
fn bytes(count: u64) -> String {
    #[allow(clippy::cast_precision_loss)]
    let value = count as f64;
    if value >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} GiB", value / (1024.0 * 1024.0 * 1024.0))
    } else {
        format!("{:.0} MiB", value / (1024.0 * 1024.0))
    }
}

/// The text report.
pub(crate) fn text(plan: &Plan, server: Option<&Server>) -> String {
    let mut out = format!(
        "{} held advisory locks, on a server of max_connections = {} and \
         max_prepared_transactions = {}:\n  \
         lock table entries         {} (the locks + {}% for the server's other locks)\n  \
         max_locks_per_transaction  {} (lock table {} entries)\n  \
         shared memory              +{} over max_locks_per_transaction = {DEFAULT_MAX_LOCKS} \
         ({} bytes an entry, measured on PostgreSQL 15)\n",
        plan.locks,
        plan.max_connections,
        plan.max_prepared_transactions,
        plan.entries_needed,
        plan.headroom_percent,
        plan.max_locks_per_transaction,
        plan.capacity,
        bytes(plan.shared_memory_bytes_over_default),
        plan.bytes_per_entry,
    );
    if let Some(server) = server {
        out.push_str(&format!(
            "this server: max_locks_per_transaction = {}, max_connections = {}, \
             max_prepared_transactions = {}, shared_memory_size = {}\n  \
             lock table                 {} entries: {}\n",
            server.max_locks_per_transaction,
            server.max_connections,
            server.max_prepared_transactions,
            server
                .shared_memory_size
                .as_deref()
                .unwrap_or("unknown (before PostgreSQL 15)"),
            server.capacity,
            if server.enough {
                "enough".to_owned()
            } else {
                format!(
                    "too small: set max_locks_per_transaction = {} and restart the server",
                    plan.max_locks_per_transaction
                )
            },
        ));
    }
    out
}

fn report(plan: &Plan, server: Option<&Server>, json: bool) -> Result<u8, Failure> {
    if json {
        let mut document = serde_json::to_string_pretty(&Document { plan, server })
            .unwrap_or_else(|_| "null".to_owned());
        document.push('\n');
        out(&document)?;
    } else {
        out(text(plan, server))?;
    }
    Ok(if server.is_some_and(|server| !server.enough) {
        TOO_SMALL
    } else {
        0
    })
}

/// Without a database: the plan for `connections` (or PostgreSQL's default 100).
pub(crate) fn offline(locks: u64, connections: Option<u64>, json: bool) -> Result<u8, Failure> {
    let plan = Plan::new(locks, connections.unwrap_or(DEFAULT_CONNECTIONS), 0);
    report(&plan, None, json)
}

/// With the server at `target`: its settings, the plan for its slots (or `connections`),
/// and whether it is enough.
pub(crate) async fn online(
    target: &Target,
    say: Say,
    locks: u64,
    connections: Option<u64>,
    json: bool,
) -> Result<u8, Failure> {
    let client = one_client(target, say).await?;
    let mut values = Vec::new();
    for name in [
        "max_locks_per_transaction",
        "max_connections",
        "max_prepared_transactions",
    ] {
        let row = client
            .query_one(&format!("SHOW {name}"), &[])
            .await
            .map_err(|error| {
                Failure::new(
                    SOFTWARE,
                    format!("SHOW {name}: {}", crate::exit::chain(&error)),
                )
            })?;
        let text: String = row.get(0);
        let value: u64 = text
            .parse()
            .map_err(|_| Failure::new(SOFTWARE, format!("SHOW {name} answered `{text}`")))?;
        values.push(value);
    }
    let shared_memory_size = client
        .query_one("SHOW shared_memory_size", &[])
        .await
        .ok()
        .map(|row| row.get::<_, String>(0));
    let (max_locks, max_connections, prepared) = (values[0], values[1], values[2]);
    let plan = Plan::new(locks, connections.unwrap_or(max_connections), prepared);
    let capacity = max_locks.saturating_mul(max_connections + prepared);
    let server = Server {
        max_locks_per_transaction: max_locks,
        max_connections,
        max_prepared_transactions: prepared,
        shared_memory_size,
        capacity,
        enough: capacity >= plan.entries_needed,
    };
    report(&plan, Some(&server), json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_million_locks_on_a_hundred_connections() {
        let plan = Plan::new(1_000_000, 100, 0);
        assert_eq!(plan.entries_needed, 1_250_000);
        // 1,250,000 ÷ 100 = 12,500, up to a multiple of 64.
        assert_eq!(plan.max_locks_per_transaction, 12_544);
        assert_eq!(plan.capacity, 1_254_400);
        assert_eq!(
            plan.shared_memory_bytes_over_default,
            (12_544 - 64) * 100 * 475
        );
        let text = text(&plan, None);
        assert!(
            text.starts_with("1000000 held advisory locks, on a server of max_connections = 100"),
            "{text}"
        );
        assert!(
            text.contains("max_locks_per_transaction  12544 (lock table 1254400 entries)"),
            "{text}"
        );
        assert!(
            text.contains("shared memory              +565 MiB over"),
            "{text}"
        );
    }

    #[test]
    fn few_locks_keep_the_default_and_prepared_slots_count() {
        let plan = Plan::new(1000, 100, 0);
        assert_eq!(plan.max_locks_per_transaction, 64);
        assert_eq!(plan.shared_memory_bytes_over_default, 0);
        let prepared = Plan::new(1_000_000, 100, 100);
        assert_eq!(prepared.max_locks_per_transaction, 6272);
        assert_eq!(prepared.capacity, 6272 * 200);
        // No overflow at the edges.
        let huge = Plan::new(u64::MAX, 0, 0);
        assert_eq!(huge.entries_needed, u64::MAX);
    }

    #[test]
    fn the_server_line_says_whether_it_is_enough() {
        let plan = Plan::new(100_000, 100, 0);
        let small = Server {
            max_locks_per_transaction: 64,
            max_connections: 100,
            max_prepared_transactions: 0,
            shared_memory_size: Some("143MB".to_owned()),
            capacity: 6400,
            enough: false,
        };
        let text = text(&plan, Some(&small));
        assert!(text.contains("shared_memory_size = 143MB"), "{text}");
        assert!(
            text.contains("6400 entries: too small: set max_locks_per_transaction = 1280"),
            "{text}"
        );
        let json = serde_json::to_value(Document {
            plan: &plan,
            server: Some(&small),
        })
        .unwrap();
        assert_eq!(json["max_locks_per_transaction"], 1280);
        assert_eq!(json["server"]["enough"], false);
        assert_eq!(json["entries_needed"], 125_000);
    }
}
