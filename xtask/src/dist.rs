//! `cargo xtask dist`: a Debian package of `pglock` for operators, in `target/dist/`.
//!
//! The package holds the release binary, the man pages (`pglock man --dir`, gzipped), the
//! bash, zsh and fish completions (`pglock completions`), and a systemd unit example for
//! `--leader`. It is assembled by hand and built with `dpkg-deb --build`, which every
//! Debian system has: nothing to install, no network, and the format needs only a
//! `DEBIAN/control` file beside the tree (cargo-deb would add a `cargo install` and a
//! second description of the same files).
//!
//! `cargo xtask dist --check` also installs the package with `dpkg -i`, runs
//! `pglock --version` and `man -w pglock`, and removes it again ([`check`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::workspace_root;

const HELP: &str = "\
usage: cargo xtask dist [--check]

Builds pglock in release mode and packs target/dist/pglock_<version>_<arch>.deb with
dpkg-deb. --check then installs it (dpkg -i, as root or with password-less sudo), runs
pglock --version and man -w pglock, and removes it.
";

/// The systemd unit example for `--leader`, installed under the package's examples.
const LEADER_UNIT: &str = "\
# An example: the fleet's one scheduler. Copy to /etc/systemd/system/, then for a job
# named NAME put DATABASE_URL=... in /etc/pglock/NAME.env and the command in
# /etc/pglock/NAME, and run `systemctl enable --now pglock-leader@NAME` on every host.
# One host leads; the others wait and take over when it goes (pglock(1), LEADER MODE).
[Unit]
Description=pglock leader for %i
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile=/etc/pglock/%i.env
ExecStart=/usr/bin/pglock run --leader --lease 30s %i -- /etc/pglock/%i
Restart=always
RestartSec=2s
# SIGTERM to pglock alone, which forwards it to the command's process group and exits with
# its status; SIGKILL of the whole cgroup after TimeoutStopSec. Keep --grace below it.
KillMode=mixed
TimeoutStopSec=15s

[Install]
WantedBy=multi-user.target
";

/// `cargo xtask dist [--check]`.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let check_it = match args {
        [] => false,
        [flag] if flag == "--check" => true,
        [flag] if flag == "-h" || flag == "--help" => {
            print!("{HELP}");
            return Ok(());
        }
        other => return Err(format!("unknown arguments {other:?}\n\n{HELP}").into()),
    };
    if check_it {
        build_and_check()?;
    } else {
        println!("{}", build()?.display());
    }
    Ok(())
}

/// Builds the package and checks that it installs, runs and removes cleanly: the step
/// for `cargo xtask test` to call (it needs root or password-less sudo, and dpkg).
pub(crate) fn build_and_check() -> crate::Result {
    let deb = build()?;
    println!("{}", deb.display());
    check(&deb)
}

/// Builds the package; its path.
pub(crate) fn build() -> crate::Result<PathBuf> {
    let status = crate::cargo()
        .args(["build", "--release", "--locked", "-p", "pglock"])
        .status()?;
    if !status.success() {
        return Err(format!("cargo build --release -p pglock failed ({status})").into());
    }
    let target = target_dir();
    let binary = target.join("release/pglock");
    let version = output(Command::new(&binary).arg("--version"))?;
    let version = version
        .trim()
        .strip_prefix("pglock ")
        .ok_or_else(|| format!("unexpected pglock --version: {version}"))?
        .to_owned();
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let arch = arch.trim();
    let name = format!("pglock_{version}_{arch}");
    let stage = target.join("dist").join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }

    let bin = stage.join("usr/bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(&binary, bin.join("pglock"))?;

    let man = stage.join("usr/share/man/man1");
    std::fs::create_dir_all(&man)?;
    run_ok(Command::new(&binary).args(["man", "--dir"]).arg(&man))?;
    for page in std::fs::read_dir(&man)? {
        run_ok(Command::new("gzip").args(["-9n"]).arg(page?.path()))?;
    }

    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/pglock"),
        ("zsh", "usr/share/zsh/vendor-completions/_pglock"),
        ("fish", "usr/share/fish/vendor_completions.d/pglock.fish"),
    ] {
        let script = output(Command::new(&binary).args(["completions", shell]))?;
        write(&stage.join(path), &script)?;
    }

    let doc = stage.join("usr/share/doc/pglock");
    write(&doc.join("examples/pglock-leader@.service"), LEADER_UNIT)?;
    write(
        &doc.join("copyright"),
        "pglock, part of the pg-advisory-locks project.\nLicense: MIT OR Apache-2.0\n",
    )?;

    let size_kib = directory_size(&stage)?.div_ceil(1024);
    write(
        &stage.join("DEBIAN/control"),
        &format!(
            "Package: pglock\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: pg-advisory-locks maintainers <pglock@invalid>\n\
             Installed-Size: {size_kib}\n\
             Depends: libc6\n\
             Section: utils\n\
             Priority: optional\n\
             Description: run a command under a PostgreSQL advisory lock\n \
             flock(1) across hosts: pglock takes a string-keyed PostgreSQL session\n \
             advisory lock, runs the command while holding it, and never lets the\n \
             command outlive the lock. Also semaphores (--permits) and leader\n \
             election (--leader), who/list/break for operators.\n"
        ),
    )?;
    let deb = target.join("dist").join(format!("{name}.deb"));
    run_ok(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    Ok(deb)
}

/// Installs `deb`, checks that `pglock --version` runs and `man -w pglock` finds the page,
/// and removes the package again (also when a check fails). Needs root or password-less
/// sudo; installs `man` (man-db) with the project's script when it is missing.
pub(crate) fn check(deb: &Path) -> crate::Result {
    if !crate::deps::on_path("man") {
        crate::deps::run_install_script("man is missing")?;
    }
    let root = is_root();
    let as_root = |program: &str| {
        if root {
            Command::new(program)
        } else {
            let mut command = Command::new("sudo");
            command.args(["-n", program]);
            command
        }
    };
    run_ok(as_root("dpkg").arg("-i").arg(deb))?;
    let checks = (|| -> crate::Result {
        let version = output(Command::new("/usr/bin/pglock").arg("--version"))?;
        if !version.starts_with("pglock ") {
            return Err(format!("pglock --version said {version:?}").into());
        }
        let page = output(Command::new("man").args(["-w", "pglock"]))?;
        if !page.trim().ends_with("pglock.1.gz") {
            return Err(format!("man -w pglock found {page:?}").into());
        }
        let unit = "/usr/share/doc/pglock/examples/pglock-leader@.service";
        if !Path::new(unit).is_file() {
            return Err(format!("{unit} is missing").into());
        }
        println!(
            "dist: installed: {}; man page {}",
            version.trim(),
            page.trim()
        );
        Ok(())
    })();
    let removed = run_ok(as_root("dpkg").args(["-r", "pglock"]));
    checks?;
    removed?;
    if Path::new("/usr/bin/pglock").exists() {
        return Err("dpkg -r pglock left /usr/bin/pglock behind".into());
    }
    Ok(())
}

/// `$CARGO_TARGET_DIR`, else the workspace's `target`.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_ok_and(|id| id.trim() == "0")
}

fn write(path: &Path, text: &str) -> crate::Result {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    Ok(())
}

fn directory_size(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        total += if metadata.is_dir() {
            directory_size(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}

/// Runs `command`; an error naming it when it fails.
fn run_ok(command: &mut Command) -> crate::Result {
    let status = command
        .status()
        .map_err(|error| format!("cannot run {command:?}: {error}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed ({status})").into())
    }
}

/// Runs `command` and returns its stdout.
fn output(command: &mut Command) -> crate::Result<String> {
    let done = command
        .output()
        .map_err(|error| format!("cannot run {command:?}: {error}"))?;
    if !done.status.success() {
        return Err(format!(
            "{command:?} failed ({}): {}",
            done.status,
            String::from_utf8_lossy(&done.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&done.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_refused() {
        assert!(run(&["--frobnicate".to_owned()]).is_err());
        assert!(run(&["--help".to_owned()]).is_ok());
    }
}
