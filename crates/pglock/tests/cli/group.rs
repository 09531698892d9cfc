//! The command never outlives the lock: pglock killed with SIGKILL takes its command's
//! whole process group with it before anyone else gets the lock, and a signal reaches
//! every process of the group, the lock being kept until the last one is gone.

use std::collections::HashMap;

use super::*;

/// The bound on how long the command's processes may outlive a killed pglock.
pub(super) const GONE_WITHIN: Duration = Duration::from_secs(1);

/// `pid -> (parent pid, state, name)` of every process on the machine, from `/proc`.
fn processes() -> HashMap<i32, (i32, char, String)> {
    let mut table = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let name = head
            .split_once(" (")
            .map_or("", |(_, name)| name)
            .to_owned();
        let mut fields = rest.split(' ');
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let parent = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        table.insert(pid, (parent, state, name));
    }
    table
}

/// Every living descendant of `root` (not `root` itself).
pub(super) fn descendants(root: i32) -> Vec<i32> {
    let table = processes();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() {
        let parent = found[index];
        found.extend(
            table
                .iter()
                .filter(|(_, (ppid, state, _))| *ppid == parent && *state != 'Z')
                .map(|(pid, _)| *pid),
        );
        index += 1;
    }
    found.remove(0);
    found
}

/// Those of `pids` still running (present and not a zombie).
pub(super) fn running(pids: &[i32]) -> Vec<i32> {
    let table = processes();
    pids.iter()
        .copied()
        .filter(|pid| table.get(pid).is_some_and(|(_, state, _)| *state != 'Z'))
        .collect()
}

/// A shell command that exits 9 if any of `pids` still runs, else 0: the probe another
/// pglock runs under the lock.
fn probe(pids: &[i32]) -> String {
    let list: Vec<String> = pids.iter().map(ToString::to_string).collect();
    format!(
        "for p in {}; do s=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | cut -c2); \
         if [ -n \"$s\" ] && [ \"$s\" != Z ]; then echo \"$p still runs ($s)\"; exit 9; fi; done",
        list.join(" ")
    )
}

/// Starts `pglock run OPTIONS KEY COMMAND...`, waits until `sleeps` `sleep` processes run
/// below it, and returns pglock and every process below it.
/// Waits until at least `sleeps` descendants of `root` run `sleep`.
async fn sleeping(root: i32, sleeps: usize) {
    eventually("the command's processes", || {
        let table = processes();
        let enough = descendants(root)
            .iter()
            .filter(|pid| table.get(pid).is_some_and(|(_, _, name)| name == "sleep"))
            .count()
            >= sleeps;
        async move { enough }
    })
    .await;
}

pub(super) async fn started(
    options: &[&str],
    key: &str,
    command: &[&str],
    sleeps: usize,
) -> (Child, Vec<i32>) {
    let child = pglock()
        .arg("run")
        .args(options)
        .arg(key)
        .args(command)
        .spawn()
        .expect("spawn");
    let pid = i32::try_from(child.id().expect("running")).expect("pid");
    sleeping(pid, sleeps).await;
    // Let the last of them get past fork into its program.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pids = descendants(pid);
    (child, pids)
}

/// SIGKILLs pglock, and checks that every process of its command is gone within
/// [`GONE_WITHIN`], and before `next` (a pglock that takes the same lock and runs the
/// probe) gets the lock.
async fn kill_and_check(child: Child, pids: &[i32], key: &str, next: &[&str]) {
    let killed = kill_pglock(child).await;
    let probe = probe(pids);
    let taken = loop {
        let attempt = output(pglock().arg("run").args(next).args([key, "-c", &probe])).await;
        match code(&attempt) {
            0 => break killed.elapsed(),
            1 => assert!(killed.elapsed() < SOON, "the lock stayed busy"),
            other => panic!(
                "exit {other}: the killed pglock's command ran while another held the lock: {}{}",
                String::from_utf8_lossy(&attempt.stdout),
                stderr(&attempt)
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    gone_within_bound(pids, killed, "the command").await;
    eprintln!("gone within {GONE_WITHIN:?}; the next pglock got the lock after {taken:?}");
}

/// SIGKILLs pglock and waits until it has exited (not for its output: an orphaned command
/// would hold the pipes open); when it was killed.
pub(super) async fn kill_pglock(mut child: Child) -> Instant {
    signal(&child, Signal::SIGKILL);
    let killed = Instant::now();
    let after = exited(&mut child).await;
    assert_eq!(after.code(), None, "pglock died of SIGKILL");
    killed
}

/// Waits until none of `pids` runs, failing if any outlives `killed` by [`GONE_WITHIN`].
pub(super) async fn gone_within_bound(pids: &[i32], killed: Instant, what: &str) {
    eventually("the command's processes to go", || {
        let left = running(pids);
        assert!(
            left.is_empty() || killed.elapsed() < GONE_WITHIN,
            "{what}: {left:?} of {pids:?} outlived pglock by {:?}",
            killed.elapsed()
        );
        async move { left.is_empty() }
    })
    .await;
}

/// Waits (a bounded time) for `child` to exit, without waiting for its output.
pub(super) async fn exited(child: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(SOON, child.wait())
        .await
        .expect("pglock exited in time")
        .expect("pglock ran")
}

/// A `-c` pipeline with a background job: a shell, a job in the background, and a
/// pipeline in the foreground.
pub(super) const PIPELINE: &str = "sleep 60 & sleep 60 | cat; wait";

#[tokio::test]
async fn a_killed_pglock_takes_its_command_with_it() {
    let (key, _dir) = unique("kill9");
    let (child, pids) = started(&[], &key, &["--", "sh", "-c", "sleep 60; true"], 1).await;
    kill_and_check(child, &pids, &key, &["-n"]).await;

    let (child, pids) = started(&[], &key, &["-c", PIPELINE], 2).await;
    kill_and_check(child, &pids, &key, &["-n"]).await;
}

#[tokio::test]
async fn a_killed_permit_holder_takes_its_command_with_it() {
    let (key, _dir) = unique("kill9-permits");
    let options = ["--permits", "1"];
    let (child, pids) = started(&options, &key, &["-c", PIPELINE], 2).await;
    kill_and_check(child, &pids, &key, &["--permits", "1", "-n"]).await;
}

#[tokio::test]
async fn a_killed_leader_takes_its_command_with_it() {
    let (key, _dir) = unique("kill9-leader");
    let (child, pids) = started(&["--leader"], &key, &["-c", PIPELINE], 2).await;
    // A leader is a semaphore of one permit: `--permits 1 -n` contends with it.
    kill_and_check(child, &pids, &key, &["--permits", "1", "-n"]).await;
}

#[tokio::test]
async fn a_signal_reaches_the_whole_group_and_the_lock_outlives_it() {
    for (number, name) in [
        (Signal::SIGTERM, "term"),
        (Signal::SIGINT, "int"),
        (Signal::SIGHUP, "hup"),
    ] {
        let (key, dir) = unique(&format!("group-{name}"));
        let late = dir.join("late");
        // A background job that ignores the signal and finishes a second later, and a
        // foreground one that does not (a shell starts background jobs ignoring INT).
        let script = format!(
            "(trap '' TERM INT HUP; sleep 1; echo late > {}) & sleep 60; wait",
            late.display()
        );
        let (mut child, pids) = started(&[], &key, &["-c", &script], 2).await;
        signal(&child, number);
        let status = exited(&mut child).await;
        // pglock has exited, so the lock is free: nothing of the group may run now.
        assert_eq!(
            running(&pids),
            Vec::<i32>::new(),
            "{name}: the group outlived the lock"
        );
        let lock_id = locks_port::lock_id(&key);
        assert!(
            late.exists(),
            "{name}: the lock was freed before the job that ignores {number} ended"
        );
        assert_eq!(lock_rows(&admin().await, lock_id).await, [], "{name}");
        let done = finish(child).await;
        assert_eq!(
            status.code(),
            Some(128 + number as i32),
            "{name}: {}",
            stderr(&done)
        );
    }
}

#[tokio::test]
async fn on_a_terminal_the_command_reads_it_and_gets_ctrl_c() {
    use std::io::Write;
    let (key, dir) = unique("terminal");
    let got = dir.join("got");
    let (mut master, terminal) = pseudo_terminal();
    // pglock in a session of its own with the terminal as its controlling terminal, as a
    // login shell would run it; its command reads a line, then sleeps until ^C.
    let script = format!("read line; echo \"$line\" > {}; sleep 30", got.display());
    let child = Command::new("setsid")
        .args([
            "-w",
            "-c",
            env!("CARGO_BIN_EXE_pglock"),
            "--url",
            &database_url(),
        ])
        .args(["run", &key, "-c", &script])
        .stdin(terminal)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("setsid pglock");
    master.write_all(b"typed\n").expect("typed");
    // A command in a background group would be stopped (SIGTTIN) by its read instead.
    wait_for_file(&got).await;
    eventually("the line", || async {
        std::fs::read_to_string(&got).is_ok_and(|text| text == "typed\n")
    })
    .await;
    // ^C only once the shell has become `sleep`: a ^C that reaches `sh -c` just before it
    // execs its last command is caught by the shell and lost in the exec, which would be
    // the shell's race, not pglock's (seen under load in CI).
    sleeping(i32::try_from(child.id().expect("running")).expect("pid"), 1).await;
    let sent = Instant::now();
    master.write_all(b"\x03").expect("^C");
    let done = finish(child).await;
    assert_eq!(code(&done), 130, "{}", stderr(&done));
    assert!(
        sent.elapsed() < Duration::from_secs(5),
        "^C took {:?}",
        sent.elapsed()
    );
}

#[tokio::test]
async fn a_killed_supervisor_takes_the_group_with_it_and_pglock_exits_70() {
    let (key, _dir) = unique("supervisor");
    let (child, pids) = started(&[], &key, &["-c", PIPELINE], 2).await;
    let pglock_pid = i32::try_from(child.id().expect("running")).expect("pid");
    // The supervisor is pglock's only child; the command's processes are below it.
    let table = processes();
    let supervisor = *pids
        .iter()
        .find(|pid| {
            table
                .get(pid)
                .is_some_and(|(parent, _, _)| *parent == pglock_pid)
        })
        .expect("the supervisor");
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).expect("SIGKILL the supervisor");
    let done = finish(child).await;
    assert_eq!(code(&done), 70, "{}", stderr(&done));
    assert_eq!(
        running(&pids),
        Vec::<i32>::new(),
        "the group outlived the supervisor"
    );
}

#[tokio::test]
async fn a_command_run_without_a_shell_gets_the_signals_pglock_forwards() {
    // A program started directly (no `sh -c`, which clears its signal mask) inherits the
    // mask of the process that forks it: the supervisor's blocked signals once reached the
    // command, and a forwarded SIGTERM never ended a plain `sleep`.
    let (key, _dir) = unique("mask");
    let shown =
        output(pglock().args(["run", &key, "--", "grep", "^SigBlk", "/proc/self/status"])).await;
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["SigBlk:", "0000000000000000"],
        "the command starts with signals blocked"
    );
    for (number, name) in [
        (Signal::SIGTERM, "term"),
        (Signal::SIGINT, "int"),
        (Signal::SIGHUP, "hup"),
    ] {
        let (key, _dir) = unique(&format!("direct-{name}"));
        let (mut child, pids) = started(&[], &key, &["--", "sleep", "60"], 1).await;
        signal(&child, number);
        let status = exited(&mut child).await;
        assert_eq!(
            running(&pids),
            Vec::<i32>::new(),
            "{name}: the command outlived pglock"
        );
        assert_eq!(status.code(), Some(128 + number as i32), "{name}");
        let _ = finish(child).await;
    }
}
