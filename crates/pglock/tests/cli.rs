//! `pglock` as a user runs it: the built binary in real processes, on real PostgreSQL
//! (`LOCKS_DATABASE_URL`, or a throwaway cluster started for this test process).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use locks_postgres::tokio_postgres::{self, NoTls};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Generous bound for things that happen "at once" on a loaded machine.
const SOON: Duration = Duration::from_secs(30);

fn database_url() -> String {
    throwaway_pg::database_url().unwrap_or_else(|error| {
        panic!("no PostgreSQL for the tests: set LOCKS_DATABASE_URL or install PostgreSQL: {error}")
    })
}

/// `pglock --url <test server>`, with no connection settings from the environment.
fn pglock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pglock"));
    for name in [
        "DATABASE_URL",
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "PGAPPNAME",
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGCONNECT_TIMEOUT",
        "PGPASSFILE",
    ] {
        command.env_remove(name);
    }
    command
        .arg("--url")
        .arg(database_url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn output(command: &mut Command) -> Output {
    tokio::time::timeout(SOON, command.output())
        .await
        .expect("pglock finished in time")
        .expect("pglock ran")
}

fn code(output: &Output) -> i32 {
    output
        .status
        .code()
        .unwrap_or_else(|| panic!("no exit code: {output:?}"))
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A key and a scratch folder no other test uses.
fn unique(name: &str) -> (String, PathBuf) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let tag = format!(
        "{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(format!("pglock-test-{name}-{tag}"));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    (format!("pglock-test:{name}:{tag}"), dir)
}

async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("admin connection");
    tokio::spawn(connection);
    client
}

/// `(pid, granted)` of every session holding or waiting for the advisory lock `lock_id`.
async fn lock_rows(admin: &tokio_postgres::Client, lock_id: i64) -> Vec<(i32, bool)> {
    let bits = u64::from_be_bytes(lock_id.to_be_bytes());
    let high = i64::try_from(bits >> 32).expect("32 bits");
    let low = i64::try_from(bits & 0xFFFF_FFFF).expect("32 bits");
    admin
        .query(
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid::bigint = $1 AND objid::bigint = $2 ORDER BY granted DESC, pid",
            &[&high, &low],
        )
        .await
        .expect("pg_locks")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// A plain session (as a Python eventsource process would be) holding `lock_id`, and its pid.
async fn foreign_holder(lock_id: i64) -> (tokio_postgres::Client, i32) {
    let foreign = admin().await;
    foreign
        .execute("SELECT pg_advisory_lock($1)", &[&lock_id])
        .await
        .expect("foreign lock");
    let pid: i32 = foreign
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pid")
        .get(0);
    (foreign, pid)
}

async fn release_foreign(foreign: &tokio_postgres::Client, lock_id: i64) {
    foreign
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_id])
        .await
        .expect("foreign unlock");
}

/// A plain session holding the lock on `key`, its pid, and `pglock run KEY -- true` waiting
/// in the server's queue behind it.
async fn held_and_awaited(key: &str) -> (tokio_postgres::Client, i32, Child) {
    let lock_id = locks_port::lock_id(key);
    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    let waiter = pglock()
        .args(["run", key, "--", "true"])
        .spawn()
        .expect("spawn");
    wait_for_a_waiter(&admin().await, lock_id).await;
    (foreign, foreign_pid, waiter)
}

/// Waits until some session waits in the server's queue for `lock_id`.
async fn wait_for_a_waiter(observer: &tokio_postgres::Client, lock_id: i64) {
    eventually("a session waiting in the server's queue", || async {
        lock_rows(observer, lock_id)
            .await
            .iter()
            .any(|(_, granted)| !granted)
    })
    .await;
}

/// Polls `check` until it is true, failing after [`SOON`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + SOON;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_file(path: &Path) {
    eventually(&format!("{}", path.display()), || async { path.exists() }).await;
}

async fn finish(child: Child) -> Output {
    tokio::time::timeout(SOON, child.wait_with_output())
        .await
        .expect("pglock finished in time")
        .expect("pglock ran")
}

fn signal(child: &Child, signal: Signal) {
    let pid = i32::try_from(child.id().expect("running")).expect("pid");
    kill(Pid::from_raw(pid), signal).expect("signal sent");
}

#[tokio::test]
async fn success_and_the_commands_status_pass_through() {
    let (key, _dir) = unique("status");
    let done = output(pglock().args(["run", &key, "--", "true"])).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));

    let failed = output(pglock().args(["run", &key, "-c", "exit 3"])).await;
    assert_eq!(code(&failed), 3, "{}", stderr(&failed));
    let killed = output(pglock().args(["run", &key, "--", "sh", "-c", "kill -9 $$"])).await;
    assert_eq!(code(&killed), 128 + 9, "{}", stderr(&killed));

    let shown =
        output(pglock().args(["run", &key, "-c", "echo \"$PGLOCK_KEY $PGLOCK_LOCK_ID\""])).await;
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let lock_id = locks_port::lock_id(&key);
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        format!("{key} {lock_id}")
    );

    let missing = output(pglock().args(["run", &key, "--", "/nonexistent/command"])).await;
    assert_eq!(code(&missing), 127, "{}", stderr(&missing));

    let admin = admin().await;
    assert_eq!(
        lock_rows(&admin, lock_id).await,
        [],
        "released after each run"
    );
}

#[tokio::test]
async fn a_foreign_session_keeps_it_out_and_a_conflict_exits_with_the_e_code() {
    let (key, dir) = unique("conflict");
    let lock_id = locks_port::lock_id(&key);
    // Any plain session holding the same id, as a Python eventsource process would.
    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    let ran = dir.join("ran");
    let ran_text = ran.display().to_string();

    let busy = output(pglock().args(["run", "-n", &key, "--", "touch", &ran_text])).await;
    assert_eq!(code(&busy), 1, "{}", stderr(&busy));
    assert!(
        stderr(&busy).contains(&format!("held by pid {foreign_pid}")),
        "{}",
        stderr(&busy)
    );
    assert_eq!(stderr(&busy).lines().count(), 1, "{}", stderr(&busy));

    let custom =
        output(pglock().args(["run", "-n", "-E", "9", &key, "--", "touch", &ran_text])).await;
    assert_eq!(code(&custom), 9, "{}", stderr(&custom));

    let started = Instant::now();
    let timed_out =
        output(pglock().args(["run", "-w", "300ms", &key, "--", "touch", &ran_text])).await;
    assert_eq!(code(&timed_out), 1, "{}", stderr(&timed_out));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        stderr(&timed_out).contains("timed out after"),
        "{}",
        stderr(&timed_out)
    );
    assert!(!ran.exists(), "the command ran without the lock");

    release_foreign(&foreign, lock_id).await;
    let free = output(pglock().args(["run", "-n", &key, "--", "touch", &ran_text])).await;
    assert_eq!(code(&free), 0, "{}", stderr(&free));
    assert!(ran.exists());
}

#[tokio::test]
async fn bad_usage_exits_64_and_help_exits_0() {
    for args in [
        &["run", "k"][..],
        &["run", "k", "-w", "soon", "--", "true"][..],
        &["run", "k", "-n", "-w", "1s", "--", "true"][..],
        &["run", "k", "-c", "true", "--", "true"][..],
        &["run", "k", "--on-lost", "shrug", "--", "true"][..],
        &["frobnicate"][..],
        &["run", "k", "--lease", "5s", "--", "true"][..],
        &[
            "run",
            "k",
            "--keepalive",
            "0",
            "--lease",
            "60s",
            "--",
            "true",
        ][..],
    ] {
        let refused = output(pglock().args(args)).await;
        assert_eq!(code(&refused), 64, "{args:?}: {}", stderr(&refused));
    }
    let short = output(pglock().args(["run", "k", "--lease", "5s", "--", "true"])).await;
    let said = stderr(&short);
    assert!(
        said.contains("--lease: a lease of 5s is too short"),
        "{said}"
    );
    let help = output(pglock().args(["run", "--help"])).await;
    assert_eq!(code(&help), 0);
    let text = String::from_utf8_lossy(&help.stdout);
    for documented in [
        "Exit codes:",
        "75",
        "64",
        "69",
        "77",
        "78",
        "--on-lost",
        "--fencing",
        "--lease",
    ] {
        assert!(text.contains(documented), "--help lacks {documented}");
    }
}

#[tokio::test]
async fn an_unreachable_server_and_an_unknown_database_have_their_own_codes() {
    let (key, _dir) = unique("unreachable");
    // Nothing listens on port 1 of the loopback: the connection is refused at once.
    let refused = output(
        pglock()
            .args(["--url", "postgres://postgres@127.0.0.1:1/postgres"])
            .args(["run", &key, "--", "true"]),
    )
    .await;
    assert_eq!(code(&refused), 69, "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(
        message.starts_with("pglock: cannot connect to postgres@127.0.0.1:1/postgres"),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1, "{message}");

    let url = database_url();
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    let unknown = output(
        pglock()
            .args(["--url", &format!("{base}/no_such_database_here")])
            .args(["run", &key, "--", "true"]),
    )
    .await;
    assert_eq!(code(&unknown), 78, "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("no_such_database_here"),
        "{}",
        stderr(&unknown)
    );

    let secret = output(
        pglock()
            .args(["--url", "postgres://someone:hunter2@127.0.0.1:1/postgres"])
            .args(["who", &key]),
    )
    .await;
    assert_eq!(code(&secret), 69, "{}", stderr(&secret));
    assert!(!stderr(&secret).contains("hunter2"), "{}", stderr(&secret));
}

#[tokio::test]
async fn runs_on_one_key_take_turns() {
    let (key, dir) = unique("turns");
    let mut children = Vec::new();
    for index in 0..3 {
        let file = dir.join(format!("run-{index}"));
        let script = format!(
            "date +%s%N > {file}; sleep 0.3; date +%s%N >> {file}",
            file = file.display()
        );
        children.push(
            pglock()
                .args(["run", &key, "-c", &script])
                .spawn()
                .expect("spawn"),
        );
    }
    for child in children {
        let done = finish(child).await;
        assert_eq!(code(&done), 0, "{}", stderr(&done));
    }
    let mut spans: Vec<(u128, u128)> = (0..3)
        .map(|index| {
            let text = std::fs::read_to_string(dir.join(format!("run-{index}"))).expect("times");
            let times: Vec<u128> = text.lines().map(|line| line.parse().expect("ns")).collect();
            assert_eq!(times.len(), 2, "{text}");
            (times[0], times[1])
        })
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two commands overlapped: {spans:?}");
    }
}

#[tokio::test]
async fn sigterm_to_pglock_reaches_the_command() {
    let (key, dir) = unique("sigterm");
    let ready = dir.join("ready");
    let got = dir.join("got");
    let script = format!(
        "trap 'echo TERM > {got}; exit 7' TERM; touch {ready}; while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let child = pglock()
        .args(["run", &key, "-c", &script])
        .spawn()
        .expect("spawn");
    wait_for_file(&ready).await;
    signal(&child, Signal::SIGTERM);
    let done = finish(child).await;
    assert_eq!(code(&done), 7, "the command's status: {}", stderr(&done));
    assert_eq!(
        std::fs::read_to_string(&got).expect("trap ran").trim(),
        "TERM"
    );
    let admin = admin().await;
    assert_eq!(lock_rows(&admin, locks_port::lock_id(&key)).await, []);
}

#[tokio::test]
async fn sigint_while_waiting_leaves_nothing_held_and_exits_130() {
    let (key, dir) = unique("sigint");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, _) = foreign_holder(lock_id).await;
    let ran = dir.join("ran");
    let child = pglock()
        .args(["run", &key, "--", "touch"])
        .arg(&ran)
        .spawn()
        .expect("spawn");
    let observer = admin().await;
    wait_for_a_waiter(&observer, lock_id).await;
    signal(&child, Signal::SIGINT);
    let done = finish(child).await;
    assert_eq!(code(&done), 130, "{}", stderr(&done));
    // Only the foreign holder is left: pglock's wait left the queue before it exited.
    let rows = lock_rows(&observer, lock_id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].1, "{rows:?}");
    release_foreign(&foreign, lock_id).await;
    assert_eq!(lock_rows(&observer, lock_id).await, []);
    assert!(
        !ran.exists(),
        "the command ran after the wait was cancelled"
    );
}

#[tokio::test]
async fn who_list_and_id_show_the_lock() {
    let (key, _dir) = unique("who");
    let lock_id = locks_port::lock_id(&key);
    let id = output(pglock().args(["--url", "postgres://nobody@127.0.0.1:1/x", "id", &key])).await;
    assert_eq!(code(&id), 0, "no database needed: {}", stderr(&id));
    assert_eq!(
        String::from_utf8_lossy(&id.stdout).trim(),
        lock_id.to_string()
    );

    let nobody = output(pglock().args(["who", &key])).await;
    assert_eq!(code(&nobody), 0, "{}", stderr(&nobody));
    assert!(String::from_utf8_lossy(&nobody.stdout).starts_with("nobody holds"));

    let (foreign, foreign_pid, waiter) = held_and_awaited(&key).await;

    let who = output(pglock().args(["who", &key])).await;
    assert_eq!(code(&who), 0, "{}", stderr(&who));
    let text = String::from_utf8_lossy(&who.stdout).into_owned();
    let holder = text
        .lines()
        .find(|line| line.starts_with("holds"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(holder.contains(&format!(" {foreign_pid} ")), "{text}");
    assert!(holder.contains("exclusive"), "{text}");
    let waiting = text
        .lines()
        .find(|line| line.starts_with("waits"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        waiting.contains("locks:pglock@"),
        "pglock's holder id: {text}"
    );

    let list = output(pglock().arg("list")).await;
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with(&lock_id.to_string())
                && line.contains(&foreign_pid.to_string())),
        "{listed}"
    );

    release_foreign(&foreign, lock_id).await;
    let done = finish(waiter).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
}

#[tokio::test]
async fn shared_lets_readers_in_together_and_keeps_a_writer_out() {
    let (key, dir) = unique("shared");
    let lock_id = locks_port::lock_id(&key);
    let first_in = dir.join("first-in");
    let go = dir.join("go");
    let script = format!(
        "touch {first_in}; while [ ! -e {go} ]; do sleep 0.05; done",
        first_in = first_in.display(),
        go = go.display()
    );
    let reader = pglock()
        .args(["run", "-s", &key, "-c", &script])
        .spawn()
        .expect("spawn");
    wait_for_file(&first_in).await;

    let second_in = dir.join("second-in");
    let second = output(
        pglock()
            .args(["run", "-s", "-n", &key, "--", "touch"])
            .arg(&second_in),
    )
    .await;
    assert_eq!(code(&second), 0, "a second reader: {}", stderr(&second));
    assert!(second_in.exists());

    let writer_in = dir.join("writer-in");
    let writer = output(
        pglock()
            .args(["run", "-n", &key, "--", "touch"])
            .arg(&writer_in),
    )
    .await;
    assert_eq!(
        code(&writer),
        1,
        "a writer beside a reader: {}",
        stderr(&writer)
    );
    assert!(!writer_in.exists());
    let timed = output(
        pglock()
            .args(["run", "-x", "-w", "200ms", &key, "--", "touch"])
            .arg(&writer_in),
    )
    .await;
    assert_eq!(code(&timed), 1, "{}", stderr(&timed));
    assert!(!writer_in.exists());

    std::fs::write(&go, "").expect("go");
    let done = finish(reader).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    let admin = admin().await;
    assert_eq!(lock_rows(&admin, lock_id).await, []);
    let writer = output(
        pglock()
            .args(["run", "-n", &key, "--", "touch"])
            .arg(&writer_in),
    )
    .await;
    assert_eq!(
        code(&writer),
        0,
        "the writer once the readers left: {}",
        stderr(&writer)
    );
}

/// Runs `script` under the lock on `key` with `options`, waits for it to write its pid to
/// `ready`, terminates the lock's session from outside, and returns pglock's output and
/// the command's pid.
async fn lose_the_lock(key: &str, ready: &Path, options: &[&str], script: &str) -> (Output, i32) {
    let lock_id = locks_port::lock_id(key);
    let child = pglock()
        .arg("run")
        .args(options)
        .args([key, "-c", script])
        .spawn()
        .expect("spawn");
    wait_for_file(ready).await;
    eventually("the pid in the ready file", || async {
        std::fs::read_to_string(ready).is_ok_and(|text| text.trim().parse::<i32>().is_ok())
    })
    .await;
    let command_pid: i32 = std::fs::read_to_string(ready)
        .expect("ready")
        .trim()
        .parse()
        .expect("pid");
    let admin = admin().await;
    let rows = lock_rows(&admin, lock_id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&rows[0].0])
        .await
        .expect("pg_terminate_backend")
        .get(0);
    assert!(terminated);
    (finish(child).await, command_pid)
}

fn gone(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None) == Err(nix::errno::Errno::ESRCH)
}

#[tokio::test]
async fn a_terminated_session_stops_the_command_and_exits_75() {
    let (key, dir) = unique("lost-term");
    let ready = dir.join("ready");
    let got = dir.join("got");
    let script = format!(
        "trap 'echo TERM > {got}; exit 0' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; \
         while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let started = Instant::now();
    let (done, command_pid) = lose_the_lock(&key, &ready, &["--keepalive", "1s"], &script).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(stderr(&done).contains("lost"), "{}", stderr(&done));
    assert_eq!(
        std::fs::read_to_string(&got)
            .expect("SIGTERM reached the command")
            .trim(),
        "TERM"
    );
    assert!(gone(command_pid), "the command still runs");
    // Well within the 30 s a sleeping command would otherwise have run.
    assert!(started.elapsed() < SOON);
}

#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
    let (key, dir) = unique("lost-grace");
    let ready = dir.join("ready");
    let script = format!(
        "trap '' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; while :; do sleep 0.05; done",
        ready = ready.display()
    );
    let (done, command_pid) = lose_the_lock(&key, &ready, &["--grace", "500ms"], &script).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(gone(command_pid), "the command outlived SIGKILL");
}

#[tokio::test]
async fn on_lost_ignore_lets_the_command_finish_and_still_exits_75() {
    let (key, dir) = unique("lost-ignore");
    let ready = dir.join("ready");
    let finished = dir.join("finished");
    let script = format!(
        "echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; sleep 1; touch {finished}; exit 0",
        ready = ready.display(),
        finished = finished.display()
    );
    let (done, _) = lose_the_lock(&key, &ready, &["--on-lost", "ignore"], &script).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(finished.exists(), "the command was stopped");
}

#[tokio::test]
async fn fencing_tokens_grow_with_every_grant() {
    let (key, _dir) = unique("fencing");
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let run = output(pglock().args([
            "run",
            "--fencing",
            &key,
            "-c",
            "echo \"$PGLOCK_FENCING_TOKEN\"",
        ]))
        .await;
        assert_eq!(code(&run), 0, "{}", stderr(&run));
        let token: i64 = String::from_utf8_lossy(&run.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("a token: {run:?}"));
        tokens.push(token);
    }
    assert!(tokens[0] >= 1 && tokens[1] > tokens[0], "{tokens:?}");
    let plain =
        output(pglock().args(["run", &key, "-c", "echo \"${PGLOCK_FENCING_TOKEN-unset}\""])).await;
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim(), "unset");
}

/// The two-word phrases that occur more than once in `line` (case and punctuation ignored).
fn repeated_phrases(line: &str) -> Vec<String> {
    let words: Vec<String> = line
        .split(|c: char| c.is_whitespace() || matches!(c, ':' | ',' | '(' | ')' | '`' | '"'))
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
        .collect();
    let pairs: Vec<String> = words.windows(2).map(|pair| pair.join(" ")).collect();
    let mut repeated: Vec<String> = pairs
        .iter()
        .enumerate()
        .filter(|(index, pair)| pairs[..*index].contains(pair))
        .map(|(_, pair)| pair.clone())
        .collect();
    repeated.dedup();
    repeated
}

#[test]
fn the_phrase_check_catches_a_cause_said_twice() {
    assert_eq!(
        repeated_phrases(
            "pglock: invalid connection string: invalid connection string: invalid value"
        ),
        ["invalid connection", "connection string", "string invalid"]
    );
    assert!(repeated_phrases("pglock: cannot connect to a@h:1/d: Connection refused").is_empty());
}

#[tokio::test]
async fn error_lines_say_each_cause_once() {
    let (key, _dir) = unique("error-text");
    let url = database_url();
    let (base, _) = url.rsplit_once('/').expect("a URL with a database");
    let cases: [(&str, String, &str, i32); 8] = [
        (
            "bad port",
            "postgres://a@127.0.0.1:notaport/d".into(),
            "port",
            78,
        ),
        (
            "port out of range",
            "host=127.0.0.1 port=99999".into(),
            "port",
            78,
        ),
        (
            "unknown option",
            "postgres://a@127.0.0.1/d?frob=1".into(),
            "frob",
            78,
        ),
        (
            "bad connect_timeout",
            "host=127.0.0.1 connect_timeout=x".into(),
            "connect_timeout",
            78,
        ),
        (
            "bad sslmode",
            "postgres://a@127.0.0.1/d?sslmode=sometimes".into(),
            "sometimes",
            78,
        ),
        (
            "unterminated quote",
            "host=127.0.0.1 user='open".into(),
            "key=value",
            78,
        ),
        (
            "unreachable host",
            "postgres://a@127.0.0.1:1/d".into(),
            "refused",
            69,
        ),
        (
            "unknown database",
            format!("{base}/no_such_database_here"),
            "no_such_database_here",
            78,
        ),
    ];
    for (what, url, named, expected) in cases {
        let failed = output(pglock().args(["--url", &url, "who", &key])).await;
        let said = stderr(&failed);
        assert_eq!(code(&failed), expected, "{what}: {said}");
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line: {said}");
        assert!(lines[0].starts_with("pglock: "), "{what}: {said}");
        assert!(lines[0].contains(named), "{what}: names {named}: {said}");
        let repeated = repeated_phrases(lines[0]);
        assert!(
            repeated.is_empty(),
            "{what}: {repeated:?} said twice in: {said}"
        );
    }
}

/// Stdout parsed as one JSON document.
fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "not one JSON document ({error}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

#[tokio::test]
async fn who_and_list_json_parse_back_to_the_holder_and_the_waiter() {
    let (key, _dir) = unique("json");
    let lock_id = locks_port::lock_id(&key);
    let nobody = output(pglock().args(["who", &key, "--json"])).await;
    assert_eq!(code(&nobody), 0, "{}", stderr(&nobody));
    let document = json(&nobody);
    assert_eq!(document["key"], key.as_str());
    assert_eq!(document["lock_id"], lock_id);
    assert_eq!(document["sessions"], serde_json::json!([]));

    let (foreign, foreign_pid, waiter) = held_and_awaited(&key).await;

    let who = output(pglock().args(["who", "--json", &key])).await;
    assert_eq!(code(&who), 0, "{}", stderr(&who));
    let document = json(&who);
    let sessions = document["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 2, "{document:#}");
    let holder = &sessions[0];
    assert_eq!(holder["state"], "holds", "{document:#}");
    assert_eq!(holder["granted"], true);
    assert_eq!(holder["pid"], foreign_pid);
    assert_eq!(holder["mode"], "exclusive");
    assert_eq!(holder["lock"], lock_id.to_string());
    assert_eq!(holder["lock_id"], lock_id);
    assert!(
        holder["holder_id"].is_null(),
        "a plain session: {document:#}"
    );
    let since = holder["since"].as_str().expect("since");
    assert!(
        since.len() == 20 && since.as_bytes()[10] == b'T' && since.ends_with('Z'),
        "RFC 3339: {since}"
    );
    assert!(holder["seconds"].as_f64().expect("seconds") >= 0.0);
    let waiting = &sessions[1];
    assert_eq!(waiting["state"], "waits", "{document:#}");
    assert_eq!(waiting["granted"], false);
    let holder_id = waiting["holder_id"].as_str().expect("pglock's holder id");
    assert!(holder_id.starts_with("pglock@"), "{document:#}");
    assert_eq!(
        waiting["application_name"],
        format!("locks:{holder_id}").as_str()
    );

    let list = output(pglock().args(["list", "--json"])).await;
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    let listed = json(&list);
    let ours: Vec<&serde_json::Value> = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter(|session| session["lock_id"] == lock_id)
        .collect();
    assert_eq!(ours.len(), 2, "{listed:#}");
    assert_eq!(ours[0]["pid"], foreign_pid);

    release_foreign(&foreign, lock_id).await;
    let done = finish(waiter).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
}

/// Whether the session `pid` still exists.
async fn session_exists(admin: &tokio_postgres::Client, pid: i32) -> bool {
    !admin
        .query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .expect("pg_stat_activity")
        .is_empty()
}

#[tokio::test]
async fn break_terminates_the_holder_and_leaves_the_waiter_alone() {
    let (key, _dir) = unique("break");
    let lock_id = locks_port::lock_id(&key);
    let free = output(pglock().args(["break", "--yes", &key])).await;
    assert_eq!(code(&free), 0, "{}", stderr(&free));
    assert!(
        String::from_utf8_lossy(&free.stdout).contains("nothing to break"),
        "{free:?}"
    );

    let (foreign, foreign_pid, waiter) = held_and_awaited(&key).await;
    let broken = output(pglock().args(["break", "--yes", &key])).await;
    assert_eq!(code(&broken), 0, "{}", stderr(&broken));
    let said = String::from_utf8_lossy(&broken.stdout).into_owned();
    let shown = said
        .lines()
        .find(|line| line.starts_with("holds"))
        .unwrap_or_else(|| panic!("the holder is shown: {said}"));
    assert!(shown.contains(&format!(" {foreign_pid} ")), "{said}");
    assert!(
        said.contains(&format!("terminated pid {foreign_pid}")),
        "{said}"
    );
    assert!(said.contains("1 waiting session(s) left alone"), "{said}");

    let admin = admin().await;
    assert!(!session_exists(&admin, foreign_pid).await);
    assert!(
        foreign.simple_query("SELECT 1").await.is_err(),
        "the holder's session is gone"
    );
    // The waiter was not touched: it got the lock and ran its command.
    let done = finish(waiter).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    assert_eq!(lock_rows(&admin, lock_id).await, [], "the lock is free");
}

#[tokio::test]
async fn break_with_waiters_ends_the_waiting_sessions_too() {
    let (key, _dir) = unique("break-waiters");
    let lock_id = locks_port::lock_id(&key);
    let (_foreign, foreign_pid, waiter) = held_and_awaited(&key).await;
    let broken = output(pglock().args(["break", "--yes", "--waiters", &key])).await;
    assert_eq!(code(&broken), 0, "{}", stderr(&broken));
    let said = String::from_utf8_lossy(&broken.stdout).into_owned();
    assert_eq!(said.matches("terminated pid").count(), 2, "{said}");
    let done = finish(waiter).await;
    assert_eq!(
        code(&done),
        69,
        "the waiter's session broke: {}",
        stderr(&done)
    );
    let admin = admin().await;
    assert!(!session_exists(&admin, foreign_pid).await);
    assert_eq!(lock_rows(&admin, lock_id).await, []);
}

#[tokio::test]
async fn break_without_a_terminal_or_yes_is_refused_and_ends_nothing() {
    let (key, _dir) = unique("break-notty");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    let refused = output(pglock().args(["break", &key])).await;
    assert_eq!(code(&refused), 64, "{}", stderr(&refused));
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    let admin = admin().await;
    assert_eq!(lock_rows(&admin, lock_id).await, [(foreign_pid, true)]);
    release_foreign(&foreign, lock_id).await;
}

/// `pglock break KEY` with a pseudo-terminal as stdin, answering `answer`.
async fn break_answering(key: &str, answer: &str) -> Output {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    use std::io::Write;
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(name.to_str().expect("a UTF-8 name"))
        .expect("the terminal");
    let mut master = std::fs::File::from(master);
    master
        .write_all(format!("{answer}\n").as_bytes())
        .expect("answered");
    let done = output(pglock().args(["break", key]).stdin(terminal)).await;
    drop(master);
    done
}

#[tokio::test]
async fn break_asks_on_a_terminal_and_only_yes_ends_the_session() {
    let (key, _dir) = unique("break-ask");
    let lock_id = locks_port::lock_id(&key);
    let (_foreign, foreign_pid) = foreign_holder(lock_id).await;
    let admin = admin().await;

    let declined = break_answering(&key, "n").await;
    assert_eq!(code(&declined), 1, "{}", stderr(&declined));
    assert!(
        stderr(&declined).contains("terminate this session? [y/N]"),
        "{}",
        stderr(&declined)
    );
    assert_eq!(lock_rows(&admin, lock_id).await, [(foreign_pid, true)]);

    let accepted = break_answering(&key, "yes").await;
    assert_eq!(code(&accepted), 0, "{}", stderr(&accepted));
    assert!(!session_exists(&admin, foreign_pid).await);
    assert_eq!(lock_rows(&admin, lock_id).await, []);
}

#[tokio::test]
async fn break_without_the_privilege_exits_77_and_ends_nothing() {
    use std::str::FromStr;
    let (key, _dir) = unique("break-noperm");
    let lock_id = locks_port::lock_id(&key);
    // The holder is a superuser session; the breaker an ordinary role.
    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    let admin = admin().await;
    let superuser: bool = admin
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .expect("rolsuper")
        .get(0);
    assert!(superuser, "the test server's role must be a superuser");
    let role = format!("pglock_breaker_{}", std::process::id());
    let password = "breaker-secret";
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD '{password}'"
        ))
        .await
        .expect("a role without privileges");
    let config = tokio_postgres::Config::from_str(&database_url()).expect("the test URL");
    let host = match config.get_hosts().first().expect("a host") {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let dbname = config.get_dbname().unwrap_or("postgres");
    let url = format!("host={host} port={port} dbname={dbname} user={role} password={password}");

    let refused = output(pglock().args(["--url", &url, "break", "--yes", &key])).await;
    let said = stderr(&refused);
    assert_eq!(code(&refused), 77, "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.starts_with(&format!("pglock: cannot end pid {foreign_pid}: ")),
        "{said}"
    );
    // The server's words vary by version ("must be a superuser to terminate superuser
    // process", "permission denied to terminate process"); the code is what scripts see.
    assert!(!said.contains(password), "{said}");
    assert_eq!(lock_rows(&admin, lock_id).await, [(foreign_pid, true)]);

    release_foreign(&foreign, lock_id).await;
    drop(foreign);
    admin
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .expect("drop the role");
}

#[tokio::test]
async fn completions_and_man_pages_know_every_command() {
    // Options by name: fish spells them `-l json`, the others `--json`.
    for shell in ["bash", "zsh", "fish"] {
        let done = output(pglock().args(["completions", shell])).await;
        assert_eq!(code(&done), 0, "{shell}: {}", stderr(&done));
        let script = String::from_utf8_lossy(&done.stdout).into_owned();
        for word in [
            "run",
            "who",
            "list",
            "break",
            "id",
            "json",
            "waiters",
            "yes",
            "on-lost",
            "connect-timeout",
        ] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let bash = output(pglock().args(["completions", "bash"])).await;
    let mut check = std::process::Command::new("bash")
        .arg("-n")
        .stdin(Stdio::piped())
        .spawn()
        .expect("bash");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), &bash.stdout)
        .expect("script written");
    assert!(check.wait().expect("bash -n").success(), "bash -n");
    let refused = output(pglock().args(["completions", "cmd.exe"])).await;
    assert_eq!(code(&refused), 64, "{}", stderr(&refused));

    let man = output(pglock().arg("man")).await;
    assert_eq!(code(&man), 0, "{}", stderr(&man));
    let page = String::from_utf8_lossy(&man.stdout).into_owned();
    assert!(
        page.starts_with(".ie") && page.contains(".TH pglock 1"),
        "{page}"
    );
    for command in ["run", "who", "list", "break", "id"] {
        assert!(
            page.contains(&format!("pglock\\-{command}(1)")),
            "pglock(1) lacks {command}"
        );
    }
    assert!(!page.contains("pglock\\-help(1)"), "{page}");

    let (_key, dir) = unique("man");
    let written = output(pglock().args(["man", "--dir"]).arg(&dir)).await;
    assert_eq!(code(&written), 0, "{}", stderr(&written));
    for (file, option) in [
        ("pglock.1", "\\-\\-url"),
        ("pglock-run.1", "\\-\\-on\\-lost"),
        ("pglock-who.1", "\\-\\-json"),
        ("pglock-list.1", "\\-\\-json"),
        ("pglock-break.1", "\\-\\-waiters"),
        ("pglock-id.1", "KEY"),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|error| {
            panic!("{file}: {error}");
        });
        assert!(text.contains(option), "{file} lacks {option}");
    }
    let unwritable = output(pglock().args(["man", "--dir"]).arg(dir.join("no/such/dir"))).await;
    assert_eq!(code(&unwritable), 73, "{}", stderr(&unwritable));
}

#[tokio::test]
async fn list_watch_shows_a_lock_come_and_go() {
    use tokio::io::AsyncReadExt;
    let (key, _dir) = unique("watch");
    let lock_id = locks_port::lock_id(&key);
    let too_often = output(pglock().args(["list", "--watch", "10ms"])).await;
    assert_eq!(code(&too_often), 64, "{}", stderr(&too_often));
    assert!(
        stderr(&too_often).contains("100ms"),
        "{}",
        stderr(&too_often)
    );

    let mut watcher = pglock()
        .args(["list", "--watch", "100ms"])
        .spawn()
        .expect("spawn");
    let mut stdout = watcher.stdout.take().expect("stdout");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut chunk = [0_u8; 4096];
            while let Ok(read) = stdout.read(&mut chunk).await {
                if read == 0 {
                    break;
                }
                seen.lock()
                    .expect("buffer")
                    .push_str(&String::from_utf8_lossy(&chunk[..read]));
            }
        })
    };
    // The rounds written so far that are complete (another header follows them).
    let rounds = |seen: &str| -> Vec<String> {
        let mut rounds: Vec<String> = seen
            .split("every 100ms: pglock list")
            .skip(1)
            .map(str::to_owned)
            .collect();
        rounds.pop();
        rounds
    };
    let held_line = |round: &str, pid: i32| {
        round
            .lines()
            .any(|line| line.starts_with(&lock_id.to_string()) && line.contains(&pid.to_string()))
    };

    let (foreign, foreign_pid) = foreign_holder(lock_id).await;
    eventually("a round that shows the holder", || async {
        rounds(&seen.lock().expect("buffer"))
            .iter()
            .any(|round| held_line(round, foreign_pid))
    })
    .await;
    release_foreign(&foreign, lock_id).await;
    let released_after = rounds(&seen.lock().expect("buffer")).len();
    eventually("a later round without the lock", || async {
        let rounds = rounds(&seen.lock().expect("buffer"));
        rounds.len() > released_after + 1
            && !rounds
                .last()
                .is_some_and(|round| round.contains(&lock_id.to_string()))
    })
    .await;
    assert!(
        watcher.try_wait().expect("status").is_none(),
        "--watch keeps going until interrupted"
    );
    signal(&watcher, Signal::SIGTERM);
    let status = tokio::time::timeout(SOON, watcher.wait())
        .await
        .expect("stopped in time")
        .expect("status");
    assert!(!status.success());
    reader.await.expect("reader");
}
