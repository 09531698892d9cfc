//! CPU time of processes from `/proc/<pid>/stat` (Linux), in clock ticks.

/// The length of a clock tick: `USER_HZ` is 100 on every Linux architecture this runs on.
pub(crate) const TICK_MS: u64 = 10;

/// User + system CPU time of `pid` (this process for `None`), in ticks; `None` where
/// `/proc` is not there.
pub(crate) fn process_ticks(pid: Option<u32>) -> Option<u64> {
    let path = pid.map_or_else(
        || "/proc/self/stat".to_owned(),
        |pid| format!("/proc/{pid}/stat"),
    );
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name, in parentheses, may hold spaces: fields are counted after it.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based, `man 5 proc`).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

pub(crate) fn ticks_to_micros(ticks: u64) -> f64 {
    crate::stats::as_f64(ticks * TICK_MS * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_a_cpu_time_that_grows() {
        let before = process_ticks(None).expect("/proc/self/stat");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(60) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_ticks(None).unwrap();
        assert!(after >= before + 2, "{before} → {after}");
    }
}
