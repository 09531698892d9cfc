//! Scenarios `cycle` (1), `try` (2), `shared` (9) and `many` (10): an uncontended cycle,
//! pinned (see [`crate::pinned`]), the library's clients against raw tokio-postgres doing
//! the same statements, prepared:
//! - `cycle`: `acquire` + `release`, without and with a timeout, with the settings a user
//!   may change and with an OpenTelemetry pipeline, against `pg_advisory_lock($1)` +
//!   `pg_advisory_unlock($1)`;
//! - `try`: `try_acquire` + `release` against `pg_try_advisory_lock($1)` + unlock;
//! - `shared`: a shared (reader) lock against `pg_advisory_lock_shared($1)` + its unlock;
//! - `many`: `acquire_many` of eight keys and the group's release against the library's two
//!   statements (ADR 0019) without its session-marker check: the eight tries in one over
//!   an array of the ids, then the eight unlocks in another. Shown beside it: the eight
//!   locks in ascending lock-id order and the eight unlocks one statement each (sixteen
//!   round trips, how `acquire_many` worked before ADR 0019).

use crate::clients::GROUP;
use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::Role::{Baseline, Library, Reference, Setting};
use crate::pinned::{Scenario, run as pinned};
use crate::{BoxError, Plan};

/// The scenario `name` (`cycle`, `try`, `shared` or `many`), measured.
pub(crate) fn run(db: &Database, plan: &Plan, name: &str) -> Result<Outcome, BoxError> {
    let scenario = |id, title, limit, clients| Scenario {
        id,
        title,
        prefix: id,
        limit,
        clients,
        notes: Vec::new(),
    };
    let scenario = match name {
        "cycle" => scenario(
            "cycle_acquire",
            "1. Uncontended acquire + release cycle, pinned",
            1.10,
            vec![
                ("raw", Baseline),
                ("library", Library),
                ("library-timeout", Library),
                ("library-fencing", Setting),
                ("library-keepalive-off", Setting),
                ("library-lease-off", Setting),
                ("library-otel", Setting),
                ("library-timeout-otel", Setting),
                ("library-otel-spans", Setting),
                ("raw-simple", Reference),
                ("raw-text-timeout", Reference),
            ],
        ),
        "try" => scenario(
            "cycle_try_acquire",
            "2. Uncontended try_acquire + release cycle, pinned",
            1.15,
            vec![
                ("raw-try", Baseline),
                ("library-try", Library),
                ("raw-simple-try", Reference),
            ],
        ),
        "shared" => scenario(
            "cycle_shared",
            "9. Uncontended shared-lock acquire + release cycle, pinned",
            1.2,
            vec![
                ("raw-shared", Baseline),
                ("library-shared", Library),
                ("library-shared-timeout", Library),
            ],
        ),
        _ => Scenario {
            notes: vec![format!(
                "Here one cycle takes and gives back a group of {GROUP} keys, the 64 keys in \
                 8 groups of {GROUP}. The library and the baseline each make 2 round trips; \
                 the one-statement-per-key row makes {}.",
                2 * GROUP
            )],
            ..scenario(
                "cycle_many",
                "10. Uncontended acquire_many of 8 keys + release, pinned",
                1.2,
                vec![
                    ("raw-many-each", Baseline),
                    ("library-many", Library),
                    ("library-many-timeout", Library),
                    ("raw-many", Reference),
                ],
            )
        },
    };
    pinned(db, plan, scenario)
}
