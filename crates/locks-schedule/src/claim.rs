//! A claim of a slot and the one function that decides it: every ledger reads the slot's
//! row and writes this decision atomically, so no two ledgers decide differently.

use time::OffsetDateTime;

use crate::Slot;
use crate::outcome::Outcome;
use crate::policy::{CrashPolicy, MissedSlots};

/// Which slot a claim is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotKind {
    /// The slot the ledger's clock is in now: refused ([`Decision::NotDue`]) once the
    /// ledger's clock has left it.
    Current,
    /// The slot before the current one: a crashed or failed run of it is settled by the
    /// crash policy, and if nothing at all was recorded for it while earlier slots were, it
    /// was missed and the missed-slot policy applies.
    Previous,
}

/// A request to run one slot of a job, made while holding the slot's lock.
#[derive(Debug, Clone)]
pub struct Claim<'a> {
    /// The job's name.
    pub name: &'a str,
    /// The slot.
    pub slot: Slot,
    /// The current slot, or the one before it.
    pub kind: SlotKind,
    /// Who claims (written to the row).
    pub holder: &'a str,
    /// What a dead or failed earlier attempt means.
    pub crash: CrashPolicy,
    /// What a slot nobody fired in means.
    pub missed: MissedSlots,
}

/// A slot's row as the ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRow {
    /// How many attempts were claimed.
    pub attempt: u32,
    /// The row's outcome.
    pub outcome: Outcome,
}

/// What a ledger does with a claim, decided by [`Claim::decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The slot is not the one the claim says on the ledger's clock; nothing written.
    NotDue,
    /// Write a new row, `running`, attempt 1: the caller runs the job.
    Run,
    /// Write the row `running` with the next attempt (keep the previous outcome): the
    /// caller runs the job again.
    Retry {
        /// The attempt to run.
        attempt: u32,
        /// The outcome of the attempt before.
        previous: Outcome,
    },
    /// Mark the running row `abandoned` (its runner is gone): the slot counts as done.
    Abandon,
    /// Write a new row `missed`: nobody ran the slot and nobody will.
    RecordMissed,
    /// Nothing to write: the slot already ran (or was settled) with this outcome.
    AlreadyDone(Outcome),
    /// Nothing to write for the previous slot: it ran or was settled, or it has no row
    /// because nothing was missed (the job never ran before, or a later slot ran).
    NothingToDo,
}

impl Claim<'_> {
    /// The decision for this claim, given the ledger's clock `now`, the slot's row (if
    /// any), and the start of the latest slot with a row for the job (if any).
    ///
    /// The caller holds the slot's lock, so a `running` row is a dead runner's.
    #[must_use]
    pub fn decide(
        &self,
        now: OffsetDateTime,
        row: Option<&SlotRow>,
        latest: Option<OffsetDateTime>,
    ) -> Decision {
        let due = match self.kind {
            SlotKind::Current => self.slot.contains(now),
            SlotKind::Previous => self.slot.next() <= now,
        };
        if !due {
            return Decision::NotDue;
        }
        let Some(row) = row else {
            return match self.kind {
                SlotKind::Current => Decision::Run,
                SlotKind::Previous => match latest {
                    Some(latest) if latest < self.slot.start() => match self.missed {
                        MissedSlots::Skip => Decision::RecordMissed,
                        MissedSlots::RunLatest => Decision::Run,
                    },
                    _ => Decision::NothingToDo,
                },
            };
        };
        match row.outcome {
            Outcome::Running | Outcome::Failed => match self.crash {
                CrashPolicy::AtLeastOnce { max_attempts } if row.attempt < max_attempts.get() => {
                    Decision::Retry {
                        attempt: row.attempt.saturating_add(1),
                        previous: if row.outcome == Outcome::Running {
                            Outcome::Abandoned
                        } else {
                            Outcome::Failed
                        },
                    }
                }
                _ if row.outcome == Outcome::Running => Decision::Abandon,
                _ => self.done(row.outcome),
            },
            outcome => self.done(outcome),
        }
    }

    /// A settled slot: the current one is reported as already run, the previous one needs
    /// nothing.
    fn done(&self, outcome: Outcome) -> Decision {
        match self.kind {
            SlotKind::Current => Decision::AlreadyDone(outcome),
            SlotKind::Previous => Decision::NothingToDo,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use time::macros::datetime;

    use super::*;

    fn claim(kind: SlotKind, crash: CrashPolicy, missed: MissedSlots) -> Claim<'static> {
        Claim {
            name: "job",
            slot: Slot::new(
                datetime!(2026-01-01 00:00:10 UTC),
                datetime!(2026-01-01 00:00:11 UTC),
            )
            .expect("a slot"),
            kind,
            holder: "me",
            crash,
            missed,
        }
    }

    fn row(attempt: u32, outcome: Outcome) -> SlotRow {
        SlotRow { attempt, outcome }
    }

    const IN_SLOT: OffsetDateTime = datetime!(2026-01-01 00:00:10.5 UTC);
    const AFTER: OffsetDateTime = datetime!(2026-01-01 00:00:11 UTC);

    #[test]
    fn the_current_slot_is_claimed_only_while_the_ledger_clock_is_in_it() {
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        assert_eq!(current.decide(IN_SLOT, None, None), Decision::Run);
        assert_eq!(
            current.decide(AFTER, None, None),
            Decision::NotDue,
            "the boundary passed"
        );
        assert_eq!(
            current.decide(datetime!(2026-01-01 00:00:09.999 UTC), None, None),
            Decision::NotDue,
            "not yet"
        );
        let previous = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        assert_eq!(previous.decide(IN_SLOT, None, None), Decision::NotDue);
    }

    #[test]
    fn a_settled_slot_is_not_run_again() {
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        for outcome in [
            Outcome::Succeeded,
            Outcome::Failed,
            Outcome::Abandoned,
            Outcome::Missed,
        ] {
            assert_eq!(
                current.decide(IN_SLOT, Some(&row(1, outcome)), None),
                Decision::AlreadyDone(outcome)
            );
        }
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Running)), None),
            Decision::Abandon
        );
    }

    #[test]
    fn at_least_once_retries_up_to_max_attempts() {
        let max_attempts = NonZeroU32::new(2).expect("2");
        let current = claim(
            SlotKind::Current,
            CrashPolicy::AtLeastOnce { max_attempts },
            MissedSlots::Skip,
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Running)), None),
            Decision::Retry {
                attempt: 2,
                previous: Outcome::Abandoned
            }
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(1, Outcome::Failed)), None),
            Decision::Retry {
                attempt: 2,
                previous: Outcome::Failed
            }
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(2, Outcome::Running)), None),
            Decision::Abandon
        );
        assert_eq!(
            current.decide(IN_SLOT, Some(&row(2, Outcome::Failed)), None),
            Decision::AlreadyDone(Outcome::Failed)
        );
        let max = NonZeroU32::new(u32::MAX).expect("max");
        let unbounded = claim(
            SlotKind::Current,
            CrashPolicy::AtLeastOnce { max_attempts: max },
            MissedSlots::Skip,
        );
        assert_eq!(
            unbounded.decide(IN_SLOT, Some(&row(u32::MAX - 1, Outcome::Failed)), None),
            Decision::Retry {
                attempt: u32::MAX,
                previous: Outcome::Failed
            }
        );
        assert_eq!(
            unbounded.decide(IN_SLOT, Some(&row(u32::MAX, Outcome::Failed)), None),
            Decision::AlreadyDone(Outcome::Failed)
        );
    }

    #[test]
    fn a_gap_before_the_current_slot_follows_the_missed_slot_policy() {
        let earlier = Some(datetime!(2026-01-01 00:00:05 UTC));
        let skip = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::Skip,
        );
        let run = claim(
            SlotKind::Previous,
            CrashPolicy::AtMostOnce,
            MissedSlots::RunLatest,
        );
        assert_eq!(skip.decide(AFTER, None, earlier), Decision::RecordMissed);
        assert_eq!(run.decide(AFTER, None, earlier), Decision::Run);
        assert_eq!(
            run.decide(AFTER, None, None),
            Decision::NothingToDo,
            "a new job missed nothing"
        );
        let later = Some(datetime!(2026-01-01 00:00:11 UTC));
        assert_eq!(
            run.decide(AFTER, None, later),
            Decision::NothingToDo,
            "a later slot ran"
        );
        assert_eq!(
            run.decide(AFTER, Some(&row(1, Outcome::Succeeded)), earlier),
            Decision::NothingToDo
        );
    }
}
