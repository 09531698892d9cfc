//! Ground floor: the charts, drawn with `plotters` (its SVG backend: axes, ticks, legends
//! and dashed series come from the library instead of hand-placed SVG elements). The
//! handoff chart: cumulative distributions of gaps on a log-scale x axis; the scale
//! curves: log-log lines, one panel per cost. They know nothing of who measured what:
//! each series brings its label, colour and line.

use plotters::coord::combinators::IntoLogRange;
use plotters::prelude::*;

use crate::BoxError;
use crate::stats::as_f64;

/// The samples of one curve on both panels, in nanoseconds.
#[derive(Debug)]
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) color: (u8, u8, u8),
    pub(crate) dashed: bool,
    pub(crate) gaps: Vec<u64>,
    pub(crate) waiter_gaps: Vec<u64>,
}

const SIZE: (u32, u32) = (1000, 600);
/// How many points of each distribution are drawn.
const POINTS: usize = 400;

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

/// `notes` one line each in grey, the first `top` pixels down `area`.
fn draw_notes(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    notes: &[String],
    top: i32,
) -> Result<(), BoxError> {
    for (line, text) in notes.iter().enumerate() {
        let y = top + 20 * i32::try_from(line).unwrap_or(0);
        area.draw(&Text::new(
            text.clone(),
            (20, y),
            ("sans-serif", 12)
                .into_font()
                .color(&RGBColor(0x55, 0x55, 0x55)),
        ))?;
    }
    Ok(())
}

/// The SVG document, `notes` under the panels.
pub(crate) fn handoff_svg(series: &[Series], notes: &[String]) -> Result<String, BoxError> {
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
                let (r, g, b) = s.color;
                let style = RGBColor(r, g, b).stroke_width(2);
                let label = format!("{} (n = {})", s.label, samples.len());
                let points = cdf(samples);
                let dashed = s.dashed;
                let drawn = if dashed {
                    chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?
                } else {
                    chart.draw_series(LineSeries::new(points, style))?
                };
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
        draw_notes(&footer, notes, 14)?;
        root.present()?;
    }
    Ok(svg)
}

/// One line of a [`curves_svg`] panel: (x, y) points, both positive.
#[derive(Debug)]
pub(crate) struct Curve {
    pub(crate) label: String,
    pub(crate) color: (u8, u8, u8),
    pub(crate) dashed: bool,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One panel of a [`curves_svg`] chart: log-scale axes, `y_unit` formats its ticks.
#[derive(Debug)]
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) x_desc: &'static str,
    pub(crate) y_desc: &'static str,
    pub(crate) y_unit: Unit,
    pub(crate) curves: Vec<Curve>,
}

/// How a panel's y ticks read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    /// Nanoseconds, shown as `10 µs`, `1 ms`.
    Nanos,
    /// A plain number (a ratio, bytes).
    Plain,
}

/// Whole decades around the positive `values`, at least one decade wide.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut low, mut high) = (i32::MAX, i32::MIN);
    for value in values.filter(|v| v.is_finite() && *v > 0.0) {
        #[allow(clippy::cast_possible_truncation)]
        {
            low = low.min(value.log10().floor() as i32);
            high = high.max(value.log10().ceil() as i32);
        }
    }
    if low > high {
        (low, high) = (0, 1);
    }
    (10f64.powi(low), 10f64.powi(high.max(low + 1)))
}

/// A plain tick: `1000`, `0.1`, `1e6`.
fn plain_tick(value: f64) -> String {
    if value >= 1e5 {
        format!("1e{:.0}", value.log10())
    } else if value >= 1.0 {
        format!("{value:.0}")
    } else {
        format!("{value}")
    }
}

/// The SVG document of `panels` laid out `columns` wide, `notes` under them: the scale
/// curves (one line per series, log-log).
pub(crate) fn curves_svg(
    title: &str,
    panels: &[Panel],
    columns: usize,
    notes: &[String],
) -> Result<String, BoxError> {
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    let height = u32::try_from(rows * 330 + 60 + notes.len() * 20).unwrap_or(2000);
    let size = (SIZE.0 + 200, height);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 18))?;
        let footer_height = u32::try_from(10 + notes.len() * 20).unwrap_or(100);
        let (grid, footer) = root.split_vertically(size.1 - 30 - footer_height);
        let areas = grid.split_evenly((rows, columns));
        for (area, panel) in areas.iter().zip(panels) {
            let (x_low, x_high) = decades(
                panel
                    .curves
                    .iter()
                    .flat_map(|c| c.points.iter().map(|p| p.0)),
            );
            let (y_low, y_high) = decades(
                panel
                    .curves
                    .iter()
                    .flat_map(|c| c.points.iter().map(|p| p.1)),
            );
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, ("sans-serif", 13))
                .margin(10)
                .x_label_area_size(36)
                .y_label_area_size(56)
                .build_cartesian_2d((x_low..x_high).log_scale(), (y_low..y_high).log_scale())?;
            let unit = panel.y_unit;
            chart
                .configure_mesh()
                .x_desc(panel.x_desc)
                .y_desc(panel.y_desc)
                .x_label_formatter(&|x| plain_tick(*x))
                .y_label_formatter(&|y| match unit {
                    Unit::Nanos => tick(*y),
                    Unit::Plain => plain_tick(*y),
                })
                .draw()?;
            for curve in &panel.curves {
                let (r, g, b) = curve.color;
                let style = RGBColor(r, g, b).stroke_width(2);
                let points: Vec<(f64, f64)> = curve
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| *x > 0.0 && *y > 0.0 && y.is_finite())
                    .collect();
                let dashed = curve.dashed;
                let drawn = if dashed {
                    chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
                } else {
                    chart.draw_series(LineSeries::new(points.clone(), style))?
                };
                drawn
                    .label(curve.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
                chart.draw_series(
                    points
                        .into_iter()
                        .map(|p| Circle::new(p, 3, style.filled())),
                )?;
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 10))
                .draw()?;
        }
        draw_notes(&footer, notes, 6)?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str, dashed: bool, gaps: Vec<u64>, waiter_gaps: Vec<u64>) -> Series {
        let label = label.to_owned();
        let color = (0x1f, 0x77, 0xb4);
        Series {
            label,
            color,
            dashed,
            gaps,
            waiter_gaps,
        }
    }

    #[test]
    fn the_chart_is_svg_with_every_series_in_its_legend() {
        let series = vec![
            series(
                "Queue, 4 contenders",
                false,
                vec![100_000, 200_000],
                vec![1],
            ),
            series("Poll, 16 contenders", true, vec![], vec![90_000_000]),
        ];
        let svg = handoff_svg(&series, &["quick run".to_owned()]).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("Queue, 4 contenders (n = 2)"));
        assert!(svg.contains("Poll, 16 contenders (n = 1)"));
        assert!(svg.contains("quick run"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn the_range_covers_the_samples_in_whole_decades() {
        let series = vec![series("raw", false, vec![2_500, 3_000_000_000], vec![])];
        assert_eq!(range(&series), (1e3, 1e10));
        assert_eq!(range(&[]), (1e4, 1e9));
        assert_eq!(cdf(&[5, 1, 3]).last(), Some(&(5.0, 1.0)));
        assert_eq!(tick(1e4), "10 µs");
        assert_eq!(tick(1e6), "1 ms");
        assert_eq!(tick(1e10), "10 s");
    }
    #[test]
    fn curves_are_svg_with_every_curve_in_a_legend() {
        let panel = Panel {
            title: "time to hold".to_owned(),
            x_desc: "held locks",
            y_desc: "time",
            y_unit: Unit::Nanos,
            curves: vec![Curve {
                label: "library".to_owned(),
                color: (0x1f, 0x77, 0xb4),
                dashed: false,
                points: vec![(1e3, 2e8), (1e4, 2e9), (1e5, 0.0)],
            }],
        };
        let svg = curves_svg("Scale", &[panel], 2, &["a note".to_owned()]).unwrap();
        assert!(svg.trim_start().starts_with("<svg"));
        assert!(svg.contains("library") && svg.contains("a note"));
        assert!(!svg.contains("NaN"));
        assert_eq!(decades([1e3, 2e5, 0.0].into_iter()), (1e3, 1e6));
        assert_eq!(decades(std::iter::empty()), (1.0, 10.0));
        assert_eq!(plain_tick(1e6), "1e6");
        assert_eq!(plain_tick(100.0), "100");
    }
}
