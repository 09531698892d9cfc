//! The lease under a real network partition: a host that vanishes without closing its
//! sockets (no FIN, no RST), as a power loss, a frozen VM or a cut cable does.
//!
//! The test makes two network namespaces joined by a veth pair
//! ([`throwaway_pg::NetworkPair`]): the near one, where a throwaway
//! PostgreSQL listens on its veth address, and the far one, where a holder and a queued waiter
//! (child processes: this test binary run again inside the namespace) reach it over real
//! TCP. The test itself plays the other hosts through the server's Unix socket. Then the
//! far side's link goes down, which drops packets both ways and closes neither socket.
//!
//! For the default lease and a short one, it measures when the cut-off holder is told
//! and when another host can take the lock (after both the holder and the waiter the
//! server granted it to are gone), and asserts the manager's documented bounds
//! ([`locks_postgres::Lease`]): told within `holder_told_within`, free within the lease,
//! and told at least the margin before the lock is free. A third holder with
//! `lease(None)` is the negative control: its lock must still be held well after the
//! short lease, or the test is not measuring the lease.
//!
//! A second test puts two session-pooling PgBouncers on the near side: one with its
//! client-side TCP settings set to the lease's server timers (the same bounds must hold)
//! and one with its defaults (the negative control: still held).
//!
//! A third runs a [`LeaderElection`] on the far side (the short lease) and a standby on
//! the near side, and asserts the hand-over's order: the cut-off leader's task is stopped at
//! least the margin before the standby's task starts, and the standby starts within the
//! lease of the cut. Its negative controls were run by hand (a library that stops a lost
//! leader's task 10 s late, or never, fails the order check; a leader with `lease(None)`
//! fails the "within the lease" one).
//!
//! It needs root (`ip netns`); where namespaces cannot be made it fails and says so.
//! Its own test binary: it starts its own cluster inside the namespace.

use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use locks_leader::LeaderElection;
use locks_port::{DistributedLock, LockGuard, Semaphore};
use locks_postgres::{Lease, PostgresLockManager};
use throwaway_pg::testing::child::{entry, say};
use throwaway_pg::testing::near::{InNamespace, NearServer, serve};

/// The child's role, and what it needs.
const ROLE: &str = "LOCKS_PARTITION_ROLE";
const URL: &str = "LOCKS_PARTITION_URL";
const KEY: &str = "LOCKS_PARTITION_KEY";
const LEASE_SECS: &str = "LOCKS_PARTITION_LEASE";
const BOUNCER_TIMERS: &str = "LOCKS_PARTITION_BOUNCER_TIMERS";
/// Set: the holder and the waiter take the one permit of a semaphore, not the lock.
const PERMIT: &str = "LOCKS_PARTITION_PERMIT";

/// The short lease measured beside the default one.
const SHORT_LEASE: Duration = Duration::from_secs(10);
/// Allowance for the test's own measuring: a message through a pipe, a 100 ms poll.
const SLACK: Duration = Duration::from_millis(500);

// ---------------------------------------------------------------------------------
// The child side: run inside a namespace by the parent, a no-op in a normal test run.

/// The entry point of the child processes (see the module documentation).
#[test]
fn child_entry() {
    entry(ROLE, |role, runtime| match role {
        "server" => serve(bouncers),
        "hold" | "wait" => runtime.block_on(child_lock(role == "hold")),
        "lead" => runtime.block_on(child_leader()),
        other => panic!("unknown {ROLE} {other:?}"),
    });
}

/// With `BOUNCER_TIMERS`: two session-pooling PgBouncers in front of the server, listening
/// on the far side's link too, one with its client-side TCP timers set to the lease's, one
/// with its defaults; their ports are the server's ready words.
fn bouncers(
    server: &throwaway_pg::ThrowawayPostgres,
    listen: &str,
) -> (Vec<throwaway_pg::PgBouncer>, Vec<String>) {
    let bouncers: Vec<throwaway_pg::PgBouncer> = std::env::var(BOUNCER_TIMERS)
        .ok()
        .map(|timers| {
            let timers: Vec<&str> = timers.split(',').collect();
            let settings = [
                ("tcp_keepalive", "1"),
                ("tcp_keepidle", timers[0]),
                ("tcp_keepintvl", timers[1]),
                ("tcp_keepcnt", timers[2]),
                ("tcp_user_timeout", timers[3]),
            ];
            [true, false]
                .into_iter()
                .map(|leased| {
                    let mut builder = throwaway_pg::PgBouncer::builder()
                        .pool_mode(throwaway_pg::PoolMode::Session)
                        .setting("listen_addr", format!("127.0.0.1,{listen}"));
                    if leased {
                        for (name, value) in settings {
                            builder = builder.setting(name, value);
                        }
                    }
                    builder
                        .start(&server.url())
                        .expect("a PgBouncer in the namespace")
                })
                .collect()
        })
        .unwrap_or_default();
    let ports = bouncers
        .iter()
        .map(|bouncer| bouncer.port().to_string())
        .collect();
    (bouncers, ports)
}

/// A child's key and its manager (`connections` of them, the lease the parent asked
/// for), from the environment the parent set.
fn child_manager(holder_id: &str, connections: usize) -> (String, PostgresLockManager) {
    let url = std::env::var(URL).expect(URL);
    let key = std::env::var(KEY).expect(KEY);
    let lease: u64 = std::env::var(LEASE_SECS)
        .expect(LEASE_SECS)
        .parse()
        .unwrap();
    let pool = locks_postgres::plain_pool(&url, connections).expect("pool");
    let manager = PostgresLockManager::builder(pool)
        .holder_id(holder_id)
        .lease((lease > 0).then(|| Duration::from_secs(lease)))
        .try_build()
        .expect("a lease that holds");
    (key, manager)
}

/// Holds (`hold`) or waits for (`wait`) the key, with the lease asked for; a holder says
/// when it is told the lock is lost. Never releases: the parent kills it.
async fn child_lock(hold: bool) {
    let (key, manager) = child_manager(if hold { "far-holder" } else { "far-waiter" }, 1);
    let lost = if std::env::var(PERMIT).is_ok() {
        // A permit's wait is in rounds of at most 1 s, each bounded by the answer it
        // waits for: a cut-off waiter's fails (ConnectionLost) where a lock's waits on.
        let Ok(permit) = manager
            .acquire_permit(&key, 1, locks_port::AcquireOptions::new())
            .await
        else {
            say("gave up");
            std::future::pending::<()>().await;
            return;
        };
        let lost = locks_port::PermitGuard::lost(&permit);
        std::mem::forget(permit);
        lost
    } else {
        let guard = manager
            .acquire(&key, locks_port::AcquireOptions::new())
            .await
            .expect("acquire");
        let lost = guard.lost();
        std::mem::forget(guard);
        lost
    };
    say("held");
    let reason = lost.await;
    say(&format!("told {reason}"));
    std::future::pending::<()>().await;
}

/// Microseconds since the Unix epoch: comparable between processes on one host.
fn wall_micros(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).expect("a clock after 1970");
    u64::try_from(since.as_micros()).expect("microseconds fit")
}

/// Campaigns in a [`LeaderElection`] for the key, with the lease asked for; its task says
/// when it starts (`leading`), when the election tells it leadership is lost (`told`),
/// and when the election stops it (`stopped`: its future dropped), each with the wall
/// clock in microseconds. Never gives the leadership up: the parent kills it.
async fn child_leader() {
    // A leader holds two permits: the election's and the leading one.
    let (key, manager) = child_manager("far-leader", 2);

    /// Says `stopped` when the task's future is dropped, which is how the election stops it.
    struct Stopped;
    impl Drop for Stopped {
        fn drop(&mut self) {
            say(&format!("stopped {}", wall_micros(SystemTime::now())));
        }
    }

    let election = LeaderElection::new(manager, key);
    let outcome = election
        .run(|lost| async move {
            let _stopped = Stopped;
            say(&format!("leading {}", wall_micros(SystemTime::now())));
            tokio::spawn(async move {
                let reason = lost.await;
                say(&format!("told {} {reason}", wall_micros(SystemTime::now())));
            });
            std::future::pending::<()>().await;
        })
        .await;
    say(&format!("the election ended: {outcome:?}"));
    std::future::pending::<()>().await;
}

// ---------------------------------------------------------------------------------
// The parent side.

/// The test's runtime of two worker threads.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A manager on the near side, through the server's Unix socket (the other hosts).
fn near_manager(server: &NearServer) -> PostgresLockManager {
    PostgresLockManager::new(locks_postgres::plain_pool(&server.socket_url(), 4).unwrap())
}

/// Makes the pair and starts the server (and PgBouncers, given their timers) on its near
/// side.
fn near_server(name: &str, octet: u8, bouncer_timers: Option<&str>) -> NearServer {
    let mut env = vec![(ROLE, "server")];
    if let Some(timers) = bouncer_timers {
        env.push((BOUNCER_TIMERS, timers));
    }
    NearServer::start(name, octet, "child_entry", &env)
}

/// Over TCP to the near address, as the far side connects: to the server, or through
/// the PgBouncer at `bouncer` in the server child's list.
fn far_url(server: &NearServer, bouncer: Option<usize>) -> String {
    server.far_url(bouncer.map(|index| server.words()[index].as_str()))
}

/// One lock on the far side: a holder, a waiter queued behind it, and what was seen.
struct Scenario {
    name: &'static str,
    key: String,
    /// A semaphore's one permit instead of the lock.
    permit: bool,
    /// The bounds the scenario must keep (`None`: the negative control, whose lock must
    /// stay held).
    lease: Option<Lease>,
    holder: InNamespace,
    _waiter: InNamespace,
    told: Option<Instant>,
    free: Option<Instant>,
}

/// One lock on the far side.
struct Plan {
    name: &'static str,
    /// The far holder's and waiter's lease.
    lease: Option<Duration>,
    /// Whether the bounds of that lease must hold (else: the negative control).
    bounded: bool,
    /// Through which PgBouncer (by its place in the server child's list), or straight
    /// to the server.
    bouncer: Option<usize>,
    /// A semaphore's one permit instead of the lock.
    permit: bool,
}

#[test]
fn a_cut_off_holder_is_told_first_and_its_lock_is_free_within_the_lease() {
    let plans = [
        ("default lease", Some(Duration::from_secs(60)), true, false),
        ("short lease", Some(SHORT_LEASE), true, false),
        (
            "a semaphore's permit, short lease",
            Some(SHORT_LEASE),
            true,
            true,
        ),
        ("no lease (negative control)", None, false, false),
    ]
    .map(|(name, lease, bounded, permit)| Plan {
        name,
        lease,
        bounded,
        bouncer: None,
        permit,
    });
    partition("locks", 213, None, &plans);
}

/// Behind PgBouncer in session pooling the server's timers face PgBouncer: PgBouncer's own
/// client-side TCP settings, set to the lease's server timers, give the same bound (a
/// client PgBouncer finds dead has its server connection reset, which frees its locks),
/// and a PgBouncer left with its defaults (the negative control) keeps the lock.
#[test]
fn behind_pgbouncer_in_session_pooling_its_own_timers_give_the_same_bound() {
    let lease =
        PostgresLockManager::builder(locks_postgres::plain_pool("postgres://x@h/d", 1).unwrap())
            .try_build()
            .unwrap()
            .lease()
            .unwrap();
    let timers = format!(
        "{},{},{},{}",
        lease.server.keepalives_idle.as_secs(),
        lease.server.keepalives_interval.as_secs(),
        lease.server.keepalives_count,
        lease.server.user_timeout.as_millis()
    );
    let plans = [
        Plan {
            name: "PgBouncer with the lease's timers",
            lease: Some(lease.duration),
            bounded: true,
            bouncer: Some(0),
            permit: false,
        },
        Plan {
            name: "PgBouncer with its defaults (negative control)",
            lease: Some(lease.duration),
            bounded: false,
            bouncer: Some(1),
            permit: false,
        },
    ];
    partition("bouncer", 215, Some(&timers), &plans);
}

/// Makes a network pair, a server (and PgBouncers, given their timers) on its near side,
/// runs each plan's holder and queued waiter on the far side, cuts the link, and checks
/// the bounds.
fn partition(name: &str, octet: u8, bouncer_timers: Option<&str>, plans: &[Plan]) {
    let server = near_server(name, octet, bouncer_timers);
    let runtime = runtime();
    let near = near_manager(&server);
    let pool = near.pool().clone();
    let waiting = |lock_id: i64| -> i64 {
        runtime.block_on(async {
            let client = pool.get().await.expect("near connection");
            throwaway_pg::testing::advisory_count(&client, lock_id, false).await
        })
    };

    let mut scenarios: Vec<Scenario> = Vec::new();
    for plan in plans {
        let (name, lease) = (plan.name, plan.lease);
        let far_url = far_url(&server, plan.bouncer);
        let key = format!("partition:{name}:{}", std::process::id());
        let secs = lease.map_or(0, |lease| lease.as_secs()).to_string();
        let env = |role| {
            let mut env = vec![
                (ROLE, role),
                (URL, far_url.as_str()),
                (KEY, key.as_str()),
                (LEASE_SECS, secs.as_str()),
            ];
            if plan.permit {
                env.push((PERMIT, "1"));
            }
            env
        };
        let holder = InNamespace::spawn(server.pair().far(), "child_entry", &env("hold"));
        let (_, held) = holder.next(Duration::from_secs(30), "the holder took the lock");
        assert_eq!(held, "held");
        let waiter = InNamespace::spawn(server.pair().far(), "child_entry", &env("wait"));
        let lock_id = near.lock_id(&key);
        let queued = Instant::now();
        while if plan.permit {
            let holders = runtime
                .block_on(near.permit_holders(&key))
                .expect("holders");
            holders.waiting == 0
        } else {
            waiting(lock_id) == 0
        } {
            assert!(
                queued.elapsed() < Duration::from_secs(30),
                "the waiter never queued"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let lease = lease.filter(|_| plan.bounded).map(|lease| {
            PostgresLockManager::builder(near.pool().clone())
                .lease(Some(lease))
                .try_build()
                .unwrap()
                .lease()
                .unwrap()
        });
        scenarios.push(Scenario {
            name,
            key,
            permit: plan.permit,
            lease,
            holder,
            _waiter: waiter,
            told: None,
            free: None,
        });
    }
    // Let the holders' keepalives run as they would, then cut.
    std::thread::sleep(Duration::from_secs(2));
    server.cut();
    let cut = Instant::now();
    let watch_until = cut + Duration::from_secs(60) + Duration::from_secs(10);
    let control_until = cut + SHORT_LEASE + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        for scenario in &mut scenarios {
            if scenario.told.is_none()
                && let Ok((at, message)) = scenario.holder.poll(Duration::ZERO)
            {
                assert!(message.starts_with("told"), "{}: {message}", scenario.name);
                scenario.told = Some(at);
            }
            if scenario.free.is_none() && (scenario.lease.is_some() || now < control_until) {
                let free = if scenario.permit {
                    runtime
                        .block_on(near.try_acquire_permit(&scenario.key, 1))
                        .expect("try a permit")
                        .is_some()
                } else {
                    runtime
                        .block_on(near.try_acquire(&scenario.key))
                        .expect("try")
                        .is_some()
                };
                if free {
                    scenario.free = Some(Instant::now());
                }
            }
        }
        let done = scenarios.iter().all(|scenario| {
            scenario.told.is_some() && (scenario.free.is_some() || scenario.lease.is_none())
        });
        if (done && now >= control_until) || now >= watch_until {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let since_cut = |at: Option<Instant>| at.map(|at| at.duration_since(cut));
    for scenario in &scenarios {
        eprintln!(
            "{}: holder told {:?} after the cut, lock free for another host {:?} after the \
             cut; documented: {:?}",
            scenario.name,
            since_cut(scenario.told),
            since_cut(scenario.free),
            scenario.lease
        );
    }
    for scenario in &scenarios {
        let name = scenario.name;
        let told = since_cut(scenario.told).unwrap_or_else(|| panic!("{name}: never told"));
        let Some(lease) = scenario.lease else {
            // The negative control: without the lease's timers, nothing frees the lock
            // of a vanished host in any time this test could wait.
            assert_eq!(
                since_cut(scenario.free),
                None,
                "{name}: the lock was free without a lease, so the lease is not what frees it"
            );
            continue;
        };
        let free = since_cut(scenario.free)
            .unwrap_or_else(|| panic!("{name}: the lock was never free (lease {lease:?})"));
        assert!(
            told <= lease.holder_told_within + SLACK,
            "{name}: told after {told:?}, documented within {:?}",
            lease.holder_told_within
        );
        assert!(
            free <= lease.duration,
            "{name}: free after {free:?}, documented within the lease {:?}",
            lease.duration
        );
        assert!(
            free >= told + lease.margin.saturating_sub(SLACK),
            "{name}: free after {free:?}, only {:?} after the holder was told ({told:?}); \
             documented: at least the margin {:?}",
            free.saturating_sub(told),
            lease.margin
        );
    }
    drop(scenarios);
    drop(server);
}

/// The standby's hand-over under a real partition: a leader on the far side (a
/// [`LeaderElection`] with the short lease) whose host vanishes, and a standby on the
/// near side. The cut-off leader's task must be stopped (its future dropped) before the
/// standby's task starts, by at least the lease's margin, and the standby must start
/// within the lease of the cut (the bound the README gives `pglock run --leader`). Both
/// ends note the wall clock, so the two processes' moments compare.
#[test]
fn a_cut_off_leader_stops_its_task_before_a_standby_takes_over_within_the_lease() {
    let server = near_server("leader", 216, None);
    let runtime = runtime();
    let near = near_manager(&server);
    let key = format!("partition:leader:{}", std::process::id());
    let (far_url, secs) = (far_url(&server, None), SHORT_LEASE.as_secs().to_string());
    let leader = InNamespace::spawn(
        server.pair().far(),
        "child_entry",
        &[
            (ROLE, "lead"),
            (URL, far_url.as_str()),
            (KEY, key.as_str()),
            (LEASE_SECS, secs.as_str()),
        ],
    );
    let (_, leading) = leader.next(Duration::from_secs(30), "the far leader leads");
    assert!(leading.starts_with("leading "), "{leading}");

    // The standby: another host, through the Unix socket. Its task notes when it starts.
    let (started, starts) = mpsc::channel::<SystemTime>();
    let standby = LeaderElection::new(near.clone(), key.clone());
    let _standing = runtime.spawn(async move {
        standby
            .run(move |_lost| {
                let started = started.clone();
                async move {
                    let _ = started.send(SystemTime::now());
                    std::future::pending::<()>().await;
                }
            })
            .await
    });
    let queued = Instant::now();
    while runtime
        .block_on(near.permit_holders(&key))
        .expect("holders")
        .waiting
        == 0
    {
        assert!(
            queued.elapsed() < Duration::from_secs(30),
            "the standby never queued"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        starts.try_recv().is_err(),
        "the standby led while the far leader did"
    );
    let lease = PostgresLockManager::builder(near.pool().clone())
        .lease(Some(SHORT_LEASE))
        .try_build()
        .unwrap()
        .lease()
        .unwrap();

    // Let the leader's keepalives run as they would, then cut.
    std::thread::sleep(Duration::from_secs(2));
    server.cut();
    let cut = SystemTime::now();
    let watch_until = Instant::now() + SHORT_LEASE + Duration::from_secs(10);
    let (mut told, mut stopped, mut standby_started) = (None, None, None);
    while (told.is_none() || stopped.is_none() || standby_started.is_none())
        && Instant::now() < watch_until
    {
        if let Ok((_, message)) = leader.poll(Duration::from_millis(50)) {
            let mut words = message.split(' ');
            let (what, micros) = (words.next(), words.next().map(str::parse::<u64>));
            let at = |micros: u64| UNIX_EPOCH + Duration::from_micros(micros);
            match (what, micros) {
                (Some("told"), Some(Ok(micros))) => told = Some(at(micros)),
                (Some("stopped"), Some(Ok(micros))) => stopped = Some(at(micros)),
                _ => panic!("the far leader said {message:?}"),
            }
        }
        if let Ok(at) = starts.try_recv() {
            standby_started = Some(at);
        }
    }

    // Signed, in case a moment precedes the cut.
    let since_cut = |at: Option<SystemTime>| {
        at.map(|at| match at.duration_since(cut) {
            Ok(after) => format!("+{after:?}"),
            Err(before) => format!("-{:?}", before.duration()),
        })
    };
    let gap = stopped.zip(standby_started).map(|(stopped, started)| {
        started.duration_since(stopped).map_or_else(
            |before| format!("-{:?}", before.duration()),
            |after| format!("+{after:?}"),
        )
    });
    eprintln!(
        "leader election, short lease: the cut-off leader was told {:?} and its task stopped \
         {:?} after the cut; the standby's task started {:?} after the cut, {:?} after the \
         leader's stopped; documented: {lease:?}",
        since_cut(told),
        since_cut(stopped),
        since_cut(standby_started),
        gap
    );

    let after_cut = |at: SystemTime, what: &str| {
        at.duration_since(cut)
            .unwrap_or_else(|_| panic!("{what} before the cut"))
    };
    let started = after_cut(
        standby_started.unwrap_or_else(|| {
            panic!(
                "the standby never led (watched {:?} after the cut; lease {:?})",
                SHORT_LEASE + Duration::from_secs(10),
                lease.duration
            )
        }),
        "the standby led",
    );
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "the cut-off leader's task never stopped, and the standby's started {started:?} \
             after the cut: two leaders"
        )
    });
    let stopped = after_cut(stopped, "the cut-off leader stopped");
    assert!(
        stopped < started,
        "the standby's task started {started:?} after the cut, {:?} before the cut-off \
         leader's task stopped ({stopped:?} after the cut): two leaders",
        stopped - started
    );
    assert!(
        started >= stopped + lease.margin.saturating_sub(SLACK),
        "the standby's task started only {:?} after the cut-off leader's stopped \
         ({stopped:?} and {started:?} after the cut); documented: at least the margin {:?}",
        started - stopped,
        lease.margin
    );
    let told = after_cut(told.expect("the far leader was told"), "the leader told");
    assert!(
        told <= lease.holder_told_within + SLACK && stopped <= lease.holder_told_within + SLACK,
        "the cut-off leader was told {told:?} and stopped {stopped:?} after the cut; \
         documented: told within {:?}",
        lease.holder_told_within
    );
    assert!(
        started <= lease.duration,
        "the standby's task started {started:?} after the cut; documented: within the \
         lease {:?}",
        lease.duration
    );
    drop(leader);
    drop(runtime);
    drop(server);
}
