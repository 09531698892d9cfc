//! How a cycle scenario runs: on a thread of its own with a current-thread runtime, each
//! pass with its CPU placement, the variants' batches interleaved in rotating rounds.

use crate::db::Database;
use crate::report::Outcome;
use crate::{BoxError, Plan, interleave, pin};

use super::report::report;
use super::variant::{Pass, Variant};

/// Runs `scenario` on a thread of its own with a current-thread runtime, so that pinning
/// that thread pins everything the client does for a cycle.
pub(crate) fn on_own_thread<F, Fut>(scenario: F) -> Result<Outcome, BoxError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Outcome, BoxError>>,
{
    std::thread::Builder::new()
        .name("lock-bench-cycle".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(scenario())
        })?
        .join()
        .map_err(|_| "the cycle thread panicked")?
}

/// Runs `scenario` with its own copies of `db` and `plan` through [`on_own_thread`],
/// from a task of the multi-threaded runtime (which it blocks meanwhile).
pub(crate) fn on_cycle_thread<F, Fut>(
    db: &Database,
    plan: &Plan,
    scenario: F,
) -> Result<Outcome, BoxError>
where
    F: FnOnce(Database, Plan) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Outcome, BoxError>>,
{
    let (db, plan) = (db.clone(), plan.clone());
    tokio::task::block_in_place(|| on_own_thread(move || scenario(db, plan)))
}

/// Sets the affinity of this thread and of every variant's backend for `pass`; what the
/// report says about it.
fn apply(pass: Pass, variants: &[Variant], all: &[usize], one: usize) -> Result<String, BoxError> {
    let cpus: &[usize] = match pass {
        Pass::Unpinned => all,
        Pass::Pinned => std::slice::from_ref(&one),
    };
    pin::this_thread(cpus)?;
    let mut local = 0;
    for pid in variants.iter().filter_map(|v| v.backend) {
        pin::process(pid, cpus)?;
        local += 1;
    }
    let shown = variants
        .iter()
        .find_map(|v| v.backend)
        .and_then(pin::process_cpus)
        .unwrap_or_else(|| "—".to_owned());
    Ok(match pass {
        Pass::Unpinned => format!("unpinned: client thread and backends on CPUs {all:?}"),
        Pass::Pinned if local == variants.len() => format!(
            "pinned: the client thread and the {local} backends on CPU {one} (taskset shows `{shown}`)"
        ),
        Pass::Pinned => format!(
            "pinned: the client thread on CPU {one}; {local} of {} backends pinned (the others \
             are not on this machine)",
            variants.len()
        ),
    })
}

/// Warms every variant, then runs each pass in rounds, one batch per variant per round,
/// the order rotating from round to round so that none always runs first or last.
pub(crate) async fn run(
    title: &str,
    id: &'static str,
    mut variants: Vec<Variant>,
    plan: &Plan,
    limit: f64,
) -> Result<Outcome, BoxError> {
    let all = pin::allowed_cpus()?;
    let one = *all.last().ok_or("no CPU is allowed")?;
    for variant in &mut variants {
        variant.find_backend().await?;
    }
    let count = variants.len();
    let mut placements = Vec::new();
    for pass in Pass::ALL {
        placements.push(apply(pass, &variants, &all, one)?);
        for variant in &mut variants {
            let _tracing = variant
                .tracing
                .as_ref()
                .map(tracing::dispatcher::set_default);
            for _ in 0..plan.cycle_warmup {
                variant.op.cycle().await?;
            }
        }
        interleave::rounds(plan.cycle_rounds, count, async |_, side| {
            variants[side].batch(pass, plan.cycle_batch).await
        })
        .await?;
    }
    apply(Pass::Unpinned, &variants, &all, one)?;
    Ok(report(title, id, &variants, plan, &placements, limit))
}
