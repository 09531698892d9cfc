//! CPU pinning for the cycle scenarios: the calling thread through `sched_setaffinity`
//! (nix's safe wrapper), a server backend through `taskset -p` run as a subprocess (it is
//! another user's process; we run as root or as its owner).
//!
//! Left to the scheduler, a lock+unlock cycle on a two-vCPU VM is mostly the time it takes
//! to wake an idle vCPU: the client and its backend hand the CPU to each other twice per
//! cycle. With both on one CPU each hand-over is a plain context switch, so what is left is
//! the work of the cycle.

use std::process::Command;

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;

use crate::BoxError;

/// The CPUs this process may run on, lowest first.
pub(crate) fn allowed_cpus() -> Result<Vec<usize>, BoxError> {
    let set = sched_getaffinity(Pid::from_raw(0))
        .map_err(|error| format!("sched_getaffinity: {error}"))?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .collect())
}

/// Restricts the calling thread to `cpus`.
pub(crate) fn this_thread(cpus: &[usize]) -> Result<(), BoxError> {
    let mut set = CpuSet::new();
    for &cpu in cpus {
        set.set(cpu)
            .map_err(|error| format!("CPU {cpu} is out of range: {error}"))?;
    }
    sched_setaffinity(Pid::from_raw(0), &set)
        .map_err(|error| format!("sched_setaffinity to {cpus:?}: {error}").into())
}

/// Restricts process `pid` (a server backend) to `cpus` with `taskset -p -c`.
pub(crate) fn process(pid: u32, cpus: &[usize]) -> Result<(), BoxError> {
    let list = cpus
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let output = Command::new("taskset")
        .args(["-p", "-c", &list, &pid.to_string()])
        .output()
        .map_err(|error| format!("could not run taskset (util-linux): {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "taskset -p -c {list} {pid} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into())
    }
}

/// The CPUs `pid` may run on, as `taskset -p` shows them (for the report).
pub(crate) fn process_cpus(pid: u32) -> Option<String> {
    let output = Command::new("taskset")
        .args(["-p", "-c", &pid.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.rsplit_once(':')
        .map(|(_, list)| list.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_can_be_pinned_and_released() {
        std::thread::spawn(|| {
            let all = allowed_cpus().unwrap();
            assert!(!all.is_empty());
            let last = *all.last().unwrap();
            this_thread(&[last]).unwrap();
            assert_eq!(allowed_cpus().unwrap(), [last]);
            this_thread(&all).unwrap();
            assert_eq!(allowed_cpus().unwrap(), all);
        })
        .join()
        .unwrap();
    }
}
