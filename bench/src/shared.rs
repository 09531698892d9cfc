//! Scenario `shared` (9): an uncontended shared (reader) lock, `acquire` in
//! `LockMode::Shared` + `release`, pinned (see [`crate::pinned`]), against raw
//! tokio-postgres's prepared `pg_advisory_lock_shared($1)` + `pg_advisory_unlock_shared($1)`.

use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::{
    Role::{Baseline, Library},
    Scenario, run,
};
use crate::{BoxError, Plan};

/// Pinned best run p50 at most this multiple of raw.
const LIMIT: f64 = 1.2;

pub(crate) fn shared(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let scenario = Scenario {
        id: "cycle_shared",
        title: "9. Uncontended shared-lock acquire + release cycle, pinned",
        prefix: "bench:shared",
        limit: LIMIT,
        clients: vec![
            ("raw-shared", Baseline),
            ("library-shared", Library),
            ("library-shared-timeout", Library),
        ],
        notes: Vec::new(),
    };
    run(db, plan, scenario)
}
