//! Floor 2: the clients the cycle scenarios compare, built by name so that the pinned
//! cycles and the callgrind child measure the same code. Each goes round [`KEYS`] keys of
//! its own (a group client: groups of 8), so a cycle meets the caches a service with many
//! keys meets, and raw does the same statements on as many lock ids.

use std::collections::BTreeSet;
use std::time::Duration;

use locks_port::{AcquireOptions, DistributedLock, LockGuard, ReleaseOutcome, lock_id};
use locks_postgres::tokio_postgres::{Client, Statement};
use locks_postgres::{PostgresLockManager, PostgresLockManagerBuilder as Builder};

use crate::Result;
use crate::db::{Database, NOT_HELD, Raw};

pub(crate) const KEYS: usize = 64;
/// Clients by name ([`client`]), as a scenario lists them.
pub(crate) type Names = &'static [&'static str];
pub(crate) const GROUP: usize = 8;

/// The words a library client's name may carry after `library`, and what its label says
/// of each (`-otel` and `-metrics-sdk` are installed by the caller).
const WORDS: [(&str, &str); 12] = [
    ("-background", ", release in background"),
    ("-fencing", ", fencing on"),
    ("-keepalive-off", ", keepalive off (and so no lease)"),
    ("-lease-off", LEASE_OFF),
    ("-metrics-off", ", metrics off (`metrics(false)`)"),
    ("-metrics-sdk", ", metrics SDK installed"),
    ("-otel", " + OpenTelemetry at INFO"),
    ("-spans", ", lock spans at INFO"),
    ("-timeout", ""),
    ("-try", ""),
    ("-shared", ""),
    ("-many", ""),
];
const LEASE_OFF: &str = ", lease off (keepalive on; the server's TCP timers left alone; the \
                         default sets them in the connection's set-up)";

fn setting(builder: Builder, word: &(&str, &str)) -> Builder {
    match word.0 {
        // On a pool of 2, so that the next acquire need not wait for the unlock's answer.
        "-background" => builder.release_in_background(true),
        "-fencing" => builder.fencing(true),
        "-keepalive-off" => builder.keepalive(None),
        "-lease-off" => builder.lease(None),
        "-metrics-off" => builder.metrics(false),
        // Lock spans at INFO, so that an INFO subscriber records them (default: DEBUG).
        "-spans" => builder.span_level(tracing::Level::INFO),
        _ => builder,
    }
}

/// What the tables call client `name` (`library, fencing on: acquire (timeout 5 s) +
/// release` for `library-fencing-timeout`); kept for the run (leaked).
pub(crate) fn label(name: &'static str) -> &'static str {
    let Some(words) = name.strip_prefix("library") else {
        return match name {
            "raw" => "raw: prepared pg_advisory_lock($1) + unlock",
            "raw-checked" => {
                "raw: the library's two statements (try + unlock, each behind its session \
                 check), prepared"
            }
            "raw-try" => "raw: prepared pg_try_advisory_lock($1) + unlock",
            "raw-shared" => "raw: prepared pg_advisory_lock_shared($1) + unlock_shared",
            "raw-many-each" => {
                "raw: the library's 2 group statements, prepared (8 tries in one, 8 unlocks in \
                 one)"
            }
            "raw-many" => "raw: 8 prepared pg_advisory_lock($1) in lock-id order + 8 unlocks",
            _ => name,
        };
    };
    let has = |word: &str| words.contains(word);
    let settings: String = WORDS.iter().filter(|w| has(w.0)).map(|w| w.1).collect();
    let wait = match has("-timeout") {
        true => "timeout 5 s",
        false => "no timeout",
    };
    let operation = match () {
        () if has("-try") => "try_acquire".to_owned(),
        () if has("-shared") => format!("acquire shared ({wait})"),
        () if has("-many") => format!("acquire_many of {GROUP} keys ({wait})"),
        () => format!("acquire ({wait})"),
    };
    format!("library{settings}: {operation} + release").leak()
}

pub(crate) fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|n| format!("{prefix}:{n}")).collect()
}

/// One way of taking and giving back a lock (or a group), going round its keys.
pub(crate) enum Op {
    Acquire(PostgresLockManager, Vec<String>, AcquireOptions),
    TryAcquire(PostgresLockManager, Vec<String>),
    AcquireMany(PostgresLockManager, Vec<Vec<String>>, AcquireOptions),
    /// Prepared lock (or try, `true`) and unlock statements.
    RawPrepared(Raw, Vec<i64>, bool),
    /// Each group's tries in one statement, then its unlocks in another ([`TRY_EACH`]).
    RawEach(Client, [Statement; 2], Vec<Vec<i64>>),
    /// Each group's locks (ascending), then its unlocks, one after another: how
    /// `acquire_many` worked before ADR 0019.
    RawMany(Raw, Vec<Vec<i64>>),
}

/// The library's two group statements (ADR 0019) without its session-marker check.
const TRY_EACH: &str = "WITH tried AS MATERIALIZED (SELECT t.ord, t.id, \
    pg_try_advisory_lock(t.id) AS got FROM unnest($1::bigint[]) WITH ORDINALITY AS t(id, ord)), \
    busy AS (SELECT min(ord) AS at FROM tried WHERE NOT got) \
    SELECT coalesce((SELECT at FROM busy), 0), \
    (SELECT count(pg_advisory_unlock(tried.id)) FROM tried, busy \
    WHERE tried.got AND tried.ord > busy.at)";
const UNLOCK_EACH: &str = "SELECT coalesce(bool_and(pg_advisory_unlock(t.id)), true) \
    FROM unnest($1::bigint[]) AS t(id)";

/// The client called `name` going round keys of `prefix`: a raw one [`label`] names, or
/// `library` followed by any of [`WORDS`] (`library-timeout`, `library-many-timeout`, …).
pub(crate) async fn client(db: &Database, name: &str, prefix: &str, app: &str) -> Result<Op> {
    let keys = keys(prefix, KEYS);
    let ids: Vec<i64> = keys.iter().map(|key| lock_id(key)).collect();
    // The lock ids of each group in the library's one global order (ascending).
    let order = |group: &[i64]| Vec::from_iter(BTreeSet::from_iter(group.iter().copied()));
    let ordered = || ids.chunks(GROUP).map(order).collect();
    match name {
        "raw" | "raw-try" | "raw-shared" => {
            let raw = Raw::connect(db, app, name == "raw-shared").await?;
            return Ok(Op::RawPrepared(raw, ids, name == "raw-try"));
        }
        "raw-checked" => return Ok(Op::RawPrepared(checked(db, app).await?, ids, true)),
        "raw-many" => return Ok(Op::RawMany(Raw::connect(db, app, false).await?, ordered())),
        "raw-many-each" => {
            let client = db.connect(app).await?;
            let statements = [
                client.prepare(TRY_EACH).await?,
                client.prepare(UNLOCK_EACH).await?,
            ];
            return Ok(Op::RawEach(client, statements, ordered()));
        }
        _ => {}
    }
    let words = (name.strip_prefix("library")).ok_or_else(|| format!("unknown client `{name}`"))?;
    let left = (WORDS.iter()).fold(words.to_owned(), |rest, w| rest.replace(w.0, ""));
    if !left.is_empty() {
        return Err(format!("unknown client `{name}` (`{left}` is not a setting)").into());
    }
    let has = |word: &str| words.contains(word);
    if has("-fencing") {
        locks_postgres::install_fencing(&db.connect(app).await?).await?;
    }
    let pool = db.pool(1 + usize::from(has("-background")), app);
    let words = WORDS.iter().filter(|w| has(w.0));
    let builder = PostgresLockManager::builder(pool);
    let manager = words.fold(builder, setting).build();
    let mut options = (has("-shared").then(AcquireOptions::shared)).unwrap_or_default();
    if has("-timeout") {
        options = options.with_timeout(Duration::from_secs(5));
    }
    let groups = || keys.chunks(GROUP).map(<[_]>::to_vec).collect();
    Ok(match () {
        () if has("-try") => Op::TryAcquire(manager, keys),
        () if has("-many") => Op::AcquireMany(manager, groups(), options),
        () => Op::Acquire(manager, keys, options),
    })
}

/// The raw statements, each behind the session check the library's statements make (ADR
/// 0014): `SELECT CASE WHEN current_setting('locks.session', true) = '…' THEN
/// pg_try_advisory_lock($1) END`, the session marked first.
async fn checked(db: &Database, app: &str) -> Result<Raw> {
    const MARKER: &str = "'0123456789abcdef'";
    let client = db.connect(app).await?;
    let mark = format!("SET locks.session = {MARKER}");
    client.batch_execute(&mark).await?;
    let check = format!("current_setting('locks.session', true) = {MARKER}");
    Raw::prepare(client, |name| {
        format!("SELECT CASE WHEN {check} THEN pg_{name}($1) END")
    })
    .await
}

fn nth<T>(items: &[T], n: usize) -> &T {
    &items[n % items.len()]
}

const REFUSED: &str = "an uncontended pg_try_advisory_lock was refused";

impl Op {
    pub(crate) async fn cycle(&self, n: usize) -> Result<()> {
        match self {
            Self::Acquire(manager, keys, options) => {
                let guard = manager.acquire(nth(keys, n).as_str(), *options).await?;
                guard.release().await;
            }
            Self::TryAcquire(manager, keys) => {
                let key = nth(keys, n).as_str();
                let guard = manager.try_acquire(key).await?.ok_or(REFUSED)?;
                guard.release().await;
            }
            Self::AcquireMany(manager, groups, options) => {
                let keys: Vec<&str> = nth(groups, n).iter().map(String::as_str).collect();
                let locks = manager.acquire_many(&keys, *options).await?;
                if locks.release().await != ReleaseOutcome::Unlocked {
                    return Err("the group's release did not unlock every lock".into());
                }
            }
            Self::RawPrepared(raw, ids, try_lock) => {
                let id = *nth(ids, n);
                match try_lock {
                    true => raw.try_lock(id).await?.then_some(()).ok_or(REFUSED)?,
                    false => raw.lock(id).await?,
                }
                raw.unlock(id).await?;
            }
            Self::RawEach(client, [try_each, unlock_each], groups) => {
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
            Self::RawMany(raw, groups) => {
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

    pub(crate) async fn backend_pid(&self) -> Result<i32> {
        let object;
        let client: &Client = match self {
            Self::Acquire(manager, ..)
            | Self::TryAcquire(manager, _)
            | Self::AcquireMany(manager, ..) => {
                object = manager.pool().get().await?;
                &object
            }
            Self::RawPrepared(raw, ..) | Self::RawMany(raw, _) => &raw.client,
            Self::RawEach(client, ..) => client,
        };
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
        Ok(row.get(0))
    }
}
