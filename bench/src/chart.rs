//! The handoff chart: cumulative distributions of the handoff gaps on a log-scale x axis,
//! drawn with `plotters` (its SVG backend: axes, ticks, legends and dashed series come from
//! the library instead of hand-placed SVG elements).

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::BoxError;
use crate::handoff::Contender;
use crate::stats::as_f64;

/// The samples of one (contender, task count), in nanoseconds.
#[derive(Debug)]
pub(crate) struct Series {
    pub(crate) contender: Contender,
    pub(crate) tasks: usize,
    pub(crate) gaps: Vec<u64>,
    pub(crate) waiter_gaps: Vec<u64>,
}

const SIZE: (u32, u32) = (1000, 600);
/// How many points of each distribution are drawn.
const POINTS: usize = 400;
/// Series with more contenders than this are dashed.
const SOLID_UP_TO: usize = 4;

fn color(contender: Contender) -> RGBColor {
    match contender {
        Contender::Raw => RGBColor(0x7f, 0x7f, 0x7f),
        Contender::Queue => RGBColor(0x1f, 0x77, 0xb4),
        Contender::Poll => RGBColor(0xd6, 0x27, 0x28),
    }
}

/// The x range in nanoseconds, whole decades: from below the smallest sample to above the
/// largest, at least 10 µs to 1 s.
fn range(series: &[Series]) -> (f64, f64) {
    let (mut low, mut high) = (4, 9);
    for value in series
        .iter()
        .flat_map(|s| s.gaps.iter().chain(&s.waiter_gaps))
        .filter(|&&v| v > 0)
    {
        let exponent = as_f64(*value).log10();
        #[allow(clippy::cast_possible_truncation)]
        {
            low = low.min(exponent.floor() as i32);
            high = high.max(exponent.ceil() as i32);
        }
    }
    (10f64.powi(low), 10f64.powi(high.max(low + 1)))
}

/// An x tick (the axis has one per decade): `10 µs`, `1 ms`, `1 s`.
fn tick(nanos: f64) -> String {
    let (value, unit) = if nanos >= 1e9 {
        (nanos / 1e9, "s")
    } else if nanos >= 1e6 {
        (nanos / 1e6, "ms")
    } else if nanos >= 1e3 {
        (nanos / 1e3, "µs")
    } else {
        (nanos, "ns")
    };
    format!("{value:.0} {unit}")
}

/// At most `POINTS` (value, cumulative share) points of the samples' distribution.
fn cdf(samples: &[u64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let steps = POINTS.min(n);
    let mut points = vec![(as_f64(sorted[0].max(1)), 0.0)];
    for k in 0..=steps {
        let index = (k * (n - 1)) / steps.max(1);
        let share = as_f64((index + 1) as u64) / as_f64(n as u64);
        points.push((as_f64(sorted[index].max(1)), share));
    }
    points
}

/// The SVG document.
pub(crate) fn handoff_svg(series: &[Series], subtitle: &str) -> Result<String, BoxError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            "Lock handoff: cumulative distribution of gaps (log scale)",
            ("sans-serif", 18),
        )?;
        let (panels, footer) = root.split_vertically(SIZE.1 - 90);
        let (x_low, x_high) = range(series);
        let titles = [
            ("release → next acquisition (anyone)", false),
            ("release → acquisition by a task already waiting", true),
        ];
        for (area, (title, waiter)) in panels.split_evenly((1, 2)).iter().zip(titles) {
            let mut chart = ChartBuilder::on(area)
                .caption(title, ("sans-serif", 14))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(48)
                .build_cartesian_2d((x_low..x_high).log_scale(), 0.0..1.0)?;
            chart
                .configure_mesh()
                .x_desc("gap")
                .y_desc("share of handoffs")
                .x_label_formatter(&|nanos| tick(*nanos))
                .y_label_formatter(&|share| format!("{:.0}%", share * 100.0))
                .draw()?;
            for s in series {
                let samples = if waiter { &s.waiter_gaps } else { &s.gaps };
                let style = color(s.contender).stroke_width(2);
                let label = format!(
                    "{}, {} contenders (n = {})",
                    s.contender.label(),
                    s.tasks,
                    samples.len()
                );
                let points = cdf(samples);
                let drawn = if s.tasks <= SOLID_UP_TO {
                    chart.draw_series(LineSeries::new(points, style))?
                } else {
                    chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?
                };
                let dashed = s.tasks > SOLID_UP_TO;
                drawn.label(label).legend(move |(x, y)| {
                    let end = if dashed { x + 8 } else { x + 20 };
                    PathElement::new(vec![(x, y), (end, y)], style)
                });
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 11))
                .draw()?;
        }
        let notes = [
            subtitle.to_owned(),
            "n = handoffs (left) / releases made while other tasks waited (right); solid: 4 \
             contenders, dashed: 16."
                .to_owned(),
            "Polling looks quick on the left only because the releaser takes the lock straight \
             back; the right shows how long the waiting tasks were passed over."
                .to_owned(),
        ];
        for (line, text) in notes.iter().enumerate() {
            let y = 14 + 20 * i32::try_from(line).unwrap_or(0);
            footer.draw(&Text::new(
                text.clone(),
                (20, y),
                ("sans-serif", 12)
                    .into_font()
                    .color(&RGBColor(0x55, 0x55, 0x55)),
            ))?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_is_svg_with_every_series_in_its_legend() {
        let series = vec![
            Series {
                contender: Contender::Queue,
                tasks: 4,
                gaps: vec![100_000, 200_000, 150_000],
                waiter_gaps: vec![100_000],
            },
            Series {
                contender: Contender::Poll,
                tasks: 16,
                gaps: vec![],
                waiter_gaps: vec![90_000_000],
            },
        ];
        let svg = handoff_svg(&series, "quick run").unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("library, Queue (server-side wait), 4 contenders (n = 3)"));
        assert!(
            svg.contains("library, Poll (100 ms, as the Python library), 16 contenders (n = 1)")
        );
        assert!(svg.contains("quick run"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn the_range_covers_the_samples_in_whole_decades() {
        let series = vec![Series {
            contender: Contender::Raw,
            tasks: 4,
            gaps: vec![2_500, 3_000_000_000],
            waiter_gaps: vec![],
        }];
        assert_eq!(range(&series), (1e3, 1e10));
        assert_eq!(range(&[]), (1e4, 1e9));
        assert_eq!(cdf(&[5, 1, 3]).last(), Some(&(5.0, 1.0)));
        assert_eq!(tick(1e4), "10 µs");
        assert_eq!(tick(1e6), "1 ms");
        assert_eq!(tick(1e10), "10 s");
    }
}
