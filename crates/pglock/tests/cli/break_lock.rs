//! `pglock break`: ending a holder's session, asking first, refused without the privilege.

use super::*;

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
    use std::io::Write;
    let (mut master, terminal) = pseudo_terminal();
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
    let password = "breaker-secret";
    let (role, url) = ordinary_role("breaker", password).await;
    let url = format!("{url} password={password}");

    let refused = output(pglock().args(["--url", &url, "break", "--yes", &key])).await;
    let said = stderr(&refused);
    assert_eq!(code(&refused), 77, "{said}");
    // The hint that the server hides the superuser's session details, and the error.
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(lines[0].contains("pg_read_all_stats"), "{said}");
    assert!(
        lines[1].starts_with(&format!("pglock: cannot end pid {foreign_pid}: ")),
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
async fn break_ends_the_permit_holders_of_a_semaphore_and_a_leader() {
    for (name, options) in [
        ("break-permits", &["--permits", "2"][..]),
        ("break-leader", &["--leader", "--backoff", "30s"][..]),
    ] {
        let (key, dir) = unique(name);
        let (ready, stopped) = (dir.join("ready"), dir.join("stopped"));
        let script = format!(
            "trap 'touch {}; exit 0' TERM; touch {}; sleep 60 & wait",
            stopped.display(),
            ready.display()
        );
        let holder = pglock()
            .arg("run")
            .args(options)
            .args([&key, "-c", &script])
            .spawn()
            .expect("spawn");
        wait_for_file(&ready).await;
        let who = output(pglock().args(["who", "--json", &key])).await;
        let document: serde_json::Value = serde_json::from_slice(&who.stdout).expect("JSON");
        assert_eq!(
            document["semaphore"]["held"].as_array().map(Vec::len),
            Some(1),
            "{document}"
        );

        let broken = output(pglock().args(["break", "--yes", &key])).await;
        let said = String::from_utf8_lossy(&broken.stdout).into_owned();
        assert_eq!(code(&broken), 0, "{name}: {said}{}", stderr(&broken));
        assert!(
            said.contains("the permits of the semaphore"),
            "{name}: {said}"
        );
        assert_eq!(said.matches("terminated pid").count(), 1, "{name}: {said}");

        // The holder lost its permit: its command is stopped (a leader then waits out its
        // backoff before campaigning again).
        let who = output(pglock().args(["who", "--json", &key])).await;
        let document: serde_json::Value = serde_json::from_slice(&who.stdout).expect("JSON");
        assert!(document["semaphore"].is_null(), "{name}: {document}");
        if options[0] == "--leader" {
            wait_for_file(&stopped).await;
            signal(&holder, Signal::SIGTERM);
            let done = finish(holder).await;
            // The signal lands in the backoff ("campaigning again in 30s"), or while pglock
            // still collects the stopped group's status ("not campaigning again"): either
            // way it ends the leader at once.
            assert!(
                stderr(&done).contains("campaigning again"),
                "{name}: {}",
                stderr(&done)
            );
            assert_eq!(code(&done), 143, "{name}: {}", stderr(&done));
        } else {
            let done = finish(holder).await;
            assert_eq!(code(&done), 75, "{name}: {}", stderr(&done));
        }
    }
}
