//! Scenario `many` (10): `acquire_many` of eight keys and the group's release, pinned (see
//! [`crate::pinned`]), against raw tokio-postgres sending the library's two statements
//! (ADR 0019) without its session-marker check, prepared: the eight tries in one over an
//! array of the ids, then the eight unlocks in another. Shown beside it: the eight locks in
//! ascending lock-id order and the eight unlocks one statement each (sixteen round trips,
//! how `acquire_many` worked before ADR 0019).

use crate::clients::GROUP;
use crate::db::Database;
use crate::harness::Outcome;
use crate::pinned::{
    Role::{Baseline, Library, Reference},
    Scenario, run,
};
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
            ("raw-many-each", Baseline),
            ("library-many", Library),
            ("library-many-timeout", Library),
            ("raw-many", Reference),
        ],
        notes: vec![format!(
            "Here one cycle takes and gives back a group of {GROUP} keys, the 64 keys in 8 \
             groups of {GROUP}. The library and the baseline each make 2 round trips; the \
             one-statement-per-key row makes {}.",
            2 * GROUP
        )],
    };
    run(db, plan, scenario)
}
