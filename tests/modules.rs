//! The imports between the modules of each crate, read from its `src/` as
//! the review's `modcycles.py` (outside this repository) reads them: every `crate::x` path (`use crate::x::…`, a path
//! in code or a doc link), `x` a top-level module of the crate, test modules
//! (`#[cfg(test)] mod tests { … }`) left out.
//!
//! - No crate has an import circle of more than one module ([`CEILING`]): a circle of
//!   modules means none of them can be read, tested or replaced alone.
//! - `locks-postgres` stands in floors ([`POSTGRES_FLOORS`], mirrored in the "Floors"
//!   section of `docs/architecture.md`): a module imports only from a lower floor, or
//!   from a module listed before it on its own floor.
//! - The bench (`lock-bench`) stands in floors too ([`BENCH_FLOORS`], said in
//!   `bench/src/main.rs`), more strictly: a module imports only from a lower floor, never
//!   from its own (no scenario imports another).
//!
//! The checks work on module texts, so the unit tests below plant a back-edge, a circle
//! and an unplaced module in a small crate held in memory and see each caught.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The largest import circle any crate may have: 1, a module alone (no two modules
/// import each other, directly or around a circle). Before wave 5 the largest were
/// locks-postgres 26, pglock 6, locks-memory 5, locks-leader, locks-schedule and
/// lock-bench 2.
const CEILING: usize = 1;

/// The floors of `locks-postgres`, lowest first, each with its modules lowest first. A
/// module may import a module of a lower floor, or one listed before it on its own
/// floor; never one after it, nor one of a higher floor. Mirrored in
/// `docs/architecture.md` ("Floors"); every module of the crate must be on a floor.
const POSTGRES_FLOORS: &[(&str, &[&str])] = &[
    (
        "ground",
        &[
            "lease",
            "limit",
            "watchdog",
            "errors",
            "telemetry",
            "settings",
            "metrics",
            "lock_ids",
            "query",
            "pool",
            "connection",
            "sql",
            "slot",
        ],
    ),
    (
        "book and monitor",
        &[
            "multiplex",
            "bookkeeping",
            "health",
            "inner",
            "stall",
            "monitor",
        ],
    ),
    (
        "strategies",
        &[
            "release",
            "mode_change",
            "guard",
            "xact",
            "fencing",
            "grant",
            "checkout",
            "acquire",
            "many",
            "inspect",
            "semaphore",
            "lock_table",
            "board",
            "store",
        ],
    ),
    ("API", &["builder", "manager"]),
];

const POSTGRES: &str = "locks-postgres";

/// The floors of the bench, lowest first: a module imports only from a lower floor,
/// never from one on its own ([`Beside::Never`]), so the scenarios are rooms apart over
/// one harness. Said in `bench/src/main.rs`; every module of the bench must be on a floor.
const BENCH_FLOORS: &[(&str, &[&str])] = &[
    ("ground", &["plan", "stats", "proxy", "otel"]),
    ("harness", &["harness", "db", "chart"]),
    ("clients and turns", &["clients", "turns"]),
    (
        "scenarios",
        &[
            "cycles",
            "throughput",
            "handoff",
            "hold",
            "memory",
            "instructions",
            "latency",
            "cutover_append",
            "scale",
        ],
    ),
];

const BENCH: &str = "lock-bench";

/// What a module may import from its own floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beside {
    /// A module listed before it (`locks-postgres`: a floor is ordered too).
    Before,
    /// Nothing (the bench: the modules of a floor stand side by side).
    Never,
}

/// A crate's floors: the table, where it lives and is mirrored (for the messages), and
/// the rule on one floor.
#[derive(Debug, Clone, Copy)]
struct Floors<'a> {
    /// The table's name in this file.
    name: &'a str,
    /// Where else the floors are said, to be kept in step.
    mirror: &'a str,
    beside: Beside,
    table: &'a [(&'a str, &'a [&'a str])],
}

const POSTGRES_RULE: Floors<'static> = Floors {
    name: "POSTGRES_FLOORS",
    mirror: "docs/architecture.md (\"Floors\")",
    beside: Beside::Before,
    table: POSTGRES_FLOORS,
};

const BENCH_RULE: Floors<'static> = Floors {
    name: "BENCH_FLOORS",
    mirror: "the floors paragraph of bench/src/main.rs",
    beside: Beside::Never,
    table: BENCH_FLOORS,
};

/// One `crate::x` path in a module's text.
#[derive(Debug, Clone)]
struct Import {
    /// The file, as shown in a failure (relative to the workspace root).
    file: String,
    line: usize,
    /// The line it is on, trimmed.
    text: String,
    /// The top-level module it names.
    target: String,
}

/// A crate's top-level modules, each with the `crate::` paths of its files (a module's
/// own paths and those naming something that is not a module are left out).
type Modules = BTreeMap<String, Vec<Import>>;

/// The top-level module a file of `src/` belongs to (`None`: the crate root), from its
/// path relative to `src/` with `/` separators.
fn top_module(relative: &str) -> Option<String> {
    let path = relative.strip_suffix(".rs")?;
    let first = path.split('/').next()?;
    match first {
        "lib" | "main" if !path.contains('/') => None,
        _ => Some(first.to_owned()),
    }
}

/// The text of a file without its test module: everything before the first
/// `#[cfg(test)]` followed by `mod tests`.
fn without_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let start = from + at;
        let rest = text[start + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests") {
            return &text[..start];
        }
        from = start + 1;
    }
    text
}

/// Every `x` of `crate::x` in `text`, `x` a lowercase identifier (`crate::Foo`, a path
/// through the crate root's re-exports, names no module), with its offset; and every
/// item of a group, `crate::{x, y::z}` (`modcycles.py` does not see those; this test does).
fn crate_paths(text: &str) -> Vec<(usize, &str)> {
    let is_ident = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let ident_at = |at: usize| {
        let rest = &text[at..];
        let starts = rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '_');
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        starts.then(|| &rest[..end])
    };
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("crate::") {
        let start = from + at + "crate::".len();
        from = start;
        if let Some(ident) = ident_at(start) {
            found.push((start, ident));
        } else if text[start..].starts_with('{') {
            // The group's items at its top level: each starts after `{` or a `,`.
            let mut depth = 0;
            for (offset, c) in text[start..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if depth == 1 && matches!(c, '{' | ',') {
                    let item = start + offset + 1;
                    let skipped = text[item..].len() - text[item..].trim_start().len();
                    if let Some(ident) = ident_at(item + skipped) {
                        found.push((item + skipped, ident));
                    }
                }
            }
        }
    }
    found
}

/// The modules of a crate from its files: (path relative to `src/`, text), `shown` the
/// prefix of the file names in failures.
fn modules_of(shown: &str, files: &[(String, String)]) -> Modules {
    let mut modules = Modules::new();
    for (relative, _) in files {
        if let Some(module) = top_module(relative) {
            modules.entry(module).or_default();
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    for (relative, text) in files {
        let Some(module) = top_module(relative) else {
            continue;
        };
        let imports = modules.get_mut(&module).expect("registered above");
        let text = without_tests(text);
        for (offset, target) in crate_paths(text) {
            if target == module || !names.contains(target) {
                continue;
            }
            let line_start = text[..offset].rfind('\n').map_or(0, |at| at + 1);
            let line_end = text[offset..]
                .find('\n')
                .map_or(text.len(), |at| offset + at);
            imports.push(Import {
                file: format!("{shown}/{relative}"),
                line: text[..offset].matches('\n').count() + 1,
                text: text[line_start..line_end].trim().to_owned(),
                target: target.to_owned(),
            });
        }
    }
    modules
}

/// The circles of modules that reach each other (Tarjan's strongly connected
/// components), each of more than one module, sorted.
fn circles(modules: &Modules) -> Vec<Vec<String>> {
    struct Search<'a> {
        edges: BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, module: &'a str) {
            let number = self.index.len();
            self.index.insert(module, number);
            self.low.insert(module, number);
            self.stack.push(module);
            self.on_stack.insert(module);
            let targets: Vec<&str> = self.edges[module].iter().copied().collect();
            for target in targets {
                if !self.index.contains_key(target) {
                    self.visit(target);
                    let low = self.low[module].min(self.low[target]);
                    self.low.insert(module, low);
                } else if self.on_stack.contains(target) {
                    let low = self.low[module].min(self.index[target]);
                    self.low.insert(module, low);
                }
            }
            if self.low[module] == self.index[module] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.to_owned());
                    if member == module {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let edges = modules
        .iter()
        .map(|(module, imports)| {
            let targets = imports
                .iter()
                .map(|import| import.target.as_str())
                .collect();
            (module.as_str(), targets)
        })
        .collect();
    let mut search = Search {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for module in modules.keys() {
        if !search.index.contains_key(module.as_str()) {
            search.visit(module);
        }
    }
    search.found.sort();
    search.found
}

/// The largest circle's size, 0 without one (as `modcycles.py` prints it).
fn largest_circle(modules: &Modules) -> usize {
    circles(modules).iter().map(Vec::len).max().unwrap_or(0)
}

/// Where a module stands: its floor's number and name, and its place on the floor.
#[derive(Clone, Copy)]
struct Place<'a> {
    floor: usize,
    name: &'a str,
    rank: usize,
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "floor {} \"{}\", place {}",
            self.floor + 1,
            self.name,
            self.rank + 1
        )
    }
}

/// What breaks the floors.
#[derive(Debug, PartialEq, Eq)]
enum FloorViolation {
    /// A module imports one that is not below it.
    Upward(String),
    /// A module of the crate is on no floor.
    Unplaced(String),
    /// The table names a module the crate does not have.
    Unknown(String),
}

impl fmt::Display for FloorViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Upward(text) | Self::Unplaced(text) | Self::Unknown(text) => f.write_str(text),
        }
    }
}

/// Every import of `modules` that is not from below, by the `floors` table and its rule
/// on one floor, and every module the table and the crate do not agree on.
fn floor_violations(modules: &Modules, floors: &Floors<'_>) -> Vec<FloorViolation> {
    let mut places: BTreeMap<&str, Place<'_>> = BTreeMap::new();
    for (floor, (name, members)) in floors.table.iter().enumerate() {
        for (rank, module) in members.iter().enumerate() {
            places.insert(module, Place { floor, name, rank });
        }
    }
    let mut violations = Vec::new();
    for module in places.keys() {
        if !modules.contains_key(*module) {
            violations.push(FloorViolation::Unknown(format!(
                "the floors name `{module}`, which is no module of the crate: take it out \
                 of {} (tests/modules.rs) and {}",
                floors.name, floors.mirror
            )));
        }
    }
    for (module, imports) in modules {
        let Some(&from) = places.get(module.as_str()) else {
            violations.push(FloorViolation::Unplaced(format!(
                "module `{module}` is on no floor: place it in {} (tests/modules.rs) and \
                 in {}",
                floors.name, floors.mirror
            )));
            continue;
        };
        for import in imports {
            let Some(&to) = places.get(import.target.as_str()) else {
                continue; // reported as unplaced
            };
            let whence = match floors.beside {
                Beside::Never if to.floor == from.floor => "from its own floor",
                Beside::Never if to.floor > from.floor => "from above it",
                Beside::Before if (to.floor, to.rank) >= (from.floor, from.rank) => "from above it",
                _ => continue,
            };
            violations.push(FloorViolation::Upward(format!(
                "{}:{}: `{}` imports `{}` {whence}: `{module}` is on {from}, `{}` on {to}\n    {}",
                import.file, import.line, module, import.target, import.target, import.text
            )));
        }
    }
    violations
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, relative to it with `/` separators, with its text.
fn rust_files(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        let entries = std::fs::read_dir(dir)
            .unwrap_or_else(|error| panic!("read {}: {error}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let relative = path.strip_prefix(root).expect("under the root");
                let relative = relative
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|error| panic!("read {}: {error}", path.display()));
                out.push((relative, text));
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    files.sort();
    files
}

/// Every workspace member with a `src/`: its package name and its modules.
fn workspace_crates() -> Vec<(String, Modules)> {
    let root = workspace_root();
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .expect("read Cargo.toml")
        .parse()
        .expect("Cargo.toml is TOML");
    let members = manifest["workspace"]["members"]
        .as_array()
        .expect("workspace.members");
    let mut crates = Vec::new();
    for member in members {
        let member = member.as_str().expect("a member is a path");
        let dir = root.join(member);
        let src = dir.join("src");
        if !src.is_dir() {
            continue; // `tests/`: test targets only, no module tree
        }
        let package: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
            .unwrap_or_else(|error| panic!("read {member}/Cargo.toml: {error}"))
            .parse()
            .expect("a member's manifest is TOML");
        let name = package["package"]["name"]
            .as_str()
            .expect("package.name")
            .to_owned();
        crates.push((
            name,
            modules_of(&format!("{member}/src"), &rust_files(&src)),
        ));
    }
    crates
}

#[test]
fn no_crate_has_an_import_circle_above_its_ceiling() {
    let crates = workspace_crates();
    assert!(
        crates.iter().any(|(name, _)| name == POSTGRES),
        "{POSTGRES} not found among the workspace members"
    );
    let mut over = Vec::new();
    for (name, modules) in &crates {
        let largest = largest_circle(modules);
        println!(
            "{name}: {} modules, largest import circle {largest} (ceiling {CEILING})",
            modules.len()
        );
        for circle in circles(modules) {
            println!("    circle of {}: {}", circle.len(), circle.join(" "));
        }
        if largest > CEILING {
            over.push(format!(
                "{name}: largest import circle {largest}, above the ceiling {CEILING}: {:?}",
                circles(modules)
            ));
        }
    }
    assert!(over.is_empty(), "\n{}\n", over.join("\n"));
}

/// Fails, naming each, on every import of crate `krate` that `floors` do not allow.
fn assert_floors(krate: &str, floors: &Floors<'_>) {
    let crates = workspace_crates();
    let (_, modules) = crates
        .iter()
        .find(|(name, _)| name == krate)
        .unwrap_or_else(|| panic!("{krate} is not a member"));
    let violations = floor_violations(modules, floors);
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
fn the_adapter_imports_only_from_lower_floors() {
    assert_floors(POSTGRES, &POSTGRES_RULE);
}

#[test]
fn the_bench_imports_only_from_lower_floors() {
    assert_floors(BENCH, &BENCH_RULE);
}

/// The files of `locks-postgres` that may hold `impl Inner` blocks: the handle itself and
/// the monitor (closing a session and losing what it held). Every other room is free
/// functions over `&Inner`, so that its calls into other rooms are imports.
const IMPL_INNER_FILES: &[&str] = &["inner.rs", "monitor.rs"];

#[test]
fn only_the_handle_and_the_monitor_implement_inner() {
    let src = workspace_root().join("crates/locks-postgres/src");
    let mut found = Vec::new();
    for (relative, text) in rust_files(&src) {
        for (index, line) in without_tests(&text).lines().enumerate() {
            if line.starts_with("impl Inner") && !IMPL_INNER_FILES.contains(&relative.as_str()) {
                found.push(format!(
                    "crates/locks-postgres/src/{relative}:{}: `{line}`: write the room's \
                     operations as free functions over `&Inner` (see inner.rs)",
                    index + 1
                ));
            }
        }
    }
    assert!(found.is_empty(), "\n{}\n", found.join("\n"));
}

/// A floor's row in `docs/architecture.md`'s table.
fn floor_row(number: usize, name: &str, members: &[&str]) -> String {
    let members: Vec<String> = members.iter().map(|module| format!("`{module}`")).collect();
    format!("| {number} | {name} | {} |", members.join(", "))
}

#[test]
fn docs_architecture_md_states_the_floors_of_this_test() {
    let doc = std::fs::read_to_string(workspace_root().join("docs/architecture.md")).unwrap();
    assert!(
        doc.contains("## Floors"),
        "docs/architecture.md has no \"Floors\" section"
    );
    for (index, (name, members)) in POSTGRES_FLOORS.iter().enumerate() {
        let row = floor_row(index + 1, name, members);
        assert!(
            doc.contains(&row),
            "docs/architecture.md does not state floor {} as\n{row}",
            index + 1
        );
    }
}

// The checker on a small crate held in memory.

const FLOORS: Floors<'static> = Floors {
    name: "FLOORS",
    mirror: "the docs",
    beside: Beside::Before,
    table: &[("ground", &["errors", "sql"]), ("top", &["manager"])],
};

/// The same floors, the bench's way: nothing from one's own floor.
const APART: Floors<'static> = Floors {
    beside: Beside::Never,
    ..FLOORS
};

fn small_crate(sql: &str) -> Modules {
    let files = [
        (
            "lib.rs",
            "mod errors;\nmod sql;\nmod manager;\npub use crate::manager::M;\n",
        ),
        ("errors.rs", "pub(crate) struct E;\n"),
        ("sql.rs", sql),
        (
            "manager/mod.rs",
            "use crate::sql::S;\nuse crate::errors::E;\n",
        ),
    ]
    .map(|(path, text)| (path.to_owned(), text.to_owned()));
    modules_of("src", &files)
}

#[test]
fn a_crate_that_imports_downward_breaks_nothing() {
    let modules = small_crate("use crate::errors::E;\n/// See [`crate::Root`].\n");
    assert_eq!(modules.len(), 3, "{modules:?}");
    assert_eq!(largest_circle(&modules), 0);
    assert_eq!(floor_violations(&modules, &FLOORS), []);
}

#[test]
fn a_planted_back_edge_is_named_with_its_file_import_and_both_floors() {
    let modules = small_crate("use crate::errors::E;\nuse crate::manager::Inner;\n");
    let violations = floor_violations(&modules, &FLOORS);
    let [FloorViolation::Upward(text)] = violations.as_slice() else {
        panic!("{violations:?}");
    };
    assert_eq!(
        text,
        "src/sql.rs:2: `sql` imports `manager` from above it: `sql` is on floor 1 \"ground\", \
         place 2, `manager` on floor 2 \"top\", place 1\n    use crate::manager::Inner;"
    );
    // It closes a circle too: sql -> manager -> sql.
    assert_eq!(circles(&modules), [["manager", "sql"]]);
    assert_eq!(largest_circle(&modules), 2);
}

#[test]
fn a_floor_neighbour_above_counts_as_above() {
    let modules = small_crate("");
    let mut errors_up = modules.clone();
    errors_up.get_mut("errors").unwrap().push(Import {
        file: "src/errors.rs".into(),
        line: 1,
        text: "use crate::sql::S;".into(),
        target: "sql".into(),
    });
    assert!(matches!(
        floor_violations(&errors_up, &FLOORS).as_slice(),
        [FloorViolation::Upward(text)] if text.contains("`errors` imports `sql` from above it")
    ));
}

#[test]
fn where_a_floor_stands_apart_its_own_floor_counts_too() {
    // sql imports errors, listed before it on the ground: allowed in order, not apart.
    let modules = small_crate("use crate::errors::E;\n");
    assert_eq!(floor_violations(&modules, &FLOORS), []);
    let violations = floor_violations(&modules, &APART);
    let [FloorViolation::Upward(text)] = violations.as_slice() else {
        panic!("{violations:?}");
    };
    assert_eq!(
        text,
        "src/sql.rs:1: `sql` imports `errors` from its own floor: `sql` is on floor 1 \
         \"ground\", place 2, `errors` on floor 1 \"ground\", place 1\n    use crate::errors::E;"
    );
    // An import from above is one in either way; from below, in neither.
    let up = small_crate("use crate::manager::M;\n");
    assert!(matches!(
        floor_violations(&up, &APART).as_slice(),
        [FloorViolation::Upward(text)] if text.contains("`sql` imports `manager` from above it")
    ));
    assert_eq!(floor_violations(&small_crate(""), &APART), []);
}

#[test]
fn imports_in_a_test_module_do_not_count() {
    let modules = small_crate(
        "use crate::errors::E;\n\n#[cfg(test)]\nmod tests {\n    use crate::manager::M;\n}\n",
    );
    assert_eq!(floor_violations(&modules, &FLOORS), []);
    assert_eq!(largest_circle(&modules), 0);
}

#[test]
fn a_module_on_no_floor_and_a_floor_naming_no_module_fail() {
    let mut modules = small_crate("");
    modules.insert("shards".into(), Vec::new());
    let floors = Floors {
        table: &[
            ("ground", &["errors", "sql", "gone"]),
            ("top", &["manager"]),
        ],
        ..FLOORS
    };
    let violations = floor_violations(&modules, &floors);
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, FloorViolation::Unplaced(text) if text.contains("`shards`")))
    );
    assert!(
        violations
            .iter()
            .any(|v| matches!(v, FloorViolation::Unknown(text) if text.contains("`gone`")))
    );
}

#[test]
fn paths_are_read_as_modcycles_reads_them() {
    let text = "use crate::{a, b::{c, d}};\nuse crate::{\n    e::F,\n    self,\n};\ncrate::sql::x(); crate::Root; crate::m2_x::y";
    let found: Vec<&str> = crate_paths(text)
        .into_iter()
        .map(|(_, name)| name)
        .collect();
    assert_eq!(found, ["a", "b", "e", "self", "sql", "m2_x"]);
    assert_eq!(top_module("pool/mod.rs").as_deref(), Some("pool"));
    assert_eq!(top_module("pool/connect.rs").as_deref(), Some("pool"));
    assert_eq!(top_module("lib.rs"), None);
    assert_eq!(top_module("main.rs"), None);
    assert_eq!(top_module("bin/main.rs").as_deref(), Some("bin"));
}
