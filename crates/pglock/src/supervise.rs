//! The supervisor: pglock re-executed in a hidden mode (`pglock __supervise`), in a process
//! group of its own, that runs the command and makes sure it never outlives pglock.
//!
//! pglock holds the only write end of the *death pipe*; the supervisor holds its read end.
//! When pglock dies by any means (SIGKILL, the OOM killer, a crash), the kernel closes the
//! write end, the supervisor reads end-of-file and SIGKILLs the command's process group and
//! every other descendant (one that left the group with `setsid` or a double fork). While
//! pglock lives, a byte N it writes on that pipe is a signal it forwarded to the group: the
//! supervisor sends it to the descendants outside the group.
//! While pglock lives, the supervisor runs the command in a process group of its own,
//! reaps every descendant (it is a child subreaper), and reports on the *status pipe*:
//!
//! ```text
//! started PGID            the command runs, in process group PGID
//! failed notfound|cannot MESSAGE
//! done exit N | done signal N   the command's status, once no descendant is left
//! ```
//!
//! See ADR 0020 for why, and what remains uncovered.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

/// The hidden first argument that selects this mode.
pub(crate) const MODE: &str = "__supervise";

/// After SIGKILLing the group on pglock's death, how long the supervisor waits for the
/// processes to go before it exits anyway.
const REAP_BOUND: Duration = Duration::from_secs(1);

/// `pglock __supervise DEATH_FD STATUS_FD TTY_PGRP|- -- PROGRAM [ARGS]...`.
///
/// Never returns an error to a caller: a failure is reported on the status pipe when there
/// is one, and as exit code 70 otherwise.
pub(crate) fn main(args: &[OsString]) -> ExitCode {
    let parsed = match args {
        [death, status, tty, dashes, program @ ..] if dashes == "--" && !program.is_empty() => {
            (reopen(death, false), reopen(status, true), tty, program)
        }
        _ => return ExitCode::from(crate::exit::SOFTWARE),
    };
    let (Ok(death), Ok(mut status), tty, program) = parsed else {
        return ExitCode::from(crate::exit::SOFTWARE);
    };
    let tty: Option<Pid> = tty
        .to_str()
        .and_then(|tty| tty.parse().ok())
        .map(Pid::from_raw);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let _ = nix::sys::prctl::set_child_subreaper(true);

    let child = match std::process::Command::new(&program[0])
        .args(&program[1..])
        .process_group(0)
        .spawn()
    {
        Ok(child) => child,
        Err(error) => {
            let kind = if error.kind() == ErrorKind::NotFound {
                "notfound"
            } else {
                "cannot"
            };
            let _ = writeln!(status, "failed {kind} {error}");
            return ExitCode::SUCCESS;
        }
    };
    let Ok(pid) = i32::try_from(child.id()) else {
        return ExitCode::from(crate::exit::SOFTWARE);
    };
    let group = Pid::from_raw(pid);
    // Signals meant for the command go to its group, not here; SIGTTOU is blocked so that
    // the terminal can be handed over from this background group. Blocked only now: a
    // process inherits its parent's mask, and the command must start with none blocked
    // (nobody signals this process before it reports the group).
    let mut blocked = SigSet::empty();
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTTOU,
    ] {
        blocked.add(signal);
    }
    let _ = blocked.thread_block();
    // From here on the death watch is armed: it knows the group before it can see EOF.
    std::thread::spawn(move || watch(death, group));
    if let Some(pglock_group) = tty {
        hand_over_terminal(group, pglock_group);
    }
    let _ = writeln!(status, "started {pid}");
    let outcome = reap_all(group);
    if let Some(pglock_group) = tty {
        let _ = nix::unistd::tcsetpgrp(std::io::stdin(), pglock_group);
    }
    let _ = match outcome {
        Some(WaitStatus::Exited(_, code)) => writeln!(status, "done exit {code}"),
        Some(WaitStatus::Signaled(_, signal, _)) => {
            writeln!(status, "done signal {}", signal as i32)
        }
        _ => writeln!(status, "done unknown"),
    };
    ExitCode::SUCCESS
}

/// The inherited pipe end `fd` as a file of its own (through `/proc/self/fd`, which needs
/// no `unsafe`), with the inherited descriptor closed so the command does not get it.
fn reopen(fd: &OsStr, write: bool) -> std::io::Result<File> {
    let number: i32 = fd
        .to_str()
        .and_then(|fd| fd.parse().ok())
        .ok_or_else(|| std::io::Error::from(ErrorKind::InvalidInput))?;
    let file = File::options()
        .read(!write)
        .write(write)
        .open(format!("/proc/self/fd/{number}"))?;
    nix::unistd::close(number)?;
    Ok(file)
}

/// Blocks until pglock is gone (end-of-file on the death pipe), then SIGKILLs the group
/// and every descendant that left it, until none is left or [`REAP_BOUND`] has passed,
/// and exits. A byte N on the pipe is pglock forwarding signal N to the group: the
/// descendants that left the group get it from here.
fn watch(mut death: File, group: Pid) {
    let mut byte = [0_u8; 1];
    loop {
        match death.read(&mut byte) {
            Ok(0) => break,
            Ok(_) => {
                if let Ok(signal) = Signal::try_from(i32::from(byte[0])) {
                    crate::descendants::signal_escaped(group, signal);
                }
            }
            Err(error) if error.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = killpg(group, Signal::SIGKILL);
    // The main thread reaps the killed processes and exits when none is left; this
    // kills those that left the group (orphans are re-parented here, the subreaper) and
    // bounds the wait.
    let deadline = Instant::now() + REAP_BOUND;
    while Instant::now() < deadline {
        let left = crate::descendants::all();
        if left.is_empty() {
            break;
        }
        for descendant in left {
            let _ = kill(descendant.pid, Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::process::exit(i32::from(crate::exit::SOFTWARE));
}

/// Makes the command's group the terminal's foreground group (pglock's was), so that it
/// reads the terminal and gets ^C as it would without pglock; SIGCONT in case it tried to
/// read before the handover and was stopped.
fn hand_over_terminal(group: Pid, pglock_group: Pid) {
    let stdin = std::io::stdin();
    if nix::unistd::tcgetpgrp(&stdin) == Ok(pglock_group)
        && nix::unistd::tcsetpgrp(&stdin, group).is_ok()
    {
        let _ = killpg(group, Signal::SIGCONT);
    }
}

/// Reaps every descendant until none is left; the status of the command itself.
fn reap_all(command: Pid) -> Option<WaitStatus> {
    let mut outcome = None;
    loop {
        match waitpid(None, None) {
            Ok(status @ (WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _)))
                if pid == command =>
            {
                outcome = Some(status);
            }
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return outcome,
        }
    }
}
