//! The two state machines: a migration's phase and a tenant's routing state.

use std::fmt;

/// The phase of one migration.
///
/// `pending → bulk_copy → dual_write → cutover → completed`; a failed cutover rolls
/// back `cutover → dual_write`; any non-terminal phase may go to `aborted` or
/// `failed`. `completed`, `aborted` and `failed` are terminal.
///
/// ```
/// use migration_cutover::Phase;
///
/// assert!(Phase::DualWrite.can_transition_to(Phase::Cutover));
/// assert!(Phase::Cutover.can_transition_to(Phase::DualWrite));
/// assert!(!Phase::Pending.can_transition_to(Phase::Cutover));
/// assert!(Phase::Pending.transition_to(Phase::Completed).is_err());
/// assert_eq!(Phase::BulkCopy.to_string(), "bulk_copy");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Created; nothing copied yet.
    Pending,
    /// Copying the tenant's history to the target in batches.
    BulkCopy,
    /// Writes go to both stores; the target keeps up with the source.
    DualWrite,
    /// A cutover holds the lock and is flipping the routing.
    Cutover,
    /// The tenant is served by the target store.
    Completed,
    /// Stopped on request; routing is back on the source.
    Aborted,
    /// Stopped by an error that needs a person.
    Failed,
}

impl Phase {
    /// Every phase, in the order of the happy path, then the other terminal ones.
    pub const ALL: [Self; 7] = [
        Self::Pending,
        Self::BulkCopy,
        Self::DualWrite,
        Self::Cutover,
        Self::Completed,
        Self::Aborted,
        Self::Failed,
    ];

    /// Whether no transition leaves this phase.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Aborted | Self::Failed)
    }

    /// Whether the state machine allows `self → next`. Staying in the same phase is
    /// not a transition.
    #[must_use]
    pub const fn can_transition_to(self, next: Self) -> bool {
        match (self, next) {
            (Self::Pending, Self::BulkCopy)
            | (Self::BulkCopy, Self::DualWrite)
            | (Self::DualWrite, Self::Cutover)
            | (Self::Cutover, Self::Completed | Self::DualWrite) => true,
            (from, Self::Aborted | Self::Failed) => !from.is_terminal(),
            _ => false,
        }
    }

    /// Whether a migration record in this phase may be saved over one in `stored`: it
    /// keeps the phase, or the machine allows `stored → self`. What every
    /// [`MigrationRepository::save`](crate::MigrationRepository::save) of this
    /// workspace checks before it replaces a record (the PostgreSQL one in its SQL).
    ///
    /// ```
    /// use migration_cutover::Phase;
    ///
    /// assert!(Phase::Cutover.may_replace(Phase::DualWrite));
    /// assert!(Phase::Completed.may_replace(Phase::Completed));
    /// assert!(!Phase::Cutover.may_replace(Phase::Completed));
    /// ```
    #[must_use]
    pub const fn may_replace(self, stored: Self) -> bool {
        self as u8 == stored as u8 || stored.can_transition_to(self)
    }

    /// `next` when the transition is allowed.
    ///
    /// # Errors
    /// [`TransitionError::Phase`] naming both phases when it is not.
    pub const fn transition_to(self, next: Self) -> Result<Self, TransitionError> {
        if self.can_transition_to(next) {
            Ok(next)
        } else {
            Err(TransitionError::Phase {
                from: self,
                to: next,
            })
        }
    }

    /// The snake-case name the Python `eventsource` library stores (`dual_write`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::BulkCopy => "bulk_copy",
            Self::DualWrite => "dual_write",
            Self::Cutover => "cutover",
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a tenant's writes are routed.
///
/// `normal → bulk_copy → dual_write → cutover_paused → migrated`; a failed cutover
/// rolls back `cutover_paused → dual_write`; any state may return to `normal`. Writes
/// are held back only in `cutover_paused`.
///
/// ```
/// use migration_cutover::RoutingState;
///
/// assert!(RoutingState::DualWrite.can_transition_to(RoutingState::CutoverPaused));
/// assert!(RoutingState::CutoverPaused.can_transition_to(RoutingState::DualWrite));
/// assert!(RoutingState::Migrated.can_transition_to(RoutingState::Normal));
/// assert!(!RoutingState::Normal.can_transition_to(RoutingState::Migrated));
/// assert!(!RoutingState::CutoverPaused.accepts_writes());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutingState {
    /// Writes go to the tenant's store; no migration.
    Normal,
    /// Writes go to the source while its history is copied.
    BulkCopy,
    /// Writes go to the source and are mirrored to the target.
    DualWrite,
    /// A cutover is flipping the routing: writes wait.
    CutoverPaused,
    /// Writes go to the target, which is now the tenant's store.
    Migrated,
}

impl RoutingState {
    /// Every state, in the order of a migration.
    pub const ALL: [Self; 5] = [
        Self::Normal,
        Self::BulkCopy,
        Self::DualWrite,
        Self::CutoverPaused,
        Self::Migrated,
    ];

    /// Whether the state machine allows `self → next`. Staying in the same state is
    /// not a transition, except `normal → normal` (returning to normal is always
    /// allowed).
    #[must_use]
    pub const fn can_transition_to(self, next: Self) -> bool {
        matches!(
            (self, next),
            (_, Self::Normal)
                | (Self::Normal, Self::BulkCopy)
                | (Self::BulkCopy, Self::DualWrite)
                | (Self::DualWrite, Self::CutoverPaused)
                | (Self::CutoverPaused, Self::Migrated | Self::DualWrite)
        )
    }

    /// Whether a route in this state may be written over one in `stored`: it keeps the
    /// state, or the machine allows `stored → self`. The state half of what every
    /// [`RoutingRepository::put`](crate::RoutingRepository::put) of this workspace
    /// checks before it replaces a route (the PostgreSQL one in its SQL); the other half
    /// is the migration's mark.
    ///
    /// ```
    /// use migration_cutover::RoutingState;
    ///
    /// assert!(RoutingState::Migrated.may_replace(RoutingState::CutoverPaused));
    /// assert!(RoutingState::DualWrite.may_replace(RoutingState::DualWrite));
    /// assert!(!RoutingState::CutoverPaused.may_replace(RoutingState::Migrated));
    /// ```
    #[must_use]
    pub const fn may_replace(self, stored: Self) -> bool {
        self as u8 == stored as u8 || stored.can_transition_to(self)
    }

    /// `next` when the transition is allowed.
    ///
    /// # Errors
    /// [`TransitionError::Routing`] naming both states when it is not.
    pub const fn transition_to(self, next: Self) -> Result<Self, TransitionError> {
        if self.can_transition_to(next) {
            Ok(next)
        } else {
            Err(TransitionError::Routing {
                from: self,
                to: next,
            })
        }
    }

    /// Whether a write may go ahead now (all states but `cutover_paused`).
    #[must_use]
    pub const fn accepts_writes(self) -> bool {
        !matches!(self, Self::CutoverPaused)
    }

    /// The snake-case name the Python `eventsource` library stores (`cutover_paused`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::BulkCopy => "bulk_copy",
            Self::DualWrite => "dual_write",
            Self::CutoverPaused => "cutover_paused",
            Self::Migrated => "migrated",
        }
    }
}

impl fmt::Display for RoutingState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transition the state machines do not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransitionError {
    /// A migration phase transition.
    #[error("illegal migration phase transition `{from}` -> `{to}`")]
    Phase {
        /// The current phase.
        from: Phase,
        /// The phase asked for.
        to: Phase,
    },
    /// A routing state transition.
    #[error("illegal routing state transition `{from}` -> `{to}`")]
    Routing {
        /// The current state.
        from: RoutingState,
        /// The state asked for.
        to: RoutingState,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_phase_machine_is_exactly_the_documented_one() {
        use Phase::*;
        let allowed = [
            (Pending, BulkCopy),
            (BulkCopy, DualWrite),
            (DualWrite, Cutover),
            (Cutover, Completed),
            (Cutover, DualWrite),
        ];
        for from in Phase::ALL {
            for to in Phase::ALL {
                let expected = allowed.contains(&(from, to))
                    || (!from.is_terminal() && matches!(to, Aborted | Failed));
                assert_eq!(from.can_transition_to(to), expected, "{from} -> {to}");
                assert_eq!(from.transition_to(to).is_ok(), expected);
            }
        }
        for terminal in [Completed, Aborted, Failed] {
            assert!(Phase::ALL.iter().all(|&to| !terminal.can_transition_to(to)));
        }
    }

    #[test]
    fn the_routing_machine_is_exactly_the_documented_one() {
        use RoutingState::*;
        let allowed = [
            (Normal, BulkCopy),
            (BulkCopy, DualWrite),
            (DualWrite, CutoverPaused),
            (CutoverPaused, Migrated),
            (CutoverPaused, DualWrite),
        ];
        for from in RoutingState::ALL {
            for to in RoutingState::ALL {
                let expected = allowed.contains(&(from, to)) || to == Normal;
                assert_eq!(from.can_transition_to(to), expected, "{from} -> {to}");
            }
        }
        assert_eq!(
            Migrated.transition_to(DualWrite).unwrap_err().to_string(),
            "illegal routing state transition `migrated` -> `dual_write`"
        );
        let writable: Vec<_> = RoutingState::ALL
            .into_iter()
            .filter(|s| !s.accepts_writes())
            .collect();
        assert_eq!(writable, [CutoverPaused]);
    }
}
