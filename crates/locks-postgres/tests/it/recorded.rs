//! The metrics a test's own meter provider recorded: the SDK's in-memory exporter, read
//! back as points (shared by the `it` binary and the `unannounced` one).

use locks_postgres::PostgresLockManager;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

use crate::support::pool;
/// One data point as exported: the instrument, its attributes as text, and the value
/// (a sum's value, or a histogram's count and sum).
#[derive(Debug, Clone)]
pub(crate) struct Point {
    pub(crate) name: String,
    pub(crate) unit: String,
    pub(crate) attributes: Vec<(String, String)>,
    pub(crate) value: f64,
    pub(crate) count: u64,
}

impl Point {
    pub(crate) fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub(crate) fn has(&self, wanted: &[(&str, &str)]) -> bool {
        wanted
            .iter()
            .all(|(name, value)| self.attribute(name) == Some(value))
    }
}

/// A meter provider of one test, with the SDK's in-memory exporter behind a periodic
/// reader (flushed on demand).
pub(crate) struct Recorded {
    exporter: InMemoryMetricExporter,
    pub(crate) provider: SdkMeterProvider,
}

impl Recorded {
    pub(crate) fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Self { exporter, provider }
    }

    /// A manager builder on a pool of `size` whose instruments record here.
    pub(crate) fn manager(&self, size: usize) -> locks_postgres::PostgresLockManagerBuilder {
        PostgresLockManager::builder(pool(size)).meter(self.provider.meter("it-metrics"))
    }

    /// Every data point recorded so far (cumulative).
    pub(crate) fn points(&self) -> Vec<Point> {
        self.exporter.reset();
        self.provider.force_flush().expect("flush");
        let exported = self.exporter.get_finished_metrics().expect("exported");
        let mut points = Vec::new();
        // Nothing recorded yet: the reader may export nothing at all.
        let Some(last) = exported.last() else {
            return points;
        };
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                let mut push = |attributes: Vec<(String, String)>, value: f64, count: u64| {
                    points.push(Point {
                        name: metric.name().to_owned(),
                        unit: metric.unit().to_owned(),
                        attributes,
                        value,
                        count,
                    });
                };
                #[allow(clippy::cast_precision_loss)] // small test counts
                match metric.data() {
                    AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                        for point in sum.data_points() {
                            push(text(point.attributes()), point.value() as f64, 0);
                        }
                    }
                    AggregatedMetrics::I64(MetricData::Sum(sum)) => {
                        for point in sum.data_points() {
                            push(text(point.attributes()), point.value() as f64, 0);
                        }
                    }
                    AggregatedMetrics::U64(MetricData::Gauge(gauge)) => {
                        for point in gauge.data_points() {
                            push(text(point.attributes()), point.value() as f64, 0);
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Sum(sum)) => {
                        for point in sum.data_points() {
                            push(text(point.attributes()), point.value(), 0);
                        }
                    }
                    AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
                        for point in histogram.data_points() {
                            push(text(point.attributes()), point.sum(), point.count());
                        }
                    }
                    other => panic!("unexpected data for {}: {other:?}", metric.name()),
                }
            }
        }
        points
    }
}

fn text<'a>(
    attributes: impl Iterator<Item = &'a opentelemetry::KeyValue>,
) -> Vec<(String, String)> {
    attributes
        .map(|kv| (kv.key.as_str().to_owned(), kv.value.to_string()))
        .collect()
}

/// The points of instrument `name` whose attributes include `wanted`.
pub(crate) fn find<'p>(points: &'p [Point], name: &str, wanted: &[(&str, &str)]) -> Vec<&'p Point> {
    points
        .iter()
        .filter(|point| point.name == name && point.has(wanted))
        .collect()
}

/// The summed value of the counter `name` over the points with `wanted`.
pub(crate) fn total(points: &[Point], name: &str, wanted: &[(&str, &str)]) -> f64 {
    find(points, name, wanted).iter().map(|p| p.value).sum()
}

/// The summed count of the histogram `name` over the points with `wanted`.
pub(crate) fn observations(points: &[Point], name: &str, wanted: &[(&str, &str)]) -> u64 {
    find(points, name, wanted).iter().map(|p| p.count).sum()
}
