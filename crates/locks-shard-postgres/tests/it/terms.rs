use std::time::{Duration, Instant};

use locks_shard::{Owned, ShardTerms};
use locks_shard_postgres::{PostgresShardTerms, guard_write};

use crate::support::{admin, pool, terms, unique};

/// The term store's contract (`locks_shard::conformance`), on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_the_term_store_contract() {
    locks_shard::conformance::terms_contract(&terms().await, &unique("terms")).await;
}

fn owned(group: &str, shard: &str, token: i64) -> Owned {
    Owned::new(group, shard, 0, token, time::OffsetDateTime::now_utc())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_s_write_is_refused_and_a_current_one_holds_off_the_next_term() {
    let store = terms().await;
    let group = unique("guard");
    let old = store
        .begin(&group, "t", 1, Some("old"))
        .await
        .expect("begin");
    let pool = pool(2);
    let mut client = pool.get().await.expect("a connection");
    {
        let tx = client.transaction().await.expect("begin");
        assert!(
            guard_write(&tx, &owned(&group, "t", old.term.token))
                .await
                .expect("guard")
        );
        tx.rollback().await.expect("rollback");
    }
    let new = store
        .begin(&group, "t", 2, Some("new"))
        .await
        .expect("begin");
    let tx = client.transaction().await.expect("begin");
    assert!(
        !guard_write(&tx, &owned(&group, "t", old.term.token))
            .await
            .expect("guard"),
        "the stale owner's write is refused"
    );
    assert!(
        !guard_write(&tx, &owned(&group, "never", 1))
            .await
            .expect("guard")
    );
    tx.rollback().await.expect("rollback");
    // A current writer's row lock holds the next term off until it commits.
    let tx = client.transaction().await.expect("begin");
    assert!(
        guard_write(&tx, &owned(&group, "t", new.term.token))
            .await
            .expect("guard")
    );
    let started = Instant::now();
    let next = tokio::spawn({
        let store = store.clone();
        let group = group.clone();
        async move {
            let begun = store
                .begin(&group, "t", 3, Some("next"))
                .await
                .expect("begin");
            (begun, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let committed = Instant::now();
    tx.commit().await.expect("commit");
    let (begun, at) = next.await.expect("the next term");
    assert_eq!(begun.term.token, 3);
    assert!(
        at >= committed,
        "the next term began {:?} after the start, before the write committed",
        at - started
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_s_loss_notice_reaches_the_next_owner_only_under_its_own_token() {
    let store = terms().await;
    let group = unique("notice");
    let notice = Some(Duration::from_millis(100));
    let first = store
        .begin_with_notice(&group, "a", 1, Some("m1"), notice)
        .await
        .expect("begin");
    assert_eq!(first.previous_loss_notice, None, "nothing before the first");
    assert_eq!(first.term.loss_notice, notice);
    let listed = store.terms(&group).await.expect("terms");
    assert_eq!(listed[0].loss_notice, notice);
    let second = store
        .begin(&group, "a", 2, Some("m2"))
        .await
        .expect("begin");
    assert!(!second.previous_ended);
    assert_eq!(
        second.previous_loss_notice, notice,
        "the owner before said it"
    );
    let third = store
        .begin_with_notice(&group, "a", 1, Some("m1"), notice)
        .await
        .expect("begin");
    assert_eq!(
        third.previous_loss_notice, None,
        "the term before recorded nothing"
    );
    // A member of a version that does not know the columns begins a term without them:
    // the pair left behind says nothing about that term's owner.
    admin()
        .await
        .execute(
            "UPDATE locks_shard_terms SET token = token + 1, ended = false \
             WHERE group_name = $1 AND shard = 'a'",
            &[&group],
        )
        .await
        .expect("an older member's begin");
    let fifth = store
        .begin(&group, "a", 2, Some("m2"))
        .await
        .expect("begin");
    assert_eq!(fifth.term.token, 5);
    assert_eq!(fifth.previous_loss_notice, None, "an older member's term");
    let rounded = store
        .begin_with_notice(&group, "b", 1, None, Some(Duration::from_micros(1500)))
        .await
        .expect("begin");
    assert_eq!(
        rounded.term.loss_notice,
        Some(Duration::from_millis(2)),
        "kept in whole milliseconds, rounded up"
    );
}

/// A term table made before the loss-notice columns existed (the first version's shape,
/// with a term in it) gains them from `install_shard_terms`, keeps its rows, and records
/// the next owners' notices (right after the old term, which did not end and recorded
/// none, nothing is carried; after an ended term, the owner's own); on a database of its
/// own, so the shared table is not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrades_a_term_table_made_before_the_loss_notice() {
    let (url, database) = throwaway_pg::testing::own_database("shard_upgrade").await;
    let pool = locks_postgres::plain_pool(&url, 2).expect("a pool");
    let client = pool.get().await.expect("a connection");
    client
        .batch_execute(
            "CREATE TABLE locks_shard_terms (group_name text NOT NULL, shard text NOT NULL, \
             token bigint NOT NULL CHECK (token > 0), member_slot integer NOT NULL, \
             holder_id text, since timestamptz NOT NULL, \
             ended boolean NOT NULL DEFAULT false, PRIMARY KEY (group_name, shard)); \
             INSERT INTO locks_shard_terms VALUES ('g', 't', 4, 1, 'old', now(), false)",
        )
        .await
        .expect("the first version's table");
    locks_shard_postgres::install_shard_terms(&client)
        .await
        .expect("the upgrade");
    drop(client);
    let store = PostgresShardTerms::new(pool.clone());
    let notice = Some(Duration::from_millis(100));
    let next = store
        .begin_with_notice("g", "t", 2, Some("new"), notice)
        .await
        .expect("a term on the upgraded table");
    assert_eq!(next.term.token, 5, "the old row's token was kept");
    assert_eq!(
        (next.previous_loss_notice, next.term.loss_notice),
        (None, None),
        "the old term recorded none, and did not end: none carried"
    );
    store.end("g", "t", 5).await.expect("ending it");
    let ended_before = store
        .begin_with_notice("g", "t", 2, Some("new"), notice)
        .await
        .expect("a term after one that ended");
    assert_eq!(ended_before.term.loss_notice, notice, "its own");
    let after = store
        .begin_with_notice("g", "t", 3, Some("newer"), None)
        .await
        .expect("the next term");
    assert_eq!(
        after.previous_loss_notice, notice,
        "recorded on the new columns"
    );
    drop((store, pool));
    throwaway_pg::testing::drop_database(&database).await;
}

/// `len` bytes of letters and digits that do not compress (the server compresses a long
/// index entry before it measures it), different for each `seed`.
fn incompressible(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(ALPHABET[usize::try_from(state >> 58).expect("6 bits") % ALPHABET.len()])
        })
        .collect()
}

/// Every group and shard name a `ShardGroup` accepts can begin a term on the server: the
/// term table's key is (group, shard), and the server refuses an index entry over 2,704
/// bytes. A group of one 3,000-byte shard name was accepted, and on PostgreSQL its shard
/// never ran (every begin refused, on every tick), while the memory store ran it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_name_a_shard_group_accepts_can_begin_a_term() {
    let store = terms().await;
    let prefix = unique("long");
    for (group_len, shard_len) in [(0, 3_000), (1_024 - prefix.len(), 1_024), (2_000, 900)] {
        let group = format!("{prefix}{}", incompressible(group_len, 1));
        let shard = incompressible(shard_len, 2);
        let Ok(accepted) = locks_shard::ShardGroup::new(group, [shard]) else {
            continue;
        };
        let shard = accepted.shard(0).expect("its shard");
        let begun = store.begin(accepted.name(), shard, 1, Some("m")).await;
        assert!(
            begun.is_ok(),
            "a group of {} bytes with a shard of {} bytes was accepted, and its term: {}",
            accepted.name().len(),
            shard.len(),
            begun.expect_err("failed")
        );
    }
}
