//! A store shared behind an `Arc` is the store: every method of [`ShardTerms`] reaches it,
//! not the trait's default (a member built on `Arc<PostgresShardTerms>` must keep its
//! roster, or its ticks read `pg_locks` again).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use locks_shard::locks_port::{LockAcquisitionError, PermitHolder};
use locks_shard::{Begun, MemoryTerms, ShardTerms, Term};

/// [`MemoryTerms`] that names each method called on it, and keeps a roster of nothing.
#[derive(Default)]
struct Recording {
    terms: MemoryTerms,
    called: Mutex<Vec<&'static str>>,
}

impl Recording {
    fn call(&self, name: &'static str) {
        self.called.lock().expect("the list").push(name);
    }
}

impl ShardTerms for Recording {
    async fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> Result<Begun, LockAcquisitionError> {
        self.call("begin");
        self.terms.begin(group, shard, member, holder_id).await
    }

    async fn begin_with_notice(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
        loss_notice: Option<Duration>,
    ) -> Result<Begun, LockAcquisitionError> {
        self.call("begin_with_notice");
        (self.terms)
            .begin_with_notice(group, shard, member, holder_id, loss_notice)
            .await
    }

    async fn end(&self, group: &str, shard: &str, token: i64) -> Result<(), LockAcquisitionError> {
        self.call("end");
        self.terms.end(group, shard, token).await
    }

    async fn terms(&self, group: &str) -> Result<Vec<Term>, LockAcquisitionError> {
        self.call("terms");
        self.terms.terms(group).await
    }

    async fn rejoined(
        &self,
        group: &str,
        shard: &str,
        token: i64,
        member: u32,
    ) -> Result<bool, LockAcquisitionError> {
        self.call("rejoined");
        self.terms.rejoined(group, shard, token, member).await
    }

    async fn enter(
        &self,
        _group: &str,
        _member: u32,
        _holder_id: Option<&str>,
        _expiry: Option<Duration>,
    ) -> Result<(), LockAcquisitionError> {
        self.call("enter");
        Ok(())
    }

    async fn roster(
        &self,
        _group: &str,
        _members_name: &str,
    ) -> Result<Option<Vec<PermitHolder>>, LockAcquisitionError> {
        self.call("roster");
        Ok(Some(Vec::new()))
    }

    async fn renew(
        &self,
        _group: &str,
        _member: u32,
        _holder_id: &str,
        _expiry: Duration,
    ) -> Result<u64, LockAcquisitionError> {
        self.call("renew");
        Ok(0)
    }
}

/// Calls every method of `store` once, in the trait's order.
async fn every_method<T: ShardTerms>(store: &T) -> Option<Vec<PermitHolder>> {
    let begun = store.begin("g", "s", 0, Some("a")).await.expect("begin");
    (store.begin_with_notice("g", "s", 0, Some("a"), None))
        .await
        .expect("begin with notice");
    (store.end("g", "s", begun.term.token)).await.expect("end");
    store.terms("g").await.expect("terms");
    (store.rejoined("g", "s", begun.term.token, 1))
        .await
        .expect("rejoined");
    (store.enter("g", 0, Some("a"), None)).await.expect("enter");
    let roster = store.roster("g", "members").await.expect("roster");
    (store.renew("g", 0, "a", Duration::from_secs(1)))
        .await
        .expect("renew");
    roster
}

#[tokio::test]
async fn every_method_of_a_store_behind_an_arc_reaches_the_store() {
    let store = Arc::new(Recording::default());
    assert_eq!(
        every_method(&store).await,
        Some(Vec::new()),
        "the roster is the store's, not the default's `None`"
    );
    assert_eq!(
        *store.called.lock().expect("the list"),
        [
            "begin",
            "begin_with_notice",
            "end",
            "terms",
            "rejoined",
            "enter",
            "roster",
            "renew"
        ],
    );
}
