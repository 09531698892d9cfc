//! `cargo xtask first-day`: the top README's "Use it in your service" as a user builds it.
//!
//! `examples/first-day` is a crate outside the workspace (its own `[workspace]` table)
//! that depends on the crates by path, as a new user's crate depends on them. This task
//! checks that the README shows its `src/main.rs` verbatim, then runs its `cargo test`
//! (which compiles `main` and runs the unit tests on the in-memory double).

use std::fs;

const EXAMPLE: &str = "examples/first-day";

/// Runs `first-day` (it takes no arguments).
pub(crate) fn run(args: &[String]) -> crate::Result {
    if !args.is_empty() {
        return Err(format!("`first-day` takes no arguments, got `{}`", args.join(" ")).into());
    }
    test_first_day_example()
}

/// Checks the README's copy of the example's `main.rs`, then runs the example's
/// `cargo test --locked` (its own lock file pins the workspace's versions), with the
/// workspace's target folder unless `CARGO_TARGET_DIR` says otherwise.
pub(crate) fn test_first_day_example() -> crate::Result {
    let root = crate::workspace_root();
    let main_rs = fs::read_to_string(root.join(EXAMPLE).join("src/main.rs"))?;
    let readme = fs::read_to_string(root.join("README.md"))?;
    readme_shows(&readme, &main_rs)?;
    let mut cargo = crate::cargo();
    cargo
        .current_dir(root.join(EXAMPLE))
        .args(["test", "--locked"]);
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        cargo.env("CARGO_TARGET_DIR", root.join("target"));
    }
    let status = cargo.status()?;
    if status.success() {
        println!("first-day: the README's service builds outside the workspace and its tests pass");
        Ok(())
    } else {
        Err(format!("first-day: `cargo test` in {EXAMPLE} failed ({status})").into())
    }
}

/// The README must show `main_rs` as one `rust` block, unchanged.
fn readme_shows(readme: &str, main_rs: &str) -> crate::Result {
    if readme.contains(&format!("```rust\n{main_rs}```\n")) {
        Ok(())
    } else {
        Err(format!(
            "README.md does not show {EXAMPLE}/src/main.rs verbatim in a ```rust block: \
             copy the file into the \"Use it in your service\" section"
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_must_show_the_file_unchanged() {
        let main_rs = "fn main() {}\n";
        assert!(readme_shows("intro\n```rust\nfn main() {}\n```\n", main_rs).is_ok());
        assert!(readme_shows("intro\n```rust\nfn main() { }\n```\n", main_rs).is_err());
        assert!(readme_shows("intro\n", main_rs).is_err());
    }

    #[test]
    fn the_repository_readme_shows_the_example() {
        let root = crate::workspace_root();
        let main_rs = fs::read_to_string(root.join(EXAMPLE).join("src/main.rs")).unwrap();
        let readme = fs::read_to_string(root.join("README.md")).unwrap();
        readme_shows(&readme, &main_rs).unwrap();
    }
}
