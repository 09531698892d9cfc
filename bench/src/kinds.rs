//! Scenarios 9 and 10: shared locks and `acquire_many` against raw statements, pinned and
//! unpinned, interleaved round by round like scenarios 1 and 2 (the same runner).
//!
//! 9 is a shared (reader) lock cycle; 10 is `acquire_many` of eight keys and the
//! group's release, against what a careful client sends on one connection for the same
//! thing: the eight locks in ascending lock-id order, then the eight unlocks, prepared,
//! one statement after another as the library sends them. The same statements
//! pipelined (each set of eight sent at once) are shown for reference: the library does
//! not batch, so they are not its baseline.

use locks_port::{AcquireOptions, lock_id};
use locks_postgres::PostgresLockManager;

use crate::cycle::{BOUNDED, Role, Variant, run};
use crate::db::Database;
use crate::ops::Op;
use crate::report::Outcome;
use crate::{BoxError, Plan};

/// The target for both: pinned p50 at most this multiple of raw.
const KINDS_LIMIT: f64 = 1.2;

/// How many keys scenario 10 takes at once.
pub(crate) const GROUP: usize = 8;

/// The `GROUP` keys of one variant of scenario 10.
pub(crate) fn group_keys(prefix: &str) -> Vec<String> {
    (0..GROUP).map(|n| format!("{prefix}:{n}")).collect()
}

/// Scenario 9: `acquire` in `LockMode::Shared` + `release`.
pub(crate) async fn shared(db: Database, plan: Plan) -> Result<Outcome, BoxError> {
    let key = |n: usize| format!("bench:shared:{n}");
    let manager = || PostgresLockManager::new(db.pool(1, "lock-bench-cycle"));
    let variants = vec![
        Variant::new(
            "library: acquire shared (no timeout) + release",
            Role::Library,
            Op::library(manager(), key(0), AcquireOptions::shared()),
        ),
        Variant::new(
            "library: acquire shared (timeout 5 s) + release",
            Role::Library,
            Op::library(
                manager(),
                key(1),
                AcquireOptions::shared().with_timeout(BOUNDED),
            ),
        ),
        Variant::new(
            "raw: prepared pg_advisory_lock_shared($1) + unlock_shared",
            Role::Baseline,
            Op::raw_prepared_shared(db.connect("lock-bench-cycle").await?, lock_id(&key(2)))
                .await?,
        ),
    ];
    run(
        "9. Uncontended shared-lock acquire + release cycle, pinned and unpinned",
        "cycle_shared",
        variants,
        &plan,
        KINDS_LIMIT,
    )
    .await
}

/// Scenario 10: `acquire_many` of eight keys + the group's release.
pub(crate) async fn many(db: Database, plan: Plan) -> Result<Outcome, BoxError> {
    let manager = || PostgresLockManager::new(db.pool(1, "lock-bench-cycle"));
    let raw = || db.connect("lock-bench-cycle");
    let variants = vec![
        Variant::new(
            "library: acquire_many of 8 keys (no timeout) + release",
            Role::Library,
            Op::library_many(manager(), group_keys("bench:many:0"), AcquireOptions::new()),
        ),
        Variant::new(
            "library: acquire_many of 8 keys (timeout 5 s) + release",
            Role::Library,
            Op::library_many(
                manager(),
                group_keys("bench:many:1"),
                AcquireOptions::new().with_timeout(BOUNDED),
            ),
        ),
        Variant::new(
            "raw: 8 prepared pg_advisory_lock($1) in lock-id order + 8 unlocks",
            Role::Baseline,
            Op::raw_many(raw().await?, &group_keys("bench:many:2"), false).await?,
        ),
        Variant::new(
            "raw, pipelined: the 8 locks at once, then the 8 unlocks at once",
            Role::Reference,
            Op::raw_many(raw().await?, &group_keys("bench:many:3"), true).await?,
        ),
    ];
    let mut outcome = run(
        "10. Uncontended acquire_many of 8 keys + release, pinned and unpinned",
        "cycle_many",
        variants,
        &plan,
        KINDS_LIMIT,
    )
    .await?;
    outcome.section.notes.push(format!(
        "Here one cycle is {GROUP} locks + {GROUP} unlocks on one connection ({} round trips \
         one after another; 2 when pipelined). The library sends one \
         `pg_try_advisory_lock` per key (a `pg_advisory_lock` wait only for a busy key) and \
         one `pg_advisory_unlock` per key, one after another, so the baseline does the same \
         with `pg_advisory_lock`; the pipelined row shows what batching could win.",
        2 * GROUP
    ));
    Ok(outcome)
}
