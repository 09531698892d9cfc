//! A member's instruments (on the global meter provider unless
//! [`ShardMember::meter`](crate::ShardMember::meter) gives another):
//!
//! | instrument | kind | unit | counted by |
//! | --- | --- | --- | --- |
//! | [`OWNED`] | up-down counter | `{shard}` | a member: the shards whose task runs |
//! | [`TERMS`] | counter | `{term}` | a member: each term it began (a shard moving to it) |
//! | [`HANDOFFS`] | counter | `{shard}` | a member: each shard it handed over to rebalance or leave |
//! | [`REBALANCE_DURATION`] | histogram | `s` | a member: from a change of the member list it saw to owning its share again |
//!
//! The attribute `shard.group` (the group's name) is added only when
//! [`metrics_name`](crate::ShardMember::metrics_name) asks for it. The moves of a fleet
//! are the sum of [`TERMS`] over its members.

use opentelemetry::InstrumentationScope;
use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};

/// The shards whose task runs on this member.
pub const OWNED: &str = "eventsource.shard.owned";
/// Terms this member began: each one a shard moving to it.
pub const TERMS: &str = "eventsource.shard.terms";
/// Shards this member handed over (its share shrank, or it left).
pub const HANDOFFS: &str = "eventsource.shard.handoffs";
/// From a change of the member list to this member owning its share again, in seconds.
pub const REBALANCE_DURATION: &str = "eventsource.shard.rebalance.duration";

#[derive(Debug, Clone)]
pub(crate) struct Instruments {
    pub(crate) owned: UpDownCounter<i64>,
    pub(crate) terms: Counter<u64>,
    pub(crate) handoffs: Counter<u64>,
    pub(crate) rebalance: Histogram<f64>,
}

impl Instruments {
    pub(crate) fn on(meter: &Meter) -> Self {
        Self {
            owned: meter
                .i64_up_down_counter(OWNED)
                .with_unit("{shard}")
                .with_description("Shards whose task runs on this member.")
                .build(),
            terms: meter
                .u64_counter(TERMS)
                .with_unit("{term}")
                .with_description("Ownership terms this member began.")
                .build(),
            handoffs: meter
                .u64_counter(HANDOFFS)
                .with_unit("{shard}")
                .with_description("Shards this member handed over.")
                .build(),
            rebalance: meter
                .f64_histogram(REBALANCE_DURATION)
                .with_unit("s")
                .with_description(
                    "From a change of the member list to this member owning its share again.",
                )
                .build(),
        }
    }

    pub(crate) fn global() -> Self {
        let scope = InstrumentationScope::builder("locks-shard")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        Self::on(&opentelemetry::global::meter_with_scope(scope))
    }
}
