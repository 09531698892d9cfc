//! What the repositories' contracts share: the cases that broke, what a case expects of
//! a write, and the check of a write's answer and of what is stored after it.

use std::fmt::Debug;

use crate::RepositoryError;

/// What broke, case by case: a failing run lists every case, not only the first.
#[derive(Debug, Default)]
pub(super) struct Broken(Vec<String>);

impl Broken {
    pub(super) fn check(&mut self, holds: bool, case: impl FnOnce() -> String) {
        if !holds {
            self.0.push(case());
        }
    }

    /// Panics listing every case that broke, if any: the `contract` broke.
    pub(super) fn assert_none(self, contract: &str) {
        assert!(
            self.0.is_empty(),
            "the {contract} contract broke in {} case(s):\n{}",
            self.0.len(),
            self.0.join("\n")
        );
    }
}

/// What the contract says of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// It replaces what is stored.
    Written,
    /// It answers that it replaced nothing (a compare-and-set from a route not stored).
    Unchanged,
    /// It is refused with an error; what is stored is unchanged.
    Refused,
}

/// A write of `next` over `stored` (a route, a migration record), which the contract
/// says `expect` of.
pub(super) struct Case<T> {
    pub(super) name: String,
    pub(super) stored: T,
    pub(super) next: T,
    pub(super) expect: Expect,
}

impl<T: PartialEq + Debug> Case<T> {
    /// Checks the write's answer (whether it replaced `stored`) and what is stored after
    /// it, `now`, against `expect`; a refusal must pass `refusal`.
    pub(super) fn answered(
        &self,
        broken: &mut Broken,
        answer: Result<bool, RepositoryError>,
        now: Option<T>,
        refusal: impl FnOnce(&RepositoryError) -> bool,
    ) {
        let holds = match (self.expect, &answer) {
            (Expect::Written, Ok(true)) => now.as_ref() == Some(&self.next),
            (Expect::Unchanged, Ok(false)) => now.as_ref() == Some(&self.stored),
            (Expect::Refused, Err(error)) => refusal(error) && now.as_ref() == Some(&self.stored),
            _ => false,
        };
        broken.check(holds, || {
            let (name, expect, answer) = (&self.name, self.expect, describe(&answer));
            format!("{name}: {expect:?} by the contract, answered {answer}, stored now {now:?}")
        });
    }
}

/// A write's answer in a broken case's words.
pub(super) fn describe<T: Debug>(answer: &Result<T, RepositoryError>) -> String {
    match answer {
        Ok(answered) => format!("Ok({answered:?})"),
        Err(error) => format!("Err(`{}`: {error})", error.what()),
    }
}
