//! Floor 2: the clients the cycle scenarios compare, built by name so that the pinned
//! cycles and the callgrind child measure the same code: the library's calls (with a
//! setting, a timeout or a kind of lock in the name) and raw `tokio-postgres` statements.
//!
//! Every client goes round [`KEYS`] keys of its own, cycle `n` taking key `n mod KEYS` (a
//! group client: group `n mod 8` of 8 keys), so a cycle meets the caches a service with
//! many keys meets, and raw does the same statements on the same number of lock ids.

use std::time::Duration;

use locks_port::{
    AcquireOptions, DistributedLock, KeyDerivation, LockGuard, ReleaseOutcome, lock_id,
};
use locks_postgres::tokio_postgres::{Client, Statement};
use locks_postgres::{PostgresLockManager, PostgresLockManagerBuilder as Builder};

use crate::BoxError;
use crate::db::{Database, NOT_HELD, Raw};

/// The timeout of the bounded variants.
pub(crate) const BOUNDED: Duration = Duration::from_secs(5);
/// How many keys each client goes round.
pub(crate) const KEYS: usize = 64;
/// How many keys a group (`acquire_many`) takes at once.
pub(crate) const GROUP: usize = 8;

/// The words a library client's name may carry after `library`, what its label says of
/// each, and the setting of the manager it makes. Without a setting: `-otel` and
/// `-metrics-sdk` are installed by the caller, and [`label`] says the operation's words.
#[allow(clippy::type_complexity)]
const WORDS: [(&str, &str, Option<fn(Builder) -> Builder>); 12] = [
    // On a pool of 2, so that the next acquire need not wait for the unlock's answer.
    (
        "-background",
        ", release in background",
        Some(|b| b.release_in_background(true)),
    ),
    ("-fencing", ", fencing on", Some(|b| b.fencing(true))),
    (
        "-keepalive-off",
        ", keepalive off (and so no lease)",
        Some(|b| b.keepalive(None)),
    ),
    (
        "-lease-off",
        ", lease off (keepalive on; the server's TCP timers left alone; the default sets \
         them in the connection's set-up)",
        Some(|b| b.lease(None)),
    ),
    (
        "-metrics-off",
        ", metrics off (`metrics(false)`)",
        Some(|b| b.metrics(false)),
    ),
    ("-metrics-sdk", ", metrics SDK installed", None),
    ("-otel", " + OpenTelemetry at INFO", None),
    // Lock spans at INFO, so that an INFO subscriber records them (default: DEBUG).
    (
        "-spans",
        ", lock spans at INFO",
        Some(|b| b.span_level(tracing::Level::INFO)),
    ),
    ("-timeout", "", None),
    ("-try", "", None),
    ("-shared", "", None),
    ("-many", "", None),
];

/// The raw clients and what the tables call them.
const RAW: [(&str, &str); 5] = [
    ("raw", "raw: prepared pg_advisory_lock($1) + unlock"),
    ("raw-try", "raw: prepared pg_try_advisory_lock($1) + unlock"),
    (
        "raw-shared",
        "raw: prepared pg_advisory_lock_shared($1) + unlock_shared",
    ),
    (
        "raw-many-each",
        "raw: the library's 2 group statements, prepared (8 tries in one, 8 unlocks in one)",
    ),
    (
        "raw-many",
        "raw: 8 prepared pg_advisory_lock($1) in lock-id order + 8 unlocks",
    ),
];

/// What the tables call the client `name` ([`client`]), `library, fencing on: acquire
/// (timeout 5 s) + release` for `library-fencing-timeout`; the name itself when it is
/// no client's. Made once per client of a run, and kept for the run (leaked).
pub(crate) fn label(name: &'static str) -> &'static str {
    if let Some((_, label)) = RAW.iter().find(|(n, _)| *n == name) {
        return label;
    }
    let Some(words) = name.strip_prefix("library") else {
        return name;
    };
    let has = |word: &str| words.contains(word);
    let settings: String = WORDS.iter().filter(|w| has(w.0)).map(|w| w.1).collect();
    let wait = if has("-timeout") {
        "timeout 5 s"
    } else {
        "no timeout"
    };
    let operation = if has("-try") {
        "try_acquire".to_owned()
    } else if has("-shared") {
        format!("acquire shared ({wait})")
    } else if has("-many") {
        format!("acquire_many of {GROUP} keys ({wait})")
    } else {
        format!("acquire ({wait})")
    };
    format!("library{settings}: {operation} + release").leak()
}

/// `count` keys `{prefix}:{n}`.
pub(crate) fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}:{n}")).collect()
}

/// One way of taking and giving back a lock (or a group of locks).
pub(crate) enum Op {
    Acquire {
        manager: PostgresLockManager,
        keys: Vec<String>,
        options: AcquireOptions,
    },
    TryAcquire {
        manager: PostgresLockManager,
        keys: Vec<String>,
    },
    AcquireMany {
        manager: PostgresLockManager,
        groups: Vec<Vec<String>>,
        options: AcquireOptions,
    },
    /// Prepared lock (or try) and unlock statements.
    RawPrepared {
        raw: Raw,
        ids: Vec<i64>,
        try_lock: bool,
    },
    /// Each group's tries in one prepared statement over an array of its ids, then its
    /// unlocks in another: the library's two statements (ADR 0019) without the session
    /// marker.
    RawEach {
        client: Client,
        try_each: Statement,
        unlock_each: Statement,
        groups: Vec<Vec<i64>>,
    },
    /// Each group's locks (ascending) and then their unlocks, prepared, on one connection,
    /// one after another: how `acquire_many` worked before ADR 0019.
    RawMany { raw: Raw, groups: Vec<Vec<i64>> },
}

/// The client called `name`, on connections tagged `application_name`, going round keys
/// of `prefix`: one of [`RAW`], or `library` followed by any of [`WORDS`]
/// (`library-timeout`, `library-fencing`, `library-shared`, `library-many-timeout`, …).
pub(crate) async fn client(
    db: &Database,
    name: &str,
    prefix: &str,
    application_name: &str,
) -> Result<Op, BoxError> {
    let keys = keys(prefix, KEYS);
    let ids: Vec<i64> = keys.iter().map(|key| lock_id(key)).collect();
    let groups: Vec<Vec<String>> = keys.chunks(GROUP).map(<[_]>::to_vec).collect();
    // The lock ids of each group in the library's one global order.
    let ordered = || {
        let order = |g: &Vec<String>| {
            let keys: Vec<&str> = g.iter().map(String::as_str).collect();
            KeyDerivation::CURRENT
                .lock_order(&keys)
                .into_keys()
                .collect()
        };
        groups.iter().map(order).collect()
    };
    let try_lock = name.ends_with("-try");
    let raw = async |shared| Raw::connect(db, application_name, shared).await;
    let connect = async || db.connect(application_name).await;
    match name {
        "raw" | "raw-try" | "raw-shared" => {
            let raw = raw(name == "raw-shared").await?;
            return Ok(Op::RawPrepared { raw, ids, try_lock });
        }
        "raw-many" => {
            let raw = raw(false).await?;
            let groups = ordered();
            return Ok(Op::RawMany { raw, groups });
        }
        "raw-many-each" => {
            let client = connect().await?;
            let unlock_each = "SELECT coalesce(bool_and(pg_advisory_unlock(t.id)), true) \
                               FROM unnest($1::bigint[]) AS t(id)";
            return Ok(Op::RawEach {
                try_each: client.prepare(TRY_EACH).await?,
                unlock_each: client.prepare(unlock_each).await?,
                client,
                groups: ordered(),
            });
        }
        _ => {}
    }
    let words = name
        .strip_prefix("library")
        .ok_or_else(|| format!("unknown client `{name}`"))?;
    let left = WORDS
        .iter()
        .fold(words.to_owned(), |rest, w| rest.replace(w.0, ""));
    if !left.is_empty() {
        return Err(format!("unknown client `{name}` (`{left}` is not a setting)").into());
    }
    let has = |word: &str| words.contains(word);
    if has("-fencing") {
        locks_postgres::install_fencing(&connect().await?).await?;
    }
    let pool_size = if has("-background") { 2 } else { 1 };
    let manager = (WORDS.iter().filter(|w| has(w.0)))
        .filter_map(|w| w.2)
        .fold(
            PostgresLockManager::builder(db.pool(pool_size, application_name)),
            |b, set| set(b),
        )
        .build();
    let mut options = if has("-shared") {
        AcquireOptions::shared()
    } else {
        AcquireOptions::new()
    };
    if has("-timeout") {
        options = options.with_timeout(BOUNDED);
    }
    Ok(if has("-try") {
        Op::TryAcquire { manager, keys }
    } else if has("-many") {
        Op::AcquireMany {
            manager,
            groups,
            options,
        }
    } else {
        Op::Acquire {
            manager,
            keys,
            options,
        }
    })
}

/// The library's group try (ADR 0019) without its session-marker check: each id of the
/// array tried in order, those after the first busy one unlocked again in the same
/// statement; answers the position of the first busy one (0: none).
const TRY_EACH: &str = "WITH tried AS MATERIALIZED (SELECT t.ord, t.id, \
    pg_try_advisory_lock(t.id) AS got FROM unnest($1::bigint[]) WITH ORDINALITY AS t(id, ord)), \
    busy AS (SELECT min(ord) AS at FROM tried WHERE NOT got) \
    SELECT coalesce((SELECT at FROM busy), 0), \
    (SELECT count(pg_advisory_unlock(tried.id)) FROM tried, busy \
    WHERE tried.got AND tried.ord > busy.at)";

fn nth<T>(items: &[T], n: usize) -> &T {
    &items[n % items.len()]
}

const REFUSED: &str = "an uncontended pg_try_advisory_lock was refused";

impl Op {
    /// Cycle `n`: one lock + unlock (of key `n mod KEYS`).
    pub(crate) async fn cycle(&self, n: usize) -> Result<(), BoxError> {
        match self {
            Self::Acquire {
                manager,
                keys,
                options,
            } => {
                let guard = manager.acquire(nth(keys, n).as_str(), *options).await?;
                guard.release().await;
            }
            Self::TryAcquire { manager, keys } => {
                let key = nth(keys, n).as_str();
                let guard = manager.try_acquire(key).await?.ok_or(REFUSED)?;
                guard.release().await;
            }
            Self::AcquireMany {
                manager,
                groups,
                options,
            } => {
                let keys: Vec<&str> = nth(groups, n).iter().map(String::as_str).collect();
                let locks = manager.acquire_many(&keys, *options).await?;
                if locks.release().await != ReleaseOutcome::Unlocked {
                    return Err("the group's release did not unlock every lock".into());
                }
            }
            Self::RawPrepared { raw, ids, try_lock } => {
                let id = *nth(ids, n);
                if *try_lock {
                    let granted: bool = raw.client.query_one(&raw.try_lock, &[&id]).await?.get(0);
                    if !granted {
                        return Err(REFUSED.into());
                    }
                } else {
                    raw.lock(id).await?;
                }
                raw.unlock(id).await?;
            }
            Self::RawEach {
                client,
                try_each,
                unlock_each,
                groups,
            } => {
                let ids = nth(groups, n);
                let busy: i64 = client.query_one(try_each, &[ids]).await?.get(0);
                if busy != 0 {
                    return Err(REFUSED.into());
                }
                let released: Option<bool> = client.query_one(unlock_each, &[ids]).await?.get(0);
                if released != Some(true) {
                    return Err(NOT_HELD.into());
                }
            }
            Self::RawMany { raw, groups } => {
                let ids = nth(groups, n);
                for &id in ids {
                    raw.lock(id).await?;
                }
                for &id in ids {
                    raw.unlock(id).await?;
                }
            }
        }
        Ok(())
    }

    /// The server process behind this client's one connection.
    pub(crate) async fn backend_pid(&self) -> Result<i32, BoxError> {
        let object;
        let client: &Client = match self {
            Self::Acquire { manager, .. }
            | Self::TryAcquire { manager, .. }
            | Self::AcquireMany { manager, .. } => {
                object = manager.pool().get().await?;
                &object
            }
            Self::RawPrepared { raw, .. } | Self::RawMany { raw, .. } => &raw.client,
            Self::RawEach { client, .. } => client,
        };
        Ok(client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0))
    }
}
