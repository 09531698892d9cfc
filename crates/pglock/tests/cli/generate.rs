//! `pglock completions` and `pglock man`.

use super::*;

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
