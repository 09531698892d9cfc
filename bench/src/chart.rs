//! Floor 1: the charts, drawn with `plotters`' SVG backend: panels of lines on a log-scale
//! x axis, the y axis log-scale too or a cumulative share ([`cdf`]).

use plotters::coord::combinators::IntoLogRange;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

use crate::Result;

/// A line: its label, colour, whether dashed, and its (x, y) points.
#[derive(Debug)]
pub(crate) struct Curve(
    pub(crate) String,
    pub(crate) RGBColor,
    pub(crate) bool,
    pub(crate) Vec<(f64, f64)>,
);

/// A panel: its title, what its axes show (x, y, and how y reads), and its curves.
#[derive(Debug)]
pub(crate) struct Panel(
    pub(crate) &'static str,
    pub(crate) (&'static str, &'static str, Unit),
    pub(crate) Vec<Curve>,
);

pub(crate) const BLUE: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
pub(crate) const ORANGE: RGBColor = RGBColor(0xff, 0x7f, 0x0e);
pub(crate) const GREEN: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
pub(crate) const RED: RGBColor = RGBColor(0xd6, 0x27, 0x28);
pub(crate) const GREY: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
const NOTES: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// How y reads: log-scale nanoseconds, a log-scale number, or the share of samples of a
/// distribution ([`cdf`]; its x nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Nanos,
    Plain,
    Share,
}

/// How many points of each distribution are drawn; a curve with more has no markers.
const POINTS: usize = 400;
const MARKED: usize = 40;

/// A tick: `10 µs`, `1 ms` for nanoseconds; `1000`, `0.1`, `1e6`; `50%`.
fn tick(value: f64, unit: Unit) -> String {
    let units = [(1e9, "s"), (1e6, "ms"), (1e3, "µs")];
    match unit {
        Unit::Nanos => {
            let (scale, unit) =
                (units.into_iter().find(|(scale, _)| value >= *scale)).unwrap_or((1.0, "ns"));
            format!("{:.0} {unit}", value / scale)
        }
        Unit::Share => format!("{:.0}%", value * 100.0),
        _ if value >= 1e5 => format!("1e{:.0}", value.log10()),
        _ if value >= 1.0 => format!("{value:.0}"),
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

/// Whole decades around the positive `values`, at least one wide.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let logs = values.filter(|v| v.is_finite() && *v > 0.0).map(f64::log10);
    let (low, high) = logs.fold((i32::MAX, i32::MIN), |(low, high), log| {
        (low.min(log.floor() as i32), high.max(log.ceil() as i32))
    });
    let (low, high) = if low > high { (0, 1) } else { (low, high) };
    (10f64.powi(low), 10f64.powi(high.max(low + 1)))
}

/// The SVG of `panels`, `columns` wide, under `title`, with `notes` at the foot.
pub(crate) fn curves_svg(
    title: &str,
    panels: &[Panel],
    columns: usize,
    notes: &[&str],
) -> Result<String> {
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
            let points = || panel.2.iter().flat_map(|c| &c.3);
            let x = decades(points().map(|p| p.0));
            if panel.1.2 == Unit::Share {
                draw(area, panel, x, 0.0..1.0)?;
            } else {
                let (low, high) = decades(points().map(|p| p.1));
                draw(area, panel, x, (low..high).log_scale())?;
            }
        }
        let font = ("sans-serif", 12).into_font().color(&NOTES);
        for (line, text) in (0..).zip(notes) {
            bottom.draw(&Text::new(*text, (20, 6 + 20 * line), font.clone()))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// One panel: x log-scale over `x`, y over `y` (log-scale or linear).
fn draw<Y>(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    panel: &Panel,
    x: (f64, f64),
    y: Y,
) -> Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let Panel(title, (x_desc, y_desc, unit), curves) = panel;
    let share = *unit == Unit::Share;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 13))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d((x.0..x.1).log_scale(), y)?;
    let x_unit = if share { Unit::Nanos } else { Unit::Plain };
    chart
        .configure_mesh()
        .x_desc(*x_desc)
        .y_desc(*y_desc)
        .x_label_formatter(&|x| tick(*x, x_unit))
        .y_label_formatter(&|y| tick(*y, *unit))
        .draw()?;
    for Curve(label, color, dashed, points) in curves {
        let (style, dashed) = (color.stroke_width(2), *dashed);
        let points: Vec<(f64, f64)> = (points.iter().copied())
            .filter(|(x, y)| *x > 0.0 && y.is_finite() && (*y > 0.0 || share))
            .collect();
        let drawn = if dashed {
            chart.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(points.clone(), style))?
        };
        drawn.label(label).legend(move |(x, y)| {
            let end = if dashed { x + 8 } else { x + 16 };
            PathElement::new(vec![(x, y), (end, y)], style)
        });
        if points.len() <= MARKED {
            let circle = |point| Circle::new(point, 3, style.filled());
            chart.draw_series(points.into_iter().map(circle))?;
        }
    }
    let corner = match share {
        true => SeriesLabelPosition::LowerRight,
        false => SeriesLabelPosition::UpperLeft,
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
        let (points, two) = (vec![(1e3, 2e8), (1e5, 0.0)], cdf(&[100_000, 200_000]));
        let held = vec![Curve("library".into(), BLUE, false, points)];
        let queue = Curve("Queue (n = 2)".into(), BLUE, false, two);
        let gaps = vec![queue, Curve("Poll (n = 0)".into(), RED, true, cdf(&[]))];
        let panels = [
            Panel("time to hold", ("held locks", "time", Unit::Nanos), held),
            Panel("gaps", ("gap", "share", Unit::Share), gaps),
        ];
        let svg = curves_svg("Scale", &panels, 2, &["a note"]).unwrap();
        assert!(svg.trim_start().starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for text in [
            "library",
            "Queue (n = 2)",
            "Poll (n = 0)",
            "a note",
            "100 µs",
            "1e5",
        ] {
            assert!(svg.contains(text), "{text}");
        }
        assert!(!svg.contains("NaN"));
        let expected = [(1e5, 0.0), (1e5, 0.5), (1e5, 0.5), (2e5, 1.0)];
        assert_eq!(cdf(&[200_000, 100_000]), expected);
    }
}
