//! How a slot's run ended: the outcome a claim decides on and a ledger records.

use std::fmt;

/// How a slot's run ended (or that it has not yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Claimed and running, or its runner died (which only a runner that holds the job's
    /// lock can conclude).
    Running,
    /// The job returned `Ok`.
    Succeeded,
    /// The job returned an error (its text is the row's detail).
    Failed,
    /// The runner died mid-job; under at-most-once the slot counts as done.
    Abandoned,
    /// No instance fired during the slot; recorded when the next firing found the gap.
    Missed,
}

impl Outcome {
    /// The outcome's name in the ledger table and in metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Abandoned => "abandoned",
            Self::Missed => "missed",
        }
    }

    /// The outcome named `text` (see [`as_str`](Self::as_str)).
    #[must_use]
    pub fn from_name(text: &str) -> Option<Self> {
        [
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::Abandoned,
            Self::Missed,
        ]
        .into_iter()
        .find(|outcome| outcome.as_str() == text)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
