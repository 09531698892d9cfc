//! Enforces the invariants of `docs/architecture.md` by reading the Cargo manifests.
//!
//! The checker works on parsed manifests, so its unit tests below can break each rule on a
//! small in-memory workspace and see it caught.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

const PORT: &str = "locks-port";
const POSTGRES: &str = "locks-postgres";
const MEMORY: &str = "locks-memory";
const CUTOVER: &str = "migration-cutover";
const XTASK: &str = "xtask";
const THROWAWAY_PG: &str = "throwaway-pg";
const WORKSPACE_TESTS: &str = "workspace-tests";
const LOCK_BENCH: &str = "lock-bench";
const PGLOCK: &str = "pglock";
const CUTOVER_POSTGRES: &str = "migration-cutover-postgres";
const SCHEDULE: &str = "locks-schedule";
const SCHEDULE_POSTGRES: &str = "locks-schedule-postgres";
const LEADER: &str = "locks-leader";
const CONFORMANCE: &str = "locks-conformance";
const SHARD: &str = "locks-shard";
const SHARD_POSTGRES: &str = "locks-shard-postgres";

const LIBRARIES: &[&str] = &[
    PORT,
    CONFORMANCE,
    POSTGRES,
    MEMORY,
    CUTOVER,
    CUTOVER_POSTGRES,
    SCHEDULE,
    SCHEDULE_POSTGRES,
    LEADER,
    SHARD,
    SHARD_POSTGRES,
];
/// The workspace crates the shards' PostgreSQL term store may use outside its tests.
const SHARD_ADAPTER_MAY_USE: &[&str] = &[SHARD, PORT, POSTGRES];
/// The workspace crates the schedule's PostgreSQL ledger may use outside its tests.
const SCHEDULE_ADAPTER_MAY_USE: &[&str] = &[SCHEDULE, PORT, POSTGRES];
const ADAPTERS: &[&str] = &[POSTGRES, MEMORY];
const TOOLING: &[&str] = &[XTASK, THROWAWAY_PG, WORKSPACE_TESTS, LOCK_BENCH];
/// Adapters of the cutover's ports (event stores, repositories, write pause).
const CUTOVER_ADAPTERS: &[&str] = &[CUTOVER_POSTGRES];
/// The workspace crates a cutover adapter may use outside its tests.
const CUTOVER_ADAPTER_MAY_USE: &[&str] = &[CUTOVER, PORT, POSTGRES];
/// Programs built on the libraries: they may use any library, never tooling outside their tests.
const APPLICATIONS: &[&str] = &[PGLOCK];

/// Async executors.
const RUNTIME_CRATES: &[&str] = &[
    "tokio",
    "async-std",
    "smol",
    "async-executor",
    "async-global-executor",
    "futures-executor",
    "actix-rt",
    "glommio",
    "monoio",
];

/// Database clients, drivers and pools.
const DATABASE_CRATES: &[&str] = &[
    "tokio-postgres",
    "postgres",
    "postgres-protocol",
    "postgres-types",
    "deadpool",
    "deadpool-postgres",
    "bb8",
    "bb8-postgres",
    "r2d2",
    "r2d2_postgres",
    "sqlx",
    "sqlx-core",
    "sqlx-postgres",
    "diesel",
    "diesel-async",
    "sea-orm",
    "pq-sys",
    "libpq",
];

/// The invariants of `docs/architecture.md`, in order: number `i + 1` is `INVARIANTS[i]`.
const INVARIANTS: &[&str] = &[
    "The port is pure.",
    "The port depends on no other workspace crate",
    "Adapters depend on the port, not on each other.",
    "The in-memory double stays a double.",
    "The cutover knows only the port.",
    "Tooling stays out of the libraries.",
    "Tooling is not published.",
    "One set of lints.",
    "Every crate has a ring.",
    "Applications stand on the libraries.",
    "The cutover's adapters stand on the cutover's ports.",
    "The schedule knows only the port; its ledger stands on it.",
    "The leader election knows only the port.",
    "The conformance suite stands on the port alone, and only tests take it.",
    "The shards know only the port; their term store stands on them.",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    Normal,
    Build,
    Dev,
}

#[derive(Debug, Clone)]
struct Dependency {
    /// The package name (after `package = "…"` renames).
    package: String,
    table: Table,
    optional: bool,
}

#[derive(Debug, Clone)]
struct Crate {
    name: String,
    manifest: String,
    dependencies: Vec<Dependency>,
    publish_false: bool,
    workspace_lints: bool,
}

impl Crate {
    /// Normal and build dependencies (optional ones included).
    fn normal(&self) -> impl Iterator<Item = &Dependency> {
        self.dependencies
            .iter()
            .filter(|dep| dep.table != Table::Dev)
    }

    fn any(&self) -> impl Iterator<Item = &Dependency> {
        self.dependencies.iter()
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Violation {
    invariant: usize,
    krate: String,
    message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant {} of docs/architecture.md (\"{}\") is broken by {}: {}",
            self.invariant,
            INVARIANTS[self.invariant - 1].trim_end_matches('.'),
            self.krate,
            self.message
        )
    }
}

/// Parses one member's manifest. `workspace_deps` is the root's `[workspace.dependencies]`,
/// for renames through `workspace = true`.
fn parse_crate(manifest: &str, text: &str, workspace_deps: &toml::Table) -> Result<Crate, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|error| format!("{manifest} is not valid TOML: {error}"))?;
    let package = table
        .get("package")
        .and_then(toml::Value::as_table)
        .ok_or_else(|| format!("{manifest} has no [package]"))?;
    let name = package
        .get("name")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| format!("{manifest} has no package.name"))?
        .to_owned();

    let mut tables = Vec::new();
    dependency_tables(&table, &mut tables);
    if let Some(targets) = table.get("target").and_then(toml::Value::as_table) {
        for target in targets.values().filter_map(toml::Value::as_table) {
            dependency_tables(target, &mut tables);
        }
    }

    let mut dependencies = Vec::new();
    for (kind, deps) in tables {
        for (key, spec) in deps {
            let spec_table = spec.as_table();
            let field = |name: &str| spec_table.and_then(|t| t.get(name));
            let inherited = field("workspace").and_then(toml::Value::as_bool) == Some(true);
            let renamed = field("package").and_then(toml::Value::as_str).or_else(|| {
                inherited
                    .then(|| workspace_deps.get(key))
                    .flatten()
                    .and_then(toml::Value::as_table)
                    .and_then(|t| t.get("package"))
                    .and_then(toml::Value::as_str)
            });
            dependencies.push(Dependency {
                package: renamed.unwrap_or(key).to_owned(),
                table: kind,
                optional: field("optional").and_then(toml::Value::as_bool) == Some(true),
            });
        }
    }

    let publish_false = package.get("publish").and_then(toml::Value::as_bool) == Some(false);
    let workspace_lints = table
        .get("lints")
        .and_then(toml::Value::as_table)
        .and_then(|lints| lints.get("workspace"))
        .and_then(toml::Value::as_bool)
        == Some(true);

    Ok(Crate {
        name,
        manifest: manifest.to_owned(),
        dependencies,
        publish_false,
        workspace_lints,
    })
}

/// The dependency tables directly in `root` (the manifest, or one `[target.…]` table).
fn dependency_tables<'a>(root: &'a toml::Table, out: &mut Vec<(Table, &'a toml::Table)>) {
    for (key, kind) in [
        ("dependencies", Table::Normal),
        ("build-dependencies", Table::Build),
        ("dev-dependencies", Table::Dev),
    ] {
        if let Some(deps) = root.get(key).and_then(toml::Value::as_table) {
            out.push((kind, deps));
        }
    }
}

/// Every broken invariant, in the order of `docs/architecture.md`.
fn check(crates: &[Crate]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut broken = |invariant: usize, krate: &Crate, message: String| {
        violations.push(Violation {
            invariant,
            krate: format!("{} ({})", krate.name, krate.manifest),
            message,
        });
    };
    let workspace: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    let is_workspace = |name: &str| workspace.contains(&name);
    let get = |name: &str| crates.iter().find(|c| c.name == name);

    if let Some(port) = get(PORT) {
        // 1. The port is pure.
        for dep in port.normal() {
            if DATABASE_CRATES.contains(&dep.package.as_str()) {
                broken(1, port, format!("database crate `{}`", dep.package));
            } else if RUNTIME_CRATES.contains(&dep.package.as_str()) {
                broken(
                    1,
                    port,
                    format!(
                        "runtime crate `{}` (optional or not; the contract suite, which runs \
                         on one, is `{CONFORMANCE}`)",
                        dep.package
                    ),
                );
            }
        }
        // 2. The port depends on no other workspace crate.
        for dep in port.any().filter(|dep| is_workspace(&dep.package)) {
            broken(
                2,
                port,
                format!("depends on workspace crate `{}`", dep.package),
            );
        }
    }

    // 3. Adapters depend on the port, not on each other.
    for adapter in ADAPTERS.iter().filter_map(|name| get(name)) {
        if !adapter
            .dependencies
            .iter()
            .any(|dep| dep.package == PORT && dep.table == Table::Normal && !dep.optional)
        {
            broken(
                3,
                adapter,
                format!("`{PORT}` is not a (non-optional) dependency"),
            );
        }
        for dep in adapter.normal() {
            let other_adapter =
                ADAPTERS.contains(&dep.package.as_str()) && dep.package != adapter.name;
            if other_adapter || dep.package == CUTOVER {
                broken(3, adapter, format!("depends on `{}`", dep.package));
            }
        }
    }

    // 4. The in-memory double stays a double.
    if let Some(memory) = get(MEMORY) {
        for dep in memory.any() {
            let suite = dep.package == CONFORMANCE && dep.table == Table::Dev;
            if is_workspace(&dep.package) && dep.package != PORT && !suite {
                broken(
                    4,
                    memory,
                    format!("depends on workspace crate `{}`", dep.package),
                );
            }
        }
        for dep in memory.normal() {
            if DATABASE_CRATES.contains(&dep.package.as_str()) {
                broken(4, memory, format!("database crate `{}`", dep.package));
            }
        }
    }

    // 5. The cutover knows only the port.
    if let Some(cutover) = get(CUTOVER) {
        for dep in cutover.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && package != PORT {
                broken(
                    5,
                    cutover,
                    format!("depends on workspace crate `{package}`"),
                );
            } else if DATABASE_CRATES.contains(&package) {
                broken(5, cutover, format!("database crate `{package}`"));
            } else if RUNTIME_CRATES.contains(&package) {
                broken(5, cutover, format!("runtime crate `{package}`"));
            }
        }
    }

    // 6. Tooling stays out of the libraries.
    for krate in crates {
        let library = LIBRARIES.contains(&krate.name.as_str());
        for dep in krate.any() {
            if dep.package == XTASK {
                broken(6, krate, "depends on `xtask`".to_owned());
            } else if library && dep.table != Table::Dev && TOOLING.contains(&dep.package.as_str())
            {
                broken(
                    6,
                    krate,
                    format!(
                        "tooling crate `{}` as a normal dependency (a dev-dependency is fine)",
                        dep.package
                    ),
                );
            }
        }
    }

    for krate in crates {
        // 7. Tooling is not published.
        if TOOLING.contains(&krate.name.as_str()) && !krate.publish_false {
            broken(7, krate, "tooling without `publish = false`".to_owned());
        }
        // 8. One set of lints.
        if !krate.workspace_lints {
            broken(8, krate, "no `[lints] workspace = true`".to_owned());
        }
        // 9. Every crate has a ring.
        if !LIBRARIES.contains(&krate.name.as_str())
            && !TOOLING.contains(&krate.name.as_str())
            && !APPLICATIONS.contains(&krate.name.as_str())
        {
            broken(
                9,
                krate,
                "not in any ring: add it to docs/architecture.md and tests/architecture.rs"
                    .to_owned(),
            );
        }
    }

    // 10. Applications stand on the libraries.
    for app in APPLICATIONS.iter().filter_map(|name| get(name)) {
        for dep in app.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && !LIBRARIES.contains(&package) {
                broken(
                    10,
                    app,
                    format!(
                        "workspace crate `{package}` as a normal dependency (only libraries; \
                         tooling is fine as a dev-dependency)"
                    ),
                );
            }
        }
    }

    // 11. The cutover's adapters stand on the cutover's ports.
    for adapter in CUTOVER_ADAPTERS.iter().filter_map(|name| get(name)) {
        if !adapter
            .dependencies
            .iter()
            .any(|dep| dep.package == CUTOVER && dep.table == Table::Normal && !dep.optional)
        {
            broken(
                11,
                adapter,
                format!("`{CUTOVER}` is not a (non-optional) dependency"),
            );
        }
        for dep in adapter.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && !CUTOVER_ADAPTER_MAY_USE.contains(&package) {
                broken(
                    11,
                    adapter,
                    format!(
                        "depends on workspace crate `{package}` (only {})",
                        CUTOVER_ADAPTER_MAY_USE.join(", ")
                    ),
                );
            }
        }
    }
    for krate in crates {
        let library = LIBRARIES.contains(&krate.name.as_str());
        if !library || CUTOVER_ADAPTERS.contains(&krate.name.as_str()) {
            continue;
        }
        for dep in krate.any() {
            if CUTOVER_ADAPTERS.contains(&dep.package.as_str()) {
                broken(
                    11,
                    krate,
                    format!("depends on the cutover adapter `{}`", dep.package),
                );
            }
        }
    }

    // 12. The schedule knows only the port; its ledger stands on it.
    if let Some(schedule) = get(SCHEDULE) {
        for dep in schedule.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && package != PORT {
                broken(
                    12,
                    schedule,
                    format!("depends on workspace crate `{package}`"),
                );
            } else if DATABASE_CRATES.contains(&package) {
                broken(12, schedule, format!("database crate `{package}`"));
            } else if !dep.optional && RUNTIME_CRATES.contains(&package) {
                broken(
                    12,
                    schedule,
                    format!(
                        "runtime crate `{package}` as a non-optional dependency (only behind \
                         the `tokio` and `conformance` features)"
                    ),
                );
            }
        }
    }
    if let Some(adapter) = get(SCHEDULE_POSTGRES) {
        if !adapter
            .dependencies
            .iter()
            .any(|dep| dep.package == SCHEDULE && dep.table == Table::Normal && !dep.optional)
        {
            broken(
                12,
                adapter,
                format!("`{SCHEDULE}` is not a (non-optional) dependency"),
            );
        }
        for dep in adapter.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && !SCHEDULE_ADAPTER_MAY_USE.contains(&package) {
                broken(
                    12,
                    adapter,
                    format!(
                        "depends on workspace crate `{package}` (only {})",
                        SCHEDULE_ADAPTER_MAY_USE.join(", ")
                    ),
                );
            }
        }
    }

    // 13. The leader election knows only the port.
    if let Some(leader) = get(LEADER) {
        for dep in leader.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && package != PORT {
                broken(
                    13,
                    leader,
                    format!("depends on workspace crate `{package}`"),
                );
            } else if DATABASE_CRATES.contains(&package) {
                broken(13, leader, format!("database crate `{package}`"));
            }
        }
    }

    // 14. The conformance suite stands on the port alone, and only tests take it.
    if let Some(suite) = get(CONFORMANCE) {
        for dep in suite.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && package != PORT {
                broken(14, suite, format!("depends on workspace crate `{package}`"));
            } else if DATABASE_CRATES.contains(&package) {
                broken(14, suite, format!("database crate `{package}`"));
            }
        }
    }
    for krate in crates {
        let user =
            LIBRARIES.contains(&krate.name.as_str()) || APPLICATIONS.contains(&krate.name.as_str());
        if !user || krate.name == CONFORMANCE {
            continue;
        }
        if krate.normal().any(|dep| dep.package == CONFORMANCE) {
            broken(
                14,
                krate,
                format!("`{CONFORMANCE}` as a normal dependency (a dev-dependency is fine)"),
            );
        }
    }

    // 15. The shards know only the port; their term store stands on them.
    if let Some(shard) = get(SHARD) {
        for dep in shard.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && package != PORT {
                broken(15, shard, format!("depends on workspace crate `{package}`"));
            } else if DATABASE_CRATES.contains(&package) {
                broken(15, shard, format!("database crate `{package}`"));
            }
        }
    }
    if let Some(store) = get(SHARD_POSTGRES) {
        if !store
            .dependencies
            .iter()
            .any(|dep| dep.package == SHARD && dep.table == Table::Normal && !dep.optional)
        {
            broken(
                15,
                store,
                format!("`{SHARD}` is not a (non-optional) dependency"),
            );
        }
        for dep in store.normal() {
            let package = dep.package.as_str();
            if is_workspace(package) && !SHARD_ADAPTER_MAY_USE.contains(&package) {
                broken(15, store, format!("depends on workspace crate `{package}`"));
            }
        }
    }

    violations.sort_by_key(|v| v.invariant);
    violations
}

/// Reads the root manifest and every member's.
fn read_workspace(root: &Path) -> Result<Vec<Crate>, String> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|error| format!("read {}: {error}", path.display()))
    };
    let manifest: toml::Table = read(&root.join("Cargo.toml"))?
        .parse()
        .map_err(|error| format!("Cargo.toml is not valid TOML: {error}"))?;
    let workspace = manifest
        .get("workspace")
        .and_then(toml::Value::as_table)
        .ok_or("Cargo.toml has no [workspace]")?;
    let empty = toml::Table::new();
    let workspace_deps = workspace
        .get("dependencies")
        .and_then(toml::Value::as_table)
        .unwrap_or(&empty);
    let members = workspace
        .get("members")
        .and_then(toml::Value::as_array)
        .ok_or("Cargo.toml has no workspace.members")?;

    let mut dirs: Vec<PathBuf> = Vec::new();
    for member in members {
        let member = member
            .as_str()
            .ok_or("workspace.members holds a non-string")?;
        match member.strip_suffix("/*") {
            Some(parent) => {
                let entries = std::fs::read_dir(root.join(parent))
                    .map_err(|error| format!("read {parent}: {error}"))?;
                let mut found: Vec<PathBuf> = entries
                    .filter_map(Result::ok)
                    .map(|entry| entry.path())
                    .filter(|path| path.join("Cargo.toml").is_file())
                    .collect();
                found.sort();
                dirs.extend(found);
            }
            None => dirs.push(root.join(member)),
        }
    }

    dirs.iter()
        .map(|dir| {
            let path = dir.join("Cargo.toml");
            let shown = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            parse_crate(&shown, &read(&path)?, workspace_deps)
        })
        .collect()
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

#[test]
fn the_workspace_keeps_the_invariants_of_docs_architecture_md() {
    let crates = read_workspace(&workspace_root()).unwrap_or_else(|error| panic!("{error}"));
    // A renamed library would silently escape the rules that name it.
    for expected in LIBRARIES {
        assert!(
            crates.iter().any(|c| c.name == *expected),
            "`{expected}` is not a workspace member; update docs/architecture.md and this test"
        );
    }
    let violations = check(&crates);
    assert!(
        violations.is_empty(),
        "\n{}\n",
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn docs_architecture_md_states_every_invariant_this_test_enforces() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).unwrap();
    for (index, title) in INVARIANTS.iter().enumerate() {
        let line = format!("{}. **{title}", index + 1);
        assert!(
            doc.contains(&line),
            "docs/architecture.md does not state invariant {} as `{line}…`",
            index + 1
        );
    }
}

/// A small workspace that keeps every invariant; each test below breaks one.
fn good_workspace() -> BTreeMap<&'static str, String> {
    let lints = "\n[lints]\nworkspace = true\n";
    let mut manifests = BTreeMap::new();
    manifests.insert(
        PORT,
        format!(
            "[package]\nname = \"locks-port\"\n\
             [dependencies]\nsha2 = \"0.11\"\n\
             [dev-dependencies]\ntokio = \"1\"\n{lints}"
        ),
    );
    manifests.insert(
        CONFORMANCE,
        format!(
            "[package]\nname = \"locks-conformance\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ntokio = \"1\"\n\
             [dev-dependencies]\nlocks-memory = {{ path = \"../locks-memory\" }}\n{lints}"
        ),
    );
    manifests.insert(
        POSTGRES,
        format!(
            "[package]\nname = \"locks-postgres\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ndeadpool-postgres = \"0.14\"\n\
             tokio = \"1\"\n\
             [dev-dependencies]\nthrowaway-pg = {{ workspace = true }}\n\
             locks-conformance = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        MEMORY,
        format!(
            "[package]\nname = \"locks-memory\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ntokio = \"1\"\n\
             [dev-dependencies]\nlocks-conformance = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        CUTOVER,
        format!(
            "[package]\nname = \"migration-cutover\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\nuuid = \"1\"\n\
             [dev-dependencies]\nlocks-memory = {{ workspace = true }}\ntokio = \"1\"\n{lints}"
        ),
    );
    manifests.insert(
        CUTOVER_POSTGRES,
        format!(
            "[package]\nname = \"migration-cutover-postgres\"\n\
             [dependencies]\nmigration-cutover = {{ workspace = true }}\n\
             locks-port = {{ workspace = true }}\nlocks-postgres = {{ workspace = true }}\n\
             deadpool-postgres = \"0.14\"\ntokio = \"1\"\n\
             [dev-dependencies]\nthrowaway-pg = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        SCHEDULE,
        format!(
            "[package]\nname = \"locks-schedule\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ncroner = \"3\"\n\
             tokio = {{ version = \"1\", optional = true }}\n\
             [dev-dependencies]\nlocks-memory = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        SCHEDULE_POSTGRES,
        format!(
            "[package]\nname = \"locks-schedule-postgres\"\n\
             [dependencies]\nlocks-schedule = {{ workspace = true }}\n\
             deadpool-postgres = \"0.14\"\ntokio = \"1\"\n\
             [dev-dependencies]\nthrowaway-pg = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        LEADER,
        format!(
            "[package]\nname = \"locks-leader\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ntokio = \"1\"\n\
             [dev-dependencies]\nlocks-memory = {{ workspace = true }}\n\
             locks-postgres = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        SHARD,
        format!(
            "[package]\nname = \"locks-shard\"\n\
             [dependencies]\nlocks-port = {{ workspace = true }}\ntokio = \"1\"\n\
             [dev-dependencies]\nlocks-memory = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        SHARD_POSTGRES,
        format!(
            "[package]\nname = \"locks-shard-postgres\"\n\
             [dependencies]\nlocks-shard = {{ workspace = true }}\n\
             deadpool-postgres = \"0.14\"\ntokio = \"1\"\n\
             [dev-dependencies]\nthrowaway-pg = {{ workspace = true }}\n{lints}"
        ),
    );
    manifests.insert(
        PGLOCK,
        format!(
            "[package]\nname = \"pglock\"\n\
             [dependencies]\nlocks-postgres = {{ workspace = true }}\nlocks-port = {{ workspace = true }}\n\
             tokio = \"1\"\n\
             [dev-dependencies]\nthrowaway-pg = {{ workspace = true }}\n{lints}"
        ),
    );
    for name in TOOLING {
        manifests.insert(
            name,
            format!("[package]\nname = \"{name}\"\npublish = false\n{lints}"),
        );
    }
    manifests
}

fn check_manifests(manifests: &BTreeMap<&'static str, String>) -> Vec<Violation> {
    let workspace_deps: toml::Table = "renamed-port = { path = \"x\", package = \"locks-port\" }"
        .parse()
        .unwrap();
    let crates: Vec<Crate> = manifests
        .iter()
        .map(|(name, text)| {
            parse_crate(&format!("{name}/Cargo.toml"), text, &workspace_deps).unwrap()
        })
        .collect();
    check(&crates)
}

/// The invariants broken after `edit` replaces `from` with `to` in `krate`'s manifest.
fn broken_after(krate: &'static str, from: &str, to: &str) -> Vec<usize> {
    let mut manifests = good_workspace();
    let manifest = manifests.get_mut(krate).unwrap();
    assert!(
        manifest.contains(from),
        "`{from}` is not in {krate}'s test manifest"
    );
    *manifest = manifest.replacen(from, to, 1);
    check_manifests(&manifests)
        .iter()
        .map(|violation| violation.invariant)
        .collect()
}

#[test]
fn the_good_workspace_keeps_every_invariant() {
    assert_eq!(check_manifests(&good_workspace()), []);
}

#[test]
fn a_database_crate_or_a_runtime_in_the_port_breaks_invariant_1() {
    assert_eq!(
        broken_after(PORT, "sha2 = \"0.11\"", "tokio-postgres = \"0.7\""),
        [1]
    );
    assert_eq!(
        broken_after(
            PORT,
            "sha2 = \"0.11\"\n",
            "sha2 = \"0.11\"\ntokio = \"1\"\n"
        ),
        [1]
    );
    // Optional ones too: the port has no feature that pulls a runtime (the contract suite
    // is its own crate).
    assert_eq!(
        broken_after(
            PORT,
            "sha2 = \"0.11\"\n",
            "sha2 = \"0.11\"\ntokio = { version = \"1\", optional = true }\n"
        ),
        [1]
    );
    assert_eq!(
        broken_after(
            PORT,
            "sha2 = \"0.11\"\n",
            "sha2 = \"0.11\"\nsqlx = { version = \"0.8\", optional = true }\n"
        ),
        [1]
    );
}

#[test]
fn the_port_depending_on_an_adapter_breaks_invariant_2_even_for_tests() {
    assert_eq!(
        broken_after(
            PORT,
            "[dev-dependencies]\n",
            "[dev-dependencies]\nlocks-memory = \"0.1\"\n"
        ),
        [2]
    );
}

#[test]
fn an_adapter_without_the_port_or_using_another_adapter_breaks_invariant_3() {
    assert_eq!(
        broken_after(POSTGRES, "locks-port = { workspace = true }\n", ""),
        [3]
    );
    assert_eq!(
        broken_after(
            POSTGRES,
            "tokio = \"1\"",
            "locks-memory = { workspace = true }"
        ),
        [3]
    );
    // A rename through `package = …` is still the port.
    assert_eq!(
        broken_after(
            POSTGRES,
            "locks-port = { workspace = true }",
            "renamed-port = { workspace = true }"
        ),
        []
    );
}

#[test]
fn the_memory_double_using_a_database_or_another_workspace_crate_breaks_invariant_4() {
    assert_eq!(
        broken_after(MEMORY, "tokio = \"1\"", "deadpool-postgres = \"0.14\""),
        [4]
    );
    // Even only for its tests.
    assert_eq!(
        broken_after(
            MEMORY,
            "[dev-dependencies]\n",
            "[dev-dependencies]\nlocks-postgres = { workspace = true }\n"
        ),
        [4]
    );
    // Depending on the cutover also breaks invariant 3 (adapters do not use it).
    assert_eq!(
        broken_after(
            MEMORY,
            "tokio = \"1\"",
            "migration-cutover = { workspace = true }"
        ),
        [3, 4]
    );
}

#[test]
fn the_cutover_using_an_adapter_a_database_or_a_runtime_breaks_invariant_5() {
    assert_eq!(
        broken_after(
            CUTOVER,
            "uuid = \"1\"",
            "locks-postgres = { workspace = true }"
        ),
        [5]
    );
    assert_eq!(
        broken_after(CUTOVER, "uuid = \"1\"", "tokio-postgres = \"0.7\""),
        [5]
    );
    assert_eq!(broken_after(CUTOVER, "uuid = \"1\"", "tokio = \"1\""), [5]);
    // Build and target-specific dependencies count as normal ones.
    assert_eq!(
        broken_after(
            CUTOVER,
            "[dev-dependencies]",
            "[target.'cfg(unix)'.dependencies]\ntokio = \"1\"\n[dev-dependencies]"
        ),
        [5]
    );
}

#[test]
fn a_library_using_tooling_outside_its_tests_breaks_invariant_6() {
    assert_eq!(
        broken_after(
            POSTGRES,
            "[dev-dependencies]\n",
            "[build-dependencies]\nthrowaway-pg = { workspace = true }\n[dev-dependencies]\n"
        ),
        [6]
    );
    assert_eq!(
        broken_after(
            THROWAWAY_PG,
            "publish = false\n",
            "publish = false\n[dependencies]\nxtask = { path = \"../xtask\" }\n"
        ),
        [6]
    );
}

#[test]
fn published_tooling_breaks_invariant_7() {
    assert_eq!(broken_after(XTASK, "publish = false\n", ""), [7]);
}

#[test]
fn a_crate_without_workspace_lints_breaks_invariant_8() {
    assert_eq!(
        broken_after(MEMORY, "workspace = true\n", "workspace = false\n"),
        [8]
    );
}

#[test]
fn a_crate_outside_every_ring_breaks_invariant_9() {
    let mut manifests = good_workspace();
    manifests.insert(
        "locks-redis",
        "[package]\nname = \"locks-redis\"\n[lints]\nworkspace = true\n".to_owned(),
    );
    let violations = check_manifests(&manifests);
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].invariant, 9);
    let message = violations[0].to_string();
    assert!(message.contains("invariant 9"), "{message}");
    assert!(message.contains("Every crate has a ring"), "{message}");
    assert!(message.contains("locks-redis"), "{message}");
}

#[test]
fn an_application_using_tooling_outside_its_tests_breaks_invariant_10() {
    assert_eq!(
        broken_after(
            PGLOCK,
            "[dev-dependencies]\nthrowaway-pg",
            "throwaway-pg = { workspace = true }\n[dev-dependencies]\nx"
        ),
        [10]
    );
    assert_eq!(
        broken_after(
            PGLOCK,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nworkspace-tests = { path = \"../../tests\" }\n"
        ),
        [10]
    );
    // Any library is fine, including the in-memory double.
    assert_eq!(
        broken_after(
            PGLOCK,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nlocks-memory = { workspace = true }\n"
        ),
        []
    );
}

#[test]
fn the_cutover_adapter_outside_its_ring_breaks_invariant_11() {
    // Without the cutover it adapts nothing.
    assert_eq!(
        broken_after(
            CUTOVER_POSTGRES,
            "migration-cutover = { workspace = true }\n",
            ""
        ),
        [11]
    );
    // Another adapter (the in-memory double) is not one it may stand on.
    assert_eq!(
        broken_after(
            CUTOVER_POSTGRES,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nlocks-memory = { workspace = true }\n"
        ),
        [11]
    );
    // No library depends on it, not even for tests (the cutover included).
    assert_eq!(
        broken_after(
            CUTOVER,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nmigration-cutover-postgres = { workspace = true }\n"
        ),
        [11]
    );
    assert_eq!(
        broken_after(
            POSTGRES,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nmigration-cutover-postgres = { workspace = true }\n"
        ),
        [11]
    );
    // Tooling in its normal dependencies is invariant 6, as for every library, and a
    // workspace crate outside the three it may use.
    assert_eq!(
        broken_after(
            CUTOVER_POSTGRES,
            "[dev-dependencies]",
            "[build-dependencies]"
        ),
        [6, 11]
    );
}

#[test]
fn the_schedule_using_a_database_an_adapter_or_a_runtime_breaks_invariant_12() {
    assert_eq!(
        broken_after(SCHEDULE, "croner = \"3\"", "tokio-postgres = \"0.7\""),
        [12]
    );
    assert_eq!(
        broken_after(
            SCHEDULE,
            "croner = \"3\"",
            "locks-postgres = { workspace = true }"
        ),
        [12]
    );
    assert_eq!(
        broken_after(
            SCHEDULE,
            "tokio = { version = \"1\", optional = true }",
            "tokio = \"1\""
        ),
        [12]
    );
    assert_eq!(
        broken_after(
            SCHEDULE_POSTGRES,
            "locks-schedule = { workspace = true }\n",
            ""
        ),
        [12]
    );
    assert_eq!(
        broken_after(
            SCHEDULE_POSTGRES,
            "tokio = \"1\"",
            "migration-cutover = { workspace = true }"
        ),
        [12]
    );
}

#[test]
fn the_leader_election_using_a_database_or_an_adapter_breaks_invariant_13() {
    assert_eq!(
        broken_after(LEADER, "tokio = \"1\"", "tokio-postgres = \"0.7\""),
        [13]
    );
    assert_eq!(
        broken_after(
            LEADER,
            "tokio = \"1\"\n[dev",
            "tokio = \"1\"\nlocks-postgres = { workspace = true }\n[dev"
        ),
        [13]
    );
}

#[test]
fn the_conformance_suite_beyond_the_port_or_outside_tests_breaks_invariant_14() {
    // A database crate or an adapter in the suite's normal dependencies.
    assert_eq!(
        broken_after(CONFORMANCE, "tokio = \"1\"", "tokio-postgres = \"0.7\""),
        [14]
    );
    assert_eq!(
        broken_after(
            CONFORMANCE,
            "tokio = \"1\"",
            "locks-postgres = { workspace = true }"
        ),
        [14]
    );
    // A library or an application taking the suite outside its tests.
    assert_eq!(
        broken_after(
            POSTGRES,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nlocks-conformance = { workspace = true }\n"
        ),
        [14]
    );
    assert_eq!(
        broken_after(
            PGLOCK,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nlocks-conformance = { workspace = true }\n"
        ),
        [14]
    );
    // The double as a normal dependency also breaks its own rule (invariant 4).
    assert_eq!(
        broken_after(
            MEMORY,
            "tokio = \"1\"\n",
            "tokio = \"1\"\nlocks-conformance = { workspace = true }\n"
        ),
        [4, 14]
    );
    // Its tests may use the double; tooling (the bench) may use it anywhere.
    assert_eq!(
        broken_after(
            LOCK_BENCH,
            "publish = false\n",
            "publish = false\n[dependencies]\nlocks-conformance = { workspace = true }\n"
        ),
        []
    );
}

#[test]
fn the_shards_using_a_database_or_their_store_dropping_them_break_invariant_15() {
    assert_eq!(
        broken_after(SHARD, "tokio = \"1\"", "tokio-postgres = \"0.7\""),
        [15]
    );
    assert_eq!(
        broken_after(
            SHARD,
            "tokio = \"1\"\n[dev",
            "tokio = \"1\"\nlocks-memory = { workspace = true }\n[dev"
        ),
        [15]
    );
    assert_eq!(
        broken_after(SHARD_POSTGRES, "locks-shard = { workspace = true }\n", ""),
        [15]
    );
    assert_eq!(
        broken_after(
            SHARD_POSTGRES,
            "tokio = \"1\"",
            "locks-leader = { workspace = true }"
        ),
        [15]
    );
}
