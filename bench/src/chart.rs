//! The handoff chart: cumulative distributions of the handoff gaps, log-scale x, written
//! by hand as SVG (it is only text).

use std::fmt::Write as _;

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

const WIDTH: f64 = 980.0;
const HEIGHT: f64 = 540.0;
const PANEL_WIDTH: f64 = 400.0;
const PANEL_HEIGHT: f64 = 300.0;
const TOP: f64 = 70.0;
const LEFTS: [f64; 2] = [70.0, 550.0];
/// How many points of each distribution are drawn.
const POINTS: usize = 400;

fn color(contender: Contender) -> &'static str {
    match contender {
        Contender::Raw => "#7f7f7f",
        Contender::Queue => "#1f77b4",
        Contender::Poll => "#d62728",
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The x range in whole decades of nanoseconds: from below the smallest sample to above
/// the largest, at least 10 µs to 1 s.
fn decades(series: &[Series]) -> (i32, i32) {
    let all = series
        .iter()
        .flat_map(|s| s.gaps.iter().chain(&s.waiter_gaps))
        .copied()
        .filter(|&v| v > 0);
    let (mut low, mut high) = (4, 9);
    for value in all {
        #[allow(clippy::cast_possible_truncation)]
        let exponent = as_f64(value).log10();
        #[allow(clippy::cast_possible_truncation)]
        {
            low = low.min(exponent.floor() as i32);
            high = high.max(exponent.ceil() as i32);
        }
    }
    (low, high.max(low + 1))
}

/// `10 µs`, `1 ms`, `100 ms`, `10 s` for 10^decade nanoseconds.
fn decade_label(decade: i32) -> String {
    let (unit, base) = match decade {
        ..=2 => ("ns", 0),
        3..=5 => ("µs", 3),
        6..=8 => ("ms", 6),
        _ => ("s", 9),
    };
    format!("{} {unit}", 10u64.pow((decade - base).unsigned_abs()))
}

fn polyline(samples: &[u64], x: impl Fn(f64) -> f64, y: impl Fn(f64) -> f64) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let n = sorted.len();
    let mut points = String::new();
    if n == 0 {
        return points;
    }
    let _ = write!(points, "{:.1},{:.1}", x(as_f64(sorted[0])), y(0.0));
    let steps = POINTS.min(n);
    for k in 0..=steps {
        let index = (k * (n - 1)) / steps.max(1);
        let value = as_f64(sorted[index]);
        let fraction = as_f64((index + 1) as u64) / as_f64(n as u64);
        let _ = write!(points, " {:.1},{:.1}", x(value), y(fraction));
    }
    points
}

/// The SVG document.
pub(crate) fn handoff_svg(series: &[Series], subtitle: &str) -> String {
    let (low, high) = decades(series);
    let span = f64::from(high - low);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="16" font-weight="bold">Lock handoff: cumulative distribution of gaps (log scale)</text>"#,
        WIDTH / 2.0
    );
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="44" text-anchor="middle" fill="#555">{}</text>"##,
        WIDTH / 2.0,
        escape(subtitle)
    );
    let panels = [
        ("release → next acquisition (anyone)", false),
        ("release → acquisition by a task already waiting", true),
    ];
    for (panel, (title, waiter)) in panels.iter().enumerate() {
        let left = LEFTS[panel];
        let x = |nanos: f64| left + (nanos.max(1.0).log10() - f64::from(low)) / span * PANEL_WIDTH;
        let y = |fraction: f64| TOP + PANEL_HEIGHT - fraction * PANEL_HEIGHT;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
            left + PANEL_WIDTH / 2.0,
            TOP - 8.0,
            escape(title)
        );
        // Grid and axes.
        for decade in low..=high {
            let px = x(10f64.powi(decade));
            let _ = writeln!(
                svg,
                r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{}" stroke="#ddd"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
                TOP + PANEL_HEIGHT,
                TOP + PANEL_HEIGHT + 16.0,
                decade_label(decade)
            );
        }
        for tenth in 0..=10 {
            let fraction = f64::from(tenth) / 10.0;
            let py = y(fraction);
            let _ = writeln!(
                svg,
                r##"<line x1="{left}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#eee"/>"##,
                left + PANEL_WIDTH
            );
            if tenth % 2 == 0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{}" y="{:.1}" text-anchor="end">{}%</text>"#,
                    left - 6.0,
                    py + 4.0,
                    tenth * 10
                );
            }
        }
        let _ = writeln!(
            svg,
            r##"<rect x="{left}" y="{TOP}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#333"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">gap</text>"#,
            left + PANEL_WIDTH / 2.0,
            TOP + PANEL_HEIGHT + 34.0
        );
        for s in series {
            let samples = if *waiter { &s.waiter_gaps } else { &s.gaps };
            let dash = if s.tasks <= 4 {
                ""
            } else {
                r#" stroke-dasharray="6 3""#
            };
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.8"{dash} points="{}"/>"#,
                color(s.contender),
                polyline(samples, x, y)
            );
        }
    }
    // Legend: one column per task count, one row per contender.
    let legend_top = TOP + PANEL_HEIGHT + 56.0;
    let mut task_counts: Vec<usize> = series.iter().map(|s| s.tasks).collect();
    task_counts.sort_unstable();
    task_counts.dedup();
    for s in series {
        let column = task_counts.iter().position(|&t| t == s.tasks).unwrap_or(0);
        let row = Contender::ALL
            .iter()
            .position(|&c| c == s.contender)
            .unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let (lx, ly) = (LEFTS[column.min(1)], legend_top + 18.0 + row as f64 * 18.0);
        let dash = if s.tasks <= 4 {
            ""
        } else {
            r#" stroke-dasharray="6 3""#
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{} (n = {} / {})</text>"#,
            lx + 28.0,
            color(s.contender),
            lx + 34.0,
            ly + 4.0,
            escape(s.contender.label()),
            s.gaps.len(),
            s.waiter_gaps.len()
        );
    }
    for (column, tasks) in task_counts.iter().enumerate().take(2) {
        let style = if *tasks <= 4 { "solid" } else { "dashed" };
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{legend_top}" font-weight="bold">{tasks} contenders ({style})</text>"#,
            LEFTS[column]
        );
    }
    for (line, text) in [
        "n = handoffs (left) / releases made while other tasks waited (right).",
        "Polling looks quick on the left only because the releaser takes the lock straight back; the right shows how long the waiting tasks were passed over.",
    ]
    .iter()
    .enumerate()
    {
        #[allow(clippy::cast_precision_loss)]
        let y = legend_top + 90.0 + line as f64 * 16.0;
        let _ = writeln!(
            svg,
            r##"<text x="{}" y="{y}" text-anchor="middle" fill="#555">{}</text>"##,
            WIDTH / 2.0,
            escape(text)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_is_well_formed_svg_with_every_series() {
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
        let svg = handoff_svg(&series, "quick run");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("library, Queue (server-side wait) (n = 3 / 1)"));
        assert!(svg.contains("16 contenders (dashed)"));
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(!svg.contains("NaN"));
        assert_eq!(decade_label(4), "10 µs");
        assert_eq!(decade_label(6), "1 ms");
        assert_eq!(decade_label(10), "10 s");
    }
}
