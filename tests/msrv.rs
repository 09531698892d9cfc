//! Keeps the workspace's `rust-version` true: no package in the dependency graph may
//! declare a newer `rust-version` than the workspace does.
//!
//! Reads `cargo metadata --format-version 1` (every package the lock file resolves, on
//! every platform), so a dependency bump that raises the minimum Rust fails here, naming
//! the package, until the workspace's `rust-version` follows.

use std::cmp::Ordering;
use std::fmt;
use std::process::Command;

use serde_json::Value;

/// A `rust-version` as Cargo accepts it: `1.88` or `1.88.0` (missing parts are 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RustVersion([u64; 3]);

impl RustVersion {
    fn parse(text: &str) -> Result<Self, String> {
        let mut parts = [0; 3];
        for (count, part) in text.split('.').enumerate() {
            let slot = parts
                .get_mut(count)
                .ok_or_else(|| format!("rust-version `{text}` has more than three parts"))?;
            *slot = part.parse().map_err(|error| {
                format!("rust-version `{text}`: `{part}` is not a number ({error})")
            })?;
        }
        Ok(Self(parts))
    }
}

impl fmt::Display for RustVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [major, minor, patch] = self.0;
        write!(f, "{major}.{minor}.{patch}")
    }
}

/// What the check needs of `cargo metadata`: the workspace's `rust-version` and every
/// other package's, by name and version.
#[derive(Debug)]
struct Graph {
    workspace: RustVersion,
    dependencies: Vec<(String, Option<RustVersion>)>,
}

fn string<'a>(value: &'a Value, field: &str) -> Result<&'a str, String> {
    value
        .get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("cargo metadata: no string field `{field}` in {value}"))
}

impl Graph {
    fn from_metadata(metadata: &Value) -> Result<Self, String> {
        let members: Vec<&str> = metadata
            .get("workspace_members")
            .and_then(Value::as_array)
            .ok_or("cargo metadata: no `workspace_members`")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let packages = metadata
            .get("packages")
            .and_then(Value::as_array)
            .ok_or("cargo metadata: no `packages`")?;
        let mut workspace: Option<(String, RustVersion)> = None;
        let mut dependencies = Vec::new();
        for package in packages {
            let name = format!(
                "{} {}",
                string(package, "name")?,
                string(package, "version")?
            );
            let rust_version = match package.get("rust_version").and_then(Value::as_str) {
                Some(text) => Some(RustVersion::parse(text).map_err(|e| format!("{name}: {e}"))?),
                None => None,
            };
            if !members.contains(&string(package, "id")?) {
                dependencies.push((name, rust_version));
                continue;
            }
            // Every member inherits `[workspace.package] rust-version`; one that did not
            // would make "the workspace's MSRV" meaningless.
            let rust_version = rust_version
                .ok_or_else(|| format!("workspace member {name} declares no rust-version"))?;
            match &workspace {
                None => workspace = Some((name, rust_version)),
                Some((first, seen)) if *seen != rust_version => {
                    return Err(format!(
                        "workspace members disagree on rust-version: {first} says {seen}, \
                         {name} says {rust_version}"
                    ));
                }
                Some(_) => {}
            }
        }
        let (_, workspace) = workspace.ok_or("cargo metadata: no workspace members")?;
        Ok(Self {
            workspace,
            dependencies,
        })
    }

    /// The dependencies that need a newer Rust than the workspace says, newest first.
    fn newer_than_workspace(&self) -> Vec<(&str, RustVersion)> {
        let mut newer: Vec<_> = self
            .dependencies
            .iter()
            .filter_map(|(name, version)| Some((name.as_str(), (*version)?)))
            .filter(|(_, version)| version.cmp(&self.workspace) == Ordering::Greater)
            .collect();
        newer.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        newer
    }
}

fn cargo_metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let output = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--manifest-path",
            manifest,
        ])
        .output()
        .unwrap_or_else(|error| panic!("could not run `{cargo} metadata`: {error}"));
    assert!(
        output.status.success(),
        "`{cargo} metadata` failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON")
}

#[test]
fn no_dependency_needs_a_newer_rust_than_the_workspace_declares() {
    let graph = Graph::from_metadata(&cargo_metadata()).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        graph.dependencies.len() > 10,
        "cargo metadata listed only {} dependencies: is this the workspace?",
        graph.dependencies.len()
    );
    let newer = graph.newer_than_workspace();
    assert!(
        newer.is_empty(),
        "the workspace says rust-version = \"{}\", but these packages need newer: {}; raise \
         `[workspace.package] rust-version` in Cargo.toml",
        graph.workspace,
        newer
            .iter()
            .map(|(name, version)| format!("{name} (rust-version {version})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// The checker on a made-up `cargo metadata`: the test above can fail.
fn metadata(workspace: &str, dependencies: &[(&str, Option<&str>)]) -> Value {
    let mut packages = vec![serde_json::json!({
        "name": "member", "version": "0.1.0", "id": "member-id", "rust_version": workspace,
    })];
    for (name, rust_version) in dependencies {
        packages.push(serde_json::json!({
            "name": name, "version": "1.0.0", "id": format!("{name}-id"),
            "rust_version": rust_version,
        }));
    }
    serde_json::json!({ "workspace_members": ["member-id"], "packages": packages })
}

#[test]
fn a_dependency_with_a_newer_rust_version_is_named() {
    let graph = Graph::from_metadata(&metadata(
        "1.85",
        &[
            ("old", Some("1.70")),
            ("same", Some("1.85.0")),
            ("none", None),
            ("uuid", Some("1.89.0")),
            ("sha2", Some("1.88")),
        ],
    ))
    .unwrap();
    let newer: Vec<String> = graph
        .newer_than_workspace()
        .iter()
        .map(|(name, version)| format!("{name} {version}"))
        .collect();
    assert_eq!(newer, ["uuid 1.0.0 1.89.0", "sha2 1.0.0 1.88.0"]);
}

#[test]
fn versions_compare_by_number_not_by_text() {
    let v = |text| RustVersion::parse(text).unwrap();
    assert!(v("1.100") > v("1.89.0"));
    assert_eq!(v("1.88"), v("1.88.0"));
    assert!(v("1.88.1") > v("1.88"));
    assert!(RustVersion::parse("1.x").is_err());
    assert!(RustVersion::parse("1.2.3.4").is_err());
}
