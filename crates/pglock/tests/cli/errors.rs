//! Failures: connection failures and their exit codes, error lines that say each cause once,
//! and a reader that closes pglock's output early.

use super::*;

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
    let cases: [(&str, String, &str, i32); 9] = [
        (
            "misspelt scheme",
            "postgress:/oops".into(),
            "`postgress:` is not a PostgreSQL URL scheme; \
             expected postgres://user:password@host:port/dbname",
            78,
        ),
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
    // The commands that read through a lock manager, a term store or a ledger, not one
    // client, give the same codes.
    let commands: [&[&str]; 4] = [
        &["who", &key],
        &["shards", &key],
        &["who", "--leader", &key],
        &["run", "--once-per", "2s", &key, "true"],
    ];
    for ((what, url, named, expected), command) in
        (cases.into_iter()).flat_map(|case| commands.map(|command| (case.clone(), command)))
    {
        let what = format!("{command:?}, {what}");
        let failed = output(pglock().args(["--url", &url]).args(command)).await;
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

/// A reader that goes away before pglock writes (`pglock list | head -1` once `head`
/// has its line, or `| true`) ends the output, not pglock: no panic, each command's own
/// exit code (0 here), nothing on stderr.
#[tokio::test]
async fn a_reader_that_goes_away_ends_the_output_not_pglock() {
    let (key, _dir) = unique("closed-pipe");
    let commands: [&[&str]; 12] = [
        &["who", &key],
        &["who", "--json", &key],
        &["who", "--leader", &key],
        &["list"],
        &["list", "--json"],
        &["shards", &key],
        &["jobs"],
        &["capacity", "--locks", "1000"],
        &["break", "--yes", &key],
        &["id", &key],
        &["man"],
        &["completions", "bash"],
    ];
    for args in commands {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        // Not `output()`, which pipes stdout whatever was set.
        let child = (pglock().args(args).stdout(writer))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("pglock ran");
        let done = tokio::time::timeout(SOON, child.wait_with_output())
            .await
            .expect("pglock finished in time")
            .expect("its status");
        assert_eq!(code(&done), 0, "{args:?}: {}", stderr(&done));
        assert_eq!(stderr(&done), "", "{args:?}");
    }
}
