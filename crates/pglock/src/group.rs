//! The command's process group, as pglock sees it: started through the supervisor
//! ([`crate::supervise`]), signalled as a whole, and finished only when no process of it
//! is left.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, PipeWriter, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::sync::mpsc;

use crate::exit::{CANNOT_EXECUTE, Failure, NOT_FOUND, SIGNAL_BASE, SOFTWARE};

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// It exited with this code.
    Exited(i32),
    /// It died of this signal number.
    Signaled(i32),
    /// The supervisor died before it could say (someone killed it): the group was killed.
    Unknown,
}

impl Status {
    /// The shell's exit code: the status, or 128+N for signal N.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Exited(code) => u8::try_from(code & 0xFF).unwrap_or(SOFTWARE),
            Self::Signaled(number) => SIGNAL_BASE.saturating_add(u8::try_from(number).unwrap_or(0)),
            Self::Unknown => SOFTWARE,
        }
    }
}

impl std::fmt::Display for Status {
    /// `exit 3`, `SIGTERM`, or `unknown status`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Exited(code) => write!(f, "exit {code}"),
            Self::Signaled(number) => match Signal::try_from(number) {
                Ok(signal) => write!(f, "{signal}"),
                Err(_) => write!(f, "signal {number}"),
            },
            Self::Unknown => f.write_str("unknown status"),
        }
    }
}

/// The running command: its process group, and the supervisor's reports.
#[derive(Debug)]
pub(crate) struct Group {
    pgid: Pid,
    reports: mpsc::UnboundedReceiver<String>,
    supervisor: std::process::Child,
    /// The status once the supervisor reported it: kept here so that a [`Group::wait`]
    /// dropped while it collects the supervisor's exit (a signal arrived) does not lose it.
    done: Option<Status>,
    /// The death pipe's only write end: closed when pglock dies, or after the end; a
    /// signal number written on it is forwarded to the descendants that left the group.
    death: PipeWriter,
}

impl Group {
    /// Starts `program` with `env` added, through the supervisor, and waits until it runs.
    pub(crate) async fn spawn(
        program: &[OsString],
        env: &[(&str, String)],
    ) -> Result<Self, Failure> {
        let software = |what: &str, error: &dyn std::fmt::Display| {
            Failure::new(SOFTWARE, format!("cannot {what}: {error}"))
        };
        let (death_read, death) = std::io::pipe().map_err(|e| software("make a pipe", &e))?;
        let (status_read, status_write) =
            std::io::pipe().map_err(|e| software("make a pipe", &e))?;
        // The supervisor inherits exactly these two ends; pglock's own stay close-on-exec.
        // pglock starts no other process meanwhile, so nothing else inherits them.
        for end in [death_read.as_fd(), status_write.as_fd()] {
            fcntl(end, FcntlArg::F_SETFD(FdFlag::empty()))
                .map_err(|e| software("pass a pipe to the supervisor", &e))?;
        }
        let tty = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            nix::unistd::getpgrp().to_string()
        } else {
            "-".to_owned()
        };
        let mut command = std::process::Command::new(own_executable());
        command
            .arg(crate::supervise::MODE)
            .arg(std::os::fd::AsRawFd::as_raw_fd(&death_read).to_string())
            .arg(std::os::fd::AsRawFd::as_raw_fd(&status_write).to_string())
            .arg(tty)
            .arg("--")
            .args(program)
            .arg0("pglock")
            .process_group(0);
        for (name, value) in env {
            command.env(name, value);
        }
        let supervisor = command
            .spawn()
            .map_err(|e| software("start the supervisor", &e))?;
        drop((death_read, status_write));
        let (sender, mut reports) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(status_read).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut group = Self {
            pgid: Pid::from_raw(0),
            reports: mpsc::unbounded_channel().1,
            supervisor,
            done: None,
            death,
        };
        let first = reports.recv().await;
        group.reports = reports;
        match first.as_deref().map(|line| line.split_once(' ')) {
            Some(Some(("started", pid))) => match pid.parse::<i32>() {
                Ok(pid) if pid > 0 => {
                    group.pgid = Pid::from_raw(pid);
                    Ok(group)
                }
                _ => Err(group.fail(&format!("a bad report: started {pid}"))),
            },
            Some(Some(("failed", reason))) => {
                let (kind, message) = reason.split_once(' ').unwrap_or((reason, ""));
                let code = if kind == "notfound" {
                    NOT_FOUND
                } else {
                    CANNOT_EXECUTE
                };
                let error = Failure::new(
                    code,
                    format!("cannot run {}: {message}", shown(&program[..1])),
                );
                group.reap_supervisor().await;
                Err(error)
            }
            _ => Err(group.fail("no report from the supervisor")),
        }
    }

    /// The group's id (the command's pid).
    pub(crate) fn pgid(&self) -> Pid {
        self.pgid
    }

    /// Sends `signal` to every process of the group, and through the supervisor to every
    /// descendant that left it, unless the group is known to be gone.
    pub(crate) fn signal(&self, signal: Signal) {
        // The group lives until the supervisor reports it empty, so the id is still its;
        // after that report the id may be reused, so nothing is sent.
        if self.done.is_none() {
            let _ = killpg(self.pgid, signal);
            // The supervisor sends it on to the processes that left the group; if it is
            // gone, so are they (it killed them when it saw pglock's end, or pglock's
            // SIGKILL of the group follows).
            let _ = (&self.death).write_all(&[signal as u8]);
        }
    }

    /// Waits until no process of the group is left; how the command ended.
    ///
    /// # Cancel safety
    /// Cancel safe: the status is kept once reported, so a wait dropped while it collects
    /// the supervisor's exit returns the same status when called again.
    pub(crate) async fn wait(&mut self) -> Status {
        if self.done.is_none() {
            self.done = Some(self.receive_status().await);
        }
        self.reap_supervisor().await;
        self.done.unwrap_or(Status::Unknown)
    }

    /// The supervisor's `done` report, or [`Status::Unknown`] (the group killed) if it
    /// died without one. Cancel safe: the channel's `recv` is, and a `done` line
    /// is returned in the same poll that takes it.
    async fn receive_status(&mut self) -> Status {
        loop {
            let Some(line) = self.reports.recv().await else {
                // The supervisor died without a word: make sure the group goes too.
                self.signal(Signal::SIGKILL);
                break Status::Unknown;
            };
            let mut words = line.split(' ');
            let (Some("done"), Some(how), Some(value)) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            break match (how, value.parse::<i32>()) {
                ("exit", Ok(code)) => Status::Exited(code),
                ("signal", Ok(number)) => Status::Signaled(number),
                _ => Status::Unknown,
            };
        }
    }

    /// A failure after the supervisor misbehaved: the group is killed.
    fn fail(&mut self, what: &str) -> Failure {
        let _ = self.supervisor.kill();
        let _ = self.supervisor.wait();
        Failure::new(SOFTWARE, format!("cannot run the command: {what}"))
    }

    /// Collects the supervisor's exit status (it exits right after its last report).
    async fn reap_supervisor(&mut self) {
        for _ in 0..200 {
            match self.supervisor.try_wait() {
                Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                Ok(Some(_)) | Err(_) => return,
            }
        }
    }
}

/// `program` for a message: its words joined with spaces, bytes that are not UTF-8 shown
/// as U+FFFD.
pub(crate) fn shown(program: &[OsString]) -> String {
    program
        .iter()
        .map(|word| word.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The path to re-execute pglock: `/proc/self/exe` on Linux (the running binary even if
/// an upgrade replaced the file), else what the standard library finds.
fn own_executable() -> std::path::PathBuf {
    let proc = std::path::Path::new("/proc/self/exe");
    if proc.exists() {
        return proc.to_owned();
    }
    std::env::current_exe().unwrap_or_else(|_| "pglock".into())
}
