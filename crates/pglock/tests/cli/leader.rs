//! `pglock run --leader --publish VALUE` and `pglock who --leader NAME [--json]`: the
//! leader and what it published, shown only while its command runs.

use super::*;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Starts `pglock run --leader [extra…] KEY` with a command that touches `marker` and
/// runs until `stop` exists.
fn leader(key: &str, extra: &[&str], marker: &Path, stop: &Path) -> Child {
    let script = format!(
        "touch {} && while [ ! -e {} ]; do sleep 0.05; done",
        marker.display(),
        stop.display()
    );
    pglock()
        .args(["run", "--leader"])
        .args(extra)
        .args([key, "-c", &script])
        .spawn()
        .expect("spawn")
}

#[tokio::test]
async fn who_leader_shows_the_published_value_and_term_while_the_command_runs() {
    let (key, dir) = unique("leader-publish");
    let (running, stop) = (dir.join("running"), dir.join("stop"));
    let before = output(pglock().args(["who", "--leader", &key])).await;
    assert_eq!(code(&before), 0, "{}", stderr(&before));
    assert!(
        stdout(&before).contains("nobody leads"),
        "{}",
        stdout(&before)
    );

    let child = leader(&key, &["--publish", "10.0.0.9:7000"], &running, &stop);
    wait_for_file(&running).await;
    let shown = output(pglock().args(["who", "--leader", &key, "--json"])).await;
    assert_eq!(code(&shown), 0, "{}", stderr(&shown));
    let document: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(document["election"], key.as_str());
    let leader = &document["leader"];
    assert_eq!(leader["value"], "10.0.0.9:7000", "{document}");
    assert!(
        leader["term"].as_u64().is_some_and(|term| term >= 1),
        "{document}"
    );
    assert!(leader["holder_id"].is_string(), "{document}");
    let since = leader["since"].as_str().expect("a start");
    assert!(
        since.len() == "2026-12-04T12:00:00.123456Z".len() && since.contains('.'),
        "a start to the microsecond: {since}"
    );
    let text = output(pglock().args(["who", "--leader", &key])).await;
    let line = stdout(&text);
    assert!(
        line.contains("leads")
            && line.contains("published '10.0.0.9:7000'")
            && line.contains("term"),
        "{line}"
    );

    std::fs::write(&stop, b"").expect("stop");
    let done = finish(child).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    let after = output(pglock().args(["who", "--leader", &key, "--json"])).await;
    let document: serde_json::Value = serde_json::from_slice(&after.stdout).expect("JSON");
    assert!(
        document["leader"].is_null(),
        "the command ended: {document}"
    );
}

#[tokio::test]
async fn who_leader_names_a_leader_that_publishes_nothing_and_publish_and_backoff_need_leader() {
    let (key, dir) = unique("leader-plain");
    let (running, stop) = (dir.join("running"), dir.join("stop"));
    let child = leader(&key, &[], &running, &stop);
    wait_for_file(&running).await;
    let shown = output(pglock().args(["who", "--leader", &key, "--json"])).await;
    let document: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    let leader = &document["leader"];
    assert!(leader["holder_id"].is_string(), "{document}");
    assert!(
        leader["term"].is_null() && leader["value"].is_null(),
        "{document}"
    );
    std::fs::write(&stop, b"").expect("stop");
    assert_eq!(code(&finish(child).await), 0);

    for option in [["--publish", "x"], ["--backoff", "2s"]] {
        let usage = output(pglock().arg("run").args(option).args([&key, "--", "true"])).await;
        assert_eq!(
            code(&usage),
            64,
            "{} without --leader: {}",
            option[0],
            stderr(&usage)
        );
    }
}
