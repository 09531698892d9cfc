//! `pglock run --permits N` and `--leader`: a semaphore's exit codes and `who`, and a
//! leader that campaigns again after its session was ended.

use super::*;

#[tokio::test]
async fn permits_admit_n_refuse_the_next_and_show_in_who() {
    let (key, dir) = unique("permits");
    let (first_in, second_in, stop) = (dir.join("1"), dir.join("2"), dir.join("stop"));
    let hold = |marker: &Path| {
        let script = format!(
            "touch {} && while [ ! -e {} ]; do sleep 0.05; done; echo \"$PGLOCK_PERMITS\"",
            marker.display(),
            stop.display()
        );
        pglock()
            .args(["run", "--permits", "2", &key, "-c", &script])
            .spawn()
            .expect("spawn")
    };
    let first = hold(&first_in);
    let second = hold(&second_in);
    wait_for_file(&first_in).await;
    wait_for_file(&second_in).await;

    let third = output(pglock().args(["run", "--permits", "2", "-n", &key, "--", "true"])).await;
    assert_eq!(code(&third), 1, "a third of 2 is busy: {}", stderr(&third));
    let timed =
        output(pglock().args(["run", "--permits", "2", "-w", "200ms", &key, "--", "true"])).await;
    assert_eq!(code(&timed), 1, "-w runs out: {}", stderr(&timed));
    let other_n = output(pglock().args(["run", "--permits", "3", &key, "--", "true"])).await;
    assert_eq!(code(&other_n), 78, "a different N: {}", stderr(&other_n));
    assert!(
        stderr(&other_n).contains("in use with 2 permits"),
        "{}",
        stderr(&other_n)
    );
    let zero = output(pglock().args(["run", "--permits", "0", &key, "--", "true"])).await;
    assert_eq!(
        code(&zero),
        64,
        "no permits is bad usage: {}",
        stderr(&zero)
    );

    let who = output(pglock().args(["who", &key])).await;
    assert_eq!(code(&who), 0, "{}", stderr(&who));
    let shown = String::from_utf8_lossy(&who.stdout);
    assert!(shown.contains("(2 permits): 2 held, 0 waiting"), "{shown}");
    assert!(
        shown.contains("permit 0") && shown.contains("permit 1"),
        "{shown}"
    );
    let json = output(pglock().args(["who", "--json", &key])).await;
    let document: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(document["semaphore"]["permits"], serde_json::json!([2]));
    assert_eq!(
        document["semaphore"]["held"].as_array().map(Vec::len),
        Some(2)
    );
    assert_eq!(document["semaphore"]["waiting"], 0);

    std::fs::write(&stop, "").expect("stop");
    for child in [first, second] {
        let done = finish(child).await;
        assert_eq!(code(&done), 0, "{}", stderr(&done));
        assert_eq!(String::from_utf8_lossy(&done.stdout).trim(), "2");
    }
    let after = output(pglock().args(["run", "--permits", "2", "-n", &key, "--", "true"])).await;
    assert_eq!(code(&after), 0, "free again: {}", stderr(&after));
}

#[tokio::test]
async fn a_leader_whose_session_ends_stops_its_command_and_campaigns_again() {
    let (key, dir) = unique("leader");
    let terms = dir.join("terms");
    // Each term appends a line and waits; the third term exits with 5.
    let script = format!(
        "echo x >> {terms}; [ $(wc -l < {terms}) -ge 3 ] && exit 5; exec sleep 600",
        terms = terms.display()
    );
    let leader = pglock()
        .args([
            "run",
            "--leader",
            "--backoff",
            "100ms",
            "--grace",
            "1s",
            &key,
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn");
    let admin = admin().await;
    let class = locks_postgres::PostgresLockManager::new(
        locks_postgres::plain_pool(&database_url(), 1).expect("pool"),
    )
    .semaphore_class(&key);
    for term in 1..=2 {
        eventually(&format!("term {term}"), || async {
            std::fs::read_to_string(&terms).is_ok_and(|text| text.lines().count() == term)
        })
        .await;
        let ended: bool = admin
            .query_one(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
                 AND objsubid = 2 AND classid = $1::int4::oid AND objid = 0 AND granted",
                &[&class],
            )
            .await
            .expect("end the leader's session")
            .get(0);
        assert!(ended);
    }
    let done = finish(leader).await;
    assert_eq!(
        code(&done),
        5,
        "the third term's own status: {}",
        stderr(&done)
    );
    assert!(
        stderr(&done).contains("campaigning again"),
        "{}",
        stderr(&done)
    );
}
