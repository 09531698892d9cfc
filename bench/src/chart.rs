//! Floor 1: the charts, drawn with `plotters`' SVG backend: panels of lines on a log-scale
//! x axis, the y axis log-scale too or a cumulative share ([`cdf`]).

use plotters::coord::combinators::IntoLogRange;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::BoxError;

#[derive(Debug)]
pub(crate) struct Curve {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

pub(crate) const BLUE: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub(crate) const ORANGE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
pub(crate) const GREEN: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
pub(crate) const RED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
pub(crate) const GREY: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);

pub(crate) fn curve(label: &str, color: RGBColor, dashed: bool, points: Vec<(f64, f64)>) -> Curve {
    let label = label.to_owned();
    Curve {
        label,
        color,
        dashed,
        points,
    }
}

/// One panel: its title, what its axes show (x, y, and how y reads), and its curves.
#[derive(Debug)]
pub(crate) struct Panel {
    title: String,
    axes: (&'static str, &'static str, Unit),
    curves: Vec<Curve>,
}

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Nanos,
    Plain,
    /// A distribution ([`cdf`]): x nanoseconds, y the share of samples.
    Share,
}

/// How many points of each distribution are drawn; a curve with more has no markers.
const POINTS: usize = 400;
const MARKED: usize = 40;

fn tick(nanos: f64) -> String {
    let units = [(1e9, "s"), (1e6, "ms"), (1e3, "µs")];
    let (scale, unit) =
        (units.into_iter().find(|(scale, _)| nanos >= *scale)).unwrap_or((1.0, "ns"));
    format!("{:.0} {unit}", nanos / scale)
}

fn plain_tick(value: f64) -> String {
    match value {
        1e5.. => format!("1e{:.0}", value.log10()),
        1.0.. => format!("{value:.0}"),
        _ => format!("{value}"),
    }
}

/// At most [`POINTS`] (value, cumulative share) points of the samples' distribution.
pub(crate) fn cdf(samples: &[u64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let (n, steps) = (sorted.len(), POINTS.min(sorted.len()));
    let at = |index: usize| (sorted[index].max(1) as f64, (index + 1) as f64 / n as f64);
    let first = sorted.first().map(|&least| (least.max(1) as f64, 0.0));
    let rest = (0..=steps)
        .filter(|_| n > 0)
        .map(|k| at(k * (n - 1) / steps.max(1)));
    first.into_iter().chain(rest).collect()
}

fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let logs = values.filter(|v| v.is_finite() && *v > 0.0).map(f64::log10);
    let (low, high) = logs.fold((i32::MAX, i32::MIN), |(low, high), log| {
        (low.min(log.floor() as i32), high.max(log.ceil() as i32))
    });
    let (low, high) = if low > high { (0, 1) } else { (low, high) };
    (10f64.powi(low), 10f64.powi(high.max(low + 1)))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

pub(crate) fn curves_svg(
    title: &str,
    panels: &[Panel],
    columns: usize,
    notes: &[String],
) -> Result<String, BoxError> {
    let rows = panels.len().div_ceil(columns).max(1);
    let footer = u32::try_from(10 + notes.len() * 20)?;
    let size = (1200, u32::try_from(rows * 330 + 50)? + footer);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 18))?;
        let (grid, bottom) = root.split_vertically(size.1 - 30 - footer);
        for (area, panel) in grid.split_evenly((rows, columns)).iter().zip(panels) {
            let along = |y: bool| {
                let points = panel.curves.iter().flat_map(|c| &c.points);
                points.map(move |p| if y { p.1 } else { p.0 })
            };
            let x = decades(along(false));
            if panel.axes.2 == Unit::Share {
                draw(area, panel, x, 0.0..1.0)?;
            } else {
                let (y_low, y_high) = decades(along(true));
                draw(area, panel, x, (y_low..y_high).log_scale())?;
            }
        }
        let font = ("sans-serif", 12)
            .into_font()
            .color(&RGBColor(0x55, 0x55, 0x55));
        for (line, text) in (0..).zip(notes) {
            bottom.draw(&Text::new(text.clone(), (20, 6 + 20 * line), font.clone()))?;
        }
        root.present()?;
    }
    Ok(svg)
}

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
    let share = unit == Unit::Share;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| if share { tick(*x) } else { plain_tick(*x) })
        .y_label_formatter(&|y| match unit {
            Unit::Nanos => tick(*y),
            Unit::Plain => plain_tick(*y),
            Unit::Share => format!("{:.0}%", y * 100.0),
        })
        .draw()?;
    for curve in &panel.curves {
        let style = curve.color.stroke_width(2);
        let points: Vec<(f64, f64)> = (curve.points.iter().copied())
            .filter(|(x, y)| *x > 0.0 && y.is_finite() && (*y > 0.0 || share))
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
    chart
        .configure_series_labels()
        .position(if share {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperLeft
        })
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
        let points = vec![(1e3, 2e8), (1e4, 2e9), (1e5, 0.0)];
        let held = vec![curve("library", BLUE, false, points)];
        let gaps = vec![
            curve("Queue (n = 2)", BLUE, false, cdf(&[100_000, 200_000])),
            curve("Poll (n = 0)", RED, true, cdf(&[])),
        ];
        let panels = [
            panel("time to hold", ("held locks", "time", Unit::Nanos), held),
            panel("gaps", ("gap", "share", Unit::Share), gaps),
        ];
        let svg = curves_svg("Scale", &panels, 2, &["a note".to_owned()]).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in ["library", "Queue (n = 2)", "Poll (n = 0)", "a note"] {
            assert!(svg.contains(text), "{text}");
        }
        assert!(!svg.contains("NaN"));
        let expected = [(1e5, 0.0), (1e5, 0.5), (1e5, 0.5), (2e5, 1.0)];
        assert_eq!(cdf(&[200_000, 100_000]), expected);
    }
}
