//! Scenario `many` (10): `acquire_many` of eight keys and the group's release, pinned (see
//! [`crate::pinned`]), against what a careful client sends on one connection for the same
//! thing: the eight locks in ascending lock-id order, then the eight unlocks, prepared, one
//! statement after another as the library sends them. The same statements pipelined (each
//! set of eight sent at once) are shown for reference: the library does not batch, so they
//! are not its baseline.

use crate::clients::GROUP;
use crate::db::Database;
use crate::pinned::{Role, Scenario, run};
use crate::report::Outcome;
use crate::{BoxError, Plan};

/// Pinned best run p50 at most this multiple of raw.
const LIMIT: f64 = 1.2;

pub(crate) fn many(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let scenario = Scenario {
        id: "cycle_many",
        title: "10. Uncontended acquire_many of 8 keys + release, pinned",
        prefix: "bench:many",
        limit: LIMIT,
        clients: vec![
            (
                "raw-many",
                "raw: 8 prepared pg_advisory_lock($1) in lock-id order + 8 unlocks",
                Role::Baseline,
            ),
            (
                "library-many",
                "library: acquire_many of 8 keys (no timeout) + release",
                Role::Library,
            ),
            (
                "library-many-timeout",
                "library: acquire_many of 8 keys (timeout 5 s) + release",
                Role::Library,
            ),
            (
                "raw-many-pipelined",
                "raw, pipelined: the 8 locks at once, then the 8 unlocks at once",
                Role::Reference,
            ),
        ],
        notes: vec![format!(
            "Here one cycle is {GROUP} locks + {GROUP} unlocks on one connection ({} round \
             trips one after another; 2 when pipelined), the 64 keys in 8 groups of 8. The \
             library sends one `pg_try_advisory_lock` per key (a `pg_advisory_lock` wait only \
             for a busy key) and one `pg_advisory_unlock` per key, one after another, so the \
             baseline does the same with `pg_advisory_lock`; the pipelined row shows what \
             batching could win.",
            2 * GROUP
        )],
    };
    run(db, plan, scenario)
}
