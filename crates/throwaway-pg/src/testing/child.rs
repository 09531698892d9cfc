//! Child processes of a test binary, for tests where something must happen in another
//! process (a process that dies holding a lock, a fleet of instances).
//!
//! Integration tests cannot run example binaries, so the test binary re-executes itself:
//! [`Child::spawn`] starts its own executable (`/proc/self/exe`, else
//! `std::env::current_exe()`) with `--exact {test} --nocapture --test-threads=1`, where
//! `{test}` is a test whose body is [`entry`]. In that process libtest runs only that test,
//! which finds its role in the environment, plays it and leaves with `std::process::exit`
//! (so nothing is dropped: a lock still held is freed only because the process's
//! connections close). In a normal test run the role is not set and the test passes at
//! once.
//!
//! The parent passes its own database URL in `LOCKS_DATABASE_URL`, so every child talks
//! to the same server. Parent and child talk over the child's stdin (one command a line:
//! [`Child::send`], [`command`]) and stdout (messages after `CHILD:`: [`say`],
//! [`Child::expect`]; libtest's own output is skipped). The child's stderr is inherited,
//! so its panics show in the test output.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::mpsc;

/// What starts a message on a child's stdout.
const PREFIX: &str = "CHILD:";

/// How long the parent waits for any one message of a child (a liveness bound).
pub const ANSWER: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// The child side.

/// The body of a test binary's child entry test: when the environment variable `role`
/// is set, plays it with `play` on a two-thread runtime and exits the process with 0;
/// otherwise (a normal test run) returns at once.
pub fn entry(role: &str, play: impl FnOnce(&str, &Runtime)) {
    let Ok(value) = std::env::var(role) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("child runtime");
    play(&value, &runtime);
    std::process::exit(0);
}

/// Says `message` to the parent.
pub fn say(message: &str) {
    println!("{PREFIX}{message}");
    std::io::stdout().flush().expect("child stdout");
}

/// The next command from the parent; `None` at end of input.
#[must_use]
pub fn command() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim().to_owned()),
    }
}

/// The environment variable `name`, which the parent must have set.
#[must_use]
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}

// ---------------------------------------------------------------------------------
// The parent side.

/// A child process of this test binary; killed and reaped on drop.
#[derive(Debug)]
pub struct Child {
    name: String,
    process: std::process::Child,
    stdin: Option<ChildStdin>,
    messages: mpsc::UnboundedReceiver<String>,
}

impl Child {
    /// Starts this test binary running only the test `test` (its path, such as
    /// `processes::child_entry`), with `vars` (the role among them) and the test server's
    /// URL in its environment. `name` is how failures name it.
    pub fn spawn<K, V>(
        name: impl Into<String>,
        test: &str,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self
    where
        K: AsRef<std::ffi::OsStr>,
        V: AsRef<std::ffi::OsStr>,
    {
        let mut command = Command::new(this_test_binary());
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("LOCKS_DATABASE_URL", super::database_url())
            .envs(vars)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut process = command.spawn().expect("spawn a child test process");
        let stdout = process.stdout.take().expect("piped stdout");
        let (sender, messages) = mpsc::unbounded_channel();
        read_messages(stdout, move |message| sender.send(message).is_ok());
        Self {
            name: name.into(),
            stdin: process.stdin.take(),
            process,
            messages,
        }
    }

    /// Waits for the child's next message, which must start with `word`; returns the rest
    /// of it, trimmed.
    pub async fn expect(&mut self, word: &str) -> String {
        let message = tokio::time::timeout(ANSWER, self.messages.recv())
            .await
            .unwrap_or_else(|_| panic!("{}: no {word:?} within {ANSWER:?}", self.name));
        let Some(message) = message else {
            let status = self.process.wait().expect("reap the child");
            panic!("{} exited ({status}) before saying {word:?}", self.name);
        };
        message
            .strip_prefix(word)
            .unwrap_or_else(|| panic!("{} said {message:?}, expected {word:?}", self.name))
            .trim()
            .to_owned()
    }

    /// The child's next message, whatever it is.
    pub async fn next(&mut self) -> String {
        tokio::time::timeout(ANSWER, self.messages.recv())
            .await
            .unwrap_or_else(|_| panic!("{}: silent for {ANSWER:?}", self.name))
            .unwrap_or_else(|| panic!("{} exited", self.name))
    }

    /// Every message the child still had to say, once it is gone (killed).
    pub async fn rest(&mut self) -> Vec<String> {
        let mut rest = Vec::new();
        while let Ok(Some(message)) = tokio::time::timeout(ANSWER, self.messages.recv()).await {
            rest.push(message);
        }
        rest
    }

    /// Sends the child one command line.
    pub fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{command}").expect("write to the child");
        stdin.flush().expect("flush to the child");
    }

    /// Waits (polling, so no runtime thread blocks) for the child to exit.
    pub async fn exit_status(&mut self) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.process.try_wait().expect("child status") {
                return status;
            }
            assert!(
                started.elapsed() < ANSWER,
                "{} did not exit within {ANSWER:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL (what `std::process::Child::kill` sends on Unix) and reap.
    pub fn kill(&mut self) {
        self.process.kill().expect("kill the child");
        self.process.wait().expect("reap the child");
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Reads a child's stdout on a thread of its own, handing each message (what follows
/// [`PREFIX`] on a line) to `deliver` until it answers `false` or the output ends.
pub(super) fn read_messages(
    stdout: std::process::ChildStdout,
    mut deliver: impl FnMut(String) -> bool + Send + 'static,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints `test processes::child_entry ... ` without a newline before
            // the test runs, so the first message shares its line.
            if let Some((_, message)) = line.split_once(PREFIX)
                && !deliver(message.to_owned())
            {
                return;
            }
        }
    });
}

/// The running test binary. Other builds in a shared target directory can replace the
/// file while the tests run; on Linux `/proc/self/exe` still names the running image, so
/// prefer it.
fn this_test_binary() -> PathBuf {
    let running = Path::new("/proc/self/exe");
    if running.exists() {
        running.to_owned()
    } else {
        std::env::current_exe().expect("the test binary's path")
    }
}
