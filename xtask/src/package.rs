//! `cargo xtask package [-- <cargo package args>]`: every published crate packaged and
//! verified as `cargo publish` would, so that publishing stays possible.
//!
//! The published crates are the workspace members without `publish = false`. First each
//! manifest is checked for the metadata crates.io shows (`keywords`, `categories`,
//! `documentation`, `readme`, a README that exists); then one `cargo package -p A -p B …`
//! packages them all and builds each from its `.crate` file, with the workspace crates it
//! depends on taken from the packages just made (cargo's local overlay registry), so
//! `pglock` is verified against the `locks-postgres` it would be published with. It needs
//! the crates.io index, as `cargo publish` does. `cargo xtask test` runs it (with
//! `--allow-dirty`, so work in progress can be tested) after the tests, and so `.ci/run`.

use std::path::Path;
use std::time::Instant;

const HELP: &str = "\
usage: cargo xtask package [-- <cargo package args>]

Checks that every published workspace crate (no `publish = false`) has keywords, categories,
documentation and readme in its manifest, then runs `cargo package --locked -p <each>`,
which packages and verifies (builds) each crate as `cargo publish` would. Arguments after
`--` go to cargo package, e.g. `cargo xtask package -- --allow-dirty` in a dirty tree.
";

/// The fields each published manifest must set, in `[package]`.
const REQUIRED: [&str; 4] = ["keywords", "categories", "documentation", "readme"];

/// A workspace member's manifest, as far as this task reads it.
#[derive(Debug, PartialEq, Eq)]
struct Manifest {
    name: String,
    published: bool,
    /// Which of [`REQUIRED`] `[package]` sets (directly or `.workspace = true`).
    has: Vec<&'static str>,
    /// `readme = "…"`, if given as a path.
    readme: Option<String>,
    /// The keywords, when given inline.
    keywords: Vec<String>,
}

/// Runs the task.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let extra = match args.split_first() {
        None => &[][..],
        Some((first, rest)) if first == "--" => rest,
        Some((first, _)) if first == "-h" || first == "--help" => {
            print!("{HELP}");
            return Ok(());
        }
        Some((first, _)) => return Err(format!("unexpected argument `{first}`\n\n{HELP}").into()),
    };
    let root = crate::workspace_root();
    let mut published = Vec::new();
    let mut problems = Vec::new();
    for member in members(&std::fs::read_to_string(root.join("Cargo.toml"))?) {
        let dir = root.join(&member);
        let manifest = parse(&std::fs::read_to_string(dir.join("Cargo.toml"))?);
        if manifest.published {
            problems.extend(check(&manifest, &dir));
            published.push(manifest.name);
        }
    }
    if !problems.is_empty() {
        return Err(format!("crate metadata:\n  {}", problems.join("\n  ")).into());
    }
    if published.is_empty() {
        return Err("no published crate found in the workspace".into());
    }
    let started = Instant::now();
    let mut command = crate::cargo();
    command.args(["package", "--locked"]);
    for name in &published {
        command.args(["-p", name]);
    }
    command.args(extra);
    let line = crate::display(&command);
    eprintln!("xtask: running `{line}`");
    let status = command
        .status()
        .map_err(|error| format!("could not run `{line}`: {error}"))?;
    if !status.success() {
        return Err(format!("`{line}` exited with {status}").into());
    }
    eprintln!(
        "xtask: packaged and verified {} crates ({}) in {:.0} s",
        published.len(),
        published.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The paths in the root manifest's `[workspace] members = [ … ]`.
fn members(root_manifest: &str) -> Vec<String> {
    let Some(start) = root_manifest.find("members = [") else {
        return Vec::new();
    };
    let list = &root_manifest[start + "members = [".len()..];
    let list = &list[..list.find(']').unwrap_or(list.len())];
    list.split(',')
        .map(|item| item.trim().trim_matches('"').to_owned())
        .filter(|item| !item.is_empty())
        .collect()
}

/// Reads the `[package]` table of a member manifest, line by line (the manifests here
/// write one key per line).
fn parse(manifest: &str) -> Manifest {
    let mut parsed = Manifest {
        name: String::new(),
        published: true,
        has: Vec::new(),
        readme: None,
        keywords: Vec::new(),
    };
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_package {
            continue;
        }
        let key = key.trim();
        let value = value.trim();
        let field = key.strip_suffix(".workspace").unwrap_or(key);
        let text = value.trim_matches('"').to_owned();
        match field {
            "name" => parsed.name.clone_from(&text),
            "publish" => parsed.published = value != "false",
            _ => {}
        }
        if let Some(required) = REQUIRED.iter().find(|required| **required == field) {
            parsed.has.push(required);
        }
        if key == "readme" {
            parsed.readme = Some(text);
        }
        if key == "keywords" {
            parsed.keywords = value
                .trim_start_matches('[')
                .trim_end_matches(']')
                .split(',')
                .map(|keyword| keyword.trim().trim_matches('"').to_owned())
                .filter(|keyword| !keyword.is_empty())
                .collect();
        }
    }
    parsed
}

/// What is wrong with a published crate's metadata (`dir` holds its manifest).
fn check(manifest: &Manifest, dir: &Path) -> Vec<String> {
    let name = &manifest.name;
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|field| !manifest.has.contains(field))
        .collect();
    let mut problems: Vec<String> = missing
        .iter()
        .map(|field| format!("{name}: no `{field}` in [package]"))
        .collect();
    if let Some(readme) = &manifest.readme
        && !dir.join(readme).is_file()
    {
        problems.push(format!("{name}: readme `{readme}` does not exist"));
    }
    // crates.io's rules: at most five keywords, each ASCII, at most 20 characters,
    // starting with a letter.
    if manifest.keywords.len() > 5 {
        problems.push(format!("{name}: more than 5 keywords"));
    }
    for keyword in &manifest.keywords {
        let valid = keyword.len() <= 20
            && keyword.starts_with(|c: char| c.is_ascii_alphabetic())
            && keyword
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '+');
        if !valid {
            problems.push(format!(
                "{name}: keyword `{keyword}` is not one crates.io takes"
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_come_from_the_workspace_list() {
        let root =
            "[workspace]\nresolver = \"3\"\nmembers = [\n    \"crates/a\",\n    \"xtask\",\n]\n";
        assert_eq!(members(root), ["crates/a", "xtask"]);
    }

    #[test]
    fn unpublished_crates_and_missing_metadata_are_told_apart() {
        let tool = parse("[package]\nname = \"tool\"\npublish = false\n");
        assert!(!tool.published);
        let bare = parse(
            "[package]\nname = \"bare\"\nversion.workspace = true\n\n[dependencies]\nreadme = 1\n",
        );
        assert!(bare.published);
        let dir = crate::workspace_root().join("crates/pglock");
        let problems = check(&bare, &dir);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(problems[0].contains("keywords"), "{problems:?}");

        let full = parse(
            "[package]\nname = \"full\"\nreadme = \"README.md\"\n\
             keywords = [\"postgresql\", \"lock\"]\ncategories = [\"database\"]\n\
             documentation = \"https://docs.rs/full\"\n",
        );
        assert_eq!(full.keywords, ["postgresql", "lock"]);
        assert_eq!(check(&full, &dir), [] as [String; 0]);
        let wrong = parse(
            "[package]\nname = \"wrong\"\nreadme = \"NOPE.md\"\n\
             keywords = [\"1st\", \"a\", \"b\", \"c\", \"d\", \"e\"]\n\
             categories = [\"database\"]\ndocumentation = \"https://docs.rs/wrong\"\n",
        );
        assert_eq!(check(&wrong, &dir).len(), 3, "{:?}", check(&wrong, &dir));
    }

    #[test]
    fn every_published_crate_of_this_workspace_passes() {
        let root = crate::workspace_root();
        let manifests: Vec<(Manifest, std::path::PathBuf)> =
            members(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap())
                .into_iter()
                .map(|member| {
                    let dir = root.join(member);
                    (
                        parse(&std::fs::read_to_string(dir.join("Cargo.toml")).unwrap()),
                        dir,
                    )
                })
                .collect();
        let published: Vec<&str> = manifests
            .iter()
            .filter(|(manifest, _)| manifest.published)
            .map(|(manifest, _)| manifest.name.as_str())
            .collect();
        assert_eq!(
            published,
            [
                "locks-port",
                "locks-postgres",
                "locks-memory",
                "migration-cutover",
                "migration-cutover-postgres",
                "pglock"
            ]
        );
        for (manifest, dir) in &manifests {
            if manifest.published {
                assert_eq!(check(manifest, dir), [] as [String; 0]);
            }
        }
    }
}
