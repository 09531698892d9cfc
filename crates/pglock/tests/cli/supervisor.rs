//! The supervisor's edges: a signal that reaches pglock while it collects the finished
//! group's status, and processes that leave the command's process group.

use tokio::io::AsyncBufReadExt;

use super::group::{PIPELINE, exited, gone_within_bound, kill_pglock, running, started};
use super::*;

/// How many times the signal is sent into the window after the command ended.
const ROUNDS: u32 = 50;

/// SIGTERM sent to pglock just as its command ends, 50 times at delays spread over the
/// moments pglock reads the supervisor's last report and collects its exit: every run ends
/// with the command's status (0) or the forwarded signal's (143), never with "the
/// command's supervisor died".
#[tokio::test]
async fn a_signal_while_the_status_is_collected_is_not_a_dead_supervisor() {
    let (key, _dir) = unique("signal-at-the-end");
    let mut codes = std::collections::BTreeMap::<i32, u32>::new();
    for round in 0..ROUNDS {
        let mut holder = pglock()
            .args(["run", &key, "-c", "echo started"])
            .spawn()
            .expect("spawn");
        let mut lines = tokio::io::BufReader::new(holder.stdout.take().expect("stdout")).lines();
        let line = tokio::time::timeout(SOON, lines.next_line())
            .await
            .expect("the command started in time")
            .expect("stdout");
        assert_eq!(line.as_deref(), Some("started"), "round {round}");
        tokio::time::sleep(Duration::from_micros(u64::from(round) * 150)).await;
        signal(&holder, Signal::SIGTERM);
        let done = finish(holder).await;
        let said = stderr(&done);
        assert!(!said.contains("supervisor died"), "round {round}: {said}");
        assert!(
            matches!(code(&done), 0 | 143),
            "round {round}: exit {}: {said}",
            code(&done)
        );
        *codes.entry(code(&done)).or_default() += 1;
    }
    eprintln!("exit codes over {ROUNDS} rounds: {codes:?}");
}

/// SIGKILLs pglock and checks that every one of `pids` is gone within [`super::group::GONE_WITHIN`].
async fn kill_and_check_gone(child: Child, pids: &[i32], what: &str) {
    let killed = kill_pglock(child).await;
    gone_within_bound(pids, killed, what).await;
    eprintln!(
        "{what}: every process gone {:?} after the kill",
        killed.elapsed()
    );
}

/// `run --once-per` and `schedule` run their command under the supervisor: pglock killed
/// with SIGKILL takes the command's whole group with it within [`super::group::GONE_WITHIN`].
#[tokio::test]
async fn a_killed_once_per_or_schedule_takes_its_command_with_it() {
    super::once_per::install().await;
    let (key, _dir) = unique("kill9-once-per");
    let (child, pids) = started(&["--once-per", "1h"], &key, &["-c", PIPELINE], 2).await;
    kill_and_check_gone(child, &pids, "run --once-per").await;

    let (key, _dir) = unique("kill9-schedule");
    let child = pglock()
        .args(["schedule", "every 1s", &key, "-c", PIPELINE])
        .spawn()
        .expect("spawn");
    let pid = i32::try_from(child.id().expect("running")).expect("pid");
    eventually("the scheduled command's processes", || async move {
        super::group::descendants(pid).len() >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pids = super::group::descendants(pid);
    kill_and_check_gone(child, &pids, "schedule").await;
}

/// `run --once-per` and `schedule` forward TERM to their command as `run` does: a command
/// that traps it ends its own way (its trap writes a file, then it exits 7), and pglock
/// exits with the command's status (`run --once-per`) or with 143 once the command has
/// ended (`schedule`). Before, `run --once-per` had no handler (SIGTERM ended pglock and
/// the supervisor SIGKILLed the command), and `schedule` exited at once with the same
/// effect: the trap never ran.
#[tokio::test]
async fn once_per_and_schedule_forward_a_signal_to_their_command() {
    super::once_per::install().await;
    for (how, expected) in [("once-per", 7), ("schedule", 143)] {
        let (key, dir) = unique(&format!("forward-{how}"));
        let (ready, trapped) = (dir.join("ready"), dir.join("trapped"));
        let script = format!(
            "trap 'touch {}; exit 7' TERM; touch {}; sleep 60 & wait",
            trapped.display(),
            ready.display()
        );
        let mut command = pglock();
        match how {
            "once-per" => command.args(["run", "--once-per", "1h", &key, "-c", &script]),
            _ => command.args(["schedule", "every 1s", &key, "-c", &script]),
        };
        let mut child = command.spawn().expect("spawn");
        let pid = i32::try_from(child.id().expect("running")).expect("pid");
        wait_for_file(&ready).await;
        let pids = super::group::descendants(pid);
        signal(&child, Signal::SIGTERM);
        let status = exited(&mut child).await;
        assert!(trapped.exists(), "{how}: the command's TERM trap never ran");
        assert_eq!(status.code(), Some(expected), "{how}");
        assert_eq!(running(&pids), Vec::<i32>::new(), "{how}: outlived pglock");
    }
}

/// Processes that leave the command's process group (`setsid`, and `setsid` in a
/// subshell that exits at once: a double fork) die with pglock all the same, by SIGKILL of
/// pglock and by a forwarded SIGTERM; the lock is free only once they are gone.
#[tokio::test]
async fn processes_that_left_the_group_die_with_the_lock() {
    let script = "setsid sleep 61 & (setsid sleep 62 &); sleep 60; wait";
    let (key, _dir) = unique("setsid-kill9");
    let (child, pids) = started(&[], &key, &["-c", script], 3).await;
    kill_and_check_gone(child, &pids, "SIGKILL").await;

    let (key, _dir) = unique("setsid-term");
    let (mut child, pids) = started(&[], &key, &["-c", script], 3).await;
    // The command starts with no signal blocked (the supervisor blocks its own later).
    for pid in &pids[1..] {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let blocked = status.lines().find(|line| line.starts_with("SigBlk:"));
        assert!(
            blocked.is_none_or(|line| line.trim_end().ends_with(":\t0000000000000000")),
            "process {pid} of the command: {blocked:?}"
        );
    }
    let sent = Instant::now();
    signal(&child, Signal::SIGTERM);
    let status = exited(&mut child).await;
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "pglock took {:?} after SIGTERM",
        sent.elapsed()
    );
    // pglock has exited, so the lock is free: nothing of the command may run now.
    assert_eq!(
        running(&pids),
        Vec::<i32>::new(),
        "the escapees outlived the lock"
    );
    assert_eq!(
        lock_rows(&admin().await, locks_port::lock_id(&key)).await,
        []
    );
    assert_eq!(status.code(), Some(143));
}

/// A leader whose leadership was just broken, SIGTERMed while its stopped command ends or
/// as its status is collected (delays spread over both): it exits 143 at once, never
/// "the command's supervisor died", and never waits out its 30 s backoff first.
#[tokio::test]
async fn a_leader_signalled_as_its_lost_term_ends_stops() {
    for round in 0..8_u64 {
        let (key, dir) = unique("leader-signal-at-the-end");
        let (ready, stopped) = (dir.join("ready"), dir.join("stopped"));
        // Even rounds: the command lingers after its stop begins, so the signal reaches
        // pglock while the command still runs (it is forwarded); odd rounds: it exits at
        // once, so the signal lands while pglock collects its status.
        let linger = if round % 2 == 0 { "0.3" } else { "0" };
        let script = format!(
            "trap 'touch {}; sleep {linger}; exit 0' TERM; touch {}; sleep 60 & wait",
            stopped.display(),
            ready.display()
        );
        let holder = pglock()
            .args(["run", "--leader", "--backoff", "30s", &key, "-c", &script])
            .spawn()
            .expect("spawn");
        wait_for_file(&ready).await;
        let broken = output(pglock().args(["break", "--yes", &key])).await;
        assert_eq!(code(&broken), 0, "round {round}: {}", stderr(&broken));
        wait_for_file(&stopped).await;
        tokio::time::sleep(Duration::from_micros(round * 500)).await;
        let sent = Instant::now();
        signal(&holder, Signal::SIGTERM);
        let done = finish(holder).await;
        let said = stderr(&done);
        assert!(!said.contains("supervisor died"), "round {round}: {said}");
        assert_eq!(code(&done), 143, "round {round}: {said}");
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "round {round}: SIGTERM took {:?}: {said}",
            sent.elapsed()
        );
    }
}
