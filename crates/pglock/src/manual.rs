//! The man page `pglock(1)`, made from the manual in the crate README (its `## Manual`
//! part, one `###` heading per man section), so the page and the README cannot drift.
//!
//! Only the Markdown the manual uses is understood: paragraphs, `-` lists, fenced code
//! blocks, tables, `code`, **bold** and `[links](…)`.

use roff::{Inline, Roff, bold, roman};

/// The README, whose `## Manual` part is the page's source.
const README: &str = include_str!("../README.md");

/// The manual's sections: `(HEADING, markdown)`, in the README's order. A heading such as
/// ``OPTIONS of `pglock run` `` becomes `OPTIONS`.
pub(crate) fn sections() -> Vec<(String, String)> {
    let Some((_, manual)) = README.split_once("\n## Manual\n") else {
        return Vec::new();
    };
    let manual = manual.split("\n## ").next().unwrap_or_default();
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in manual.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            let words: Vec<&str> = heading
                .split_whitespace()
                .take_while(|word| word.chars().all(|c| !c.is_lowercase()))
                .collect();
            sections.push((words.join(" "), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

/// `pglock(1)` in roff.
pub(crate) fn page() -> String {
    let mut page = Roff::new();
    page.control(
        "TH",
        [
            "PGLOCK",
            "1",
            "",
            &format!("pglock {}", env!("CARGO_PKG_VERSION")),
            "User Commands",
        ],
    );
    for (heading, body) in sections() {
        page.control("SH", [heading.as_str()]);
        if heading == "EXIT STATUS" {
            render(&with_exit_table(&body), &mut page);
        } else {
            render(&body, &mut page);
        }
    }
    page.to_roff()
}

/// The EXIT STATUS section with its table made from [`crate::exit::TABLE`], the one
/// source of the codes (a test keeps the README's copy equal to it).
fn with_exit_table(body: &str) -> String {
    let mut text = String::new();
    let mut placed = false;
    for line in body.lines() {
        if line.starts_with('|') {
            if !placed {
                text.push_str(&crate::exit::markdown_table());
                placed = true;
            }
        } else {
            text.push_str(line);
            text.push('\n');
        }
    }
    text
}

/// Appends the Markdown `text` to `page`.
fn render(text: &str, page: &mut Roff) {
    let mut paragraph: Vec<&str> = Vec::new();
    let mut lines = text.lines().peekable();
    let flush = |paragraph: &mut Vec<&str>, page: &mut Roff| {
        if !paragraph.is_empty() {
            page.control("PP", []);
            page.text(inline(&paragraph.join(" ")));
            paragraph.clear();
        }
    };
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            flush(&mut paragraph, page);
            page.control("PP", []).control("nf", []);
            for code in lines.by_ref() {
                if code.trim_start().starts_with("```") {
                    break;
                }
                page.text([roman(code)]);
            }
            page.control("fi", []);
        } else if trimmed.starts_with('|') {
            flush(&mut paragraph, page);
            let cells: Vec<&str> = trimmed
                .trim_matches('|')
                .split(" | ")
                .map(str::trim)
                .collect();
            let separator = trimmed.starts_with("| ---");
            // A header row is the one above the separator.
            let header = lines
                .peek()
                .is_some_and(|next| next.trim().starts_with("| ---"));
            if separator || header {
                continue;
            }
            page.control("TP", []);
            page.text(inline(cells.first().copied().unwrap_or_default()));
            page.text(inline(&cells[1.min(cells.len())..].join("; ")));
        } else if let Some(item) = trimmed.strip_prefix("- ") {
            flush(&mut paragraph, page);
            page.control("IP", ["*", "2"]);
            page.text(inline(item));
        } else if trimmed.is_empty() {
            flush(&mut paragraph, page);
        } else {
            paragraph.push(trimmed);
        }
    }
    flush(&mut paragraph, page);
}

/// Markdown inline text as roff: `code` bold, the rest roman, `**` dropped, a link shown
/// as its text.
fn inline(text: &str) -> Vec<Inline> {
    let text = unlink(&text.replace("**", "").replace("\\|", "|"));
    text.split('`')
        .enumerate()
        .filter(|(_, part)| !part.is_empty())
        .map(|(index, part)| {
            if index % 2 == 1 {
                bold(part)
            } else {
                roman(part)
            }
        })
        .collect()
}

/// `[text](target)` → `text`.
fn unlink(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        let Some(close) = after.find("](") else { break };
        let Some(end) = after[close + 2..].find(')') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&after[..close]);
        rest = &after[close + 2 + end + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_inlines_become_roff() {
        assert_eq!(unlink("see [ADR 7](../adr/7.md) now"), "see ADR 7 now");
        assert_eq!(unlink("a [b] c"), "a [b] c");
        let page = {
            let mut page = Roff::new();
            render(
                "| option | meaning |\n| --- | --- |\n| `-n` | do **not** wait |\n\n```sh\n.x\n```\n",
                &mut page,
            );
            page.to_roff()
        };
        assert!(page.contains(".TP\n\\fB\\-n\\fR\ndo not wait"), "{page}");
        assert!(page.contains(".nf\n\\&.x\n.fi"), "{page}");
        assert!(
            !page.contains("option"),
            "the header row is left out: {page}"
        );
    }
}
