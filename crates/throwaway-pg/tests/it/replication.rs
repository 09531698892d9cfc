use throwaway_pg::{PrimaryWithStandby, ThrowawayPostgres};

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

/// Binary sets without `pg_basebackup` (the npm packages `cargo xtask test --postgres N`
/// uses) get a standby copied from the cleanly stopped primary instead.
#[test]
fn without_pg_basebackup_the_standby_is_a_copy_of_the_stopped_primary() {
    let local = ThrowawayPostgres::start().expect("find the local binaries");
    let bin = std::env::temp_dir().join(format!("throwaway-pg-bin-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    for tool in ["initdb", "pg_ctl", "postgres", "psql"] {
        let _ = std::fs::remove_file(bin.join(tool));
        std::os::unix::fs::symlink(local.bin_dir().join(tool), bin.join(tool)).unwrap();
    }
    drop(local);
    let pair = PrimaryWithStandby::builder()
        .synchronous(true)
        .bin_dir(&bin)
        .start()
        .expect("start a pair without pg_basebackup");
    let (primary, standby) = (pair.primary(), pair.standby());
    assert!(!standby.data_dir().join("backup_label").exists());
    assert_eq!(standby.psql("SELECT pg_is_in_recovery()").unwrap(), "t");
    assert_eq!(
        primary
            .psql("SELECT slot_name || ' ' || active FROM pg_replication_slots")
            .unwrap(),
        "throwaway_standby true"
    );
    primary
        .psql("CREATE TABLE t (v int); INSERT INTO t VALUES (7)")
        .unwrap();
    pair.stop_primary_immediately().unwrap();
    pair.promote_standby().unwrap();
    assert_eq!(standby.psql("SELECT v FROM t").unwrap(), "7");
    drop(pair);
    std::fs::remove_dir_all(&bin).unwrap();
}
