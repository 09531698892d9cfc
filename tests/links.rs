//! Every relative link in the repository's Markdown resolves: the file (or folder) it names
//! exists, and its `#anchor`, if any, is the GitHub slug of a heading in that file.
//!
//! The files are the tracked `*.md` files (`git ls-files '*.md'`; where git is not there,
//! every `*.md` under the root outside `target/` and hidden folders). In each, outside fenced
//! code blocks and inline code, every inline link and image `[text](target)`, and every
//! reference definition `[label]: target`, is checked:
//!
//! - `path`, `path#anchor` and `#anchor` (the same file), relative to the file's folder, or
//!   to the repository's root when the path starts with `/`;
//! - an anchor on a Markdown file must be the slug of one of its headings, as GitHub makes
//!   it: the heading's text as rendered (inline code kept, emphasis marks and a link's target
//!   dropped), lowercased, every character but letters, digits, spaces, `-` and `_` removed,
//!   spaces turned into `-`; a repeated slug gets `-1`, `-2`, … in order. An anchor on any
//!   other file must be a line anchor (`#L12`, `#L12-L20`).
//!
//! **Not checked here**: external links (`http://`, `https://`, `mailto:`) are not fetched,
//! since the tests run without a network. Links in rustdoc comments are checked by
//! `cargo doc` with warnings denied (`RUSTDOCFLAGS=-Dwarnings`, which makes
//! `rustdoc::broken_intra_doc_links` an error), as CI runs it. A crate README that rustdoc
//! includes is checked here as Markdown: its relative links resolve in the repository, but
//! rustdoc does not rewrite them, so in the generated HTML they are relative to the page
//! (as on docs.rs); that is not checked.
//!
//! The checker is a small hand-written scanner (about 250 lines) rather than a Markdown
//! parser (`pulldown-cmark`): the repository's Markdown uses inline links, fenced blocks and
//! ATX headings only, and the unit tests below pin each case the scanner must get right,
//! among them a planted broken anchor and a link inside a code block that must be skipped.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// One broken link: where it is and what is wrong.
#[derive(Debug, PartialEq, Eq)]
struct Broken {
    file: String,
    line: usize,
    target: String,
    problem: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: ({}) {}",
            self.file, self.line, self.target, self.problem
        )
    }
}

/// A link found in a Markdown file: its line and its target as written.
#[derive(Debug, PartialEq, Eq)]
struct Link {
    line: usize,
    target: String,
}

/// The lines of `text` that are prose: `None` for a line inside (or fencing) a code block.
fn prose_lines(text: &str) -> Vec<Option<&str>> {
    let mut fence: Option<(char, usize)> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
            let run = marker.map_or(0, |c| trimmed.chars().take_while(|x| *x == c).count());
            match (fence, marker) {
                (None, Some(c)) if run >= 3 => {
                    fence = Some((c, run));
                    None
                }
                (Some((c, open)), Some(m))
                    if m == c && run >= open && trimmed[run..].trim().is_empty() =>
                {
                    fence = None;
                    None
                }
                (Some(_), _) => None,
                (None, _) => Some(line),
            }
        })
        .collect()
}

/// `line` with its inline code spans (`` `…` ``, ``` ``…`` ```) blanked out.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let ticks = &rest[start..start + run];
        let after = &rest[start + run..];
        match after.find(ticks) {
            Some(end) => {
                out.push_str(&" ".repeat(run + end + run));
                rest = &after[end + run..];
            }
            None => {
                out.push_str(ticks);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The links of a Markdown file, in order.
fn links(text: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (index, line) in prose_lines(text).into_iter().enumerate() {
        let Some(line) = line else { continue };
        let line = without_code_spans(line);
        let number = index + 1;
        // A reference definition: `[label]: target`.
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]:")
            && !trimmed[..close].contains("](")
        {
            if let Some(target) = trimmed[close + 2..].split_whitespace().next() {
                found.push(Link {
                    line: number,
                    target: target.trim_matches(['<', '>']).to_owned(),
                });
            }
            continue;
        }
        // Inline links and images: `](target)` or `](target "title")`.
        let mut rest = line.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let mut depth = 0usize;
            let end = after
                .char_indices()
                .find(|&(_, c)| match c {
                    '(' => {
                        depth += 1;
                        false
                    }
                    ')' if depth == 0 => true,
                    ')' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .map_or(after.len(), |(i, _)| i);
            let inside = after[..end].trim();
            let target = inside.split_whitespace().next().unwrap_or("");
            found.push(Link {
                line: number,
                target: target.trim_matches(['<', '>']).to_owned(),
            });
            rest = &after[end..];
        }
    }
    found
}

/// The text of a heading as GitHub renders it: code marks, emphasis marks and link targets
/// dropped.
fn rendered_heading(raw: &str) -> String {
    let mut text = String::new();
    let mut rest = raw;
    // `[text](target)` becomes `text`.
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.chars().filter(|c| !matches!(c, '`' | '*')).collect()
}

/// GitHub's slug of a heading's rendered text.
fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings, duplicates numbered as GitHub numbers them.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = HashSet::new();
    for line in prose_lines(text).into_iter().flatten() {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue; // indented code
        }
        let level = trimmed.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&level) {
            continue;
        }
        let after = &trimmed[level..];
        if !(after.is_empty() || after.starts_with(' ')) {
            continue;
        }
        // A closing run of `#` is not part of the heading.
        let content = after.trim().trim_end_matches('#').trim_end();
        let base = slug(&rendered_heading(content));
        let count = seen.entry(base.clone()).or_insert(0);
        let anchor = if *count == 0 {
            base
        } else {
            format!("{base}-{count}")
        };
        *count += 1;
        anchors.insert(anchor);
    }
    anchors
}

/// Whether `target` leaves the repository (not checked: no network in the tests).
fn is_external(target: &str) -> bool {
    let lower = target.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:")
}

/// `path` with `.` and `..` resolved, without touching the file system; `None` if it
/// climbs out of the root.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(parts.iter().collect())
}

/// The repository seen by the checker: which paths exist and what each Markdown file says.
trait Tree {
    fn exists(&self, path: &Path) -> bool;
    fn markdown(&self, path: &Path) -> Option<String>;
}

/// Checks every link of the Markdown file `file` (a path from the root) whose text is `text`.
fn check_file(tree: &dyn Tree, file: &Path, text: &str) -> Vec<Broken> {
    let mut broken = Vec::new();
    let folder = file.parent().unwrap_or(Path::new(""));
    for link in links(text) {
        let mut report = |problem: String| {
            broken.push(Broken {
                file: file.display().to_string(),
                line: link.line,
                target: link.target.clone(),
                problem,
            })
        };
        if link.target.is_empty() {
            report("empty link target".into());
            continue;
        }
        if is_external(&link.target) {
            continue;
        }
        let (path, anchor) = match link.target.split_once('#') {
            Some((path, anchor)) => (path, Some(anchor)),
            None => (link.target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            Some(file.to_path_buf())
        } else if let Some(from_root) = path.strip_prefix('/') {
            normalise(Path::new(from_root))
        } else {
            normalise(&folder.join(path))
        };
        let Some(resolved) = resolved.filter(|p| tree.exists(p)) else {
            report(format!(
                "no such file or folder: {}",
                folder.join(path).display()
            ));
            continue;
        };
        let Some(anchor) = anchor else { continue };
        let is_markdown = resolved.extension().is_some_and(|e| e == "md");
        if is_markdown {
            let headings = tree
                .markdown(&resolved)
                .map(|text| anchors(&text))
                .unwrap_or_default();
            if !headings.contains(anchor) {
                let mut known: Vec<_> = headings.into_iter().collect();
                known.sort();
                report(format!(
                    "no heading of {} has the anchor #{anchor} (its anchors: {})",
                    resolved.display(),
                    known.join(", ")
                ));
            }
        } else if !is_line_anchor(anchor) {
            report(format!(
                "#{anchor} on {}, which is not Markdown: only line anchors (#L12, #L12-L20) can be checked",
                resolved.display()
            ));
        }
    }
    broken
}

/// `L12` or `L12-L20`.
fn is_line_anchor(anchor: &str) -> bool {
    let line = |s: &str| {
        s.strip_prefix('L')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match anchor.split_once('-') {
        Some((from, to)) => line(from) && line(to),
        None => line(anchor),
    }
}

/// The repository on disk.
struct Disk {
    root: PathBuf,
}

impl Tree for Disk {
    fn exists(&self, path: &Path) -> bool {
        self.root.join(path).exists()
    }

    fn markdown(&self, path: &Path) -> Option<String> {
        std::fs::read_to_string(self.root.join(path)).ok()
    }
}

/// The Markdown files to check, as paths from the root: the tracked ones, or (without git)
/// every one outside `target/` and hidden folders.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let listed = Command::new("git")
        .args(["ls-files", "-z", "--", "*.md"])
        .current_dir(root)
        .output();
    match listed {
        Ok(output) if output.status.success() => output
            .stdout
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
            // A file deleted in the work tree but not yet in the index is not there to read.
            .filter(|path| root.join(path).is_file())
            .collect(),
        _ => {
            eprintln!("links: `git ls-files` failed; walking the tree instead");
            let mut files = Vec::new();
            walk(root, Path::new(""), &mut files);
            files
        }
    }
}

fn walk(root: &Path, relative: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(relative)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let path = relative.join(&name);
        let hidden = name.to_string_lossy().starts_with('.');
        if entry.path().is_dir() {
            if !hidden && name != "target" {
                walk(root, &path, files);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
}

#[test]
fn every_relative_link_and_anchor_in_the_markdown_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_path_buf();
    let files = markdown_files(&root);
    assert!(
        files.len() > 10,
        "found only {} Markdown files under {}: is this the repository?",
        files.len(),
        root.display()
    );
    let disk = Disk { root: root.clone() };
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = disk
            .markdown(file)
            .unwrap_or_else(|| panic!("cannot read {}", file.display()));
        checked += links(&text).len();
        broken.extend(check_file(&disk, file, &text));
    }
    assert!(
        checked > 50,
        "found only {checked} links in {} files",
        files.len()
    );
    let list: Vec<String> = broken.iter().map(ToString::to_string).collect();
    assert!(
        broken.is_empty(),
        "{} broken link(s) in the Markdown:\n{}",
        broken.len(),
        list.join("\n")
    );
}

#[cfg(test)]
mod checker {
    use super::*;

    /// A small repository in memory.
    struct Memory(BTreeMap<&'static str, &'static str>);

    impl Tree for Memory {
        fn exists(&self, path: &Path) -> bool {
            let path = path.to_string_lossy();
            self.0
                .keys()
                .any(|file| *file == path || file.starts_with(&format!("{path}/")))
        }

        fn markdown(&self, path: &Path) -> Option<String> {
            self.0
                .get(path.to_string_lossy().as_ref())
                .map(|s| (*s).to_owned())
        }
    }

    fn check(files: &[(&'static str, &'static str)], file: &str) -> Vec<String> {
        let tree = Memory(files.iter().copied().collect());
        let text = tree.markdown(Path::new(file)).unwrap();
        check_file(&tree, Path::new(file), &text)
            .iter()
            .map(|b| format!("{}:{} {}", b.file, b.line, b.target))
            .collect()
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(
            slug(&rendered_heading("Health: knowing when a lock is lost")),
            "health-knowing-when-a-lock-is-lost"
        );
        assert_eq!(
            slug(&rendered_heading("1. Uncontended acquire + release cycle")),
            "1-uncontended-acquire--release-cycle"
        );
        assert_eq!(
            slug(&rendered_heading("`acquire_many`: all or *nothing*")),
            "acquire_many-all-or-nothing"
        );
        assert_eq!(
            slug(&rendered_heading("See [ADR 0013](adr/0013.md) — why")),
            "see-adr-0013--why"
        );
        assert_eq!(
            slug("Tested PostgreSQL versions"),
            "tested-postgresql-versions"
        );
    }

    #[test]
    fn repeated_headings_are_numbered_and_code_blocks_have_none() {
        let text = "# Notes\n## Run\n## Run\n```sh\n# Run\n```\n## Run #\n";
        let found = anchors(text);
        let mut found: Vec<_> = found.into_iter().collect();
        found.sort();
        assert_eq!(found, ["notes", "run", "run-1", "run-2"]);
    }

    #[test]
    fn links_in_prose_are_found_and_links_in_code_are_not() {
        let text = "See [a](a.md), ![img](x.svg \"title\") and [b\nc](b.md#part).\n\
                    `[not](code.md)` and\n```\n[not](block.md)\n```\n[ref]: <c.md>\n\
                    [web](https://example.invalid/x)\n";
        let targets: Vec<_> = links(text)
            .into_iter()
            .map(|l| (l.line, l.target))
            .collect();
        assert_eq!(
            targets,
            [
                (1, "a.md".to_owned()),
                (1, "x.svg".to_owned()),
                (2, "b.md#part".to_owned()),
                (7, "c.md".to_owned()),
                (8, "https://example.invalid/x".to_owned()),
            ]
        );
    }

    #[test]
    fn a_planted_broken_anchor_and_a_missing_file_are_reported() {
        let files = [
            (
                "README.md",
                "# Top\n[ok](docs/guide.md#the-part) [self](#top) [dir](docs)\n\
                 [bad anchor](docs/guide.md#no-such-part)\n[gone](docs/gone.md)\n\
                 [up](../outside.md) [line](src/lib.rs#L3-L9) [web](https://x.invalid/#y)\n",
            ),
            (
                "docs/guide.md",
                "# Guide\n## The part\n[back](../README.md#top)\n",
            ),
            ("src/lib.rs", ""),
        ];
        assert_eq!(
            check(&files, "README.md"),
            [
                "README.md:3 docs/guide.md#no-such-part",
                "README.md:4 docs/gone.md",
                "README.md:5 ../outside.md",
            ]
        );
        assert!(check(&files, "docs/guide.md").is_empty());
    }

    #[test]
    fn anchors_on_files_other_than_markdown_must_be_line_anchors() {
        let files = [("a.md", "[x](b.rs#fn-main) [y](b.rs#L1)\n"), ("b.rs", "")];
        assert_eq!(check(&files, "a.md"), ["a.md:1 b.rs#fn-main"]);
    }
}
