//! `pglock who`, `pglock list`, `--json` and `list --watch` against real holders and waiters.

use super::*;

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
    assert!(
        listed.lines().any(|line| line.starts_with("lock table: ")
            && line.contains("advisory entries (all databases) of ")),
        "how full the server's lock table is: {listed}"
    );

    release_foreign(&foreign, lock_id).await;
    let done = finish(waiter).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
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
    // How full the server's lock table is: at least our holder and waiter, of a
    // capacity the server's settings give (64 x (100 + 0) or more).
    let usage = &listed["lock_table_usage"];
    let advisory = usage["advisory"].as_u64().expect("advisory");
    let capacity = usage["capacity"].as_u64().expect("capacity");
    assert!(advisory >= 2, "{listed:#}");
    assert!(usage["entries"].as_u64().expect("entries") >= advisory);
    assert!(capacity >= 64, "{listed:#}");
    #[allow(clippy::cast_precision_loss)] // small counts
    let fraction = advisory as f64 / capacity as f64;
    assert!(
        (usage["fraction"].as_f64().expect("fraction") - fraction).abs() < 1e-9,
        "{listed:#}"
    );

    release_foreign(&foreign, lock_id).await;
    let done = finish(waiter).await;
    assert_eq!(code(&done), 0, "{}", stderr(&done));
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
