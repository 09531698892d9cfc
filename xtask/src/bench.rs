//! `cargo xtask bench`: the lock benchmarks (placeholder).
//!
//! To be written: run the benchmarks inside [`crate::pg::with_database`], passing the URL to
//! the child as `LOCKS_DATABASE_URL`.

/// Runs the benchmarks with `args`.
pub(crate) fn run(_args: &[String]) -> crate::Result {
    Err("`cargo xtask bench` is not yet implemented".into())
}
