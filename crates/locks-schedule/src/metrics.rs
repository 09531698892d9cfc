//! Metrics through the OpenTelemetry metrics API (the API crate only; the application
//! installs the SDK and an exporter).
//!
//! | instrument | kind | unit | attributes |
//! | --- | --- | --- | --- |
//! | [`RUNS`] | counter | `{run}` | `schedule.job`, `schedule.outcome` (`succeeded`, `failed`, `abandoned` when a firing finds a dead runner's slot) |
//! | [`ALREADY_RUN`] | counter | `{slot}` | `schedule.job`, `schedule.outcome` (the slot's) |
//! | [`BUSY`] | counter | `{firing}` | `schedule.job` |
//! | [`MISSED`] | counter | `{slot}` | `schedule.job` |
//! | [`LATENESS`] | histogram | `s` | `schedule.job`, `schedule.catch_up` |
//!
//! `schedule.job` is the job's name: one series per job, which is the point.

use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry::{InstrumentationScope, KeyValue};

use crate::Outcome;

/// The name of the instrumentation scope (the meter).
pub const SCOPE: &str = "locks-schedule";
/// Runs of a slot (each attempt), by how they ended.
pub const RUNS: &str = "eventsource.schedule.runs";
/// Firings that found their slot already run (or settled) by another runner.
pub const ALREADY_RUN: &str = "eventsource.schedule.already_run";
/// Firings that found the job's lock held (overlap policy `Skip`, or `Wait` timed out).
pub const BUSY: &str = "eventsource.schedule.busy";
/// Slots nobody fired in, found by the next firing.
pub const MISSED: &str = "eventsource.schedule.missed";
/// How late a run started after its slot began, on the ledger's clock.
pub const LATENESS: &str = "eventsource.schedule.lateness";

const JOB: &str = "schedule.job";
const OUTCOME: &str = "schedule.outcome";
const CATCH_UP: &str = "schedule.catch_up";

#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    job: KeyValue,
    runs: Counter<u64>,
    already_run: Counter<u64>,
    busy: Counter<u64>,
    missed: Counter<u64>,
    lateness: Histogram<f64>,
}

impl Metrics {
    pub(crate) fn new(job: &str, meter: Option<&Meter>) -> Self {
        let global;
        let meter = if let Some(meter) = meter {
            meter
        } else {
            let scope = InstrumentationScope::builder(SCOPE)
                .with_version(env!("CARGO_PKG_VERSION"))
                .build();
            global = opentelemetry::global::meter_with_scope(scope);
            &global
        };
        Self {
            job: KeyValue::new(JOB, job.to_owned()),
            runs: meter
                .u64_counter(RUNS)
                .with_unit("{run}")
                .with_description("Runs of a scheduled slot, by outcome")
                .build(),
            already_run: meter
                .u64_counter(ALREADY_RUN)
                .with_unit("{slot}")
                .with_description("Firings whose slot had already run")
                .build(),
            busy: meter
                .u64_counter(BUSY)
                .with_unit("{firing}")
                .with_description("Firings that found the job's lock held")
                .build(),
            missed: meter
                .u64_counter(MISSED)
                .with_unit("{slot}")
                .with_description("Slots nobody fired in")
                .build(),
            lateness: meter
                .f64_histogram(LATENESS)
                .with_unit("s")
                .with_description(
                    "How late a run started after its slot began, on the ledger's clock",
                )
                .build(),
        }
    }

    pub(crate) fn ran(&self, outcome: Outcome) {
        self.runs.add(
            1,
            &[self.job.clone(), KeyValue::new(OUTCOME, outcome.as_str())],
        );
    }

    pub(crate) fn already_run(&self, outcome: Outcome) {
        self.already_run.add(
            1,
            &[self.job.clone(), KeyValue::new(OUTCOME, outcome.as_str())],
        );
    }

    pub(crate) fn missed(&self) {
        self.missed.add(1, std::slice::from_ref(&self.job));
    }

    pub(crate) fn busy(&self) {
        self.busy.add(1, std::slice::from_ref(&self.job));
    }

    pub(crate) fn late(&self, lateness: Duration, catch_up: bool) {
        self.lateness.record(
            lateness.as_secs_f64(),
            &[self.job.clone(), KeyValue::new(CATCH_UP, catch_up)],
        );
    }
}
