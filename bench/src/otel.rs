//! A tracing + OpenTelemetry pipeline as users install it (tracing-opentelemetry's layer on
//! the SDK's batch span processor, behind an INFO level filter, as `RUST_LOG=info`), with an
//! exporter that counts the spans it is handed and drops them: everything up to the wire is
//! done, nothing accumulates.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// Counts exported spans.
#[derive(Debug, Clone, Default)]
struct CountingExporter {
    exported: Arc<AtomicU64>,
}

impl SpanExporter for CountingExporter {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.exported.fetch_add(
            u64::try_from(batch.len()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        std::future::ready(Ok(()))
    }
}

/// The provider and the count of what reached the exporter.
#[derive(Debug)]
pub(crate) struct Pipeline {
    provider: SdkTracerProvider,
    exported: Arc<AtomicU64>,
}

impl Pipeline {
    /// A batch span processor (its own export thread) in front of the counting exporter.
    pub(crate) fn new() -> Self {
        let exporter = CountingExporter::default();
        let exported = Arc::clone(&exporter.exported);
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .build();
        Self { provider, exported }
    }

    /// A subscriber sending the spans and events at INFO and above to this pipeline (a
    /// registry with the OpenTelemetry layer behind an INFO filter). The library's lock
    /// spans are at DEBUG unless the manager is built with `span_level(INFO)`: the
    /// `-spans` variants do that, so every span reaches the pipeline.
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(self.provider.tracer("lock-bench")))
            .with(LevelFilter::INFO)
    }

    /// Exports what is queued and returns how many spans have been exported so far.
    pub(crate) fn flush(&self) -> u64 {
        let _ = self.provider.force_flush();
        self.exported.load(Ordering::Relaxed)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}
