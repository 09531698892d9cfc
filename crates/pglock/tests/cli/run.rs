//! `pglock run`: exit statuses, conflicts, bad usage, turns, signals, shared locks, fencing.

use super::*;

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
    // In the CLI's own flags, with rounded durations, and the lease that would do.
    assert!(
        said.contains("--lease 5.0s is too short for --keepalive 5.0s: it needs at least "),
        "{said}"
    );
    assert!(
        !said.contains("lease(") && !said.contains("keepalive("),
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

/// A signal while connecting ends pglock at once (130), before the connect timeout:
/// plain `run` and `run --shards` (which used to wait the whole connect timeout out,
/// then exit 69), against a server that accepts the connection and never answers.
#[tokio::test]
async fn sigint_while_connecting_exits_130_at_once() {
    let (key, _dir) = unique("sigint-connecting");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let url = format!(
        "postgres://nobody@127.0.0.1:{}/nothing",
        silent.local_addr().expect("its port").port()
    );
    for args in [
        &["run", &key, "--", "true"][..],
        &["run", "--shards", "2", &key, "--", "true"],
    ] {
        let child = pglock()
            .args(["--url", &url, "--connect-timeout", "25s"])
            .args(args)
            .spawn()
            .expect("spawn");
        // Connected (its signal handlers are in place): it now waits for an answer.
        let (accepted, _) = silent.accept().expect("pglock connects");
        signal(&child, Signal::SIGINT);
        let done = finish(child).await;
        drop(accepted);
        assert_eq!(code(&done), 130, "{args:?}: {}", stderr(&done));
    }
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

/// Arguments are bytes, as `flock` passes them: a file name in Latin-1 reaches the command
/// unchanged, with or without a shell, and a key that is not UTF-8 is bad usage (64), never
/// a crash.
#[tokio::test]
async fn arguments_that_are_not_utf8_reach_the_command_unchanged() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let (key, _dir) = unique("bytes");
    let latin1 = OsStr::from_bytes(b"caf\xe9 \xff\xfe");

    let direct = output(
        pglock()
            .args(["run", &key, "--", "printf", "%s"])
            .arg(latin1),
    )
    .await;
    assert_eq!(code(&direct), 0, "{}", stderr(&direct));
    assert_eq!(direct.stdout, latin1.as_bytes());

    let mut script = b"printf '%s' '".to_vec();
    script.extend_from_slice(latin1.as_bytes());
    script.push(b'\'');
    let shell = output(
        pglock()
            .args(["run", &key, "-c"])
            .arg(OsStr::from_bytes(&script)),
    )
    .await;
    assert_eq!(code(&shell), 0, "{}", stderr(&shell));
    assert_eq!(shell.stdout, latin1.as_bytes());

    let bad_key = output(pglock().arg("run").arg(latin1).args(["--", "true"])).await;
    assert_eq!(code(&bad_key), 64, "{}", stderr(&bad_key));
    assert!(
        !stderr(&bad_key).contains("panicked"),
        "{}",
        stderr(&bad_key)
    );
}

/// A signal ignored when pglock starts (`nohup`, a shell's background job, `trap '' HUP`)
/// stays ignored, as for `flock` and any program: it neither cancels the wait nor is
/// forwarded to the command, and the command starts with it ignored too.
#[tokio::test]
async fn signals_ignored_at_start_stay_ignored_for_pglock_and_the_command() {
    let (key, dir) = unique("ignored");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, _) = foreign_holder(lock_id).await;
    let ready = dir.join("ready");
    let release = dir.join("release");
    // The command prints the mask of the signals it ignores, then runs until released.
    let script = format!(
        "sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status; touch {ready}; \
         while [ ! -e {release} ]; do sleep 0.05; done; echo survived",
        ready = ready.display(),
        release = release.display()
    );
    let mut child = pglock_under(&["sh", "-c", "trap '' HUP INT; exec \"$@\"", "sh"])
        .args(["run", &key, "-c", &script])
        .spawn()
        .expect("spawn");
    let observer = admin().await;
    wait_for_a_waiter(&observer, lock_id).await;
    // While waiting: ignored, the wait goes on.
    signal(&child, Signal::SIGHUP);
    signal(&child, Signal::SIGINT);
    release_foreign(&foreign, lock_id).await;
    // While the command runs: ignored, not forwarded.
    let deadline = Instant::now() + SOON;
    while !ready.exists() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let done = finish(child).await;
            panic!("pglock ended while waiting ({status}): {}", stderr(&done));
        }
        assert!(Instant::now() < deadline, "the command did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(&child, Signal::SIGHUP);
    signal(&child, Signal::SIGINT);
    std::fs::write(&release, "").expect("release the command");
    let done = finish(child).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    let stdout = String::from_utf8_lossy(&done.stdout);
    let mut lines = stdout.lines();
    let mask = u64::from_str_radix(lines.next().expect("the mask"), 16).expect("a hex mask");
    let ignored = |signal: Signal| mask & (1 << (signal as u32 - 1)) != 0;
    assert!(
        ignored(Signal::SIGHUP) && ignored(Signal::SIGINT),
        "the command does not ignore HUP and INT: SigIgn {mask:x}"
    );
    assert_eq!(lines.next(), Some("survived"), "{stdout}");
    assert_eq!(lock_rows(&observer, lock_id).await, []);
}
