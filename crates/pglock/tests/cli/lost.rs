//! A lock lost while the command runs: the command is stopped as `--on-lost` says, exit 75.

use super::*;

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

/// With `-v` the library's own warning of the loss reaches stderr, naming the key and the
/// reason; without it (and without `PGLOCK_LOG`) pglock's one line is all there is.
#[tokio::test]
async fn verbose_shows_the_libraries_warning_of_the_loss() {
    let script = |ready: &Path| {
        format!(
            "echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; while :; do sleep 0.05; done",
            ready = ready.display()
        )
    };
    let (key, dir) = unique("lost-verbose");
    let ready = dir.join("ready");
    let (done, _) = lose_the_lock(&key, &ready, &["-v"], &script(&ready)).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    let said = stderr(&done);
    let warning = said
        .lines()
        .find(|line| line.contains("advisory lock lost"))
        .unwrap_or_else(|| panic!("no library warning of the loss: {said}"));
    assert!(
        warning.contains("WARN") && warning.contains(&key) && warning.contains("reason="),
        "{warning}"
    );
    let (key, dir) = unique("lost-quiet");
    let ready = dir.join("ready");
    let (done, _) = lose_the_lock(&key, &ready, &[], &script(&ready)).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(
        !stderr(&done).contains("advisory lock lost"),
        "{}",
        stderr(&done)
    );
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

/// Runs a command under the lock on `key` with `options` (a 30 s lease: answer timeout
/// 2.5 s), stops the lock's backend with SIGSTOP for 5 s, continues it, and asks the
/// command to finish. Returns pglock's output and whether the command got SIGTERM.
async fn stall_the_backend(key: &str, dir: &Path, options: &[&str]) -> (Output, bool) {
    let (ready, got, finish_now) = (dir.join("ready"), dir.join("got"), dir.join("finish"));
    let script = format!(
        "trap 'echo TERM > {got}; exit 0' TERM; echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; \
         while [ ! -e {finish_now} ]; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display(),
        finish_now = finish_now.display()
    );
    let child = pglock()
        .args(["run", "--keepalive", "200ms", "--lease", "30s"])
        .args(options)
        .args([key, "-c", &script])
        .spawn()
        .expect("spawn");
    wait_for_file(&ready).await;
    let rows = lock_rows(&admin().await, locks_port::lock_id(key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let backend = Pid::from_raw(rows[0].0);
    kill(backend, Signal::SIGSTOP).expect("SIGSTOP the lock's backend");
    tokio::time::sleep(Duration::from_secs(5)).await;
    kill(backend, Signal::SIGCONT).expect("SIGCONT");
    std::fs::write(&finish_now, "").expect("finish");
    (finish(child).await, got.exists())
}

#[tokio::test]
async fn a_stalled_backend_loses_the_lock_unless_stall_patience_outlasts_it() {
    // Without patience the keepalive unanswered for the answer timeout (2.5 s) is a loss,
    // though the stopped backend keeps the lock on the server until it runs again.
    let (key, dir) = unique("stall-impatient");
    let (done, terminated) = stall_the_backend(&key, &dir, &[]).await;
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(terminated, "the command was not stopped");
    // With 8 s of patience the 5 s stall is waited out: the command runs on and exits 0.
    let (key, dir) = unique("stall-patient");
    let (done, terminated) = stall_the_backend(&key, &dir, &["--stall-patience", "8s"]).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    assert!(!terminated, "the command was stopped: {}", stderr(&done));
    // The lease still has to fit the longer time a cut-off host takes to be told.
    let fits = ["run", "k", "--keepalive", "200ms", "--lease", "12s"];
    let checked = output(pglock().args(fits).args(["--no-wait", "--", "true"])).await;
    assert_eq!(code(&checked), 0, "{}", stderr(&checked));
    let short = output(
        pglock()
            .args(fits)
            .args(["--stall-patience", "8s", "--", "true"]),
    )
    .await;
    assert_eq!(code(&short), 64, "{}", stderr(&short));
    assert!(
        stderr(&short).contains("and --stall-patience 8.0s: it needs at least "),
        "{}",
        stderr(&short)
    );
}

/// `pglock run` with `KEY -c script`, the script writing its pid to `ready` and running
/// until `finish_now` exists; pglock itself is then SIGSTOPped (as `Ctrl-Z` would) and
/// the test watches the lock on the server for `watch`. Returns how long after the stop
/// the lock was free (`None`: held throughout), then continues pglock, lets the command
/// finish, and returns pglock's output.
async fn stop_pglock(
    key: &str,
    dir: &Path,
    options: &[&str],
    watch: Duration,
) -> (Option<Duration>, Output) {
    let (ready, finish_now) = (dir.join("ready"), dir.join("finish"));
    let script = format!(
        "echo $$ > {ready}.tmp; mv {ready}.tmp {ready}; \
         while [ ! -e {finish_now} ]; do sleep 0.05; done",
        ready = ready.display(),
        finish_now = finish_now.display()
    );
    let child = pglock()
        .arg("run")
        .args(options)
        .args([key, "-c", &script])
        .spawn()
        .expect("spawn");
    wait_for_file(&ready).await;
    let (admin, lock_id) = (admin().await, locks_port::lock_id(key));
    assert_eq!(lock_rows(&admin, lock_id).await.len(), 1, "held");
    signal(&child, Signal::SIGSTOP);
    let stopped = Instant::now();
    let mut freed = None;
    while stopped.elapsed() < watch {
        if lock_rows(&admin, lock_id).await.is_empty() {
            freed = Some(stopped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&child, Signal::SIGCONT);
    if freed.is_none() {
        std::fs::write(&finish_now, "").expect("finish");
    }
    (freed, finish(child).await)
}

/// `--expire-stopped`: a stopped pglock's lock is freed within the lease's bound, and
/// woken it stops its command and exits 75. Without it (the control) the lock stays held
/// however long pglock stays stopped. Before PostgreSQL 14 the option is refused by the
/// server (no `idle_session_timeout`).
#[tokio::test]
async fn a_stopped_pglock_loses_its_lock_within_the_lease_with_expire_stopped() {
    let version: i32 = (admin()
        .await
        .query_one("SHOW server_version_num", &[])
        .await)
        .expect("version")
        .get::<_, String>(0)
        .parse()
        .expect("a number");
    // A 10 s lease with 1 s keepalives: the server bound (told + the 5 s margin) is about 7.3 s.
    let options = ["--keepalive", "1s", "--lease", "10s", "--expire-stopped"];
    let (key, dir) = unique("stopped-expire");
    if version < 140_000 {
        let refused = output(pglock().arg("run").args(options).args([&key, "--", "true"])).await;
        assert_ne!(code(&refused), 0, "{}", stderr(&refused));
        assert!(
            stderr(&refused).contains("idle_session_timeout"),
            "{}",
            stderr(&refused)
        );
        return;
    }
    let (freed, done) = stop_pglock(&key, &dir, &options, Duration::from_secs(12)).await;
    let freed = freed.expect("the stopped pglock's lock was freed");
    eprintln!("a stopped pglock's lock was free {freed:?} after its SIGSTOP");
    assert!(
        freed <= Duration::from_secs(10),
        "beyond the lease: {freed:?}"
    );
    assert_eq!(code(&done), 75, "{}", stderr(&done));
    assert!(stderr(&done).contains("lost"), "{}", stderr(&done));

    let (key, dir) = unique("stopped-keep");
    let (freed, done) = stop_pglock(&key, &dir, &options[..4], Duration::from_secs(12)).await;
    assert_eq!(
        freed, None,
        "without --expire-stopped the stopped pglock keeps its lock"
    );
    assert_eq!(code(&done), 0, "{}", stderr(&done));
}

#[tokio::test]
async fn expire_stopped_without_a_lease_is_a_usage_error() {
    for off in [["--lease", "0s"], ["--keepalive", "0s"]] {
        let (key, _dir) = unique("stopped-no-lease");
        let refused =
            output(
                pglock()
                    .arg("run")
                    .args(off)
                    .args(["--expire-stopped", &key, "--", "true"]),
            )
            .await;
        assert_eq!(code(&refused), 64, "{}", stderr(&refused));
        assert!(
            stderr(&refused).contains("--expire-stopped needs a lease"),
            "{}",
            stderr(&refused)
        );
    }
}
