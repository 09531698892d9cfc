//! Ground floor: the charts, drawn with `plotters` (its SVG backend: axes, ticks, legends
//! and dashed series come from the library instead of hand-placed SVG elements). One
//! function draws them all ([`curves_svg`]): panels of lines on a log-scale x axis, the y
//! axis log-scale too (the scale curves) or a cumulative share (the handoff gaps, [`cdf`]).
//! It knows nothing of who measured what: each curve brings its label, colour and line.

use plotters::coord::combinators::IntoLogRange;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::BoxError;
use crate::stats::as_f64;

/// One line of a [`curves_svg`] panel: (x, y) points, x positive.
#[derive(Debug)]
pub(crate) struct Curve {
    pub(crate) label: String,
    pub(crate) color: Rgb,
    pub(crate) dashed: bool,
    pub(crate) points: Vec<(f64, f64)>,
}

/// A curve's colour, (red, green, blue).
pub(crate) type Rgb = (u8, u8, u8);
pub(crate) const BLUE: Rgb = (0x1f, 0x77, 0xb4);
pub(crate) const ORANGE: Rgb = (0xff, 0x7f, 0x0e);
pub(crate) const GREEN: Rgb = (0x2c, 0xa0, 0x2c);
pub(crate) const RED: Rgb = (0xd6, 0x27, 0x28);
pub(crate) const GREY: Rgb = (0x7f, 0x7f, 0x7f);

/// A curve of `points` labelled `label`.
pub(crate) fn curve(label: &str, color: Rgb, dashed: bool, points: Vec<(f64, f64)>) -> Curve {
    let label = label.to_owned();
    Curve {
        label,
        color,
        dashed,
        points,
    }
}

/// One panel of a [`curves_svg`] chart: its title, what its axes show and how its y axis
/// reads, and its curves.
#[derive(Debug)]
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) axes: (&'static str, &'static str, Unit),
    pub(crate) curves: Vec<Curve>,
}

/// A panel of `curves` under `title`: (x description, y description, y unit).
pub(crate) fn panel(
    title: &str,
    axes: (&'static str, &'static str, Unit),
    curves: Vec<Curve>,
) -> Panel {
    let title = title.to_owned();
    Panel {
        title,
        axes,
        curves,
    }
}

/// A count on a chart's x axis.
pub(crate) fn x(count: usize) -> f64 {
    as_f64(count as u64)
}

/// How a panel's axes read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// y log-scale in nanoseconds, shown as `10 µs`, `1 ms`.
    Nanos,
    /// y log-scale, a plain number (a ratio, bytes).
    Plain,
    /// A distribution ([`cdf`]): x nanoseconds, y the share of samples, linear 0–100 %.
    Share,
}

/// How many points of each distribution are drawn; a curve with more has no markers.
const POINTS: usize = 400;
const MARKED: usize = 40;

/// A tick in nanoseconds (the axis has one per decade): `10 µs`, `1 ms`, `1 s`.
fn tick(nanos: f64) -> String {
    let units = [(1e9, "s"), (1e6, "ms"), (1e3, "µs")];
    let (scale, unit) =
        (units.into_iter().find(|(scale, _)| nanos >= *scale)).unwrap_or((1.0, "ns"));
    format!("{:.0} {unit}", nanos / scale)
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

/// At most [`POINTS`] (value, cumulative share) points of the samples' distribution.
pub(crate) fn cdf(samples: &[u64]) -> Vec<(f64, f64)> {
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

/// Whole decades around the positive `values`, at least one decade wide.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut low, mut high) = (i32::MAX, i32::MIN);
    for value in values.filter(|v| v.is_finite() && *v > 0.0) {
        low = low.min(value.log10().floor() as i32);
        high = high.max(value.log10().ceil() as i32);
    }
    if low > high {
        (low, high) = (0, 1);
    }
    (10f64.powi(low), 10f64.powi(high.max(low + 1)))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// The SVG document of `panels` laid out `columns` wide under `title`, `notes` under them.
pub(crate) fn curves_svg(
    title: &str,
    panels: &[Panel],
    columns: usize,
    notes: &[String],
) -> Result<String, BoxError> {
    let columns = columns.max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    let height = u32::try_from(rows * 330 + 60 + notes.len() * 20).unwrap_or(2000);
    let size = (1200, height);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 18))?;
        let footer_height = u32::try_from(10 + notes.len() * 20).unwrap_or(100);
        let (grid, footer) = root.split_vertically(size.1 - 30 - footer_height);
        for (area, panel) in grid.split_evenly((rows, columns)).iter().zip(panels) {
            let along = |y: bool| {
                panel
                    .curves
                    .iter()
                    .flat_map(move |c| c.points.iter().map(move |p| if y { p.1 } else { p.0 }))
            };
            let (x_low, x_high) = decades(along(false));
            if panel.axes.2 == Unit::Share {
                draw(area, panel, (x_low, x_high), 0.0..1.0)?;
            } else {
                let (y_low, y_high) = decades(along(true));
                draw(area, panel, (x_low, x_high), (y_low..y_high).log_scale())?;
            }
        }
        for (line, text) in notes.iter().enumerate() {
            let y = 6 + 20 * i32::try_from(line).unwrap_or(0);
            let font = ("sans-serif", 12)
                .into_font()
                .color(&RGBColor(0x55, 0x55, 0x55));
            footer.draw(&Text::new(text.clone(), (20, y), font))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// One panel on `area`: x log-scale over `x`, y over `y` (log-scale or linear).
fn draw<Y>(area: &Area<'_>, panel: &Panel, x: (f64, f64), y: Y) -> Result<(), BoxError>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 13))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d((x.0..x.1).log_scale(), y)?;
    let (x_desc, y_desc, unit) = panel.axes;
    let x_tick: fn(f64) -> String = if unit == Unit::Share {
        tick
    } else {
        plain_tick
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| x_tick(*x))
        .y_label_formatter(&|y| match unit {
            Unit::Nanos => tick(*y),
            Unit::Plain => plain_tick(*y),
            Unit::Share => format!("{:.0}%", y * 100.0),
        })
        .draw()?;
    for curve in &panel.curves {
        let (r, g, b) = curve.color;
        let style = RGBColor(r, g, b).stroke_width(2);
        let points: Vec<(f64, f64)> = (curve.points.iter().copied())
            .filter(|(x, y)| *x > 0.0 && y.is_finite() && (*y > 0.0 || unit == Unit::Share))
            .collect();
        let dashed = curve.dashed;
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?
        };
        drawn.label(curve.label.clone()).legend(move |(x, y)| {
            let end = if dashed { x + 8 } else { x + 16 };
            PathElement::new(vec![(x, y), (end, y)], style)
        });
        if points.len() <= MARKED {
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, style.filled())),
            )?;
        }
    }
    let corner = if unit == Unit::Share {
        SeriesLabelPosition::LowerRight
    } else {
        SeriesLabelPosition::UpperLeft
    };
    chart
        .configure_series_labels()
        .position(corner)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 10))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panels_are_svg_with_every_curve_in_a_legend() {
        let panels = [
            panel(
                "time to hold",
                ("held locks", "time", Unit::Nanos),
                vec![curve(
                    "library",
                    BLUE,
                    false,
                    vec![(1e3, 2e8), (1e4, 2e9), (1e5, 0.0)],
                )],
            ),
            panel(
                "gaps",
                ("gap", "share", Unit::Share),
                vec![
                    curve("Queue (n = 2)", BLUE, false, cdf(&[100_000, 200_000])),
                    curve("Poll (n = 0)", RED, true, cdf(&[])),
                ],
            ),
        ];
        let svg = curves_svg("Scale", &panels, 2, &["a note".to_owned()]).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in ["library", "Queue (n = 2)", "Poll (n = 0)", "a note"] {
            assert!(svg.contains(text), "{text}");
        }
        assert!(!svg.contains("NaN"));
    }
}
