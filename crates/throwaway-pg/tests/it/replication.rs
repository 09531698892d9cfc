use throwaway_pg::PrimaryWithStandby;

use crate::accepts_connections;

#[test]
fn the_standby_streams_the_primary_and_takes_over_when_promoted() {
    let pair = PrimaryWithStandby::start().expect("start a primary and a standby");
    let (primary, standby) = (pair.primary(), pair.standby());
    let dirs = [primary.dir().to_path_buf(), standby.dir().to_path_buf()];
    assert_ne!(primary.port(), standby.port());
    assert!(!pair.is_synchronous());
    assert_eq!(primary.psql("SELECT pg_is_in_recovery()").unwrap(), "f");
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()").unwrap(), "t");
    assert_eq!(standby.psql("SHOW transaction_read_only").unwrap(), "on");
    assert_eq!(
        pair.multi_host_url(),
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            primary.port(),
            standby.port()
        )
    );

    primary
        .psql("CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
        .unwrap();
    pair.wait_for_replay().expect("replay");
    assert_eq!(standby.psql("SELECT v FROM t").unwrap(), "42");
    let refused = standby.psql("INSERT INTO t VALUES (1)").unwrap_err();
    assert!(
        refused.to_string().contains("read-only transaction"),
        "{refused}"
    );

    pair.stop_primary_immediately().expect("stop the primary");
    assert!(!primary.is_running());
    assert!(!accepts_connections(primary.port()));
    pair.promote_standby().expect("promote");
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()").unwrap(), "f");
    standby.psql("INSERT INTO t VALUES (43)").unwrap();
    assert_eq!(standby.psql("SELECT sum(v) FROM t").unwrap(), "85");

    drop(pair);
    for dir in dirs {
        assert!(!dir.exists(), "{} is left behind", dir.display());
    }
}

#[test]
fn a_synchronous_standby_has_every_commit_the_primary_reported() {
    let pair = PrimaryWithStandby::builder()
        .synchronous(true)
        .start()
        .expect("start a synchronous pair");
    let (primary, standby) = (pair.primary(), pair.standby());
    assert!(pair.is_synchronous());
    assert_eq!(primary.psql("SHOW synchronous_standby_names").unwrap(), "*");
    assert_eq!(primary.psql("SHOW synchronous_commit").unwrap(), "on");
    assert_eq!(
        primary
            .psql("SELECT sync_state FROM pg_stat_replication")
            .unwrap(),
        "sync"
    );
    assert_eq!(standby.psql("SHOW synchronous_standby_names").unwrap(), "");

    primary
        .psql("CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 1000)")
        .unwrap();
    // No wait for replay: a synchronous commit is on the standby once it returns.
    pair.stop_primary_immediately().expect("stop the primary");
    pair.promote_standby().expect("promote");
    assert_eq!(standby.psql("SELECT count(*) FROM t").unwrap(), "1000");
    // The promoted standby commits without waiting for a standby of its own.
    standby.psql("INSERT INTO t VALUES (0)").unwrap();
}
