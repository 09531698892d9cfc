//! Ground floor: a tracing + OpenTelemetry pipeline as users install it, and the metrics
//! SDK, each with an exporter that counts what it is handed and drops it.

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

#[derive(Debug, Clone, Default)]
struct Counting(Arc<AtomicU64>);

impl Counting {
    fn add(&self, count: usize) -> impl Future<Output = OTelSdkResult> + Send + use<> {
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        self.0.fetch_add(count, Ordering::Relaxed);
        std::future::ready(Ok(()))
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
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

/// tracing-opentelemetry's layer on the SDK's batch span processor (its own thread).
#[derive(Debug)]
pub(crate) struct Pipeline(SdkTracerProvider, Counting);

impl Pipeline {
    pub(crate) fn new() -> Self {
        let exported = Counting::default();
        let provider = SdkTracerProvider::builder().with_batch_exporter(exported.clone());
        Self(provider.build(), exported)
    }

    /// A subscriber sending spans at INFO and above here (the lock spans are at DEBUG
    /// unless the manager says INFO).
    pub(crate) fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(self.0.tracer("lock-bench")))
            .with(LevelFilter::INFO)
    }

    /// How many spans have been exported, once the queue is.
    pub(crate) fn flush(&self) -> u64 {
        let _ = self.0.force_flush();
        self.1.get()
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}

/// The global meter provider with a periodic reader (its own thread, every 60 s).
#[derive(Debug)]
pub(crate) struct MetricsPipeline(SdkMeterProvider, Counting);

impl MetricsPipeline {
    pub(crate) fn install() -> Self {
        let exports = Counting::default();
        let reader = PeriodicReader::builder(exports.clone()).build();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        opentelemetry::global::set_meter_provider(provider.clone());
        Self(provider, exports)
    }

    pub(crate) fn flush(&self) -> u64 {
        let _ = self.0.force_flush();
        self.1.get()
    }
}

impl Drop for MetricsPipeline {
    fn drop(&mut self) {
        let _ = self.0.shutdown();
    }
}
