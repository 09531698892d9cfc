use std::process::Stdio;
use std::time::Duration;

use throwaway_pg::{Error, ThrowawayPostgres};

use crate::{accepts_connections, eventually};

#[test]
fn starts_with_the_promised_settings_and_cleans_up_on_drop() {
    let pg = ThrowawayPostgres::start().expect("start");
    let port = pg.port();
    let dir = pg.dir().to_path_buf();

    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    assert!(accepts_connections(port));
    assert!(pg.is_running());
    assert!(pg.data_dir().join("PG_VERSION").is_file());
    assert!(pg.log_file().is_file());
    assert_eq!(pg.psql("select 1").unwrap(), "1");
    assert_eq!(pg.psql("show max_connections").unwrap(), "600");
    assert_eq!(pg.psql("show fsync").unwrap(), "off");
    assert_eq!(pg.psql("show synchronous_commit").unwrap(), "off");
    assert_eq!(pg.psql("show full_page_writes").unwrap(), "off");
    assert_eq!(pg.psql("show listen_addresses").unwrap(), "127.0.0.1");
    assert_eq!(
        pg.psql("show unix_socket_directories").unwrap(),
        dir.to_string_lossy()
    );
    assert_eq!(pg.psql("select current_user").unwrap(), "postgres");

    drop(pg);
    assert!(!dir.exists(), "{} is left behind", dir.display());
    assert!(
        !accepts_connections(port),
        "the server still listens on {port}"
    );
}

#[test]
fn extra_settings_override_the_defaults() {
    let pg = ThrowawayPostgres::builder()
        .setting("max_connections", "50")
        .setting("work_mem", "'8MB'")
        .start()
        .expect("start");
    assert_eq!(pg.psql("show max_connections").unwrap(), "50");
    assert_eq!(pg.psql("show work_mem").unwrap(), "8MB");
}

#[test]
fn restart_keeps_the_port_and_ends_sessions_holding_advisory_locks() {
    let pg = ThrowawayPostgres::start().expect("start");
    let port = pg.port();

    // A session that takes an advisory lock and stays connected.
    let mut holder = pg
        .psql_command()
        .args([
            "-c",
            "select pg_advisory_lock(42)",
            "-c",
            "select pg_sleep(600)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn psql");
    let held = "select count(*) from pg_locks where locktype = 'advisory' and granted";
    assert!(
        eventually(Duration::from_secs(10), || pg.psql(held).unwrap() == "1"),
        "the psql session never took its lock"
    );

    pg.restart().expect("restart");

    assert_eq!(pg.port(), port);
    assert!(pg.is_running());
    assert_eq!(pg.psql(held).unwrap(), "0", "the lock survived the restart");
    assert!(
        eventually(Duration::from_secs(10), || holder
            .try_wait()
            .unwrap()
            .is_some()),
        "the locking session survived the restart"
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn stop_then_start_again_on_the_same_port() {
    let pg = ThrowawayPostgres::start().expect("start");
    let port = pg.port();

    pg.stop().expect("stop");
    assert!(!pg.is_running());
    assert!(!accepts_connections(port));
    assert!(pg.data_dir().is_dir(), "stop keeps the folder");
    assert!(pg.psql("select 1").is_err());

    pg.start_again().expect("start again");
    assert!(pg.is_running());
    assert_eq!(pg.psql("select 1").unwrap(), "1");

    pg.stop_immediately().expect("immediate stop");
    assert!(!pg.is_running());
    pg.start_again().expect("start after an immediate stop");
    assert_eq!(pg.psql("select 1").unwrap(), "1");
}

#[test]
fn a_detached_cluster_keeps_running_until_attached_and_destroyed() {
    let pg = ThrowawayPostgres::builder()
        .watchdog(true)
        .start()
        .expect("start");
    let port = pg.port();
    let dir = pg.detach();
    assert!(accepts_connections(port), "detach stopped the server");
    assert!(dir.is_dir());

    // Adopt it by its data folder, as `cargo xtask pg stop <data dir>` would.
    let again = ThrowawayPostgres::attach(dir.join("data")).expect("attach");
    assert_eq!(again.port(), port);
    assert_eq!(again.dir(), dir);
    assert!(again.is_running());
    again.destroy().expect("destroy");
    assert!(!dir.exists());
    assert!(!accepts_connections(port));
}

#[test]
fn attach_refuses_a_folder_it_did_not_make_and_leaves_it_alone() {
    let dir = std::env::temp_dir().join(format!("not-throwaway-pg-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("precious"), "keep me").unwrap();

    let error = ThrowawayPostgres::attach(&dir).expect_err("attach must refuse");
    assert!(
        matches!(error, Error::NotAThrowawayCluster { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains(&*dir.to_string_lossy()));
    assert!(dir.join("precious").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_bad_setting_is_an_error_naming_it_and_starts_nothing() {
    let error = ThrowawayPostgres::builder()
        .setting("fsync", "off\nport = 1")
        .start()
        .expect_err("a value with a newline must be refused");
    assert!(matches!(error, Error::InvalidSetting { .. }), "{error:?}");
    assert!(error.to_string().contains("fsync"), "{error}");
}

#[test]
fn a_folder_without_binaries_is_an_error_that_says_what_to_install() {
    let error = ThrowawayPostgres::builder()
        .bin_dir("/nonexistent/postgresql/bin")
        .start()
        .expect_err("no binaries there");
    assert!(matches!(error, Error::NotInstalled { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("apt-get install postgresql"), "{message}");
    assert!(message.contains("/nonexistent/postgresql/bin"), "{message}");
}
