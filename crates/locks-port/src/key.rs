//! Key naming and key-to-lock-id derivation.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::{AcquisitionErrorKind, LockAcquisitionError};

/// How a string key becomes the signed 64-bit id that PostgreSQL's advisory-lock
/// functions take.
///
/// The derivation is versioned: every process that must contend on the same lock
/// for the same key has to use the same derivation, so a new one is added as a new
/// variant and chosen explicitly, never swapped in silently under an old name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyDerivation {
    /// Version 1, bit-exact with the Python `eventsource` library (0.8.x): the first
    /// eight bytes of SHA-256 over the key's UTF-8 bytes, read big-endian, with the
    /// top bit cleared so the id is a non-negative `bigint`.
    ///
    /// ```
    /// use locks_port::KeyDerivation;
    ///
    /// assert_eq!(KeyDerivation::Sha256V1.lock_id("cutover:tenant-123"), 7696161359070260854);
    /// ```
    #[default]
    Sha256V1,
}

impl KeyDerivation {
    /// The derivation used when none is chosen: [`KeyDerivation::Sha256V1`].
    pub const CURRENT: Self = Self::Sha256V1;

    /// Derives the lock id of `key`; the result is always in `0..=i64::MAX`.
    ///
    /// The derivation itself takes every `&str`, the empty one and very long ones
    /// included, exactly as the Python library does (it derives an id for `""` too).
    /// The managers refuse the empty key before deriving anything (see [`check_key`]),
    /// so `""` never silently becomes one lock shared by every caller whose key text
    /// came out empty; every non-empty key keeps its bit-exact id.
    #[must_use]
    pub fn lock_id(self, key: &str) -> i64 {
        match self {
            Self::Sha256V1 => {
                let digest = Sha256::digest(key.as_bytes());
                let mut prefix = [0u8; 8];
                prefix.copy_from_slice(&digest[..8]);
                let masked = u64::from_be_bytes(prefix) & 0x7FFF_FFFF_FFFF_FFFF;
                // The mask leaves 63 bits, so the value always fits.
                i64::try_from(masked).unwrap_or(i64::MAX)
            }
        }
    }

    /// The one global order in which `acquire_many` takes several keys: ascending lock
    /// id, keys of one lock id merged into one lock (the first of them named). Callers
    /// that all take their keys in this order can never deadlock on each other.
    ///
    /// ```
    /// use locks_port::KeyDerivation;
    ///
    /// let order = KeyDerivation::CURRENT.lock_order(&["b", "a", "b"]);
    /// assert_eq!(order.len(), 2, "a key named twice is one lock");
    /// assert!(order.keys().is_sorted());
    /// ```
    #[must_use]
    pub fn lock_order<'k>(self, keys: &[&'k str]) -> BTreeMap<i64, &'k str> {
        lock_order_with(keys, |key| self.lock_id(key))
    }

    /// A stable, human-readable name for this derivation (for logs and docs).
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sha256V1 => "sha256-v1",
        }
    }
}

/// Checks that `key` can name a lock: any non-empty string. The empty key is refused
/// with [`AcquisitionErrorKind::InvalidKey`] by every manager's acquisition (locks,
/// groups, permits, transaction locks), before anything is asked of the backend.
///
/// Why: a key built from data that came out empty (`""` where a tenant id was
/// expected) would otherwise be one lock shared by every such caller. The Python
/// library accepts `""`; a Rust process refuses it, and for every other key derives the
/// same id as Python does.
///
/// ```
/// use locks_port::{AcquisitionErrorKind, check_key};
///
/// assert!(check_key("job:nightly").is_ok());
/// let error = check_key("").unwrap_err();
/// assert_eq!(error.kind(), AcquisitionErrorKind::InvalidKey);
/// assert_eq!(
///     error.to_string(),
///     "Failed to acquire lock '': the key is empty; a lock needs a non-empty key"
/// );
/// ```
///
/// # Errors
/// As above.
pub fn check_key(key: &str) -> Result<(), LockAcquisitionError> {
    if key.is_empty() {
        Err(LockAcquisitionError::new(
            key,
            AcquisitionErrorKind::InvalidKey,
            "the key is empty; a lock needs a non-empty key",
        ))
    } else {
        Ok(())
    }
}

/// Derives the lock id of `key` with [`KeyDerivation::CURRENT`].
///
/// These are the golden vectors shared with the Python library; a Python process
/// and a Rust process asking for the same key contend on the same server lock.
///
/// ```
/// use locks_port::lock_id;
///
/// assert_eq!(lock_id("migration:tenant-abc"), 2549018982395383070);
/// assert_eq!(lock_id(""), 7183457195969485844);
/// assert_eq!(lock_id("cutover:tenant-123"), 7696161359070260854);
/// assert_eq!(lock_id("é"), 5375421630974772051);
/// assert_eq!(
///     lock_id("cutover:00000000-0000-0000-0000-000000000000"),
///     1326370806243621539,
/// );
/// ```
#[must_use]
pub fn lock_id(key: &str) -> i64 {
    KeyDerivation::CURRENT.lock_id(key)
}

/// [`KeyDerivation::lock_order`] with the lock ids from `lock_id` (a manager's cache of
/// derived ids, say): ascending lock id, keys of one lock id merged (the first named).
///
/// ```
/// use locks_port::{lock_id, lock_order_with};
///
/// let order = lock_order_with(&["b", "a", "b"], lock_id);
/// assert_eq!(order.len(), 2, "a key named twice is one lock");
/// ```
pub fn lock_order_with<'k>(
    keys: &[&'k str],
    mut lock_id: impl FnMut(&str) -> i64,
) -> BTreeMap<i64, &'k str> {
    let mut ordered = BTreeMap::new();
    for key in keys {
        ordered.entry(lock_id(key)).or_insert(*key);
    }
    ordered
}

/// The operation name [`migration_lock_key`] uses when given `None`.
pub const DEFAULT_MIGRATION_OPERATION: &str = "migration";

/// The lock key for one operation on one tenant: `"{operation}:{tenant_id}"`, the
/// tenant id in its hyphenated lower-case form; `None` means `"migration"`.
///
/// ```
/// use locks_port::migration_lock_key;
/// use uuid::Uuid;
///
/// let tenant = Uuid::nil();
/// assert_eq!(
///     migration_lock_key(tenant, None),
///     "migration:00000000-0000-0000-0000-000000000000"
/// );
/// assert_eq!(
///     migration_lock_key(tenant, Some("cutover")),
///     "cutover:00000000-0000-0000-0000-000000000000"
/// );
/// ```
///
/// Kept for compatibility with the Python library's signature; for a named operation
/// [`migration_lock_key_for`] reads more plainly.
#[must_use]
pub fn migration_lock_key(tenant_id: Uuid, operation: Option<&str>) -> String {
    migration_lock_key_for(tenant_id, operation.unwrap_or(DEFAULT_MIGRATION_OPERATION))
}

/// The lock key for `operation` on one tenant: `"{operation}:{tenant_id}"`, the tenant
/// id in its hyphenated lower-case form. The same key as
/// [`migration_lock_key`]`(tenant_id, Some(operation))`, so Python and Rust processes
/// contend on it.
///
/// ```
/// use locks_port::{lock_id, migration_lock_key_for};
/// use uuid::Uuid;
///
/// let key = migration_lock_key_for(Uuid::nil(), "cutover");
/// assert_eq!(key, "cutover:00000000-0000-0000-0000-000000000000");
/// assert_eq!(lock_id(&key), 1326370806243621539);
/// ```
#[must_use]
pub fn migration_lock_key_for(tenant_id: Uuid, operation: &str) -> String {
    format!("{operation}:{}", tenant_id.hyphenated())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// seed-facts §1: the vectors a Python fleet derives for the same keys.
    const GOLDEN: [(&str, i64); 5] = [
        ("migration:tenant-abc", 2_549_018_982_395_383_070),
        ("", 7_183_457_195_969_485_844),
        ("cutover:tenant-123", 7_696_161_359_070_260_854),
        ("é", 5_375_421_630_974_772_051),
        (
            "cutover:00000000-0000-0000-0000-000000000000",
            1_326_370_806_243_621_539,
        ),
    ];

    #[test]
    fn golden_vectors_match_the_python_library() {
        for (key, expected) in GOLDEN {
            assert_eq!(lock_id(key), expected, "key {key:?}");
            assert_eq!(KeyDerivation::Sha256V1.lock_id(key), expected);
        }
    }

    #[test]
    fn the_docstring_value_of_the_original_is_not_what_it_derives() {
        // The Python docstring claims 4526372985471823495 for this key; it is wrong.
        assert_ne!(lock_id("migration:tenant-abc"), 4_526_372_985_471_823_495);
    }

    #[test]
    fn large_and_odd_keys_are_valid_and_non_negative() {
        let big = "k".repeat(1 << 20);
        let odd = ["\0", "'\"; DROP TABLE x; --", "\u{1F512}", &big];
        for key in odd {
            let id = lock_id(key);
            assert!(id >= 0);
            assert_eq!(id, lock_id(key), "derivation is deterministic");
        }
        assert_ne!(lock_id(&big), lock_id(&big[1..]));
    }

    #[test]
    fn migration_key_uses_lowercase_hyphenated_uuid() {
        let tenant = Uuid::from_u128(0xABCD_EF01_2345_6789_ABCD_EF01_2345_6789);
        assert_eq!(
            migration_lock_key(tenant, Some("cutover")),
            "cutover:abcdef01-2345-6789-abcd-ef0123456789"
        );
        assert_eq!(
            lock_id(&migration_lock_key(Uuid::nil(), Some("cutover"))),
            1_326_370_806_243_621_539
        );
    }
}
