//! What an operator reads: silence where cron wants it, refused keys, escaped text,
//! unknown shown as unknown, exit codes by cause, the password file's permissions, and a
//! wait on a frozen server that still obeys SIGTERM.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[tokio::test]
async fn a_skipped_run_can_be_silent_and_bad_keys_and_counts_are_usage() {
    let (key, _dir) = unique("silent");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, _pid) = foreign_holder(lock_id).await;
    let skipped = output(pglock().args(["run", "-n", "-E", "0", &key, "--", "true"])).await;
    assert_eq!(code(&skipped), 0, "{}", stderr(&skipped));
    assert_eq!(stderr(&skipped), "", "-n -E 0 prints nothing, as flock");
    let quiet = output(pglock().args(["run", "-n", "-q", &key, "--", "true"])).await;
    assert_eq!((code(&quiet), stderr(&quiet).as_str()), (1, ""));
    let quiet_wait = output(pglock().args(["run", "-w", "100ms", "-q", &key, "--", "true"])).await;
    assert_eq!((code(&quiet_wait), stderr(&quiet_wait).as_str()), (1, ""));
    let said = output(pglock().args(["run", "-n", &key, "--", "true"])).await;
    assert_eq!(code(&said), 1);
    assert_eq!(stderr(&said).lines().count(), 1, "{}", stderr(&said));
    release_foreign(&foreign, lock_id).await;

    for args in [
        &["run", "", "--", "true"][..],
        &["who", ""][..],
        &["break", "--yes", ""][..],
        &["id", ""][..],
        &["run", "--permits", "0", &key, "--", "true"][..],
        &["run", "--permits", "65537", &key, "--", "true"][..],
    ] {
        let refused = output(pglock().args(args)).await;
        assert_eq!(code(&refused), 64, "{args:?}: {}", stderr(&refused));
    }
    let empty = output(pglock().args(["run", "", "--", "true"])).await;
    assert!(
        stderr(&empty).contains("the key is empty"),
        "{}",
        stderr(&empty)
    );
}

#[tokio::test]
async fn control_characters_are_escaped_in_every_output() {
    let (tag, _dir) = unique("hostile");
    let key = format!("{tag}\n\u{1b}[31mred");
    let lock_id = locks_port::lock_id(&key);
    let hostile_app = "\u{1b}]0;owned\u{7}app\nline";
    let foreign = admin().await;
    foreign
        .execute(
            "SELECT set_config('application_name', $1, false)",
            &[&hostile_app],
        )
        .await
        .expect("application_name");
    foreign
        .execute("SELECT pg_advisory_lock($1)", &[&lock_id])
        .await
        .expect("lock");
    let who = output(pglock().args(["who", &key])).await;
    let list = output(pglock().args(["list"])).await;
    let busy = output(pglock().args(["run", "-n", &key, "--", "true"])).await;
    let broken = output(pglock().args(["break", "--yes", &key])).await;
    for (what, done) in [
        ("who", &who),
        ("list", &list),
        ("run -n", &busy),
        ("break", &broken),
    ] {
        for (stream, bytes) in [("stdout", &done.stdout), ("stderr", &done.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            assert!(
                !text.chars().any(|c| c.is_control() && c != '\n'),
                "{what} {stream} printed a control character raw: {text:?}"
            );
            assert!(
                !text.contains("31mred\n") && !text.contains("app\nline"),
                "{what}: {text:?}"
            );
        }
    }
    let shown = String::from_utf8_lossy(&who.stdout);
    assert!(shown.contains("\\n\\u{1b}[31mred'"), "{shown}");
    // The server itself shows a control character of an application_name as `?`.
    assert!(
        stderr(&busy).contains("\\n\\u{1b}[31mred' is busy"),
        "{}",
        stderr(&busy)
    );
    assert_eq!(code(&broken), 0, "{}", stderr(&broken));
}

#[tokio::test]
async fn an_ordinary_role_sees_unknown_as_unknown() {
    let (key, _dir) = unique("unknown");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, _pid) = foreign_holder(lock_id).await;
    let (role, url) = ordinary_role("viewer", "viewer-secret").await;

    let json = output(pglock().args(["--url", &url, "who", "--json", &key])).await;
    assert_eq!(code(&json), 0, "{}", stderr(&json));
    let document: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let session = &document["sessions"][0];
    assert_eq!(session["state"], "holds", "{document}");
    assert!(session["client"].is_null(), "{document}");
    assert!(session["seconds"].is_null(), "{document}");
    assert!(session["since"].is_null(), "{document}");
    assert!(
        stderr(&json).contains("pg_read_all_stats"),
        "{}",
        stderr(&json)
    );

    let table = output(pglock().args(["--url", &url, "who", &key])).await;
    let text = String::from_utf8_lossy(&table.stdout);
    let row = text
        .lines()
        .find(|line| line.starts_with("holds"))
        .expect("a row");
    assert!(!row.contains("local") && !row.contains("0ms"), "{text}");
    assert!(
        row.split_whitespace().filter(|cell| *cell == "?").count() >= 3,
        "{text}"
    );

    let admin = admin().await;
    admin
        .batch_execute(&format!("GRANT pg_read_all_stats TO {role}"))
        .await
        .expect("grant");
    let granted = output(pglock().args(["--url", &url, "who", "--json", &key])).await;
    let document: serde_json::Value = serde_json::from_slice(&granted.stdout).expect("JSON");
    assert!(document["sessions"][0]["client"].is_string(), "{document}");
    assert!(document["sessions"][0]["seconds"].is_number(), "{document}");
    assert!(
        !stderr(&granted).contains("pg_read_all_stats"),
        "{}",
        stderr(&granted)
    );

    release_foreign(&foreign, lock_id).await;
    drop(foreign);
    admin
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .expect("drop");
}

/// The server's `pg_hba.conf`, with lines for `role` demanding a password put first;
/// the original text, to put back.
async fn demand_a_password(role: &str) -> (PathBuf, String) {
    let admin = admin().await;
    let path: String = admin
        .query_one("SELECT current_setting('hba_file')", &[])
        .await
        .expect("hba_file")
        .get(0);
    let path = PathBuf::from(path);
    let original = std::fs::read_to_string(&path)
        .expect("the test server's pg_hba.conf is on this machine (a throwaway cluster)");
    let lines = format!(
        "host all {role} 127.0.0.1/32 scram-sha-256\nhost all {role} ::1/128 scram-sha-256\n"
    );
    std::fs::write(&path, format!("{lines}{original}")).expect("write pg_hba.conf");
    admin
        .execute("SELECT pg_reload_conf()", &[])
        .await
        .expect("reload");
    // The reload is asynchronous: wait until a password-less connection is refused.
    (path, original)
}

#[tokio::test]
async fn credentials_exit_77_and_a_readable_pgpass_is_refused_with_a_warning() {
    let (key, dir) = unique("credentials");
    let password = "scram-secret";
    let (role, url) = ordinary_role("scram", password).await;
    let (hba, original) = demand_a_password(&role).await;
    let missing_code = || async {
        let missing = output(pglock().args(["--url", &url, "who", &key])).await;
        (code(&missing), stderr(&missing))
    };
    let mut missing = missing_code().await;
    let deadline = Instant::now() + SOON;
    while missing.0 == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        missing = missing_code().await;
    }
    assert_eq!(missing.0, 77, "no password: {}", missing.1);
    assert!(
        missing.1.contains("asks for a password and none is set"),
        "{}",
        missing.1
    );

    let wrong =
        output(pglock().args(["--url", &format!("{url} password=nope"), "who", &key])).await;
    assert_eq!(code(&wrong), 77, "{}", stderr(&wrong));

    let pgpass = dir.join("pgpass");
    std::fs::write(&pgpass, format!("*:*:*:{role}:{password}\n")).expect("pgpass");
    let with_file = |mode: u32| {
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let mut command = pglock();
        command
            .env("PGPASSFILE", &pgpass)
            .args(["--url", &url, "who", &key]);
        command
    };
    let open = output(&mut with_file(0o644)).await;
    assert_eq!(
        code(&open),
        77,
        "a 0644 file is not used: {}",
        stderr(&open)
    );
    assert!(
        stderr(&open).contains("has group or world access; permissions should be u=rw (0600)"),
        "{}",
        stderr(&open)
    );
    let private = output(&mut with_file(0o600)).await;
    assert_eq!(
        code(&private),
        0,
        "a 0600 file is used: {}",
        stderr(&private)
    );
    assert!(
        !stderr(&private).contains("WARNING"),
        "{}",
        stderr(&private)
    );

    std::fs::write(&hba, original).expect("restore pg_hba.conf");
    let admin = admin().await;
    admin
        .execute("SELECT pg_reload_conf()", &[])
        .await
        .expect("reload");
    admin
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .expect("drop");
}

#[tokio::test]
async fn fencing_without_the_grant_exits_77_with_the_grant_to_ask_for() {
    let (key, _dir) = unique("fencing-grant");
    // The table exists (a superuser's run creates it); the ordinary role may not write it.
    let made = output(pglock().args(["run", "--fencing", &key, "--", "true"])).await;
    assert_eq!(code(&made), 0, "{}", stderr(&made));
    let (role, url) = ordinary_role("fenced", "fenced-secret").await;
    let refused =
        output(pglock().args(["--url", &url, "run", "--fencing", &key, "--", "true"])).await;
    let said = stderr(&refused);
    assert_eq!(code(&refused), 77, "{said}");
    assert!(
        said.contains(&format!(
            "GRANT SELECT, INSERT, UPDATE ON advisory_lock_fencing_tokens TO {role}"
        )),
        "{said}"
    );
    assert!(!said.contains("locks_postgres::"), "{said}");
    admin()
        .await
        .batch_execute(&format!("DROP ROLE {role}"))
        .await
        .expect("drop");
}

/// A role that may connect but was granted nothing on the tables beside the locks: each
/// command says which grant it needs and exits 77, as `--fencing` does; `run --shards`
/// says so before it joins (it used to retry its join for ever, silently).
#[tokio::test]
async fn the_tables_beside_the_locks_without_grants_exit_77_naming_the_grant() {
    let (key, _dir) = unique("no-grants");
    let admin = admin().await;
    locks_shard_postgres::install_shard_terms(&admin)
        .await
        .expect("the shard tables");
    locks_postgres::install_leader_board(&admin)
        .await
        .expect("the leader board");
    locks_schedule_postgres::install_ledger(&admin)
        .await
        .expect("the ledger");
    let (role, url) = ordinary_role("nogrants", "nogrants-secret").await;
    let cases: [(&[&str], String); 5] = [
        (
            &["run", "--shards", "2", &key, "--", "true"],
            format!("GRANT SELECT, INSERT, UPDATE ON locks_shard_terms TO {role}"),
        ),
        (
            &["run", "--leader", "--publish", "v", &key, "--", "true"],
            format!("GRANT SELECT, INSERT, UPDATE ON advisory_lock_leader_terms TO {role}"),
        ),
        (
            &["who", "--leader", &key],
            format!("GRANT SELECT ON advisory_lock_leader_terms TO {role}"),
        ),
        (&["shards", &key], "GRANT SELECT ON locks_shard_".to_owned()),
        (&["jobs"], "ON scheduled_job_runs".to_owned()),
    ];
    for (args, grant) in cases {
        let refused = output(pglock().args(["--url", &url]).args(args)).await;
        let said = stderr(&refused);
        assert_eq!(code(&refused), 77, "{args:?}: {said}");
        assert!(said.contains(&grant), "{args:?} names {grant}: {said}");
        assert!(!said.contains("--fencing"), "{args:?}: {said}");
    }
    // Some of the privileges: only the table still lacking one is named, with all of
    // its privileges (a list given to `has_table_privilege` would pass on any one).
    admin
        .batch_execute(&format!(
            "GRANT SELECT, INSERT, UPDATE ON locks_shard_terms TO {role}; \
             GRANT SELECT, INSERT, UPDATE ON locks_shard_members TO {role}"
        ))
        .await
        .expect("grant");
    let refused =
        output(pglock().args(["--url", &url, "run", "--shards", "2", &key, "--", "true"])).await;
    let said = stderr(&refused);
    assert_eq!(code(&refused), 77, "{said}");
    assert!(
        said.contains(&format!(
            "needs: GRANT SELECT, INSERT, UPDATE, DELETE ON locks_shard_members TO {role}\n"
        )),
        "only the members' table, lacking DELETE: {said}"
    );
    admin
        .batch_execute(&format!(
            "REVOKE ALL ON locks_shard_terms, locks_shard_members FROM {role}; DROP ROLE {role}"
        ))
        .await
        .expect("drop");
}

#[tokio::test]
async fn a_waiter_on_a_frozen_server_obeys_sigterm_within_two_seconds() {
    let (key, _dir) = unique("frozen");
    let lock_id = locks_port::lock_id(&key);
    let (foreign, _foreign_pid, waiter) = held_and_awaited(&key).await;
    let admin = admin().await;
    let waiting_pid = lock_rows(&admin, lock_id)
        .await
        .into_iter()
        .find(|(_, granted)| !granted)
        .expect("the waiter's session")
        .0;
    // Its server process stops answering anything, cancel requests included.
    kill(Pid::from_raw(waiting_pid), Signal::SIGSTOP).expect("SIGSTOP the backend");
    let sent = Instant::now();
    signal(&waiter, Signal::SIGTERM);
    let done = finish(waiter).await;
    let took = sent.elapsed();
    kill(Pid::from_raw(waiting_pid), Signal::SIGCONT).expect("SIGCONT the backend");
    assert_eq!(code(&done), 143, "{}", stderr(&done));
    assert!(took < Duration::from_secs(2), "SIGTERM took {took:?}");
    eprintln!("SIGTERM on a frozen server: exited after {took:?}");
    release_foreign(&foreign, lock_id).await;
}
