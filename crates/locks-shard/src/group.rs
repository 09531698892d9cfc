//! A group and its shard list: the names members must agree on, and the lock and
//! semaphore names derived from them.

use std::sync::Arc;

use locks_port::{AcquisitionErrorKind, LockAcquisitionError, MAX_PERMITS};
use sha2::{Digest, Sha256};

/// The most shards one group may have.
pub const MAX_SHARDS: usize = 100_000;

/// The longest group name, and the longest shard name, in bytes. A term store keys its
/// terms by both (on PostgreSQL the term table's primary key, whose entries the server
/// refuses over 2,704 bytes): a longer name could never begin a term there, its shard
/// never run.
pub const MAX_NAME_BYTES: usize = 1024;

/// The fewest member slots a group has: at most this many members are guaranteed room.
/// The membership semaphore has between this and
/// [`MAX_PERMITS`](locks_port::MAX_PERMITS) permits, the exact number derived from the
/// shard list (see [`ShardGroup::member_permits`]).
pub const MIN_MEMBER_SLOTS: u32 = 1024;

/// A group: a name and the list of its shards, in order.
///
/// Every member of a group must use the same list (names and order). The list's digest
/// decides the number of permits of the group's membership semaphore, so a member whose
/// list differs is refused with a
/// [`Configuration`](locks_port::AcquisitionErrorKind::Configuration) error when it joins,
/// as a semaphore used with two numbers of permits is.
///
/// ```
/// use locks_shard::ShardGroup;
///
/// let group = ShardGroup::new("projections", ["tenant-1", "tenant-2", "tenant-3"])?;
/// assert_eq!(group.len(), 3);
/// assert_eq!(group.shard(1), Some("tenant-2"));
/// assert_eq!(group.index_of("tenant-3"), Some(2));
/// let other = ShardGroup::new("projections", ["tenant-1", "tenant-2"])?;
/// assert_ne!(group.member_permits(), other.member_permits());
/// # Ok::<(), locks_shard::locks_port::LockAcquisitionError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardGroup {
    name: Arc<str>,
    shards: Arc<[Arc<str>]>,
    digest: [u8; 32],
}

impl ShardGroup {
    /// A group `name` with `shards` (names, in the order every member uses).
    ///
    /// # Errors
    /// [`InvalidKey`](AcquisitionErrorKind::InvalidKey) for an empty group name;
    /// [`Configuration`](AcquisitionErrorKind::Configuration) for no shards, more than
    /// [`MAX_SHARDS`], a name given twice, a NUL character in any name, or a name longer
    /// than [`MAX_NAME_BYTES`] (each error names the input, a long name by its start).
    pub fn new<I, S>(name: impl Into<String>, shards: I) -> Result<Self, LockAcquisitionError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let name: String = name.into();
        if name.is_empty() {
            return Err(LockAcquisitionError::new(
                name,
                AcquisitionErrorKind::InvalidKey,
                "a shard group needs a non-empty name",
            ));
        }
        let shards: Vec<Arc<str>> = shards.into_iter().map(|s| Arc::from(s.as_ref())).collect();
        let refuse = |reason: String| {
            LockAcquisitionError::new(name.clone(), AcquisitionErrorKind::Configuration, reason)
        };
        if shards.is_empty() || shards.len() > MAX_SHARDS {
            return Err(refuse(format!(
                "a shard group needs 1 to {MAX_SHARDS} shards, not {}",
                shards.len()
            )));
        }
        // PostgreSQL's `text` (the term table) cannot hold a NUL.
        if name.contains('\0') {
            return Err(refuse(
                "a shard group's name cannot contain a NUL character".to_owned(),
            ));
        }
        if let Some(bad) = shards.iter().find(|s| s.contains('\0')) {
            return Err(refuse(format!(
                "the shard {:?} contains a NUL character, which a term store cannot keep",
                bad
            )));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(refuse(format!(
                "a shard group's name can be at most {MAX_NAME_BYTES} bytes, not {}",
                name.len()
            )));
        }
        if let Some(long) = shards.iter().find(|s| s.len() > MAX_NAME_BYTES) {
            let start: String = long.chars().take(40).collect();
            return Err(refuse(format!(
                "the shard {start:?}... is {} bytes long; a shard's name can be at most \
                 {MAX_NAME_BYTES} bytes, which a term store can keep",
                long.len()
            )));
        }
        let mut sorted: Vec<&str> = shards.iter().map(|s| &**s).collect();
        sorted.sort_unstable();
        if let Some(twice) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(refuse(format!("the shard '{}' is listed twice", twice[0])));
        }
        let mut hasher = Sha256::new();
        hasher.update(b"locks-shard-v1:");
        for shard in &shards {
            // Length-prefixed, so ["ab"] and ["a", "b"] differ.
            hasher.update((shard.len() as u64).to_be_bytes());
            hasher.update(shard.as_bytes());
        }
        Ok(Self {
            name: name.into(),
            shards: shards.into(),
            digest: hasher.finalize().into(),
        })
    }

    /// The group's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many shards the group has (N).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Always `false`: a group has at least one shard.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The name of shard `index`, if there is one.
    #[must_use]
    pub fn shard(&self, index: usize) -> Option<&str> {
        self.shards.get(index).map(|s| &**s)
    }

    /// The shards, in order.
    pub fn shards(&self) -> impl ExactSizeIterator<Item = &str> {
        self.shards.iter().map(|s| &**s)
    }

    /// The index of the shard `name`.
    #[must_use]
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.shards.iter().position(|s| &**s == name)
    }

    /// The key of shard `name`'s lock: a member runs the shard's task only while it
    /// holds it. On the in-memory double, a unit test loses a shard with
    /// `manager.lose(&group.shard_key(name), reason)`.
    #[must_use]
    pub fn shard_key(&self, name: &str) -> String {
        format!("{}\u{0}shard\u{0}{name}", self.name)
    }

    /// The name of the group's membership semaphore: each member holds one permit.
    #[must_use]
    pub fn members_name(&self) -> String {
        Self::members_name_of(&self.name)
    }

    /// The name of the membership semaphore of the group named `group`.
    #[must_use]
    pub fn members_name_of(group: &str) -> String {
        format!("{group}\u{0}members")
    }

    /// The number of permits of the membership semaphore: [`MIN_MEMBER_SLOTS`] plus the
    /// shard list's digest modulo the rest of the range up to
    /// [`MAX_PERMITS`](locks_port::MAX_PERMITS). Two different lists give two different
    /// numbers except with a chance of 1 in 64,513.
    #[must_use]
    pub fn member_permits(&self) -> u32 {
        let span = MAX_PERMITS - MIN_MEMBER_SLOTS + 1;
        let mut prefix = [0u8; 4];
        prefix.copy_from_slice(&self.digest[..4]);
        MIN_MEMBER_SLOTS + u32::from_be_bytes(prefix) % span
    }

    /// The error for a member whose shard list differs from the group's members'.
    pub(crate) fn disagreement(&self, others: &[u32]) -> LockAcquisitionError {
        let others: Vec<String> = others.iter().map(u32::to_string).collect();
        LockAcquisitionError::new(
            self.name.to_string(),
            AcquisitionErrorKind::Configuration,
            format!(
                "the members of the shard group disagree on its shard list: this member's \
                 {} shards have the list code {}, the members' is {}; every member must \
                 list the same shards in the same order",
                self.len(),
                self.member_permits(),
                others.join(" and ")
            ),
        )
    }

    /// A 64-bit score of `shard` for the member `slot` (rendezvous hashing): a member
    /// tries free shards in the order of its scores, so members that look for work at
    /// once try different shards first, and of the shards it has held equally long, sheds
    /// those it scores lowest.
    pub(crate) fn score(&self, slot: u32, shard: usize) -> u64 {
        let mut hasher = Sha256::new();
        hasher.update(self.digest);
        hasher.update(slot.to_be_bytes());
        hasher.update((shard as u64).to_be_bytes());
        let digest = hasher.finalize();
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lists_are_errors_naming_the_input() {
        let empty: [&str; 0] = [];
        let none = ShardGroup::new("g", empty).unwrap_err();
        assert_eq!(none.kind(), AcquisitionErrorKind::Configuration);
        assert!(none.to_string().contains("not 0"), "{none}");
        let twice = ShardGroup::new("g", ["a", "b", "a"]).unwrap_err();
        assert!(twice.to_string().contains("'a' is listed twice"), "{twice}");
        let unnamed = ShardGroup::new("", ["a"]).unwrap_err();
        assert_eq!(unnamed.kind(), AcquisitionErrorKind::InvalidKey);
        let nul = ShardGroup::new("g", ["a", "b\0c"]).unwrap_err();
        assert_eq!(nul.kind(), AcquisitionErrorKind::Configuration);
        assert!(nul.to_string().contains(r#""b\0c""#), "{nul}");
        assert!(ShardGroup::new("g\0", ["a"]).is_err());
        let longest = "s".repeat(MAX_NAME_BYTES);
        assert!(ShardGroup::new(&longest, [&longest]).is_ok());
        let long = format!("{longest}s");
        let shard = ShardGroup::new("g", ["a", long.as_str()]).unwrap_err();
        assert_eq!(shard.kind(), AcquisitionErrorKind::Configuration);
        assert!(shard.to_string().contains("1025 bytes long"), "{shard}");
        let group = ShardGroup::new(long, ["a"]).unwrap_err();
        assert!(group.to_string().contains("not 1025"), "{group}");
    }

    #[test]
    fn the_list_code_depends_on_names_and_order_and_stays_in_range() {
        let a = ShardGroup::new("g", ["a", "b"]).unwrap();
        let swapped = ShardGroup::new("g", ["b", "a"]).unwrap();
        let joined = ShardGroup::new("g", ["ab"]).unwrap();
        assert_ne!(a.member_permits(), swapped.member_permits());
        assert_ne!(a.member_permits(), joined.member_permits());
        assert_eq!(
            a.member_permits(),
            ShardGroup::new("other", ["a", "b"])
                .unwrap()
                .member_permits()
        );
        for n in 1..200 {
            let group = ShardGroup::new("g", (0..n).map(|i| format!("s{i}"))).unwrap();
            assert!((MIN_MEMBER_SLOTS..=MAX_PERMITS).contains(&group.member_permits()));
        }
    }
}
