//! Runners killed mid-job, and the server restarted mid-slot.

/// The child that runs a job that never ends (see the crash tests).
pub(crate) async fn child_crash() {}
