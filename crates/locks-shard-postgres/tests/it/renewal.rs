//! A renewal ends the sessions of a member whose row expired while its membership slot is
//! still held: every session of a member that stopped renewing, and only the old slot's
//! session of a member that joined again under another slot (its sessions gone on its
//! side but not yet on the server's, after a network cut), never the sessions that member
//! runs its shards on; and a member that left (its slot free) is only forgotten. A
//! renewal expiry too short for the renewals to keep up is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use locks_shard::locks_port::{AcquisitionErrorKind, PermitDerivation};
use locks_shard::{ShardGroup, ShardMember, ShardTerms};
use locks_shard_postgres::tokio_postgres::Client;

use crate::record::{SHARDS, group};
use crate::support::{admin, database_url, manager, terms, unique};

/// What a test session holds: a slot of the membership semaphore (its class, the slot),
/// or a shard's lock (its key).
enum Held {
    Slot(i32, i32),
    Shard(i64),
}

/// A session named as the sessions of holder `holder` are, holding `held`; and its
/// backend's pid.
async fn session(holder: &str, held: Held) -> (Client, i32) {
    let mut config: locks_shard_postgres::tokio_postgres::Config =
        database_url().parse().expect("the test server's URL");
    config.application_name(locks_postgres::holder_application_name(holder));
    let (client, connection) = config
        .connect(locks_shard_postgres::tokio_postgres::NoTls)
        .await
        .expect("a session");
    tokio::spawn(connection);
    match held {
        Held::Slot(class, slot) => client
            .execute(
                "SELECT pg_advisory_lock($1::int4, $2::int4)",
                &[&class, &slot],
            )
            .await
            .expect("the slot"),
        Held::Shard(key) => client
            .execute("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .expect("a shard's lock"),
    };
    let pid = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("its pid")
        .get(0);
    (client, pid)
}

/// A row of the member table for `slot`, of holder `holder`, expiring `seconds` from now
/// (in the past when negative).
async fn row(admin: &Client, group: &str, slot: i32, holder: &str, seconds: f64) {
    admin
        .execute(
            "INSERT INTO locks_shard_members (group_name, member_slot, application_name, expires) \
             VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4))",
            &[
                &group,
                &slot,
                &locks_postgres::holder_application_name(holder),
                &seconds,
            ],
        )
        .await
        .expect("a member row");
}

/// Whether the backend `pid` is still there.
async fn alive(admin: &Client, pid: i32) -> bool {
    admin
        .query_one(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .expect("pg_stat_activity")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_ends_a_stopped_member_but_only_the_old_slot_of_one_that_joined_again() {
    let terms = terms().await;
    let admin = admin().await;
    let group = unique("renewal");
    let class = PermitDerivation::CURRENT.class(&ShardGroup::members_name_of(&group));
    let (x, z) = (unique("x"), unique("z"));
    // x: its old membership's session still holds slot 1 on the server (its side gave it
    // up), and x runs on: a live row under slot 2, and a session holding a shard's lock.
    let (_old, old_pid) = session(&x, Held::Slot(class, 1)).await;
    let (_current, current_pid) = session(&x, Held::Slot(class, 2)).await;
    let (_running, running_pid) = session(&x, Held::Shard(7)).await;
    row(&admin, &group, 1, &x, -5.0).await;
    row(&admin, &group, 2, &x, 60.0).await;
    // z stopped renewing: its row expired, its slot and a shard's lock still held.
    let (_z_slot, z_slot_pid) = session(&z, Held::Slot(class, 3)).await;
    let (_z_shard, z_shard_pid) = session(&z, Held::Shard(8)).await;
    row(&admin, &group, 3, &z, -5.0).await;
    // w left: its row expired, its slot free; a session of its name goes on (a process
    // that left the group and takes other locks). It is only forgotten.
    let w = unique("w");
    let (_w_other, w_other_pid) = session(&w, Held::Shard(9)).await;
    row(&admin, &group, 5, &w, -5.0).await;

    let ended = terms
        .renew(&group, 4, &unique("y"), Duration::from_secs(10))
        .await
        .expect("a renewal");
    // pg_terminate_backend signals; the backends go a moment later.
    let gone = async |pid| {
        for _ in 0..100 {
            if !alive(&admin, pid).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    };
    assert!(gone(z_slot_pid).await, "the stopped member's slot session");
    assert!(
        gone(z_shard_pid).await,
        "the stopped member's shard session"
    );
    assert!(gone(old_pid).await, "the old slot's session of x");
    assert!(
        alive(&admin, current_pid).await && alive(&admin, running_pid).await,
        "a renewal ended the sessions of x, which renews under another slot: its shards \
         would be lost"
    );
    assert!(
        alive(&admin, w_other_pid).await,
        "a renewal ended a session of w, a member that left (its slot free)"
    );
    assert_eq!(ended, 3, "the three sessions above, no other");
    let rows: Vec<i32> = admin
        .query(
            "SELECT member_slot FROM locks_shard_members WHERE group_name = $1 ORDER BY 1",
            &[&group],
        )
        .await
        .expect("the rows")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        rows,
        vec![2, 4],
        "the expired rows deleted (w's too), x's and y's kept"
    );
}

/// A member whose role may not end a stuck member's sessions (another role's, here the
/// superuser's) is still renewed: the renewal answers 0 ended, its row is renewed, and
/// the stuck session stays. Before, the refused `pg_terminate_backend` failed the whole
/// renewal, so every healthy member would have stopped its tasks at its self-stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_may_not_end_a_stuck_member_still_renews_this_one() {
    let admin = admin().await;
    crate::support::terms().await; // the tables
    let group = unique("renewal_noperm");
    let class = PermitDerivation::CURRENT.class(&ShardGroup::members_name_of(&group));
    // z stopped renewing, its slot still held by a session of the superuser.
    let z = unique("z");
    let (_z_slot, z_pid) = session(&z, Held::Slot(class, 3)).await;
    row(&admin, &group, 3, &z, -5.0).await;
    let role = unique("shard_member");
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON locks_shard_terms, locks_shard_members \
             TO {role}"
        ))
        .await
        .expect("a member's role");
    let mut config: locks_shard_postgres::tokio_postgres::Config =
        database_url().parse().expect("the test server's URL");
    config.user(&role);
    let store = locks_shard_postgres::PostgresShardTerms::new(
        locks_postgres::plain_pool_with_config(config, 1).expect("a pool"),
    );
    let renewed = store
        .renew(&group, 4, &unique("y"), Duration::from_secs(10))
        .await;
    drop(store);
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .expect("drop the role");
    assert_eq!(renewed.expect("this member is renewed"), 0);
    assert!(alive(&admin, z_pid).await, "the superuser's session stays");
    let live: bool = admin
        .query_one(
            "SELECT expires > clock_timestamp() FROM locks_shard_members \
             WHERE group_name = $1 AND member_slot = 4",
            &[&group],
        )
        .await
        .expect("this member's row")
        .get(0);
    assert!(live, "this member's row is renewed");
}

/// A member renews every fifth of its expiry and stops itself 0.8 of it after its last
/// confirmed renewal was sent, so each renewal has 0.3 of the expiry to be answered in.
/// Below `MIN_RENEWAL_EXPIRY` a member is refused at once (a `Configuration` error, no
/// join); at it, a lone member on this server keeps each of its shards' tasks for 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_expiry_below_the_floor_is_refused_and_one_at_it_keeps_its_shards() {
    let floor = locks_shard::MIN_RENEWAL_EXPIRY;
    for expiry in [Duration::from_millis(20), floor] {
        let name = unique("expiry");
        let member = ShardMember::new(
            manager(&unique("m"), SHARDS + 4),
            terms().await,
            group(&name),
        )
        .tick(Duration::from_millis(50))
        .backoff(Duration::from_millis(200))
        .renewal(Some(expiry));
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let run = member.run(move |_, stop| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let _ = stop.await;
            }
        });
        let ran = tokio::time::timeout(Duration::from_secs(3), run).await;
        let started = starts.load(Ordering::SeqCst);
        if expiry < floor {
            let error = ran
                .unwrap_or_else(|_| {
                    panic!(
                        "a renewal expiry of {expiry:?} was not refused: {started} task starts \
                         for {SHARDS} shards in 3 s"
                    )
                })
                .expect_err("run never returns Ok");
            assert_eq!(error.kind(), AcquisitionErrorKind::Configuration, "{error}");
            assert_eq!(started, 0);
        } else {
            assert!(ran.is_err(), "run ended: {ran:?}");
            assert_eq!(
                started, SHARDS,
                "a member at the floor stopped itself: {started} task starts for {SHARDS} shards"
            );
        }
    }
}
