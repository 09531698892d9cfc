//! Ground floor: what a scenario hands back, and the markdown made of it.

use std::fmt::Write as _;

use serde_json::Value;

/// One scenario's results.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The key of this scenario in the JSON file.
    pub(crate) id: &'static str,
    pub(crate) section: Section,
    pub(crate) checks: Vec<Check>,
    pub(crate) json: Value,
    /// Files to write beside the results (name, contents): the handoff chart.
    pub(crate) files: Vec<(&'static str, String)>,
}

/// A titled markdown table with notes under it.
#[derive(Debug)]
pub(crate) struct Section {
    pub(crate) title: String,
    pub(crate) notes: Vec<String>,
    pub(crate) header: Vec<&'static str>,
    pub(crate) rows: Vec<Vec<String>>,
}

/// One target and whether it was met.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    pub(crate) name: String,
    pub(crate) measured: String,
    pub(crate) target: String,
    pub(crate) pass: bool,
}

impl Check {
    pub(crate) fn new(
        name: impl Into<String>,
        measured: impl Into<String>,
        target: impl Into<String>,
        pass: bool,
    ) -> Self {
        Self {
            name: name.into(),
            measured: measured.into(),
            target: target.into(),
            pass,
        }
    }

    pub(crate) fn verdict(&self) -> &'static str {
        verdict(self.pass)
    }

    pub(crate) fn to_json(&self) -> Value {
        serde_json::json!({
            "target": self.name,
            "measured": self.measured,
            "limit": self.target,
            "pass": self.pass,
        })
    }
}

pub(crate) fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "MISS" }
}

/// A markdown table; `|` inside cells is escaped.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let cell = |text: &str| text.replace('|', "\\|");
    let _ = writeln!(
        out,
        "| {} |",
        header
            .iter()
            .map(|h| cell(h))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(
        out,
        "|{}|",
        header.iter().map(|_| " --- ").collect::<Vec<_>>().join("|")
    );
    for row in rows {
        let _ = writeln!(
            out,
            "| {} |",
            row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
        );
    }
    out
}

/// All sections, then the targets.
pub(crate) fn markdown(heading: &str, outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{heading}");
    for outcome in outcomes {
        let section = &outcome.section;
        let _ = writeln!(out, "\n### {}\n", section.title);
        for note in &section.notes {
            let _ = writeln!(out, "{note}\n");
        }
        out.push_str(&table(&section.header, &section.rows));
    }
    let checks: Vec<&Check> = outcomes.iter().flat_map(|o| &o.checks).collect();
    if !checks.is_empty() {
        let _ = writeln!(out, "\n### Targets\n");
        let rows: Vec<Vec<String>> = checks
            .iter()
            .map(|check| {
                vec![
                    check.name.clone(),
                    check.measured.clone(),
                    check.target.clone(),
                    check.verdict().to_owned(),
                ]
            })
            .collect();
        out.push_str(&table(&["Target", "Measured", "Limit", "Result"], &rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_markdown() {
        let text = table(&["a", "b"], &[vec!["1".into(), "x|y".into()]]);
        assert_eq!(text, "| a | b |\n| --- | --- |\n| 1 | x\\|y |\n");
    }
}
