//! Who owns which shard, as any process sees it: the latest term of each shard, trusted
//! only while it is not ended and its member still holds its membership permit.

use std::time::Duration;

use locks_port::{LockAcquisitionError, PermitHolder, Semaphore};
use time::OffsetDateTime;

use crate::group::ShardGroup;
use crate::terms::{ShardTerms, Term, held_members};

/// The owner of one shard (see [`owners`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardOwner {
    /// The owner's slot in the membership semaphore.
    pub member: u32,
    /// The owner's holder id, when its manager has one.
    pub holder_id: Option<String>,
    /// When its term began, by the term store's clock.
    pub since: OffsetDateTime,
    /// The term's fencing token.
    pub token: i64,
}

/// Every shard of a group, in the group's order, with its owner (`None`: nobody owns
/// it now, it is moving).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Shards {
    /// `(shard, owner)` in the group's order.
    pub shards: Vec<(String, Option<ShardOwner>)>,
    /// The members' slots, sorted.
    pub members: Vec<u32>,
}

impl Shards {
    /// How many shards each member owns, by slot (members owning none included).
    #[must_use]
    pub fn counts(&self) -> Vec<(u32, usize)> {
        self.members
            .iter()
            .map(|&member| {
                let owned = self
                    .shards
                    .iter()
                    .filter(|(_, owner)| owner.as_ref().is_some_and(|o| o.member == member))
                    .count();
                (member, owned)
            })
            .collect()
    }

    /// Whether every shard has an owner and the members' counts differ by at most one.
    #[must_use]
    pub fn is_balanced(&self) -> bool {
        let counts: Vec<usize> = self.counts().into_iter().map(|(_, n)| n).collect();
        let all_owned = self.shards.iter().all(|(_, owner)| owner.is_some());
        match (counts.iter().min(), counts.iter().max()) {
            (Some(min), Some(max)) => all_owned && max - min <= 1,
            _ => false,
        }
    }
}

/// Who owns which shard of `group` now: two reads (the members, from the term store's
/// [`roster`](ShardTerms::roster) or else the membership semaphore's holders, then the
/// term store). A term is named when it is not ended and its member's permit is
/// held by the same holder, so a dead member's terms are not named once its permit is
/// free. A member whose terms could not be ended when their tasks stopped (the store
/// unreachable, as through a server restart) ends them before it joins again, so they
/// are not named under its new membership either. A term is named from its beginning,
/// which may be up to the takeover delay before its task starts, and until its member
/// ends it or is gone: a term whose shard lock was lost (its session terminated) is
/// named until the member is told and ends it (within its manager's loss notice), and a
/// killed member's until its membership is free. So this is a view for people and
/// dashboards; what guards a write is the term's token
/// (the store's `guard_write`, see [`ShardTerms`]).
///
/// # Errors
/// A backend failure of either read.
pub async fn owners<S: Semaphore, T: ShardTerms>(
    semaphores: &S,
    terms: &T,
    group: &ShardGroup,
) -> Result<Shards, LockAcquisitionError> {
    let read = async {
        let (holders, _) =
            held_members(semaphores, terms, group.name(), &group.members_name()).await?;
        let latest = terms.terms(group.name()).await?;
        Ok(assemble(&holders, &latest, group.shards()))
    };
    read.await
        .map_err(|error| reading_owners(error, group.name()))
}

/// A failed read of who owns `group`'s shards, said as a read.
fn reading_owners(error: LockAcquisitionError, group: &str) -> LockAcquisitionError {
    error.for_read(format!("who owns the shards of group '{group}'"))
}

/// As [`owners`], for a group known by its name only (a command-line tool, a dashboard):
/// the shards are those the term store has had a term of, by name; a shard that never
/// ran is not listed.
///
/// # Errors
/// A backend failure of either read.
pub async fn owners_by_name<S: Semaphore, T: ShardTerms>(
    semaphores: &S,
    terms: &T,
    group: &str,
) -> Result<Shards, LockAcquisitionError> {
    let read = async {
        let members = ShardGroup::members_name_of(group);
        let (holders, _) = held_members(semaphores, terms, group, &members).await?;
        let latest = terms.terms(group).await?;
        let mut names: Vec<&str> = latest.iter().map(|term| term.shard.as_str()).collect();
        names.sort_unstable();
        Ok(assemble(&holders, &latest, names.into_iter()))
    };
    read.await.map_err(|error| reading_owners(error, group))
}

/// The owner of each of `names`: its latest term, if not ended and its member's slot is
/// held by the same holder.
fn assemble<'a>(
    holders: &[PermitHolder],
    latest: &[Term],
    names: impl Iterator<Item = &'a str>,
) -> Shards {
    let mut members: Vec<u32> = holders.iter().map(|h| h.slot).collect();
    members.sort_unstable();
    members.dedup();
    let shards = names
        .map(|name| {
            let owner = latest
                .iter()
                .find(|term| term.shard == name && !term.ended)
                .filter(|term| {
                    holders
                        .iter()
                        .any(|h| h.slot == term.member && h.holder_id == term.holder_id)
                })
                .map(|term| ShardOwner {
                    member: term.member,
                    holder_id: term.holder_id.clone(),
                    since: term.since,
                    token: term.token,
                });
            (name.to_owned(), owner)
        })
        .collect();
    Shards { shards, members }
}

/// How often a [`ShardWatch`] reads by default.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// The changes of a group's owners, read every interval (see
/// [`ShardMember::watch`](crate::ShardMember::watch)).
#[derive(Debug)]
pub struct ShardWatch<'a, S, T> {
    semaphores: &'a S,
    terms: &'a T,
    group: &'a ShardGroup,
    interval: Duration,
    seen: Option<Shards>,
}

impl<'a, S: Semaphore, T: ShardTerms> ShardWatch<'a, S, T> {
    /// A watch of `group` on `semaphores` and `terms` (no membership needed).
    #[must_use]
    pub fn new(semaphores: &'a S, terms: &'a T, group: &'a ShardGroup) -> Self {
        Self {
            semaphores,
            terms,
            group,
            interval: DEFAULT_WATCH_INTERVAL,
            seen: None,
        }
    }

    /// Reads every `interval` instead of [`DEFAULT_WATCH_INTERVAL`] (a zero interval is
    /// read as 1 ms).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The owners: on the first call as they are now, then each time they changed.
    ///
    /// # Errors
    /// A read's backend failure; the next call reads again.
    ///
    /// # Cancel safety
    /// Cancel safe: the next call compares with the last state it reported.
    pub async fn changed(&mut self) -> Result<Shards, LockAcquisitionError> {
        loop {
            if self.seen.is_some() {
                tokio::time::sleep(self.interval).await;
            }
            let now = owners(self.semaphores, self.terms, self.group).await?;
            if self.seen.as_ref() != Some(&now) {
                self.seen = Some(now.clone());
                return Ok(now);
            }
        }
    }
}
