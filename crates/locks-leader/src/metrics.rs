//! The election's instruments (on the global meter provider unless
//! [`LeaderElection::meter`](crate::LeaderElection::meter) gives another):
//!
//! | instrument | kind | unit | counted by |
//! | --- | --- | --- | --- |
//! | [`IS_LEADER`] | up-down counter | `{leader}` | the leader: 1 while its task runs |
//! | [`TERMS`] | counter | `{term}` | the leader: each term it led |
//! | [`CHANGES`] | counter | `{change}` | an observer: each change of the leader it saw |
//!
//! The attribute `leader.election` (the election's name) is added only when
//! [`metrics_name`](crate::LeaderElection::metrics_name) asks for it. A fleet's
//! transitions are the sum of [`TERMS`] over its processes (Kubernetes'
//! `leaseTransitions`), and the published term number counts them too; [`CHANGES`] is
//! what one observer saw, so it also counts the gaps (the leader to nobody, nobody to
//! the next leader) and a change it polled too slowly to see is not in it.

use opentelemetry::InstrumentationScope;
use opentelemetry::metrics::{Counter, Meter, UpDownCounter};

/// Whether this process leads: 1 while a term runs its task, 0 otherwise.
pub const IS_LEADER: &str = "eventsource.leader.is_leader";
/// Terms this process has led (each one a transition to leading).
pub const TERMS: &str = "eventsource.leader.terms";
/// Changes of the leader (a new term, the leader gone, a leader again) an observer's
/// [`LeaderWatch`](crate::LeaderWatch) reported, its first reading not included.
pub const CHANGES: &str = "eventsource.leader.changes";

/// This crate's instrumentation scope.
pub(crate) fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("locks-leader")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

#[derive(Debug, Clone)]
pub(crate) struct Instruments {
    pub(crate) is_leader: UpDownCounter<i64>,
    pub(crate) terms: Counter<u64>,
    pub(crate) changes: Counter<u64>,
}

impl Instruments {
    pub(crate) fn on(meter: &Meter) -> Self {
        Self {
            is_leader: meter
                .i64_up_down_counter(IS_LEADER)
                .with_unit("{leader}")
                .with_description(
                    "Whether this process leads the election: 1 while leading, else 0.",
                )
                .build(),
            terms: meter
                .u64_counter(TERMS)
                .with_unit("{term}")
                .with_description("Terms this process has led: each one a transition to leading.")
                .build(),
            changes: meter
                .u64_counter(CHANGES)
                .with_unit("{change}")
                .with_description("Changes of the leader this process observed.")
                .build(),
        }
    }

    pub(crate) fn global() -> Self {
        Self::on(&opentelemetry::global::meter_with_scope(scope()))
    }
}
