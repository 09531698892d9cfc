//! The term store: one row per shard with the token of its latest ownership term, who
//! holds it and since when, and whether that term ended cleanly.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use locks_port::{LockAcquisitionError, PermitHolder, Semaphore};
use time::OffsetDateTime;

/// One ownership term of a shard, as the term store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Term {
    /// The shard's name.
    pub shard: String,
    /// The term's fencing token: 1 for the first term of the shard, then one more for
    /// each term, whichever member owns it (strictly growing, never reused).
    pub token: i64,
    /// The owner's slot in the group's membership semaphore.
    pub member: u32,
    /// The owner's holder id, when its manager has one.
    pub holder_id: Option<String>,
    /// When the term began, by the store's clock (the server's on PostgreSQL).
    pub since: OffsetDateTime,
    /// Whether the owner ended the term after its task stopped. A term that is not
    /// ended may still be over: its owner may have died without a word.
    pub ended: bool,
    /// How long the next owner of this term, if it does not end, waits before starting:
    /// how soon, at worst, the owner is told that its lock's session ended (its
    /// manager's [`loss_notice_bound`](locks_port::DistributedLock::loss_notice_bound), or
    /// its takeover delay when the manager does not know), and, when the term began
    /// after one that did not end, no less than that term's (see [`carried_loss_notice`]).
    /// `None` when unknown (a member of an older version, or a store that does not keep
    /// it): the next owner then waits its own takeover delay.
    pub loss_notice: Option<Duration>,
}

impl Term {
    /// A term, for stores outside this crate.
    #[must_use]
    pub fn new(
        shard: impl Into<String>,
        token: i64,
        member: u32,
        holder_id: Option<String>,
        since: OffsetDateTime,
        ended: bool,
    ) -> Self {
        Self {
            shard: shard.into(),
            token,
            member,
            holder_id,
            since,
            ended,
            loss_notice: None,
        }
    }

    /// The term, with its owner's [`loss_notice`](Self::loss_notice) bound.
    #[must_use]
    pub fn with_loss_notice(mut self, loss_notice: Option<Duration>) -> Self {
        self.loss_notice = loss_notice;
        self
    }
}

/// The loss notice a store records for a new term ([`Term::loss_notice`]): the new
/// owner's `own` when the term before it ended (or there was none, `previous` is
/// `None`); when it did not end, the longer of `own` and that term's notice, or `None`
/// if either is unknown.
///
/// Why: an owner whose term ends while it still waits its takeover delay (its lock
/// lost, or its process dead) leaves its term not ended, and the next owner waits only
/// what this term records, counted from its own later grant. The owner before may still
/// be running until its own notice ran out, so this term must promise no less than that
/// one did (ADR 0027, case 4 of the order). Unknown stays unknown: the next owner then
/// waits its own takeover delay, as this owner did.
///
/// ```
/// use std::time::Duration;
/// use locks_shard::{Term, carried_loss_notice, time::OffsetDateTime};
///
/// let ms = Duration::from_millis;
/// let term = |ended| Term::new("a", 1, 0, None, OffsetDateTime::UNIX_EPOCH, ended);
/// let before = term(false).with_loss_notice(Some(ms(1_000)));
/// assert_eq!(carried_loss_notice(Some(ms(100)), Some(&before)), Some(ms(1_000)));
/// let ended = term(true).with_loss_notice(Some(ms(1_000)));
/// assert_eq!(carried_loss_notice(Some(ms(100)), Some(&ended)), Some(ms(100)));
/// let unknown = term(false);
/// assert_eq!(carried_loss_notice(Some(ms(100)), Some(&unknown)), None);
/// assert_eq!(carried_loss_notice(Some(ms(100)), None), Some(ms(100)));
/// ```
#[must_use]
pub fn carried_loss_notice(own: Option<Duration>, previous: Option<&Term>) -> Option<Duration> {
    match previous {
        Some(previous) if !previous.ended => own.zip(previous.loss_notice).map(|(a, b)| a.max(b)),
        _ => own,
    }
}

/// What [`ShardTerms::begin`] returns: the new term, and whether the term before it
/// was ended by its owner (or there was none), in which case its task is known to have
/// stopped and the new one may start without a takeover delay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Begun {
    /// The new term.
    pub term: Term,
    /// Whether the previous term was ended (`true` for a shard's first term).
    pub previous_ended: bool,
    /// The previous term's [`loss_notice`](Term::loss_notice): how soon its owner is
    /// told of a loss. When the previous term did not end, the new owner waits this long
    /// before starting (its own takeover delay when `None`).
    pub previous_loss_notice: Option<Duration>,
}

impl Begun {
    /// A begun term, for stores outside this crate.
    #[must_use]
    pub fn new(term: Term, previous_ended: bool) -> Self {
        Self {
            term,
            previous_ended,
            previous_loss_notice: None,
        }
    }

    /// The begun term, with the previous term's [`loss_notice`](Term::loss_notice).
    #[must_use]
    pub fn with_previous_loss_notice(mut self, loss_notice: Option<Duration>) -> Self {
        self.previous_loss_notice = loss_notice;
        self
    }
}

/// Where the terms of a group's shards are kept, shared by every member.
///
/// The contract (both stores of this workspace pass `conformance::terms_contract`, feature
/// `conformance`): [`begin`](Self::begin) gives a token one more than the shard's last (1 for the
/// first) and records the owner; [`end`](Self::end) marks a term ended only while it is
/// the latest; [`terms`](Self::terms) lists the latest term of each shard that has had one.
/// A member calls `begin` only while it holds the shard's lock, so two `begin`s of one
/// shard never race, and a progress write guarded by the token (see the PostgreSQL
/// store's `guard_write`) is refused once a newer term began.
pub trait ShardTerms: Send + Sync {
    /// Begins the next term of `shard` in `group`, owned by the member `member`.
    ///
    /// # Errors
    /// A backend failure, in the backend's words.
    ///
    /// # Cancel safety
    /// The term exists once the backend committed it; a dropped call may or may not have
    /// begun it (the next `begin` gives a larger token either way).
    fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> impl Future<Output = Result<Begun, LockAcquisitionError>> + Send;

    /// As [`begin`](Self::begin), and records as the term's
    /// [`loss_notice`](Term::loss_notice) what [`carried_loss_notice`] makes of
    /// `loss_notice` (how soon the new owner is told that its lock's session ended) and
    /// the term before, read in the same step, for the next owner to read in
    /// [`Begun::previous_loss_notice`]. A member begins its terms with this.
    ///
    /// The default calls `begin` and records nothing: the next owner then waits its own
    /// takeover delay, the conservative side.
    ///
    /// # Errors
    /// As [`begin`](Self::begin).
    ///
    /// # Cancel safety
    /// As [`begin`](Self::begin).
    fn begin_with_notice(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
        loss_notice: Option<Duration>,
    ) -> impl Future<Output = Result<Begun, LockAcquisitionError>> + Send {
        let _ = loss_notice;
        self.begin(group, shard, member, holder_id)
    }

    /// Marks the term `token` of `shard` ended, if it is still the latest.
    ///
    /// # Errors
    /// A backend failure.
    fn end(
        &self,
        group: &str,
        shard: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send;

    /// The latest term of every shard of `group` that has had one.
    ///
    /// # Errors
    /// A backend failure.
    fn terms(
        &self,
        group: &str,
    ) -> impl Future<Output = Result<Vec<Term>, LockAcquisitionError>> + Send;

    /// Records that the term `token` of `shard` goes on under the member slot `member`:
    /// its member's membership session ended while it kept the shard's lock, and it
    /// joined again under another slot. Only while `token` is the shard's latest term and
    /// not ended. The token does not change: the term and its task go on.
    ///
    /// Returns whether it was so (the term recorded under `member`). `false` says that
    /// another member began a newer term of the shard while this one was away (after a
    /// partition): this member's lock of the shard was lost and it has not been told yet.
    /// The member then drops the term's task at once and does not count the shard as its
    /// own, so that it takes its share of the free ones without waiting for the notice.
    ///
    /// The default does nothing and returns `true`: a store without it keeps naming the
    /// old slot, so [`owners`](crate::owners) does not name the shard's owner until the
    /// shard moves, and a superseded term is dropped only when its loss is told.
    ///
    /// # Errors
    /// A backend failure.
    fn rejoined(
        &self,
        group: &str,
        shard: &str,
        token: i64,
        member: u32,
    ) -> impl Future<Output = Result<bool, LockAcquisitionError>> + Send {
        let _ = (group, shard, token, member);
        std::future::ready(Ok(true))
    }

    /// Records in the group's roster that membership slot `member` is held by the member
    /// of `holder_id`, as it joins (before its first tick) and again whenever
    /// [`roster`](Self::roster) does not list it. `expiry` is its renewal expiry when it
    /// renews ([`renew`](Self::renew) keeps the entry from then on), `None` when it does
    /// not (the entry then lasts until another member takes the slot).
    ///
    /// The default does nothing, and [`roster`](Self::roster) then reads nothing.
    ///
    /// # Errors
    /// A backend failure.
    fn enter(
        &self,
        group: &str,
        member: u32,
        holder_id: Option<&str>,
        expiry: Option<Duration>,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send {
        let _ = (group, member, holder_id, expiry);
        std::future::ready(Ok(()))
    }

    /// The group's members as its roster names them: the membership slots (of the
    /// semaphore `members_name`) that are held now and have an entry
    /// ([`enter`](Self::enter) or [`renew`](Self::renew)), each with the holder id of its
    /// entry, without reading the lock manager's whole table. A member's ticks and
    /// [`owners`](crate::owners) read this instead of the semaphore's
    /// [`permit_holders`](locks_port::Semaphore::permit_holders), which on PostgreSQL
    /// copies the server's whole lock table (`pg_locks`) and holds up every other
    /// session's lock request while it does.
    ///
    /// A slot taken a moment ago may be listed under its previous holder's id, or not
    /// at all, until its member's entry is written: a member that is not listed enters
    /// again on its next tick.
    ///
    /// `Ok(None)` (the default) when the store keeps no roster: the members are then read
    /// from [`permit_holders`](locks_port::Semaphore::permit_holders).
    ///
    /// # Errors
    /// A backend failure.
    fn roster(
        &self,
        group: &str,
        members_name: &str,
    ) -> impl Future<Output = Result<Option<Vec<PermitHolder>>, LockAcquisitionError>> + Send {
        let _ = (group, members_name);
        std::future::ready(Ok(None))
    }

    /// Renews the liveness of the member `member` (its manager's `holder_id`) for
    /// `expiry`, and ends the lock sessions of the group's members whose renewal expired:
    /// a member whose process stopped (`SIGSTOP`, a frozen VM, a deadlocked runtime) still
    /// holds its locks while its kernel answers TCP, and this is what frees its shards.
    /// A member that renews under another slot loses only the session that still holds
    /// its old, expired one. Returns how many sessions were ended.
    ///
    /// The default does nothing (returns 0): a store that cannot end sessions (the
    /// in-memory one, whose members cannot freeze apart from their process) leaves the
    /// fencing token as the only guard against a frozen member.
    ///
    /// # Errors
    /// A backend failure.
    fn renew(
        &self,
        group: &str,
        member: u32,
        holder_id: &str,
        expiry: Duration,
    ) -> impl Future<Output = Result<u64, LockAcquisitionError>> + Send {
        let _ = (group, member, holder_id, expiry);
        std::future::ready(Ok(0))
    }
}

/// The members of a group now, by membership slot with their holder ids: from the term
/// store's [`roster`](ShardTerms::roster) when it keeps one (never `pg_locks`), else from
/// the membership semaphore's [`permit_holders`](Semaphore::permit_holders); and whether
/// they came from the roster.
pub(crate) async fn held_members<S: Semaphore, T: ShardTerms>(
    semaphores: &S,
    terms: &T,
    group: &str,
    members_name: &str,
) -> Result<(Vec<PermitHolder>, bool), LockAcquisitionError> {
    match terms.roster(group, members_name).await? {
        Some(held) => Ok((held, true)),
        None => Ok((semaphores.permit_holders(members_name).await?.held, false)),
    }
}

/// The term store of one process: the test double of a database's table, shared by
/// every member made with a clone of it.
///
/// [`is_latest`](Self::is_latest) is what a progress write checks in a unit test.
#[derive(Debug, Clone, Default)]
pub struct MemoryTerms {
    rows: Arc<Mutex<HashMap<(String, String), Term>>>,
}

impl MemoryTerms {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Term>> {
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `token` is the latest term of `shard`: a progress write carrying it would
    /// be accepted (the check the PostgreSQL store makes under the row's lock).
    #[must_use]
    pub fn is_latest(&self, group: &str, shard: &str, token: i64) -> bool {
        self.rows()
            .get(&(group.to_owned(), shard.to_owned()))
            .is_some_and(|term| term.token == token)
    }
}

impl ShardTerms for MemoryTerms {
    async fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> Result<Begun, LockAcquisitionError> {
        self.begin_with_notice(group, shard, member, holder_id, None)
            .await
    }

    async fn begin_with_notice(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
        loss_notice: Option<Duration>,
    ) -> Result<Begun, LockAcquisitionError> {
        let mut rows = self.rows();
        let key = (group.to_owned(), shard.to_owned());
        let last = rows.get(&key);
        let (token, previous_ended, previous_notice) = last.map_or((1, true, None), |last| {
            (last.token + 1, last.ended, last.loss_notice)
        });
        let loss_notice = carried_loss_notice(loss_notice, last);
        let term = Term::new(
            shard,
            token,
            member,
            holder_id.map(str::to_owned),
            locks_port::stored_time(OffsetDateTime::now_utc()),
            false,
        )
        .with_loss_notice(loss_notice);
        rows.insert(key, term.clone());
        Ok(Begun::new(term, previous_ended).with_previous_loss_notice(previous_notice))
    }

    async fn end(&self, group: &str, shard: &str, token: i64) -> Result<(), LockAcquisitionError> {
        if let Some(term) = self.rows().get_mut(&(group.to_owned(), shard.to_owned()))
            && term.token == token
        {
            term.ended = true;
        }
        Ok(())
    }

    async fn rejoined(
        &self,
        group: &str,
        shard: &str,
        token: i64,
        member: u32,
    ) -> Result<bool, LockAcquisitionError> {
        if let Some(term) = self.rows().get_mut(&(group.to_owned(), shard.to_owned()))
            && term.token == token
            && !term.ended
        {
            term.member = member;
            return Ok(true);
        }
        Ok(false)
    }

    async fn terms(&self, group: &str) -> Result<Vec<Term>, LockAcquisitionError> {
        Ok(self
            .rows()
            .iter()
            .filter(|((of, _), _)| of == group)
            .map(|(_, term)| term.clone())
            .collect())
    }
}

impl<T: ShardTerms + ?Sized> ShardTerms for Arc<T> {
    fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> impl Future<Output = Result<Begun, LockAcquisitionError>> + Send {
        (**self).begin(group, shard, member, holder_id)
    }

    fn begin_with_notice(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
        loss_notice: Option<Duration>,
    ) -> impl Future<Output = Result<Begun, LockAcquisitionError>> + Send {
        (**self).begin_with_notice(group, shard, member, holder_id, loss_notice)
    }

    fn end(
        &self,
        group: &str,
        shard: &str,
        token: i64,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send {
        (**self).end(group, shard, token)
    }

    fn terms(
        &self,
        group: &str,
    ) -> impl Future<Output = Result<Vec<Term>, LockAcquisitionError>> + Send {
        (**self).terms(group)
    }

    fn rejoined(
        &self,
        group: &str,
        shard: &str,
        token: i64,
        member: u32,
    ) -> impl Future<Output = Result<bool, LockAcquisitionError>> + Send {
        (**self).rejoined(group, shard, token, member)
    }

    fn enter(
        &self,
        group: &str,
        member: u32,
        holder_id: Option<&str>,
        expiry: Option<Duration>,
    ) -> impl Future<Output = Result<(), LockAcquisitionError>> + Send {
        (**self).enter(group, member, holder_id, expiry)
    }

    fn roster(
        &self,
        group: &str,
        members_name: &str,
    ) -> impl Future<Output = Result<Option<Vec<PermitHolder>>, LockAcquisitionError>> + Send {
        (**self).roster(group, members_name)
    }

    fn renew(
        &self,
        group: &str,
        member: u32,
        holder_id: &str,
        expiry: Duration,
    ) -> impl Future<Output = Result<u64, LockAcquisitionError>> + Send {
        (**self).renew(group, member, holder_id, expiry)
    }
}
