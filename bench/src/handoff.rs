//! Scenario `handoff`: tasks on one key or a semaphore, each with a manager and pool of
//! one, timed by [`crate::turns`]; then a window of long jobs on the semaphore.

use std::time::Duration;

use plotters::style::RGBColor;
use serde_json::json;

use crate::chart::{BLUE, Curve, GREEN, GREY, Panel, RED, Unit, cdf, curves_svg};
use crate::db::Database;
use crate::harness::{self, Cell, Outcome, row, verdict};
use crate::stats::{Latencies, fairness, fmt_ns};
use crate::turns::{Contender, Turns};
use crate::{Plan, Result};

const CONTENDERS: [usize; 2] = [4, 16];
const PERMITS: Contender = Contender::Permits(4);
const JOB_TASKS: usize = 8;
const JOB_WINDOW: Duration = Duration::from_secs(8);
const APP: (&str, bool) = ("lock-bench-handoff", true);
const HOLD: Duration = Duration::from_millis(2);

/// Tasks of one contender taking turns, holding 2 ms or (`jobs`) 100–400 ms.
struct Case {
    turns: Turns,
    jobs: bool,
}

impl Case {
    fn new(contender: Contender, tasks: usize, jobs: bool) -> Self {
        let turns = Turns::new(contender, tasks);
        Self { turns, jobs }
    }

    /// Its targets, each a limit and how it reads, or none: gap p99 (ns), fairness, idle
    /// share, and how many may hold at once.
    fn limits(&self) -> impl Iterator<Item = Option<(f64, String)>> {
        let n = Some(self.turns.contender.capacity() as f64);
        let limits = match (self.turns.contender, self.turns.tasks, self.jobs) {
            (Contender::Queue, 4, _) => [Some(2e6), Some(1.5), None, None],
            (Contender::Queue, ..) => [None, Some(1.5), None, None],
            (Contender::Permits(_), _, false) => [Some(5e6), Some(1.5), None, n],
            (Contender::Permits(_), _, true) => [Some(1e7), None, Some(0.01), n],
            _ => [None; 4],
        };
        let shown: [fn(f64) -> String; 4] = [
            |limit| fmt_ns(limit as u64),
            |limit| limit.to_string(),
            |limit| format!("{:.0} %", limit * 100.0),
            |limit| limit.to_string(),
        ];
        (limits.into_iter().zip(shown)).map(|(limit, shown)| limit.map(|l| (l, shown(l))))
    }

    fn says(&self) -> (String, RGBColor) {
        let (label, color) = match self.turns.contender {
            Contender::Raw => ("raw pg_advisory_lock (server queue)", GREY),
            Contender::Queue => ("library, Queue (server-side wait)", BLUE),
            Contender::Poll => ("library, Poll (100 ms, as the Python library)", RED),
            Contender::Permits(_) => ("library, semaphore of N = 4", GREEN),
        };
        match self.jobs {
            true => (format!("{label}, 100–400 ms jobs"), color),
            false => (label.to_owned(), color),
        }
    }
}

/// A job of 100–400 ms, spread by task and turn.
fn job(task: usize, turn: u64) -> Duration {
    let spread = (task as u64)
        .wrapping_mul(7_919)
        .wrapping_add(turn.wrapping_mul(104_729));
    Duration::from_millis(100 + spread % 301)
}

pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome> {
    let locks = [Contender::Raw, Contender::Queue, Contender::Poll];
    let mut cases: Vec<Case> = (CONTENDERS.iter())
        .flat_map(|&tasks| locks.map(|contender| Case::new(contender, tasks, false)))
        .chain([Case::new(PERMITS, 16, false)])
        .collect();
    let (rounds, window, poll_window) = (plan.pick(2, 5), plan.ms(600, 2000), plan.ms(1500, 6000));
    harness::rounds(rounds, cases.len(), async |round, side| {
        let case = &mut cases[side];
        let poll = case.turns.contender == Contender::Poll;
        let length = if poll { poll_window } else { window };
        let key = format!("bench:handoff:{round}:{side}:{}", std::process::id());
        case.turns.window(db, APP, key, length, |_, _| HOLD).await
    })
    .await?;
    let mut jobs = Case::new(PERMITS, JOB_TASKS, true);
    let key = format!("bench:handoff:jobs:{}", std::process::id());
    jobs.turns.window(db, APP, key, JOB_WINDOW, job).await?;
    cases.push(jobs);

    let title = "4. Handoff under contention: one key, hold 2 ms, acquire timeout 5 s";
    let mut out = Outcome::new("handoff", title);
    let (seconds, poll_seconds) = (window.as_secs_f64(), poll_window.as_secs_f64());
    out.note(format!(
        "{rounds} rounds of one window a row ({seconds:.1} s, Poll {poll_seconds:.1} s), then \
         {JOB_WINDOW:?} of long jobs; definitions: docs/benchmarks.md, \"What each scenario \
         measures\"."
    ));
    let mut left_out = Vec::new();
    let mut curves: [Vec<_>; 2] = Default::default();
    for case in &cases {
        let ((name, color), tasks, windows) = (case.says(), case.turns.tasks, &case.turns.windows);
        let state = case.turns.take();
        let [gaps, waiter_gaps, waits] =
            [&state.gaps, &state.waiter_gaps, &state.waits].map(|s| Latencies::of(s));
        let worst = windows.iter().map(|t| fairness(t)).fold(0.0_f64, f64::max);
        let capacity = case.turns.contender.capacity();
        let idle = state.idle.as_secs_f64() / (case.turns.measured.as_secs_f64() * capacity as f64);
        let percent = |share: f64| Cell::new(format!("{:.2} %", share * 100.0), share);
        // Infinite (a task without a turn) is null in the JSON.
        let fair = match worst.is_finite() {
            true => format!("{worst:.2}"),
            false => "∞ (a task got no turn)".to_owned(),
        };
        let fair = Cell::new(fair, worst);
        let gap = Some(gaps.p99() as f64).filter(|_| gaps.count() > 0);
        let most = state.most_inside;
        // Each target: what it measures, its figure shown and compared.
        let gates = [
            ("gap p99", Cell::ns(gaps.p99()), gap),
            ("fairness (worst window)", fair.clone(), Some(worst)),
            ("idle share", percent(idle), Some(idle)),
            ("most inside at once", Cell::from(most), Some(most as f64)),
        ];
        let (mut missed, mut gated) = (Vec::new(), false);
        for ((measure, measured, value), limit) in gates.into_iter().zip(case.limits()) {
            let Some((at, shown)) = limit else { continue };
            let pass = value.is_some_and(|value| value <= at);
            let target = format!("handoff {measure}, {name}, {tasks} tasks");
            out.gate(target, measured, format!("≤ {shown}"), pass);
            gated = true;
            missed.extend((!pass).then_some(measure));
        }
        let result = match &missed[..] {
            [] if !gated => String::new(),
            [] => verdict(true).to_owned(),
            missed => format!("MISS: {}", missed.join(", ")),
        };
        let retaken = match gaps.count() {
            0 => Cell::from("—"),
            count => {
                let share = state.retaken as f64 / count as f64;
                Cell::new(format!("{:.0} %", share * 100.0), share)
            }
        };
        out.row(row![
            "Tasks" => tasks,
            "Waiting" => &name,
            "Turns" => windows.iter().flatten().sum::<u64>(),
            "gap p50" => Cell::ns(gaps.p50()),
            "gap p99" => Cell::ns(gaps.p99()),
            "gap to a waiter p50" => Cell::ns(waiter_gaps.p50()),
            "gap to a waiter p99" => Cell::ns(waiter_gaps.p99()),
            "wait p99" => Cell::ns(waits.p99()),
            "fairness" => fair,
            "re-taken" => retaken,
            "timeouts" => state.timeouts,
            "most inside" => state.most_inside,
            "idle share" => percent(idle),
            "Result" => result,
        ]);
        left_out.push(json!({
            "row": format!("{name}, {tasks} tasks"),
            "releases_abandoned_by_all_waiters": state.abandoned,
            "releases_unserved_at_window_end": state.unserved_at_end,
        }));
        if case.turns.contender != PERMITS {
            for (side, samples) in [&state.gaps, &state.waiter_gaps].into_iter().enumerate() {
                let label = format!("{name}, {tasks} contenders (n = {})", samples.len());
                let dashed = tasks > CONTENDERS[0];
                curves[side].push(Curve(label, color, dashed, cdf(samples)));
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mode = plan.mode();
    let machine = format!("{cores} cores, {mode} mode; hold 2 ms, acquire timeout 5 s.");
    let chart_notes = [
        &machine,
        "n = handoffs (left) / releases made while other tasks waited (right); solid: 4 \
         contenders, dashed: 16.",
        "Polling looks quick on the left only because the releaser takes the lock straight \
         back; the right shows how long the waiting tasks were passed over.",
    ];
    let titles = [
        "release → next acquisition (anyone)",
        "release → acquisition by a task already waiting",
    ];
    let axes = ("gap", "share of handoffs", Unit::Share);
    let panels: Vec<_> = (titles.into_iter().zip(curves))
        .map(|(title, curves)| Panel(title, axes, curves))
        .collect();
    let title = "Lock handoff: cumulative distribution of gaps (log scale)";
    out.files
        .push(("handoff.svg", curves_svg(title, &panels, 2, &chart_notes)?));
    Ok(out.with(json!({ "releases_not_handoffs": left_out })))
}
