//! Finding the PostgreSQL server binaries.

use std::env;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::Error;

/// Environment variable naming the folder that holds `initdb`, `pg_ctl` and `postgres`;
/// when set it wins over every other place.
pub const BINDIR_ENV: &str = "THROWAWAY_PG_BINDIR";

/// Where Debian and Ubuntu install each PostgreSQL major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// A folder holding the server binaries.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// Looks, in order, at `$THROWAWAY_PG_BINDIR`, `pg_config --bindir`, the highest
    /// `/usr/lib/postgresql/<version>/bin`, and the `PATH`.
    pub(crate) fn find() -> Result<Self, Error> {
        let mut looked_in = Vec::new();

        if let Some(dir) = env::var_os(BINDIR_ENV).filter(|dir| !dir.is_empty()) {
            let dir = PathBuf::from(dir);
            if has_server_binaries(&dir) {
                return Ok(Self { dir });
            }
            looked_in.push(format!("{BINDIR_ENV}={}", dir.display()));
        }

        match pg_config_bindir() {
            Some(dir) if has_server_binaries(&dir) => return Ok(Self { dir }),
            Some(dir) => looked_in.push(format!("`pg_config --bindir` ({})", dir.display())),
            None => looked_in.push("`pg_config --bindir` (no pg_config)".to_owned()),
        }

        let mut versions = debian_version_dirs(Path::new(DEBIAN_ROOT));
        versions.sort_by(|a, b| b.0.cmp(&a.0));
        if let Some((_, dir)) = versions
            .into_iter()
            .find(|(_, dir)| has_server_binaries(dir))
        {
            return Ok(Self { dir });
        }
        looked_in.push(format!("{DEBIAN_ROOT}/*/bin"));

        if let Some(dir) = env::var_os("PATH")
            .iter()
            .flat_map(env::split_paths)
            .find(|dir| has_server_binaries(dir))
        {
            return Ok(Self { dir });
        }
        looked_in.push("PATH".to_owned());

        Err(Error::NotInstalled { looked_in })
    }

    /// Uses `dir` as is, if it holds the server binaries.
    pub(crate) fn at(dir: PathBuf) -> Result<Self, Error> {
        if has_server_binaries(&dir) {
            Ok(Self { dir })
        } else {
            Err(Error::NotInstalled {
                looked_in: vec![dir.display().to_string()],
            })
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn has_server_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"]
        .iter()
        .all(|name| dir.join(name).is_file())
}

fn pg_config_bindir() -> Option<PathBuf> {
    let output = Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| PathBuf::from(text))
}

/// `(version, <root>/<version>/bin)` for each `<root>/<version>` whose name is a version number.
fn debian_version_dirs(root: &Path) -> Vec<(Vec<u32>, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = parse_version(&entry.file_name())?;
            Some((version, entry.path().join("bin")))
        })
        .collect()
}

/// `"15"` → `[15]`, `"9.6"` → `[9, 6]`; anything else → `None`.
fn parse_version(name: &OsStr) -> Option<Vec<u32>> {
    name.to_str()?
        .split('.')
        .map(|part| part.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically_not_as_text() {
        let mut versions: Vec<Vec<u32>> = ["9.6", "15", "10", "16"]
            .iter()
            .map(|name| parse_version(OsStr::new(name)).unwrap())
            .collect();
        versions.sort();
        assert_eq!(versions, [vec![9, 6], vec![10], vec![15], vec![16]]);
        assert_eq!(parse_version(OsStr::new("15beta")), None);
        assert_eq!(parse_version(OsStr::new("")), None);
    }

    #[test]
    fn the_highest_installed_version_is_found() {
        let root =
            std::env::temp_dir().join(format!("throwaway-pg-bindirs-{}", std::process::id()));
        for version in ["9.6", "16", "10", "notaversion"] {
            std::fs::create_dir_all(root.join(version).join("bin")).unwrap();
        }
        let mut found = debian_version_dirs(&root);
        found.sort_by(|a, b| b.0.cmp(&a.0));
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].1, root.join("16").join("bin"));
    }
}
