//! `cargo xtask package [-- <cargo package args>]`: every published crate packaged and
//! verified as `cargo publish` would, so that publishing stays possible.
//!
//! The published crates are the workspace members without `publish = false`. First each
//! manifest is checked for the metadata crates.io shows (`keywords`, `categories`,
//! `documentation`, `readme`, a README that exists); then one `cargo package -p A -p B …`
//! packages them all and builds each from its `.crate` file, with the workspace crates it
//! depends on taken from the packages just made (cargo's local overlay registry), so
//! `pglock` is verified against the `locks-postgres` it would be published with. Before
//! that, each published crate is documented alone (`cargo doc -p`, warnings as errors),
//! as a user builds its docs. It needs
//! the crates.io index, as `cargo publish` does. `cargo xtask test` runs it (with
//! `--allow-dirty`, so work in progress can be tested) after the tests, and so `.ci/run`.

use std::path::{Path, PathBuf};
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
    document_alone(&published)?;
    let unpacked = forget_unpacked(&cargo_home(), &published)?;
    if !unpacked.is_empty() {
        eprintln!(
            "xtask: removed {} copies of this workspace's crates that earlier packaging runs \
             unpacked under {} (cargo would reuse them)",
            unpacked.len(),
            cargo_home().join("registry").join("src").display()
        );
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("package-check");
    let built = forget_built(&target, &published)?;
    if !built.is_empty() {
        eprintln!(
            "xtask: removed {} build records of this workspace's crates from {}",
            built.len(),
            target.display()
        );
    }
    let started = Instant::now();
    let mut command = crate::cargo();
    command.args(["package", "--locked", "--target-dir"]);
    command.arg(&target);
    for name in &published {
        command.args(["-p", name]);
    }
    command.args(extra);
    crate::run(&mut command)?;
    eprintln!(
        "xtask: packaged and verified {} crates ({}) in {:.0} s",
        published.len(),
        published.join(", "),
        started.elapsed().as_secs_f64()
    );
    // The verification build is a second copy of every dependency (over 1 GiB) that nothing
    // else reuses; a CI disk once filled up with it in place.
    match std::fs::remove_dir_all(&target) {
        Ok(()) => eprintln!(
            "xtask: removed the verification build in {}",
            target.display()
        ),
        Err(error) => eprintln!(
            "xtask: could not remove the verification build in {}: {error}",
            target.display()
        ),
    }
    Ok(())
}

/// Documents each published crate alone, with its default features, warnings as errors:
/// as a user's `cargo doc -p` builds it. The workspace's own `cargo doc` unifies features
/// across crates, so a link to an item behind a feature resolves there and breaks here.
fn document_alone(published: &[String]) -> crate::Result {
    let started = Instant::now();
    for name in published {
        crate::run(
            crate::cargo()
                .args(["doc", "--quiet", "--no-deps", "-p", name])
                .env("RUSTDOCFLAGS", "-Dwarnings"),
        )?;
    }
    eprintln!(
        "xtask: documented the {} published crates one by one in {:.0} s",
        published.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Cargo's home: `$CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
}

/// Removes the copies of `crates` that cargo unpacked from local (overlay) registries into
/// `cargo_home/registry/src/-*/name-version`, and answers what it removed. Copies unpacked
/// from crates.io (`index.crates.io-…`) are never touched.
fn forget_unpacked(cargo_home: &Path, crates: &[String]) -> std::io::Result<Vec<PathBuf>> {
    let sources = cargo_home.join("registry").join("src");
    let mut removed = Vec::new();
    let Ok(registries) = std::fs::read_dir(&sources) else {
        return Ok(removed);
    };
    for registry in registries {
        let registry = registry?;
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for unpacked in std::fs::read_dir(registry.path())? {
            let unpacked = unpacked?;
            let ours = is_ours(&unpacked.file_name().to_string_lossy(), crates, |version| {
                version.starts_with(|c: char| c.is_ascii_digit())
            });
            if ours && unpacked.file_type()?.is_dir() {
                std::fs::remove_dir_all(unpacked.path())?;
                removed.push(unpacked.path());
            }
        }
    }
    removed.sort();
    Ok(removed)
}

/// Removes the build records (`<target>/<profile>/.fingerprint/<name>-<hash>`) of `crates`
/// from the packaging's own target folder, so cargo rebuilds them; answers what it removed.
fn forget_built(target: &Path, crates: &[String]) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let Ok(profiles) = std::fs::read_dir(target) else {
        return Ok(removed);
    };
    for profile in profiles {
        let fingerprints = profile?.path().join(".fingerprint");
        let Ok(records) = std::fs::read_dir(&fingerprints) else {
            continue;
        };
        for record in records {
            let record = record?;
            if is_ours(&record.file_name().to_string_lossy(), crates, |rest| {
                rest.chars().all(|c| c.is_ascii_hexdigit())
            }) {
                std::fs::remove_dir_all(record.path())?;
                removed.push(record.path());
            }
        }
    }
    removed.sort();
    Ok(removed)
}

/// Whether `folder` is `<one of crates>-<rest>` with `rest` as `suffix` wants it.
fn is_ours(folder: &str, crates: &[String], suffix: impl Fn(&str) -> bool) -> bool {
    crates.iter().any(|name| {
        folder
            .strip_prefix(name.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|rest| !rest.is_empty() && suffix(rest))
    })
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
    fn only_our_crates_unpacked_from_local_registries_are_forgotten() {
        let home = std::env::temp_dir().join(format!("xtask-package-{}", std::process::id()));
        let src = home.join("registry").join("src");
        let folders = [
            "-1a32e80f12c17dc4/locks-port-0.1.0",
            "-1a32e80f12c17dc4/locks-port-extra-0.1.0",
            "-1a32e80f12c17dc4/tokio-1.0.0",
            "-7d36319c136135d3/pglock-0.2.0",
            "index.crates.io-1949cf8c6b5b557f/locks-port-0.1.0",
        ];
        for folder in folders {
            std::fs::create_dir_all(src.join(folder).join("src")).unwrap();
        }
        let crates = ["locks-port".to_owned(), "pglock".to_owned()];
        let removed = forget_unpacked(&home, &crates).unwrap();
        assert_eq!(
            removed,
            [
                src.join("-1a32e80f12c17dc4/locks-port-0.1.0"),
                src.join("-7d36319c136135d3/pglock-0.2.0"),
            ]
        );
        for kept in &folders[1..=2] {
            assert!(src.join(kept).is_dir(), "{kept} was removed");
        }
        assert!(
            src.join(folders[4]).is_dir(),
            "crates.io's copy was removed"
        );
        assert_eq!(forget_unpacked(&home, &crates).unwrap(), [] as [PathBuf; 0]);
        assert_eq!(
            forget_unpacked(&home.join("nowhere"), &crates).unwrap(),
            [] as [PathBuf; 0]
        );
        std::fs::remove_dir_all(&home).unwrap();
    }

    #[test]
    fn only_our_crates_build_records_are_forgotten() {
        let target = std::env::temp_dir().join(format!("xtask-built-{}", std::process::id()));
        let records = [
            "debug/.fingerprint/locks-port-0c27a4db74e6e8f0",
            "debug/.fingerprint/locks-port-extra-0c27a4db74e6e8f0",
            "debug/.fingerprint/tokio-0c27a4db74e6e8f0",
            "release/.fingerprint/pglock-10cde59a0bbd67ac",
        ];
        for record in records {
            std::fs::create_dir_all(target.join(record)).unwrap();
        }
        std::fs::create_dir_all(target.join("package")).unwrap();
        let crates = ["locks-port".to_owned(), "pglock".to_owned()];
        assert_eq!(
            forget_built(&target, &crates).unwrap(),
            [target.join(records[0]), target.join(records[3])]
        );
        assert!(target.join(records[1]).is_dir() && target.join(records[2]).is_dir());
        std::fs::remove_dir_all(&target).unwrap();
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
                "locks-conformance",
                "locks-postgres",
                "locks-memory",
                "migration-cutover",
                "migration-cutover-postgres",
                "locks-schedule",
                "locks-schedule-postgres",
                "locks-leader",
                "locks-shard",
                "locks-shard-postgres",
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
