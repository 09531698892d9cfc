//! Scenarios `cycle`, `try` and `shared`: an uncontended lock + unlock, pinned, the
//! library's clients against raw tokio-postgres doing the same statements, prepared; `cycle`
//! over TCP and then over the same server's Unix socket. The method (the client thread and
//! its backends pinned to one CPU, 64 keys, 9 rounds of 500 + 5,000 cycles after a round
//! whose runs are dropped, each client's best run p50 ÷ raw's) and why the best run:
//! `docs/benchmarks.md`, "How fast".

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::clients::{Op, client, label};
use crate::db::Database;
use crate::harness::{self, Batches, Cell, Outcome, cells};
use crate::otel::Pipeline;
use crate::stats::{Latencies, as_f64, fmt_ns, ratio};
use crate::{BoxError, Plan};

/// What a client is for: checked against the baseline, shown (a setting), or the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Library,
    Setting,
    Baseline,
}
use Role::{Baseline, Library, Setting};

/// The scenario `name` (`cycle`, `try` or `shared`): its JSON key, title, the target of
/// its library rows, and its clients by name ([`client`]), each with a role.
fn scenario(name: &str) -> (&'static str, &'static str, f64, Vec<(&'static str, Role)>) {
    match name {
        "cycle" => (
            CYCLE,
            "1. Uncontended acquire + release cycle, pinned",
            1.10,
            vec![
                ("raw", Baseline),
                ("library", Library),
                ("library-timeout", Library),
                ("library-fencing", Setting),
                ("library-keepalive-off", Setting),
                ("library-lease-off", Setting),
                ("library-otel", Setting),
                ("library-timeout-otel", Setting),
                ("library-otel-spans", Setting),
            ],
        ),
        "try" => (
            "cycle_try_acquire",
            "2. Uncontended try_acquire + release cycle, pinned",
            1.15,
            vec![("raw-try", Baseline), ("library-try", Library)],
        ),
        _ => (
            "cycle_shared",
            "9. Uncontended shared-lock acquire + release cycle, pinned",
            1.2,
            vec![
                ("raw-shared", Baseline),
                ("library-shared", Library),
                ("library-shared-timeout", Library),
            ],
        ),
    }
}

/// Rounds, and the untimed and timed cycles of a run.
fn counts(plan: &Plan) -> [usize; 3] {
    [plan.pick(3, 9), plan.pick(100, 500), plan.pick(1000, 5000)]
}

/// The JSON key of scenario `cycle` over the URL's server (TCP, or the socket the URL
/// names), and of its second pass over the same server's Unix socket.
const CYCLE: &str = "cycle_acquire";
const CYCLE_SOCKET: &str = "cycle_acquire_socket";

struct Measured {
    label: &'static str,
    role: Role,
    op: Op,
    /// Installed (thread-locally) around this client's runs.
    tracing: Option<tracing::Dispatch>,
    /// The server process of this client's connection, when the server runs here.
    backend: Option<Pid>,
    /// Each run's p50, and every timed cycle.
    runs: Batches,
    next: usize,
}

impl Measured {
    /// One run: `warmup` untimed cycles, then `cycles` timed ones, kept when `kept`.
    async fn run(&mut self, warmup: usize, cycles: usize, kept: bool) -> Result<(), BoxError> {
        let _tracing = self.tracing.as_ref().map(tracing::dispatcher::set_default);
        let mut run = Latencies::new();
        for n in 0..warmup + cycles {
            let started = std::time::Instant::now();
            self.op.cycle(self.next).await?;
            if n >= warmup {
                run.record(started.elapsed());
            }
            self.next += 1;
        }
        if kept {
            self.runs.add(&run);
        }
        Ok(())
    }
}

/// Runs scenario `name` on a thread of its own with a current-thread runtime (the
/// connections' drivers run there too), so that pinning that thread pins everything the
/// client does; the calling task of the multi-threaded runtime blocks meanwhile. Scenario
/// `cycle` runs twice when the URL is TCP: over it, and then over the same server's Unix
/// socket when this machine can reach one ([`Database::over_socket`]; a note says when
/// not), the same clients by the same method, each pass divided by its own raw.
pub(crate) fn run(db: &Database, plan: &Plan, name: &str) -> Result<Vec<Outcome>, BoxError> {
    let (db, plan, name) = (db.clone(), plan.clone(), name.to_owned());
    tokio::task::block_in_place(|| {
        std::thread::Builder::new()
            .name("lock-bench-cycle".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(passes(&db, &plan, &name))
            })?
            .join()
            .map_err(|_| "the cycle thread panicked")?
    })
}

async fn passes(db: &Database, plan: &Plan, name: &str) -> Result<Vec<Outcome>, BoxError> {
    let (id, ..) = scenario(name);
    let mut first = measure(db, plan, name, id).await?;
    if id != CYCLE {
        return Ok(vec![first]);
    }
    let socket = match db.is_unix() {
        true => Err("the URL names a Unix socket, so the pass above is over it".to_owned()),
        false => db.over_socket().await,
    };
    match socket {
        Ok(socket) => Ok(vec![
            first,
            measure(&socket, plan, name, CYCLE_SOCKET).await?,
        ]),
        Err(why) => {
            first.note(format!("No second pass over a Unix socket: {why}."));
            Ok(vec![first])
        }
    }
}

/// One pass of scenario `name` over `db`, reported under `id`.
async fn measure(
    db: &Database,
    plan: &Plan,
    name: &str,
    id: &'static str,
) -> Result<Outcome, BoxError> {
    let (_, title, limit, names) = scenario(name);
    let otel = names.iter().any(|(name, ..)| name.contains("-otel"));
    let pipeline = otel.then(Pipeline::new);
    let mut clients = Vec::new();
    for (index, &(name, role)) in names.iter().enumerate() {
        let op = client(db, name, &format!("{id}:{index}"), "lock-bench-cycle").await?;
        let pid = op.backend_pid().await?;
        let backend = is_local_postgres(pid).then(|| Pid::from_raw(pid));
        let tracing = pipeline
            .as_ref()
            .filter(|_| name.contains("-otel"))
            .map(|pipeline| tracing::Dispatch::new(pipeline.subscriber()));
        clients.push(Measured {
            label: label(name),
            role,
            op,
            tracing,
            backend,
            runs: Batches::default(),
            next: 0,
        });
    }
    let all = allowed(Pid::from_raw(0))?;
    let one = *all.last().ok_or("no CPU is allowed")?;
    let placement = place(&clients, &[one])?;
    let [rounds, warmup, cycles] = counts(plan);
    // A round more, before the kept ones, whose runs are dropped: the first run of a
    // pass, on new backends just pinned, was at times 4 µs faster than the same
    // client's eight others (raw over the socket: 34.0 µs, then 38.2-40.2 µs), and
    // only the client that runs first gets it (`docs/benchmarks.md`, "How fast").
    let outcome = harness::rounds(rounds + 1, clients.len(), async |round, side| {
        clients[side].run(warmup, cycles, round > 0).await
    })
    .await;
    place(&clients, &all)?;
    outcome?;
    let mut notes = vec![format!("Placement: {placement}.")];
    if let Some(pipeline) = &pipeline {
        let exported = pipeline.flush();
        if exported == 0 {
            return Err(
                "the OpenTelemetry clients exported no span: the pipeline is not wired".into(),
            );
        }
        notes.push(format!(
            "OpenTelemetry: tracing-opentelemetry's layer on the SDK's batch span processor \
             behind an INFO filter, with an exporter that counts and drops; it was handed \
             {exported} spans (the lock spans are at DEBUG unless the manager says INFO)."
        ));
    }
    Ok(report(db, plan, (id, title, limit), &clients, notes))
}

/// The CPUs process (or thread) `pid` may run on, lowest first; 0 is this thread.
fn allowed(pid: Pid) -> Result<Vec<usize>, BoxError> {
    let set = sched_getaffinity(pid).map_err(|error| format!("sched_getaffinity: {error}"))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Restricts process (or thread) `pid` to `cpus`; 0 is this thread.
fn pin(pid: Pid, cpus: &[usize]) -> Result<(), BoxError> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)
            .map_err(|error| format!("CPU {cpu} is out of range: {error}"))?;
    }
    sched_setaffinity(pid, &set)
        .map_err(|error| format!("sched_setaffinity of {pid} to {cpus:?}: {error}").into())
}

/// Restricts this thread and every client's backend to `cpus`; what the report says.
fn place(clients: &[Measured], cpus: &[usize]) -> Result<String, BoxError> {
    let backends: Vec<Pid> = clients.iter().filter_map(|c| c.backend).collect();
    for pid in std::iter::once(Pid::from_raw(0)).chain(backends.iter().copied()) {
        pin(pid, cpus)?;
    }
    let shown = (backends.first())
        .map(|&pid| allowed(pid).map_or_else(|e| e.to_string(), |c| format!("{c:?}")));
    Ok(format!(
        "the client thread and {} of {} backends on CPU {cpus:?} (the first backend may \
         run on {}; a backend not on this machine is not pinned)",
        backends.len(),
        clients.len(),
        shown.as_deref().unwrap_or("—")
    ))
}

/// Whether `pid` is a PostgreSQL process on this machine (the server is local).
fn is_local_postgres(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
}

const HEADER: [&str; 8] = [
    "Client",
    "best run p50",
    "÷ raw",
    "median run p50",
    "runs",
    "p99",
    "Target",
    "Result",
];

/// The table of a pass over `db` under `id` and `title`, `limit` the target of its
/// library rows.
fn report(
    db: &Database,
    plan: &Plan,
    (id, title, limit): (&'static str, &str, f64),
    clients: &[Measured],
    notes: Vec<String>,
) -> Outcome {
    let via = if db.is_unix() { "Unix socket" } else { "TCP" };
    let mut out = Outcome::new(id, format!("{title}, over {via}"), &HEADER);
    let baseline = clients.iter().find(|c| c.role == Baseline);
    let base = baseline.map_or(0, |c| c.runs.best());
    let base_name = baseline.map_or("—", |c| c.label);
    out.note(format!(
        "{} rounds of {} + {} cycles a client (after one whose runs are dropped) over {}, \
         ÷ **{}**'s best run ({} mode; method: docs/benchmarks.md, \"How fast\").",
        counts(plan)[0],
        counts(plan)[1],
        counts(plan)[2],
        db.transport(),
        base_name,
        plan.mode()
    ));
    notes.into_iter().for_each(|note| out.note(note));
    for c in clients {
        let best = c.runs.best();
        let ratio = ratio(as_f64(best), as_f64(base));
        let [target, result] = match c.role {
            Library => out.gate(
                format!("{}: pinned p50 vs raw, {}", c.label, via),
                Cell::new(
                    format!(
                        "{} ({} vs {}; best of {} runs)",
                        ratio.map_or_else(|| "—".to_owned(), |r| format!("{r:.3}×")),
                        fmt_ns(best),
                        fmt_ns(base),
                        c.runs.runs.len()
                    ),
                    ratio,
                ),
                format!("≤ {limit:.2}×"),
                ratio.is_some_and(|r| r <= limit),
            ),
            Baseline => [Cell::from("baseline"), Cell::default()],
            Setting => Default::default(),
        };
        out.row(cells![
            c.label,
            Cell::ns(best),
            Cell::ratio(ratio),
            Cell::ns(c.runs.median()),
            c.runs.spread(),
            Cell::ns(c.runs.pooled.p99()),
            target,
            result,
        ]);
    }
    out
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
