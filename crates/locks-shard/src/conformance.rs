//! The term store's contract, run by every [`ShardTerms`] store (feature `conformance`):
//! [`MemoryTerms`](crate::MemoryTerms) in this crate's tests, the PostgreSQL store in
//! `locks-shard-postgres`'s. A store of your own can run it too:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! locks_shard::conformance::terms_contract(&locks_shard::MemoryTerms::new(), "g").await;
//! # }
//! ```
//!
//! Each case panics with what broke.

use std::time::Duration;

use crate::terms::ShardTerms;

/// Every case, each on a group of its own whose name begins with `group` (a name no
/// other test uses: the cases expect their groups empty).
pub async fn terms_contract<T: ShardTerms>(store: &T, group: &str) {
    tokens_grow_per_shard_and_only_the_latest_term_ends(store, &format!("{group}-tokens")).await;
    a_kept_term_moves_only_while_it_is_the_latest(store, &format!("{group}-rejoined")).await;
    a_term_after_one_that_did_not_end_keeps_the_longer_notice(store, &format!("{group}-notice"))
        .await;
}

/// [`begin`](ShardTerms::begin) gives one more than the shard's last token (1 for the
/// first, per shard) and says whether the term before was ended;
/// [`end`](ShardTerms::end) ends only the latest term; [`terms`](ShardTerms::terms)
/// lists the latest term of each shard.
pub async fn tokens_grow_per_shard_and_only_the_latest_term_ends<T: ShardTerms>(
    store: &T,
    group: &str,
) {
    let first = store.begin(group, "a", 3, Some("m1")).await.expect("begin");
    assert_eq!(first.term.token, 1);
    assert!(first.previous_ended, "a first term has nothing before it");
    let second = store.begin(group, "a", 4, Some("m2")).await.expect("begin");
    assert_eq!(second.term.token, 2);
    assert!(!second.previous_ended, "term 1 was not ended");
    assert!(second.term.since >= first.term.since);
    for term in [&first.term, &second.term] {
        assert_eq!(
            term.since,
            locks_port::stored_time(term.since),
            "a term's start is kept as PostgreSQL keeps it (UTC, to the microsecond)"
        );
    }
    store.end(group, "a", 1).await.expect("end");
    let listed = store.terms(group).await.expect("terms");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].since, second.term.since, "listed as begun");
    assert!(!listed[0].ended, "ending an older term changes nothing");
    assert_eq!(
        (listed[0].member, listed[0].holder_id.as_deref()),
        (4, Some("m2"))
    );
    store.end(group, "a", 2).await.expect("end");
    assert!(store.terms(group).await.expect("terms")[0].ended);
    let third = store.begin(group, "a", 3, None).await.expect("begin");
    assert_eq!(third.term.token, 3);
    assert!(third.previous_ended);
    let other = store.begin(group, "b", 3, None).await.expect("begin");
    assert_eq!(other.term.token, 1, "tokens are per shard");
}

/// [`rejoined`](ShardTerms::rejoined) records a term under a new slot only while it is
/// the shard's latest and not ended, and says whether it did: a term superseded while
/// its member was away is reported, and the newer one left as it is.
pub async fn a_kept_term_moves_only_while_it_is_the_latest<T: ShardTerms>(store: &T, group: &str) {
    let member_of = async |shard: &str| {
        let listed = store.terms(group).await.expect("terms");
        let term = listed.iter().find(|t| t.shard == shard).expect("a term");
        (term.token, term.member, term.ended)
    };
    // Rejoins `shard`'s term `token` under `slot`: whether it was recorded, and the
    // shard's latest term after.
    let rejoin = async |shard: &str, token: i64, slot: u32, recorded: bool, after, what: &str| {
        let said = store.rejoined(group, shard, token, slot).await;
        assert_eq!(said.expect("rejoined"), recorded, "{what}");
        assert_eq!(member_of(shard).await, after, "{what}");
    };
    store.begin(group, "a", 3, Some("m1")).await.expect("begin");
    rejoin(
        "a",
        1,
        7,
        true,
        (1, 7, false),
        "the same term, the new slot",
    )
    .await;
    rejoin(
        "a",
        0,
        9,
        false,
        (1, 7, false),
        "an older token changes nothing",
    )
    .await;
    store.end(group, "a", 1).await.expect("end");
    rejoin(
        "a",
        1,
        9,
        false,
        (1, 7, true),
        "an ended term changes nothing",
    )
    .await;
    // A term superseded while its member was away: another member began a newer one.
    for (slot, holder) in [(3, "m1"), (4, "m2")] {
        store
            .begin(group, "b", slot, Some(holder))
            .await
            .expect("begin");
    }
    rejoin(
        "b",
        1,
        7,
        false,
        (2, 4, false),
        "a superseded term is reported, and kept",
    )
    .await;
}

/// [`begin_with_notice`](ShardTerms::begin_with_notice) records what
/// [`carried_loss_notice`](crate::carried_loss_notice) says: the owner's notice after a
/// term that ended (or none), the longer of the two after one that did not, nothing when
/// either is unknown; the term returned and the list say the same, and the next begin
/// reads it as the previous term's notice. A store that keeps no notices records none.
pub async fn a_term_after_one_that_did_not_end_keeps_the_longer_notice<T: ShardTerms>(
    store: &T,
    group: &str,
) {
    let ms = Duration::from_millis;
    let begin = async |notice: Option<Duration>| {
        let begun = (store
            .begin_with_notice(group, "a", 1, Some("m"), notice)
            .await)
            .expect("begin");
        let listed = store.terms(group).await.expect("terms");
        assert_eq!(
            listed[0].loss_notice, begun.term.loss_notice,
            "listed as begun"
        );
        begun
    };
    let first = begin(Some(ms(1_000))).await;
    if first.term.loss_notice.is_none() {
        // A store that keeps no notice: every next owner waits its own takeover delay.
        assert_eq!(begin(Some(ms(100))).await.previous_loss_notice, None);
        return;
    }
    assert_eq!(
        first.term.loss_notice,
        Some(ms(1_000)),
        "the first term, its own"
    );
    let second = begin(Some(ms(100))).await;
    assert_eq!(second.previous_loss_notice, Some(ms(1_000)));
    assert_eq!(
        second.term.loss_notice,
        Some(ms(1_000)),
        "after a term that did not end, the longer of the two"
    );
    let third = begin(Some(ms(2_000))).await;
    assert_eq!(
        third.term.loss_notice,
        Some(ms(2_000)),
        "its own when longer"
    );
    store.end(group, "a", third.term.token).await.expect("end");
    let fourth = begin(Some(ms(100))).await;
    assert_eq!(
        (fourth.previous_ended, fourth.term.loss_notice),
        (true, Some(ms(100))),
        "after a term that ended, its own"
    );
    let unknown = begin(None).await;
    assert_eq!(unknown.term.loss_notice, None, "its own unknown");
    let after_unknown = begin(Some(ms(100))).await;
    assert_eq!(
        (
            after_unknown.previous_loss_notice,
            after_unknown.term.loss_notice
        ),
        (None, None),
        "after an unended term that recorded nothing, nothing"
    );
}
