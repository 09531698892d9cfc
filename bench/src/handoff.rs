//! Scenario `handoff`: 4 and 16 tasks on one key (raw, `Queue`, `Poll`) and 16 on a
//! semaphore of N = 4, acquire (timeout 5 s) / hold 2 ms / release, each with a manager and
//! pool of one; then a window of long jobs on the semaphore. Timed by [`crate::turns`].

use std::time::Duration;

use serde_json::json;

use crate::chart::{BLUE, Curve, GREEN, GREY, RED, Rgb, Unit, cdf, curve, curves_svg, panel};
use crate::db::Database;
use crate::harness::{self, Cell, Outcome, cells, verdict};
use crate::stats::{Latencies, as_f64, fairness, finite, fmt_ns, nanos};
use crate::turns::{Contender, Turns};
use crate::{BoxError, Plan};

const CONTENDERS: [usize; 2] = [4, 16];
const PERMITS: Contender = Contender::Permits(4);
const JOB_TASKS: usize = 8;
const JOB_WINDOW: Duration = Duration::from_secs(8);
const APP: (&str, bool) = ("lock-bench-handoff", true);

/// A contender's label, and its colour in the chart.
fn says(contender: Contender) -> (&'static str, Rgb) {
    match contender {
        Contender::Raw => ("raw pg_advisory_lock (server queue)", GREY),
        Contender::Queue => ("library, Queue (server-side wait)", BLUE),
        Contender::Poll => ("library, Poll (100 ms, as the Python library)", RED),
        Contender::Permits(_) => ("library, semaphore of N = 4", GREEN),
    }
}

/// A hold of 2 ms.
fn short(_: usize, _: u64) -> Duration {
    Duration::from_millis(2)
}

/// A job of 100–400 ms, spread by task and turn.
fn job(task: usize, turn: u64) -> Duration {
    let spread = (task as u64)
        .wrapping_mul(7_919)
        .wrapping_add(turn.wrapping_mul(104_729));
    Duration::from_millis(100 + spread % 301)
}

/// One measured case (a row): who contends, how many, and their windows.
struct Case {
    contender: Contender,
    jobs: bool,
    turns: Turns,
}

impl Case {
    fn new(contender: Contender, tasks: usize, jobs: bool) -> Self {
        let turns = Turns::new(contender, tasks);
        Self {
            contender,
            jobs,
            turns,
        }
    }

    /// Its targets: gap p99, fairness, idle share, and whether at most N hold at once.
    fn limits(&self) -> (Option<Duration>, Option<f64>, Option<f64>, bool) {
        let ms = Duration::from_millis;
        match (self.contender, self.turns.tasks(), self.jobs) {
            (Contender::Queue, 4, _) => (Some(ms(2)), Some(1.5), None, false),
            (Contender::Queue, ..) => (None, Some(1.5), None, false),
            (Contender::Permits(_), _, false) => (Some(ms(5)), Some(1.5), None, true),
            (Contender::Permits(_), _, true) => (Some(ms(10)), None, Some(0.01), true),
            _ => (None, None, None, false),
        }
    }

    fn name(&self) -> String {
        let label = says(self.contender).0;
        if self.jobs {
            format!("{label}, 100–400 ms jobs")
        } else {
            label.to_owned()
        }
    }
}

fn fmt_fairness(value: f64) -> String {
    if value.is_finite() {
        format!("{value:.2}")
    } else {
        "∞ (a task got no turn)".to_owned()
    }
}

/// The handoff scenario, with its chart.
pub(crate) async fn run(db: &Database, plan: &Plan) -> Result<Outcome, BoxError> {
    let locks = [Contender::Raw, Contender::Queue, Contender::Poll];
    let mut cases: Vec<Case> = CONTENDERS
        .iter()
        .flat_map(|&tasks| locks.map(|contender| Case::new(contender, tasks, false)))
        .chain([Case::new(PERMITS, 16, false)])
        .collect();
    harness::rounds(plan.pick(2, 5), cases.len(), async |round, side| {
        let case = &mut cases[side];
        let length = if case.contender == Contender::Poll {
            plan.ms(1500, 6000)
        } else {
            plan.ms(600, 2000)
        };
        let key = format!("bench:handoff:{round}:{side}:{}", std::process::id());
        case.turns.window(db, APP, key, length, short).await
    })
    .await?;
    let mut jobs = Case::new(PERMITS, JOB_TASKS, true);
    let key = format!("bench:handoff:jobs:{}", std::process::id());
    jobs.turns.window(db, APP, key, JOB_WINDOW, job).await?;
    cases.push(jobs);

    let header = [
        "Tasks",
        "Waiting",
        "Turns",
        "gap p50",
        "gap p99",
        "gap to a waiter p50",
        "gap to a waiter p99",
        "wait p99",
        "fairness",
        "re-taken",
        "timeouts",
        "most inside",
        "idle share",
        "Result",
    ];
    let title = "4. Handoff under contention: one key, hold 2 ms, acquire timeout 5 s";
    let mut out = Outcome::new("handoff", title, &header);
    out.note(format!(
        "{} rounds of one window a row ({:.1} s, Poll {:.1} s), then {JOB_WINDOW:?} of long \
         jobs; definitions: docs/benchmarks.md, \"What each scenario measures\".",
        plan.pick(2, 5),
        plan.ms(600, 2000).as_secs_f64(),
        plan.ms(1500, 6000).as_secs_f64(),
    ));
    let mut left_out = Vec::new();
    let mut curves: [Vec<Curve>; 2] = Default::default();
    for case in &cases {
        let (_, color) = says(case.contender);
        let (name, tasks, windows) = (case.name(), case.turns.tasks(), &case.turns.windows);
        let state = case.turns.take();
        let [gaps, waiter_gaps, waits] =
            [&state.gaps, &state.waiter_gaps, &state.waits].map(|s| Latencies::of(s));
        let worst = windows.iter().map(|t| fairness(t)).fold(0.0_f64, f64::max);
        let turns: u64 = windows.iter().flatten().sum();
        let capacity = case.contender.capacity();
        let idle = state.idle.as_secs_f64()
            / (case.turns.measured.as_secs_f64() * as_f64(capacity as u64));
        let percent = |share: f64| Cell::new(format!("{:.2} %", share * 100.0), share);
        let fair = Cell::new(fmt_fairness(worst), finite(worst));
        let (gap_limit, fairness_limit, idle_limit, inside) = case.limits();
        // Each target: what it measures, its limit when this row has one, whether it held.
        let gates = [
            (
                ("gap p99", Cell::ns(gaps.p99())),
                gap_limit.map(|limit| fmt_ns(nanos(limit))),
                gap_limit.is_some_and(|l| gaps.count() > 0 && gaps.p99() <= nanos(l)),
            ),
            (
                ("fairness (worst window)", fair.clone()),
                fairness_limit.map(|limit| limit.to_string()),
                fairness_limit.is_some_and(|limit| worst <= limit),
            ),
            (
                ("idle share", percent(idle)),
                idle_limit.map(|limit| format!("{:.0} %", limit * 100.0)),
                idle_limit.is_some_and(|limit| idle <= limit),
            ),
            (
                ("most inside at once", Cell::from(state.most_inside)),
                inside.then(|| capacity.to_string()),
                state.most_inside <= capacity,
            ),
        ];
        let mut missed = Vec::new();
        let mut gated = false;
        for ((measure, measured), limit, pass) in gates {
            let Some(limit) = limit else { continue };
            let target = format!("handoff {measure}, {name}, {tasks} tasks");
            out.gate(target, measured, format!("≤ {limit}"), pass);
            gated = true;
            if !pass {
                missed.push(measure);
            }
        }
        let result = match &missed[..] {
            [] if !gated => String::new(),
            [] => verdict(true).to_owned(),
            missed => format!("MISS: {}", missed.join(", ")),
        };
        let retaken = if gaps.count() == 0 {
            Cell::from("—")
        } else {
            let share = as_f64(state.retaken) / as_f64(gaps.count());
            Cell::new(format!("{:.0} %", share * 100.0), share)
        };
        out.row(cells![
            tasks,
            &name,
            turns,
            Cell::ns(gaps.p50()),
            Cell::ns(gaps.p99()),
            Cell::ns(waiter_gaps.p50()),
            Cell::ns(waiter_gaps.p99()),
            Cell::ns(waits.p99()),
            fair,
            retaken,
            state.timeouts,
            state.most_inside,
            percent(idle),
            result,
        ]);
        left_out.push(json!({
            "row": format!("{name}, {tasks} tasks"),
            "releases_abandoned_by_all_waiters": state.abandoned,
            "releases_unserved_at_window_end": state.unserved_at_end,
        }));
        if case.contender != PERMITS {
            for (side, samples) in [&state.gaps, &state.waiter_gaps].into_iter().enumerate() {
                let label = format!("{name}, {tasks} contenders (n = {})", samples.len());
                let dashed = tasks > CONTENDERS[0];
                curves[side].push(curve(&label, color, dashed, cdf(samples)));
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let chart_notes = [
        format!(
            "{cores} cores, {} mode; hold 2 ms, acquire timeout 5 s.",
            plan.mode()
        ),
        "n = handoffs (left) / releases made while other tasks waited (right); solid: 4 \
         contenders, dashed: 16."
            .to_owned(),
        "Polling looks quick on the left only because the releaser takes the lock straight \
         back; the right shows how long the waiting tasks were passed over."
            .to_owned(),
    ];
    let titles = [
        "release → next acquisition (anyone)",
        "release → acquisition by a task already waiting",
    ];
    let axes = ("gap", "share of handoffs", Unit::Share);
    let panels = (titles.into_iter().zip(curves)).map(|(title, curves)| panel(title, axes, curves));
    let title = "Lock handoff: cumulative distribution of gaps (log scale)";
    let svg = curves_svg(title, &panels.collect::<Vec<_>>(), 2, &chart_notes)?;
    out.files.push(("handoff.svg", svg));
    Ok(out.with(json!({ "releases_not_handoffs": left_out })))
}
