//! What a cycle scenario measures: a variant (one way of taking and giving back a lock),
//! its role against the baseline, and what each pass (unpinned, pinned) recorded of it.

use crate::interleave::Batches;
use crate::ops::Op;
use crate::otel::Pipeline;
use crate::stats::as_f64;
use crate::{BoxError, cpu};

/// What a variant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The library, checked against the baseline.
    Library,
    /// The library with an OpenTelemetry pipeline installed: shown, the target is on
    /// instructions (scenario 7).
    Traced,
    /// The library with a setting changed (fencing on, keepalive off): shown, no target.
    Setting,
    /// A candidate for the baseline: the faster of these is the physical limit.
    Baseline,
    /// Shown for reading the figures (the library's own SQL text on a raw connection).
    Reference,
}

/// Left to the scheduler, or on one CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    Unpinned,
    Pinned,
}

impl Pass {
    pub(super) const ALL: [Self; 2] = [Self::Unpinned, Self::Pinned];

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// What one pass measured of one variant.
#[derive(Debug)]
pub(super) struct PassData {
    pub(super) batches: Batches,
    pub(super) client_ticks: u64,
    pub(super) server_ticks: u64,
}

impl PassData {
    fn new() -> Self {
        Self {
            batches: Batches::new(),
            client_ticks: 0,
            server_ticks: 0,
        }
    }
}

pub(crate) struct Variant {
    pub(super) name: &'static str,
    pub(super) role: Role,
    pub(super) op: Op,
    /// Installed (thread-locally) around this variant's batches.
    pub(super) tracing: Option<tracing::Dispatch>,
    /// The server process of this variant's connection, when the server runs here.
    pub(super) backend: Option<u32>,
    pub(super) passes: [PassData; 2],
}

impl Variant {
    pub(crate) fn new(name: &'static str, role: Role, op: Op) -> Self {
        Self {
            name,
            role,
            op,
            tracing: None,
            backend: None,
            passes: [PassData::new(), PassData::new()],
        }
    }

    pub(super) fn traced(mut self, pipeline: &Pipeline) -> Self {
        self.tracing = Some(tracing::Dispatch::new(pipeline.subscriber()));
        self
    }

    pub(super) async fn find_backend(&mut self) -> Result<(), BoxError> {
        let pid = self.op.backend_pid().await?;
        self.backend = u32::try_from(pid)
            .ok()
            .filter(|&pid| is_local_postgres(pid));
        Ok(())
    }

    /// One batch of `cycles`, recorded in `pass`.
    pub(super) async fn batch(&mut self, pass: Pass, cycles: usize) -> Result<(), BoxError> {
        let _tracing = self.tracing.as_ref().map(tracing::dispatcher::set_default);
        let data = &mut self.passes[pass.index()];
        let client_before = cpu::process_ticks(None).unwrap_or(0);
        let server_before = self.backend.and_then(|pid| cpu::process_ticks(Some(pid)));
        let op = &self.op;
        data.batches
            .batch(cycles, async || op.cycle().await)
            .await?;
        let client_after = cpu::process_ticks(None).unwrap_or(0);
        data.client_ticks += client_after.saturating_sub(client_before);
        if let (Some(pid), Some(before)) = (self.backend, server_before) {
            let after = cpu::process_ticks(Some(pid)).unwrap_or(before);
            data.server_ticks += after.saturating_sub(before);
        }
        Ok(())
    }

    /// CPU per cycle in microseconds in `pass`: (client, server).
    pub(super) fn cpu_per_cycle(&self, pass: Pass) -> (Option<f64>, Option<f64>) {
        let data = &self.passes[pass.index()];
        let cycles = data.batches.pooled.count();
        let per = |ticks: u64| cpu::ticks_to_micros(ticks) / as_f64(cycles.max(1));
        let client = cpu::process_ticks(None).map(|_| per(data.client_ticks));
        let server = self.backend.map(|_| per(data.server_ticks));
        (client, server)
    }
}

/// Whether `pid` is a PostgreSQL process on this machine (the server is local).
fn is_local_postgres(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}
