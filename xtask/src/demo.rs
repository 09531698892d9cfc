//! `cargo xtask demo`: the lock demo (placeholder).
//!
//! To be written: run the demo inside [`crate::pg::with_database`], passing the URL to the
//! child as `LOCKS_DATABASE_URL`.

/// Runs the demo with `args`.
pub(crate) fn run(_args: &[String]) -> crate::Result {
    Err("`cargo xtask demo` is not yet implemented".into())
}
