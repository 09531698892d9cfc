//! A tracing + OpenTelemetry pipeline as users install it (tracing-opentelemetry's layer on
//! the SDK's batch span processor, behind an INFO filter) and the metrics SDK
//! ([`MetricsPipeline`]), each with an exporter that counts what it is handed and drops it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::prelude::*;

/// An exporter that counts what it is handed (spans, or metric exports) and drops it.
#[derive(Debug, Clone, Default)]
struct Counting(Arc<AtomicU64>);

impl Counting {
    fn add(&self, count: usize) -> impl Future<Output = OTelSdkResult> + Send + use<> {
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        self.0.fetch_add(count, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }
}

impl SpanExporter for Counting {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.add(batch.len())
    }
}

impl PushMetricExporter for Counting {
    fn export(&self, _: &ResourceMetrics) -> impl Future<Output = OTelSdkResult> + Send {
        self.add(1)
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _: std::time::Duration) -> OTelSdkResult {
        Ok(())
    }

    fn temporality(&self) -> Temporality {
        Temporality::Cumulative
    }
}

/// The provider and the count of what reached the exporter.
#[derive(Debug)]
pub(crate) struct Pipeline {
    provider: SdkTracerProvider,
    exported: Counting,
}

impl Pipeline {
    /// A batch span processor (its own export thread) in front of the counting exporter.
    pub(crate) fn new() -> Self {
        let exported = Counting::default();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exported.clone())
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
        self.exported.0.load(Ordering::Relaxed)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// The OpenTelemetry metrics SDK as an application installs it: a global meter provider
/// with a periodic reader (its own thread, exporting every 60 s by default) in front of
/// an exporter that counts and drops.
#[derive(Debug)]
pub(crate) struct MetricsPipeline {
    provider: SdkMeterProvider,
    exports: Counting,
}

impl MetricsPipeline {
    /// Installs the provider as the global one.
    pub(crate) fn install() -> Self {
        let exports = Counting::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exports.clone()).build())
            .build();
        opentelemetry::global::set_meter_provider(provider.clone());
        Self { provider, exports }
    }

    /// Exports what was recorded and returns how many exports there were.
    pub(crate) fn flush(&self) -> u64 {
        let _ = self.provider.force_flush();
        self.exports.0.load(Ordering::Relaxed)
    }
}

impl Drop for MetricsPipeline {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}
