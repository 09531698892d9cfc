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
    assert!(page.starts_with(".TH PGLOCK 1"), "{page}");
    for command in ["run", "who", "list", "break", "id"] {
        assert!(
            page.contains(&format!("pglock\\-{command}(1)")),
            "pglock(1) lacks {command}"
        );
    }
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "\"EXIT STATUS\"",
        "SIGNALS",
        "ENVIRONMENT",
        "FILES",
        "LEASE",
        "EXAMPLES",
    ] {
        assert!(
            page.contains(&format!("\n.SH {section}\n")),
            "pglock(1) lacks {section}"
        );
    }
    assert_the_page_says_what_the_readme_says(&page);
    assert!(!page.contains("pglock\\-help(1)"), "{page}");

    let (_key, dir) = unique("man");
    let written = output(pglock().args(["man", "--dir"]).arg(dir.path())).await;
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

/// The words of `text` (letters, digits, `_`), roff's font escapes and `\-` taken out.
fn words(text: &str) -> Vec<String> {
    let text = text
        .replace("\\fB", " ")
        .replace("\\fR", " ")
        .replace("\\fI", " ")
        .replace("\\-", "-")
        .replace("\\(aq", "'")
        .replace("\\&", "");
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| !word.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every section of the README's manual is in the page, word for word and in order, so
/// the two cannot drift: the page is made from the README when pglock is built.
fn assert_the_page_says_what_the_readme_says(page: &str) {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README");
    let (_, manual) = readme.split_once("\n## Manual\n").expect("a manual");
    let page_words = words(page);
    let mut checked = 0;
    for section in manual.split("\n### ").skip(1) {
        let (heading, body) = section.split_once('\n').unwrap_or((section, ""));
        // Not shown in the page: a fence's language, a table's header and separator rows.
        let lines: Vec<&str> = body.lines().collect();
        let body: String = lines
            .iter()
            .enumerate()
            .filter(|(index, line)| {
                let next_is_separator = lines
                    .get(index + 1)
                    .is_some_and(|next| next.starts_with("| ---"));
                !line.starts_with("```") && !line.starts_with("| ---") && !next_is_separator
            })
            .map(|(_, line)| *line)
            .collect::<Vec<_>>()
            .join("\n");
        // Link targets are not shown in the page.
        let body: String = body
            .split("](")
            .enumerate()
            .map(|(index, part)| {
                if index == 0 {
                    part
                } else {
                    part.split_once(')').map_or(part, |(_, rest)| rest)
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let mut remaining = page_words.iter();
        for word in words(&body) {
            assert!(
                remaining.any(|candidate| *candidate == word),
                "pglock(1) lacks `{word}` of the README's {heading} (or in another order)"
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} sections");
}
