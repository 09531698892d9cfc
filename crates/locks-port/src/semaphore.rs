//! Counting semaphores: "at most N at a time" for one name, and the versioned derivation
//! of a name into the `(class, slot)` pairs of PostgreSQL's two-`integer` advisory locks.
//!
//! See ADR 0018 (`docs/adr/0018-semaphores-and-leader-election.md`) for the design.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::{
    AcquireOptions, AcquisitionErrorKind, LockAcquisitionError, LostSignal, ReleaseOutcome,
};

/// The most permits one semaphore may have. A larger `permits` is a
/// [`Configuration`](AcquisitionErrorKind::Configuration) error: the PostgreSQL manager
/// keeps one advisory lock per permit in use, and the server's lock table holds a few
/// thousand by default.
pub const MAX_PERMITS: u32 = 1 << 16;

/// How a semaphore's name becomes the `(class, slot)` pairs of its advisory locks.
///
/// Versioned like [`KeyDerivation`](crate::KeyDerivation): every process using one
/// semaphore must use the same derivation, so a new one is a new variant, chosen
/// explicitly.
///
/// PostgreSQL keeps the two-`integer` key space (`pg_locks.objsubid = 2`) apart from the
/// one-`bigint` space of every lock id (`objsubid = 1`), so a semaphore's locks never
/// collide with a lock of this library or of the Python one, whatever the names.
///
/// ```
/// use locks_port::PermitDerivation;
///
/// let v1 = PermitDerivation::V1;
/// let class = v1.class("reports");
/// assert!(class >= 0 && class % 2 == 0);
/// assert_eq!(v1.slot_key("reports", 2), (class, 2));
/// assert_eq!(v1.since_class("reports"), class + 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PermitDerivation {
    /// Version 1: the class is the first four bytes of SHA-256 over
    /// `"locks-semaphore-v1:"` and the name's UTF-8 bytes, read big-endian, with the top
    /// bit and the lowest bit cleared (a non-negative, even `integer`). Within the class,
    /// slots `0..N` are the permits; the odd class `class + 1` is the adapter's to use
    /// (the PostgreSQL adapter records there when each permit was granted). How an
    /// adapter queues waiters on the negative slots of the class is the adapter's own.
    #[default]
    V1,
}

impl PermitDerivation {
    /// The derivation used when none is chosen.
    pub const CURRENT: Self = Self::V1;

    /// The class (first `integer`) of every lock of the semaphore `name`.
    #[must_use]
    pub fn class(self, name: &str) -> i32 {
        match self {
            Self::V1 => {
                let mut hasher = Sha256::new();
                hasher.update(b"locks-semaphore-v1:");
                hasher.update(name.as_bytes());
                let digest = hasher.finalize();
                let mut prefix = [0u8; 4];
                prefix.copy_from_slice(&digest[..4]);
                let masked = u32::from_be_bytes(prefix) & 0x7FFF_FFFE;
                i32::try_from(masked).unwrap_or(0)
            }
        }
    }

    /// The class of the "since" locks of `name` (see [`PermitDerivation::V1`]).
    #[must_use]
    pub fn since_class(self, name: &str) -> i32 {
        self.class(name) | 1
    }

    /// The lock of permit `slot` (`0..N`).
    #[must_use]
    pub fn slot_key(self, name: &str, slot: u32) -> (i32, i32) {
        (self.class(name), i32::try_from(slot).unwrap_or(i32::MAX))
    }

    /// A stable, human-readable name for this derivation.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::V1 => "semaphore-v1",
        }
    }
}

/// Checks a call on semaphore `name` with `permits`: the name non-empty (else an
/// [`InvalidKey`](AcquisitionErrorKind::InvalidKey) error, as [`check_key`](crate::check_key))
/// and `permits` in `1..=MAX_PERMITS` (else a
/// [`Configuration`](AcquisitionErrorKind::Configuration) error naming the input). Both
/// errors speak of a permit (see [`LockAcquisitionError::for_permit`]).
///
/// ```
/// use locks_port::{check_permits, AcquisitionErrorKind};
///
/// assert!(check_permits("jobs", 3).is_ok());
/// let zero = check_permits("jobs", 0).unwrap_err();
/// assert_eq!(zero.kind(), AcquisitionErrorKind::Configuration);
/// assert_eq!(
///     zero.to_string(),
///     "Failed to acquire a permit of semaphore 'jobs': a semaphore needs 1 to 65536 permits, not 0"
/// );
/// assert!(check_permits("jobs", u32::MAX).is_err());
/// assert_eq!(check_permits("", 3).unwrap_err().kind(), AcquisitionErrorKind::InvalidKey);
/// ```
///
/// # Errors
/// As above.
pub fn check_permits(name: &str, permits: u32) -> Result<u32, LockAcquisitionError> {
    crate::check_key(name).map_err(LockAcquisitionError::for_permit)?;
    if (1..=MAX_PERMITS).contains(&permits) {
        Ok(permits)
    } else {
        Err(LockAcquisitionError::new(
            name,
            AcquisitionErrorKind::Configuration,
            format!("a semaphore needs 1 to {MAX_PERMITS} permits, not {permits}"),
        )
        .for_permit())
    }
}

/// The error for a semaphore used with different numbers of permits.
#[must_use]
pub fn permits_disagree(name: &str, asked: u32, others: &[u32]) -> LockAcquisitionError {
    let others: Vec<String> = others.iter().map(u32::to_string).collect();
    LockAcquisitionError::new(
        name,
        AcquisitionErrorKind::Configuration,
        format!(
            "the semaphore is in use with {} permits, this call asked for {asked}: every \
             process must use the same number",
            others.join(" and ")
        ),
    )
    .for_permit()
}

/// What a manager hands back with a permit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PermitInfo {
    name: Arc<str>,
    permits: u32,
    slot: u32,
    acquired_at: SystemTime,
    holder_id: Option<String>,
    fencing_token: Option<i64>,
}

impl PermitInfo {
    /// A permit granted now: `slot` of `permits` on the semaphore `name`.
    #[must_use]
    pub fn acquired_now(
        name: impl Into<Arc<str>>,
        permits: u32,
        slot: u32,
        holder_id: Option<String>,
    ) -> Self {
        Self {
            name: name.into(),
            permits,
            slot,
            acquired_at: SystemTime::now(),
            holder_id,
            fencing_token: None,
        }
    }

    /// The same value carrying the fencing token of this grant.
    #[must_use]
    pub fn with_fencing_token(mut self, token: i64) -> Self {
        self.fencing_token = Some(token);
        self
    }

    /// The semaphore's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits the semaphore has (the `permits` of the call).
    #[must_use]
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Which permit this is, in `0..permits`.
    #[must_use]
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// When the permit was granted, in UTC.
    #[must_use]
    pub fn acquired_at(&self) -> OffsetDateTime {
        OffsetDateTime::from(self.acquired_at)
    }

    /// The holder label of the manager that took the permit, if it has one.
    #[must_use]
    pub fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }

    /// The fencing token of this grant, when the manager hands them out: it grows with
    /// every grant of any permit of this semaphore. `None` when fencing is off.
    #[must_use]
    pub fn fencing_token(&self) -> Option<i64> {
        self.fencing_token
    }
}

/// One held permit, as [`Semaphore::permit_holders`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolder {
    /// Which permit, in `0..permits`.
    pub slot: u32,
    /// The holder label of the manager that holds it, when known.
    pub holder_id: Option<String>,
    /// When it was granted (to the second on PostgreSQL), when known.
    pub since: Option<OffsetDateTime>,
}

impl PermitHolder {
    /// A holder of `slot`.
    #[must_use]
    pub fn new(slot: u32, holder_id: Option<String>, since: Option<OffsetDateTime>) -> Self {
        Self {
            slot,
            holder_id,
            since,
        }
    }
}

/// Who holds and who waits for the permits of one semaphore right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitHolders {
    /// The numbers of permits the participants use: one value normally, several when
    /// processes disagree, none when nobody holds or waits.
    pub permits: Vec<u32>,
    /// The held permits, by slot.
    pub held: Vec<PermitHolder>,
    /// How many acquisitions wait for a permit.
    pub waiting: usize,
}

/// A held permit. Dropping it releases the permit; [`release`](PermitGuard::release)
/// does the same and says what happened.
pub trait PermitGuard: Send + fmt::Debug {
    /// The permit this guard holds.
    fn info(&self) -> &PermitInfo;

    /// Fires when the permit is no longer held (as
    /// [`LockGuard::lost`](crate::LockGuard::lost)).
    fn lost(&self) -> LostSignal;

    /// Whether the permit is no longer held (a cheap local check).
    fn is_lost(&self) -> bool {
        self.lost().is_lost()
    }

    /// Releases the permit now and reports how.
    ///
    /// # Cancel safety
    /// Dropping the returned future part-way still releases the permit: at worst the
    /// session that held it is closed instead of unlocked.
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send;
}

/// A counting semaphore per name: at most `permits` holders of one name at a time.
///
/// The contract, the same for every manager (the conformance cases stamped out by
/// `locks-conformance`'s `semaphore_suite!` check it):
/// - at most `permits` guards of one name are held at once, across every manager that
///   shares the backend;
/// - waiters are served roughly in arrival order, and a freed permit goes to a waiter
///   rather than to a later [`try_acquire_permit`](Semaphore::try_acquire_permit);
/// - `options` work as for a lock: no timeout waits forever, a timeout bounds the wait
///   (one attempt at least, zero is exactly one try), and a timeout's error names the
///   permit (`Failed to acquire a permit of semaphore '{name}': Timeout after {s}s`);
/// - `permits` of 0 or above [`MAX_PERMITS`], and a `permits` that differs from the
///   one other holders or waiters of the name use, fail with
///   [`AcquisitionErrorKind::Configuration`]; the empty name fails with
///   [`AcquisitionErrorKind::InvalidKey`], as the empty key does;
/// - cancel safe: a dropped call leaves no permit held and no wait queued;
/// - a semaphore never contends with the lock of the same name.
///
/// ```
/// use std::time::Duration;
/// use locks_port::{LockAcquisitionError, PermitGuard, Semaphore};
///
/// /// At most three reports at once, fleet-wide.
/// async fn report<S: Semaphore>(semaphores: &S) -> Result<(), LockAcquisitionError> {
///     let permit = semaphores
///         .acquire_permit("reports", 3, Duration::from_secs(30))
///         .await?;
///     assert!(permit.info().slot() < 3);
///     // ... the report; `permit.lost()` fires if the permit is lost meanwhile ...
///     permit.release().await;
///     Ok(())
/// }
/// ```
pub trait Semaphore: Send + Sync {
    /// The guard of a held permit.
    type Permit: PermitGuard;

    /// Takes one of the `permits` permits of `name`, waiting as `options` say: its
    /// timeout as for a lock; its mode and wait strategy are ignored (a permit is
    /// exclusive, and waiters always queue).
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`](crate::DistributedLock::acquire), plus
    /// [`AcquisitionErrorKind::Configuration`] for a bad or disagreeing `permits`.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves no permit held and no wait queued.
    fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Permit, LockAcquisitionError>> + Send;

    /// Takes a permit if one is free right now and nobody waits for one; `Ok(None)`
    /// otherwise. Never waits.
    ///
    /// # Errors
    /// As [`acquire_permit`](Semaphore::acquire_permit); contention is never an error.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_permit`](Semaphore::acquire_permit).
    fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
    ) -> impl Future<Output = Result<Option<Self::Permit>, LockAcquisitionError>> + Send;

    /// Who holds and who waits for the permits of `name` right now, across every
    /// manager sharing the backend.
    ///
    /// # Errors
    /// A backend failure, as a [`LockAcquisitionError`] naming `name`.
    fn permit_holders(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<PermitHolders, LockAcquisitionError>> + Send;

    /// Whether permit `slot` of `name` is held right now, without saying by whom: for a
    /// poll that only needs to know (a leader watch). A manager may answer it more
    /// cheaply than [`permit_holders`](Semaphore::permit_holders), whose cost on
    /// PostgreSQL grows with every lock held on the server; the default asks
    /// `permit_holders`.
    ///
    /// # Errors
    /// A backend failure, as a [`LockAcquisitionError`] naming `name`.
    fn permit_held(
        &self,
        name: &str,
        slot: u32,
    ) -> impl Future<Output = Result<bool, LockAcquisitionError>> + Send {
        let holders = self.permit_holders(name);
        async move {
            let holders = holders.await?;
            Ok(holders.held.iter().any(|held| held.slot == slot))
        }
    }
}

/// A shared reference is a manager too, so `LeaderElection::new(&manager, name)` and
/// other users generic over the port can borrow one (an `Arc<M>` lends one with
/// `&*arc`).
impl<S: Semaphore + ?Sized> Semaphore for &S {
    type Permit = S::Permit;

    fn acquire_permit(
        &self,
        name: &str,
        permits: u32,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Permit, LockAcquisitionError>> + Send {
        (**self).acquire_permit(name, permits, options)
    }

    fn try_acquire_permit(
        &self,
        name: &str,
        permits: u32,
    ) -> impl Future<Output = Result<Option<Self::Permit>, LockAcquisitionError>> + Send {
        (**self).try_acquire_permit(name, permits)
    }

    fn permit_holders(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<PermitHolders, LockAcquisitionError>> + Send {
        (**self).permit_holders(name)
    }

    fn permit_held(
        &self,
        name: &str,
        slot: u32,
    ) -> impl Future<Output = Result<bool, LockAcquisitionError>> + Send {
        (**self).permit_held(name, slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_even_non_negative_and_stable() {
        let v1 = PermitDerivation::V1;
        for name in ["", "reports", "é", "\0", &"k".repeat(10_000)] {
            let class = v1.class(name);
            assert!(class >= 0 && class % 2 == 0, "{name:?}: {class}");
            assert_eq!(class, v1.class(name));
            assert_eq!(v1.since_class(name), class + 1);
        }
        // The golden vector of version 1: changing it breaks every running fleet.
        assert_eq!(v1.class("reports"), 1_210_612_880);
        assert_ne!(v1.class("a"), v1.class("b"));
    }

    #[test]
    fn bad_permit_counts_are_errors_not_panics() {
        for bad in [0, MAX_PERMITS + 1, u32::MAX] {
            let error = check_permits("n", bad).unwrap_err();
            assert_eq!(error.kind(), AcquisitionErrorKind::Configuration);
            assert!(error.is_permit());
            assert!(error.to_string().contains(&format!("permits, not {bad}")));
        }
        let error = permits_disagree("n", 3, &[4]);
        assert_eq!(
            error.to_string(),
            "Failed to acquire a permit of semaphore 'n': the semaphore is in use with 4 permits, this call \
             asked for 3: every process must use the same number"
        );
    }
}
