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
