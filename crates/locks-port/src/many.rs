//! Several keys at once: the capability both managers offer beside [`DistributedLock`].

use std::fmt;
use std::future::Future;

use crate::{
    AcquireOptions, DistributedLock, LockAcquisitionError, LockInfo, LostSignal, ReleaseOutcome,
};

/// A manager that takes several keys at once, all or nothing.
///
/// The contract, the same for every manager:
/// - **one global order**: the keys are taken by ascending lock id
///   ([`KeyDerivation::lock_order`](crate::KeyDerivation::lock_order)), keys of one lock
///   id merged into one lock, so two callers can never deadlock on each other;
/// - **all or nothing**: after an error nothing is held;
/// - **one deadline**: `options`' timeout bounds the whole group, and a timeout names
///   the first key still busy when it passed;
/// - **cancel safe as a whole**: a dropped call leaves nothing held and no wait queued;
/// - **one guard** ([`LockGroup`]) releases them all, and its `lost()` fires when any of
///   them is no longer held;
/// - every lock in `options`' mode; an empty list is granted at once with a guard
///   that holds nothing.
///
/// The managers also have `acquire_many` as an inherent method (callable without this
/// trait in scope); this trait is for code generic over the manager.
///
/// ```
/// use std::time::Duration;
/// use locks_port::{AcquireMany, LockAcquisitionError, LockGroup};
///
/// async fn transfer<L: AcquireMany>(locks: &L) -> Result<(), LockAcquisitionError> {
///     let accounts = locks
///         .acquire_many(&["account:17", "account:4"], Duration::from_secs(2))
///         .await?;
///     // ... move money between the two accounts ...
///     accounts.release().await;
///     Ok(())
/// }
/// ```
pub trait AcquireMany: DistributedLock {
    /// The guard of one group.
    type Locks: LockGroup;

    /// Takes the locks of all `keys`, or none (see the trait's contract). Any list of
    /// strings will do: `&["a", "b"]`, `&Vec<String>`, `vec![key]`, an iterator of
    /// `format!`ed keys.
    ///
    /// ```
    /// use std::time::Duration;
    /// use locks_port::{AcquireMany, LockAcquisitionError};
    ///
    /// async fn pay<L: AcquireMany>(locks: &L, accounts: &[u64]) -> Result<(), LockAcquisitionError> {
    ///     let keys: Vec<String> = accounts.iter().map(|id| format!("account:{id}")).collect();
    ///     let group = locks.acquire_many(&keys, Duration::from_secs(2)).await?;
    ///     drop(group);
    ///     let _by_iterator = locks
    ///         .acquire_many(accounts.iter().map(|id| format!("account:{id}")), Duration::ZERO)
    ///         .await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`], naming the key that could not be had.
    fn acquire_many<K: AsRef<str>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        options: impl Into<AcquireOptions> + Send,
    ) -> impl Future<Output = Result<Self::Locks, LockAcquisitionError>> + Send;
}

/// The keys of an [`AcquireMany::acquire_many`] call as owned strings, each checked with
/// [`check_key`](crate::check_key): the adapters' shared first step, so the returned
/// future borrows nothing of the caller's iterator.
///
/// ```
/// assert_eq!(locks_port::owned_keys(["a", "b"]).unwrap(), ["a", "b"]);
/// assert!(locks_port::owned_keys(vec![String::new()]).is_err());
/// ```
///
/// # Errors
/// The first empty key, as `check_key` reports it.
pub fn owned_keys<K: AsRef<str>>(
    keys: impl IntoIterator<Item = K>,
) -> Result<Vec<String>, LockAcquisitionError> {
    keys.into_iter()
        .map(|key| {
            let key = key.as_ref();
            crate::check_key(key).map(|()| key.to_owned())
        })
        .collect()
}

/// The locks of one [`AcquireMany::acquire_many`], released together; dropping it
/// releases them all.
pub trait LockGroup: Send + fmt::Debug {
    /// The locks, in the order they were taken (ascending lock id).
    fn infos(&self) -> &[LockInfo];

    /// Fires when any of the locks is no longer held (see
    /// [`LockGuard::lost`](crate::LockGuard::lost)).
    fn lost(&self) -> LostSignal;

    /// Whether any of the locks is no longer held.
    fn is_lost(&self) -> bool {
        self.lost().is_lost()
    }

    /// Releases every lock now: `Unlocked` when each was unlocked by this call, else the
    /// first other outcome (one was taken away or lost meanwhile).
    fn release(self) -> impl Future<Output = ReleaseOutcome> + Send;
}
