//! Scenarios `cycle`, `try` and `shared`: an uncontended lock + unlock, pinned, the
//! library's clients against raw tokio-postgres doing the same statements, prepared;
//! `cycle` over TCP and then over the same server's Unix socket. The method and why the
//! best run: `docs/benchmarks.md`, "How fast".

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::clients::{Names, client, label};
use crate::db::Database;
use crate::harness::{self, Batches, Cell, Outcome, row};
use crate::otel::Pipeline;
use crate::stats::{Latencies, fmt_ns, ratio};
use crate::{Plan, Result};

/// The JSON keys of scenario `cycle` over the URL, and of its pass over the Unix socket.
const CYCLE: &str = "cycle_acquire";
const CYCLE_SOCKET: &str = "cycle_acquire_socket";

/// Each scenario: name, JSON key, title, the target of its library rows, and its clients:
/// the baseline, then `gated` library clients held to the target, then settings.
type Scenario = (&'static str, &'static str, &'static str, f64, usize, Names);
const SCENARIOS: [Scenario; 3] = [
    (
        "cycle",
        CYCLE,
        "1. Uncontended acquire + release cycle, pinned",
        1.10,
        2,
        &[
            "raw",
            "library",
            "library-timeout",
            "library-fencing",
            "library-keepalive-off",
            "library-lease-off",
            "library-otel",
            "library-timeout-otel",
            "library-otel-spans",
            "raw-checked",
        ],
    ),
    (
        "try",
        "cycle_try_acquire",
        "2. Uncontended try_acquire + release cycle, pinned",
        1.15,
        1,
        &["raw-try", "library-try"],
    ),
    (
        "shared",
        "cycle_shared",
        "9. Uncontended shared-lock acquire + release cycle, pinned",
        1.2,
        2,
        &["raw-shared", "library-shared", "library-shared-timeout"],
    ),
];

/// Runs scenario `name` on a thread of its own with a current-thread runtime (the
/// connections' drivers too), so that pinning that thread pins all the client does.
/// `cycle` runs again over the same server's Unix socket when the URL is TCP and this
/// machine can reach one ([`Database::over_socket`]; a note says when not).
pub(crate) fn run(db: &Database, plan: &Plan, name: &str) -> Result<Vec<Outcome>> {
    let found = SCENARIOS.iter().find(|s| s.0 == name);
    let scenario = *found.ok_or("no such scenario")?;
    let (db, plan) = (db.clone(), plan.clone());
    let thread = std::thread::Builder::new().name("lock-bench-cycle".into());
    let passes = thread.spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let mut passes = vec![measure(&db, &plan, scenario, scenario.1).await?];
            let socket = match db.is_unix() {
                _ if scenario.1 != CYCLE => return Ok(passes),
                true => Err("the URL names a Unix socket, so the pass above is over it".into()),
                false => db.over_socket().await,
            };
            match socket {
                Ok(socket) => passes.push(measure(&socket, &plan, scenario, CYCLE_SOCKET).await?),
                Err(why) => passes[0].note(format!("No second pass over a Unix socket: {why}.")),
            }
            Ok(passes)
        })
    })?;
    tokio::task::block_in_place(|| passes.join().map_err(|_| "the cycle thread panicked")?)
}

async fn measure(
    db: &Database,
    plan: &Plan,
    scenario: Scenario,
    id: &'static str,
) -> Result<Outcome> {
    let (_, _, title, limit, gated, names) = scenario;
    let pipeline = (names.iter().any(|name| name.contains("-otel"))).then(Pipeline::new);
    // Each client, with the tracing it installs (thread-locally) around its runs; and
    // the backends to pin.
    let (mut clients, mut backends) = (Vec::new(), Vec::new());
    for (index, &name) in names.iter().enumerate() {
        let op = client(db, name, &format!("{id}:{index}"), "lock-bench-cycle").await?;
        let pid = op.backend_pid().await?;
        backends.extend(is_local_postgres(pid).then(|| Pid::from_raw(pid)));
        let otel = pipeline.as_ref().filter(|_| name.contains("-otel"));
        clients.push((
            op,
            otel.map(|pipeline| tracing::Dispatch::new(pipeline.subscriber())),
        ));
    }
    let all = allowed(Pid::from_raw(0))?;
    let one = *all.last().ok_or("no CPU is allowed")?;
    let placement = place(&backends, names.len(), &[one])?;
    let [rounds, warmup, cycles] = [plan.pick(3, 9), plan.pick(100, 500), plan.pick(1000, 5000)];
    // A round more, dropped: the first run on backends just pinned was at times faster,
    // and only the client that runs first gets it (`docs/benchmarks.md`, "How fast").
    let runs = harness::rounds(rounds + 1, clients.len(), async |round, side| {
        let (op, tracing) = &clients[side];
        let _tracing = tracing.as_ref().map(tracing::dispatcher::set_default);
        let first = round * (warmup + cycles);
        for n in first..first + warmup {
            op.cycle(n).await?;
        }
        let timed = first + warmup..first + warmup + cycles;
        Latencies::timed(timed, async |n| op.cycle(n).await).await
    })
    .await;
    place(&backends, names.len(), &all)?;
    let runs: Vec<Batches> = (runs?.iter()).map(|runs| Batches::of(&runs[1..])).collect();

    let via = if db.is_unix() { "Unix socket" } else { "TCP" };
    let mut out = Outcome::new(id, format!("{title}, over {via}"));
    let base = runs[0].best();
    let (transport, baseline, mode) = (db.transport(), label(names[0]), plan.mode());
    out.note(format!(
        "{rounds} rounds of {warmup} + {cycles} cycles a client (after one whose runs are \
         dropped) over {transport}, ÷ **{baseline}**'s best run ({mode} mode; method: \
         docs/benchmarks.md, \"How fast\")."
    ));
    out.note(format!("Placement: {placement}."));
    if let Some(pipeline) = &pipeline {
        let exported = pipeline.flush();
        if exported == 0 {
            let error = "the OpenTelemetry clients exported no span: the pipeline is not wired";
            return Err(error.into());
        }
        out.note(format!(
            "OpenTelemetry: tracing-opentelemetry's layer on the SDK's batch span processor \
             behind an INFO filter, with an exporter that counts and drops; it was handed \
             {exported} spans (the lock spans are at DEBUG unless the manager says INFO)."
        ));
    }
    for (index, (runs, &name)) in runs.iter().zip(names).enumerate() {
        let (label, best) = (label(name), runs.best());
        let ratio = ratio(best as f64, base as f64);
        let shown = ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.3}×"));
        let count = runs.runs.len();
        let vs = format!("{} vs {}; best of {count} runs", fmt_ns(best), fmt_ns(base));
        let measured = Cell::new(format!("{shown} ({vs})"), ratio);
        let name = format!("{label}: pinned p50 vs raw, {via}");
        let pass = ratio.is_some_and(|r| r <= limit);
        let [target, result] = match index {
            0 => [Cell::from("baseline"), Cell::default()],
            _ if index <= gated => out.gate(name, measured, format!("≤ {limit:.2}×"), pass),
            _ => Default::default(),
        };
        out.row(row![
            "Client" => label,
            "best run p50" => Cell::ns(best),
            "÷ raw" => Cell::ratio(ratio),
            "median run p50" => Cell::ns(runs.median()),
            "runs" => runs.spread(),
            "p99" => Cell::ns(runs.pooled.p99()),
            "Target" => target,
            "Result" => result,
        ]);
    }
    Ok(out)
}

/// The CPUs process (or thread) `pid` may run on; 0 is this thread.
fn allowed(pid: Pid) -> Result<Vec<usize>> {
    let set = sched_getaffinity(pid).map_err(|error| format!("sched_getaffinity: {error}"))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

fn pin(pid: Pid, cpus: &[usize]) -> Result<()> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)
            .map_err(|error| format!("CPU {cpu} is out of range: {error}"))?;
    }
    sched_setaffinity(pid, &set)
        .map_err(|error| format!("sched_setaffinity of {pid} to {cpus:?}: {error}").into())
}

/// Restricts this thread and the `backends` (of `clients`) to `cpus`; what the report says.
fn place(backends: &[Pid], clients: usize, cpus: &[usize]) -> Result<String> {
    for &pid in std::iter::once(&Pid::from_raw(0)).chain(backends) {
        pin(pid, cpus)?;
    }
    let shown = (backends.first())
        .map(|&pid| allowed(pid).map_or_else(|e| e.to_string(), |c| format!("{c:?}")));
    let (pinned, shown) = (backends.len(), shown.as_deref().unwrap_or("—"));
    Ok(format!(
        "the client thread and {pinned} of {clients} backends on CPU {cpus:?} (the first \
         backend may run on {shown}; a backend not on this machine is not pinned)"
    ))
}

fn is_local_postgres(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_be_pinned_and_released() {
        std::thread::spawn(|| {
            let this = Pid::from_raw(0);
            let all = allowed(this).unwrap();
            let last = *all.last().unwrap();
            pin(this, &[last]).unwrap();
            assert_eq!(allowed(this).unwrap(), [last]);
            pin(this, &all).unwrap();
            assert_eq!(allowed(this).unwrap(), all);
        })
        .join()
        .unwrap();
    }
}
