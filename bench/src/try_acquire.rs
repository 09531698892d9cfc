//! Scenario `try` (2): uncontended `try_acquire` + `release`, pinned (see
//! [`crate::pinned`]), against raw tokio-postgres's prepared `pg_try_advisory_lock($1)` +
//! `pg_advisory_unlock($1)`.

use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::{
    Role::{Baseline, Library, Reference},
    Scenario, run,
};
use crate::{BoxError, Plan};

/// No pinned-cycle target of its own: the earlier one.
const LIMIT: f64 = 1.15;

pub(crate) fn try_acquire(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let scenario = Scenario {
        id: "cycle_try_acquire",
        title: "2. Uncontended try_acquire + release cycle, pinned",
        prefix: "bench:try",
        limit: LIMIT,
        clients: vec![
            ("raw-try", Baseline),
            ("library-try", Library),
            ("raw-simple-try", Reference),
        ],
        notes: Vec::new(),
    };
    run(db, plan, scenario)
}
