//! The chaos soak behind `cargo xtask soak`: worker processes with managers of their own
//! do read-modify-write on a counter per key under the lock, with fencing tokens, while
//! a chaos driver kills workers, stops them, terminates and stops their backends, restarts the
//! server and cuts the workers' network (a veth link taken down between two network
//! namespaces: no socket closes). At the end it checks that no acknowledged update was lost or applied twice,
//! that no fencing token repeated or went backwards, that a worker stopped past its idle
//! bound kept no lock (`expire_stopped_holders`), and that no advisory lock is left.
//!
//! `cargo run -p locks-postgres --example soak -- --seconds 60` (the driver starts a
//! throwaway PostgreSQL of its own: the restart fault needs a server it owns).
//! Workers are this binary again, with `--worker`. With `--patroni` the server is an HA
//! pair under Patroni instead (`throwaway_pg::PatroniCluster`) and the faults include
//! Patroni failovers (see `soak/patroni.rs`). With `--shards`, member processes of a
//! 24-shard `locks-shard` group run beside the workers under the same faults, and the
//! end checks their tasks too (see `soak/shards.rs`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime};

use locks_postgres::PostgresLockManager;
use locks_postgres::prelude::*;
use locks_postgres::tokio_postgres::{self, NoTls};

#[path = "soak/causes.rs"]
mod causes;
#[path = "soak/patroni.rs"]
mod patroni;
#[path = "soak/shards.rs"]
mod shards;
#[path = "soak/warm.rs"]
mod warm;

type Error = Box<dyn std::error::Error + Send + Sync>;

const KEYS: usize = 4;
const WORKERS: usize = 4;
/// How long a counter worker's lock sessions may stay idle before the server ends them
/// (its lease's `server_frees_after`, `idle_session_timeout` with `expire_stopped_holders`).
const WORKER_IDLE_BOUND: Duration = Duration::from_millis(6_900);

/// A small generator, seeded per process.
struct Lcg(u64);

impl Lcg {
    fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_nanos());
        Self(
            u64::from(std::process::id())
                ^ u64::try_from(nanos % u128::from(u64::MAX)).unwrap_or(7),
        )
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn key(n: u64) -> String {
    format!("soak:counter:{n}")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let shards = args.iter().any(|arg| arg == "--shards");
    args.retain(|arg| arg != "--shards");
    match args.first().map(String::as_str) {
        Some("--worker") => worker(&args[1], &args[2], &args[3]).await,
        Some("--shard-member") => shards::member(&args[1], &args[2]).await,
        Some("--patroni") => {
            let seconds: u64 = match &args[1..] {
                [] => 60,
                [flag, n] if flag == "--seconds" => n.parse()?,
                _ => return Err("usage: soak --patroni [--seconds N] [--shards]".into()),
            };
            patroni::driver(Duration::from_secs(seconds), shards).await
        }
        Some("--in-namespace") => {
            let net = throwaway_pg::NetworkPair::attach(&args[1])?;
            driver(Duration::from_secs(args[2].parse()?), &net, shards).await
        }
        _ => {
            let seconds: u64 = match (args.first().map(String::as_str), args.get(1)) {
                (Some("--seconds"), Some(n)) => n.parse()?,
                (None, _) => 60,
                _ => return Err("usage: soak [--seconds N] [--shards]".into()),
            };
            in_namespaces(seconds, shards)
        }
    }
}

/// One worker: takes random keys with random bounded and unbounded waits; logs every
/// grant (`grant key token`), every acknowledged increment (`ack key value token`),
/// every refused write (`refused ...`) and every loss (`lost key reason`).
async fn worker(url: &str, name: &str, log: &str) -> Result<(), Error> {
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut random = Lcg::seeded();
    let parent = std::os::unix::process::parent_id();
    // The negative controls: SOAK_BREAK=fencing writes without the fencing check
    // (a holder that lost its lock unnoticed can then overwrite a newer one);
    // SOAK_BREAK=lock also takes a lock of its own per worker (excluding nothing). The
    // checker must then report lost updates.
    let breaking = std::env::var("SOAK_BREAK").unwrap_or_default();
    let break_lock = breaking == "lock";
    let broken = break_lock || breaking == "fencing";
    let mut note = |line: String| {
        // One write(2) per line: a SIGKILL loses no line already written.
        let _ = log.write_all(format!("{line}\n").as_bytes());
    };
    loop {
        let pool = locks_postgres::plain_pool(url, 2)?;
        // A worker process the driver stops loses its lock once its sessions were idle for
        // the lease's bound (told 1.9 s + the 5 s margin: 6.9 s), and on waking its
        // write is refused by the fencing check (ADR 0032).
        let manager = PostgresLockManager::builder(pool)
            .holder_id(name)
            .fencing(true)
            .keepalive(Some(Duration::from_millis(500)))
            .answer_timeout(Duration::from_secs(1))
            .expire_stopped_holders(true)
            .build();
        let bound = manager
            .lease()
            .and_then(|lease| lease.server.idle_session_timeout);
        assert_eq!(bound, Some(WORKER_IDLE_BOUND), "the driver's idle bound");
        let Ok((data, connection)) = tokio_postgres::connect(url, NoTls).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        tokio::spawn(connection);
        loop {
            // The driver is gone (it is our parent): stop, holding nothing.
            if std::os::unix::process::parent_id() != parent {
                return Ok(());
            }
            let key = key(random.below(KEYS as u64));
            let options = if random.below(2) == 0 {
                AcquireOptions::new().with_timeout(Duration::from_millis(200 + random.below(2000)))
            } else {
                AcquireOptions::new()
            };
            // SOAK_BREAK=lock: a lock of its own per worker, excluding nothing.
            let lock_key = if break_lock {
                format!("{key}:{name}")
            } else {
                key.clone()
            };
            let guard = match tokio::time::timeout(
                Duration::from_secs(20),
                manager.acquire(&lock_key, options),
            )
            .await
            {
                Ok(Ok(guard)) => guard,
                Ok(Err(error)) if error.is_timeout() => continue,
                Ok(Err(_)) | Err(_) => break, // the server went away: start over
            };
            let token = guard.info().fencing_token().unwrap_or(0);
            note(format!("grant {key} {token}"));
            // The fencing protocol on the protected row: claim it with the token
            // (refused if a newer holder claimed it) and read it in one statement; write
            // only while the row still carries this token.
            let claimed = data
                .query_opt(
                    if broken {
                        "UPDATE soak_counters SET token = $2 WHERE key = $1 AND $2::bigint > 0 RETURNING n"
                    } else {
                        "UPDATE soak_counters SET token = $2 WHERE key = $1 AND token < $2 RETURNING n"
                    },
                    &[&key, &token],
                )
                .await;
            let n: i64 = match claimed {
                Ok(Some(row)) => row.get(0),
                Ok(None) => {
                    note(format!("refused {key} {token}"));
                    guard.release().await;
                    continue;
                }
                Err(_) => break,
            };
            tokio::time::sleep(Duration::from_millis(random.below(20))).await;
            note(format!("try {key} {token}"));
            let written = data
                .execute(
                    if broken {
                        "UPDATE soak_counters SET n = $2 WHERE key = $1 AND $3::bigint > 0"
                    } else {
                        "UPDATE soak_counters SET n = $2 WHERE key = $1 AND token = $3"
                    },
                    &[&key, &(n + 1), &token],
                )
                .await;
            match written {
                Ok(1) if !guard.is_lost() => note(format!("ack {key} {} {token}", n + 1)),
                Ok(1) => note(format!("unacked {key} {} {token}", n + 1)),
                Ok(_) => note(format!("refused {key} {token}")),
                Err(_) => {
                    note(format!("unknown {key} {token}"));
                    break;
                }
            }
            if let Some(reason) = guard.lost().reason() {
                note(format!("lost {key} {}", reason.as_str()));
            }
            guard.release().await;
        }
        drop(manager);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Default)]
struct Faults {
    kills: u32,
    terminations: u32,
    stops: u32,
    /// Counter worker processes SIGSTOPped, how many of those past their idle bound (and
    /// of those, how many had idle sessions holding locks to check), and what the checks
    /// found.
    worker_stops: u32,
    worker_stops_past_bound: u32,
    worker_stops_checked: u32,
    stop_violations: Vec<String>,
    restarts: u32,
    partitions: u32,
    /// Patroni failovers (`--patroni`): crashes, switchovers, failovers.
    failovers: u32,
    /// When the server was down or cut off from every worker (restarts, partitions,
    /// failovers), by this host's clock (the server's, which is down then, runs on it).
    outages: Vec<(SystemTime, SystemTime)>,
    /// The faults that reached a shard member, with what they reached (`--shards`).
    hits: Vec<causes::Hit>,
}

impl Faults {
    /// Runs `fault`, noting its span as an outage.
    async fn outage<T>(
        &mut self,
        fault: impl AsyncFnOnce() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let from = SystemTime::now();
        let outcome = fault().await;
        self.outages.push((from, SystemTime::now()));
        outcome
    }
}

/// The processes the chaos driver kills and restarts: counter workers and, with
/// `--shards`, shard members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Counter,
    ShardMember,
}

/// The driver's processes: their roles, in index order.
fn roles(shards: bool) -> Vec<Role> {
    let mut roles = vec![Role::Counter; WORKERS];
    if shards {
        roles.extend(std::iter::repeat_n(Role::ShardMember, shards::MEMBERS));
    }
    roles
}

/// Makes the network the soak runs on (the driver and the server in the pair's near
/// namespace, the workers in the far one; the partition fault takes the link down), runs
/// the driver inside it, and removes it.
fn in_namespaces(seconds: u64, shards: bool) -> Result<(), Error> {
    let net = throwaway_pg::NetworkPair::make("soak", 214)?;
    let status = throwaway_pg::NetworkPair::command_in(net.near(), std::env::current_exe()?)
        .args(["--in-namespace", &net.describe(), &seconds.to_string()])
        .args(shards.then_some("--shards"))
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the soak driver failed ({status})").into())
    }
}

/// A worker process of `role`, in the pair's far namespace when there is one (`net`).
fn spawn_worker(
    role: Role,
    url: &str,
    index: usize,
    dir: &Path,
    net: Option<&throwaway_pg::NetworkPair>,
) -> Result<Child, Error> {
    let mut command = match net {
        Some(net) => throwaway_pg::NetworkPair::command_in(net.far(), std::env::current_exe()?),
        None => Command::new(std::env::current_exe()?),
    };
    match role {
        Role::Counter => command.args([
            "--worker",
            url,
            &format!("soak-{index}"),
            &dir.join(format!("worker-{index}.log"))
                .display()
                .to_string(),
        ]),
        // A shard member's records are rows on the server (see `soak/shards.rs`).
        Role::ShardMember => command.args(["--shard-member", url, &format!("soak-shard-{index}")]),
    };
    Ok(command.spawn()?)
}

/// When the server lists no session named `application_name` any more (polled every
/// 2 ms for up to 2 s; `None` past that or on an error): how long a killed process's
/// sessions outlive it.
async fn sessions_gone(
    admin: &tokio_postgres::Client,
    application_name: &str,
) -> Option<SystemTime> {
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let row = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&application_name],
            )
            .await
            .ok()?;
        if row.get::<_, i64>(0) == 0 {
            return Some(SystemTime::now());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    None
}

async fn admin(url: &str) -> Option<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.ok()?;
    tokio::spawn(connection);
    Some(client)
}

/// The backends of the workers' lock connections.
async fn worker_backends(admin: &tokio_postgres::Client) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'locks:soak-%'",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|row| row.get(0)).collect())
        .unwrap_or_default()
}

/// The sessions named `application_name` that are idle and hold a granted advisory lock.
async fn idle_holders(admin: &tokio_postgres::Client, application_name: &str) -> Vec<i32> {
    admin
        .query(
            "SELECT DISTINCT a.pid FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
             WHERE a.application_name = $1 AND a.state = 'idle' \
             AND l.locktype = 'advisory' AND l.granted",
            &[&application_name],
        )
        .await
        .map(|rows| rows.iter().map(|row| row.get(0)).collect())
        .unwrap_or_default()
}

/// Which of `pids` still have a session (`None`: none do, or the server did not say).
async fn still_there(admin: &tokio_postgres::Client, pids: &[i32]) -> Option<Vec<i32>> {
    let rows = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1)",
            &[&pids],
        )
        .await
        .ok()?;
    let left: Vec<i32> = rows.iter().map(|row| row.get(0)).collect();
    (!left.is_empty()).then_some(left)
}

fn signal(pid: i32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

async fn driver(
    duration: Duration,
    net: &throwaway_pg::NetworkPair,
    shards: bool,
) -> Result<(), Error> {
    let listen = format!("'127.0.0.1,{}'", net.near_address());
    let cluster = tokio::task::spawn_blocking(move || {
        throwaway_pg::ThrowawayPostgres::builder()
            .setting("listen_addresses", listen)
            .start()
    })
    .await??;
    // The workers connect from the far side.
    cluster.trust(&net.network())?;
    let url = cluster.url();
    let worker_url = format!(
        "postgres://postgres@{}:{}/postgres",
        net.near_address(),
        cluster.port()
    );
    println!(
        "soak: {WORKERS} workers, {KEYS} keys, {}{duration:?}, server {url}",
        shards::banner(shards)
    );
    let cluster = &cluster;
    let outcome = chaos(
        duration,
        &url,
        &worker_url,
        Some(net),
        shards,
        async |roll, faults: &mut Faults, random: &mut Lcg| -> Result<(), Error> {
            let pause = Duration::from_millis(2000 + random.below(10_000));
            if roll <= 8 {
                // A partition: the workers' link down for 2-12 s, long enough at times
                // for the server to free a silent holder's lock (its lease).
                faults
                    .outage(async || {
                        net.cut()?;
                        tokio::time::sleep(pause).await;
                        Ok(net.heal()?)
                    })
                    .await?;
                faults.partitions += 1;
            } else {
                faults
                    .outage(async || {
                        tokio::task::block_in_place(|| cluster.stop())?;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok(tokio::task::block_in_place(|| cluster.start_again())?)
                    })
                    .await?;
                faults.restarts += 1;
            }
            Ok(())
        },
    )
    .await;
    net.heal()?;
    outcome
}

/// The run both drivers share: the workers (on `worker_url`, in `net`'s far namespace
/// when there is one; with `shards`, the shard members too), then until `duration` a
/// fault after each 0.3-1.5 s of calm (on the workers for rolls 0 to 6 of 10, else
/// `server_fault` with the roll, 7 to 9), then the checks.
async fn chaos(
    duration: Duration,
    url: &str,
    worker_url: &str,
    net: Option<&throwaway_pg::NetworkPair>,
    shards: bool,
    mut server_fault: impl AsyncFnMut(u64, &mut Faults, &mut Lcg) -> Result<(), Error>,
) -> Result<(), Error> {
    let dir = prepare(url, shards).await?;
    let mut workers: Vec<(Role, Child)> = roles(shards)
        .into_iter()
        .enumerate()
        .map(|(i, role)| Ok::<_, Error>((role, spawn_worker(role, worker_url, i, &dir, net)?)))
        .collect::<Result<_, _>>()?;
    let mut faults = Faults::default();
    let mut random = Lcg::seeded();
    let started = Instant::now();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(300 + random.below(1200))).await;
        let Some(admin) = admin(url).await else {
            continue;
        };
        let roll = random.below(10);
        if roll <= 6 {
            worker_fault(
                roll,
                &admin,
                &mut workers,
                worker_url,
                &dir,
                net,
                &mut faults,
                &mut random,
            )
            .await?;
        } else {
            drop(admin);
            server_fault(roll, &mut faults, &mut random).await?;
        }
    }
    finish(url, &mut workers, &dir, &faults, shards).await
}

/// The faults both drivers make on the workers, by `roll` (0 to 6): kill a worker (a
/// counter worker or a shard member) and start it again (0-1), terminate (2-4) or SIGSTOP
/// for a while (5-6) a worker's lock backend; one in two of the 6s SIGSTOPs a counter
/// worker process itself instead, for 2-10 s (its idle bound is 6.9 s), and checks that
/// its idle sessions holding locks are gone once stopped past the bound.
#[allow(clippy::too_many_arguments)]
async fn worker_fault(
    roll: u64,
    admin: &tokio_postgres::Client,
    workers: &mut [(Role, Child)],
    worker_url: &str,
    dir: &Path,
    net: Option<&throwaway_pg::NetworkPair>,
    faults: &mut Faults,
    random: &mut Lcg,
) -> Result<(), Error> {
    match roll {
        0..=1 => {
            let index = usize::try_from(random.below(workers.len() as u64)).unwrap_or(0);
            let (role, worker) = &mut workers[index];
            let pid = worker.id();
            if *role == Role::ShardMember {
                faults.hits.push(causes::Hit::killed(index, pid));
            }
            let _ = worker.kill();
            let _ = worker.wait();
            if *role == Role::ShardMember
                && let Some(hit) = faults.hits.last_mut()
            {
                hit.reaped = Some(SystemTime::now());
                hit.sessions_gone =
                    sessions_gone(admin, &format!("locks:soak-shard-{index}-{pid}")).await;
            }
            *worker = spawn_worker(*role, worker_url, index, dir, net)?;
            faults.kills += 1;
        }
        2..=4 => {
            let backends = worker_backends(admin).await;
            if let Some(&pid) =
                backends.get(usize::try_from(random.below(backends.len() as u64)).unwrap_or(0))
            {
                faults
                    .hits
                    .extend(causes::Hit::on_backend(admin, pid, "terminated").await);
                let _ = admin
                    .execute("SELECT pg_terminate_backend($1)", &[&pid])
                    .await;
                faults.terminations += 1;
            }
        }
        6 if random.below(2) == 0 => {
            let counters: Vec<usize> = (workers.iter().enumerate())
                .filter(|(_, (role, _))| *role == Role::Counter)
                .map(|(index, _)| index)
                .collect();
            let pick = random.below(counters.len() as u64);
            if let Some(&index) = counters.get(usize::try_from(pick).unwrap_or(0)) {
                let pid = i32::try_from(workers[index].1.id()).unwrap_or(0);
                let until = Instant::now() + Duration::from_millis(2_000 + random.below(8_000));
                signal(pid, "STOP");
                // Stopped, the worker sends nothing: its sessions idle now, holding a
                // lock, must be ended by the server within the idle bound of this look.
                let looked = Instant::now();
                let holding = idle_holders(admin, &format!("locks:soak-{index}")).await;
                tokio::time::sleep_until(until.into()).await;
                let past = looked.elapsed() >= WORKER_IDLE_BOUND + Duration::from_secs(1);
                if past && let Some(left) = still_there(admin, &holding).await {
                    faults.stop_violations.push(format!(
                        "worker {index} stopped {:?}: its idle sessions {left:?} still held \
                         locks past the idle bound ({WORKER_IDLE_BOUND:?})",
                        looked.elapsed()
                    ));
                }
                signal(pid, "CONT");
                faults.worker_stops += 1;
                faults.worker_stops_past_bound += u32::from(past);
                faults.worker_stops_checked += u32::from(past && !holding.is_empty());
            }
        }
        5..=6 => {
            let backends = worker_backends(admin).await;
            if let Some(&pid) =
                backends.get(usize::try_from(random.below(backends.len() as u64)).unwrap_or(0))
            {
                faults
                    .hits
                    .extend(causes::Hit::on_backend(admin, pid, "stopped").await);
                signal(pid, "STOP");
                tokio::time::sleep(Duration::from_millis(500 + random.below(2500))).await;
                signal(pid, "CONT");
                faults.stops += 1;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The soak's folder for the workers' logs, and on the server at `url` the fencing table
/// and the counters (and with `shards` the shard members' tables).
async fn prepare(url: &str, shards: bool) -> Result<std::path::PathBuf, Error> {
    let dir = std::env::temp_dir().join(format!("lock-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let admin = admin(url).await.ok_or("no admin connection")?;
    locks_postgres::install_fencing(&admin).await?;
    admin
        .batch_execute("CREATE TABLE soak_counters (key text PRIMARY KEY, n bigint NOT NULL, token bigint NOT NULL)")
        .await?;
    for n in 0..KEYS as u64 {
        admin
            .execute("INSERT INTO soak_counters VALUES ($1, 0, 0)", &[&key(n)])
            .await?;
    }
    if shards {
        shards::prepare(&admin).await?;
    }
    Ok(dir)
}

/// Stops the workers, waits for their locks to go, checks the invariants and prints the
/// report; an error when any was violated.
async fn finish(
    url: &str,
    workers: &mut [(Role, Child)],
    dir: &Path,
    faults: &Faults,
    shards: bool,
) -> Result<(), Error> {
    // The end of the shards' window, by the server's clock, before any member is killed.
    let shards_end = match admin(url).await {
        Some(admin) if shards => Some(shards::now(&admin).await?),
        _ => None,
    };
    for (_, worker) in workers.iter_mut() {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    // Every worker process is gone: nothing may be left held. (After a failover the
    // first connections may still fail: retried.)
    let mut admin_client = None;
    for _ in 0..100 {
        admin_client = admin(url).await;
        if admin_client.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admin = admin_client.ok_or("no admin connection at the end")?;
    let mut left = 1_i64;
    for _ in 0..50 {
        left = admin
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                &[],
            )
            .await?
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let counters: HashMap<String, i64> = admin
        .query("SELECT key, n FROM soak_counters", &[])
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let report = check(dir, &counters, left)?;
    println!(
        "soak: {} grants, {} acknowledged increments, {} refused by the fencing check, {} unacknowledged; \
         losses: {}; faults: {} kills, {} terminations, {} stops, {} worker process stops ({} past the idle bound, {} with idle held sessions checked gone), {} restarts, {} partitions, {} failovers; advisory locks left: {left}; violations: {}",
        report.grants,
        report.acks,
        report.refused,
        report.unacked,
        report.losses_text(),
        faults.kills,
        faults.terminations,
        faults.stops,
        faults.worker_stops,
        faults.worker_stops_past_bound,
        faults.worker_stops_checked,
        faults.restarts,
        faults.partitions,
        faults.failovers,
        report.violations.len() + faults.stop_violations.len()
    );
    let mut violations = report.violations;
    violations.extend(faults.stop_violations.iter().cloned());
    if shards {
        let end = shards_end.ok_or("no admin connection to close the shards' window")?;
        violations.extend(shards::check(&admin, end, faults).await?);
    }
    for violation in &violations {
        println!("violation: {violation}");
    }
    drop(admin);
    if std::env::var_os("SOAK_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(format!("{} violations", violations.len()).into())
    }
}

#[derive(Default)]
struct Report {
    grants: u64,
    acks: u64,
    refused: u64,
    unacked: u64,
    losses: BTreeMap<String, u64>,
    violations: Vec<String>,
}

impl Report {
    fn losses_text(&self) -> String {
        if self.losses.is_empty() {
            return "none".to_owned();
        }
        self.losses
            .iter()
            .map(|(reason, count)| format!("{count} {reason}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The invariants, from the workers' logs and the final counters:
/// - no lost update: the acknowledged increments of a key wrote distinct values (two
///   holders at once would both write `n + 1` from the same `n`), and the counter is at
///   least the highest acknowledged value;
/// - no double apply: the counter is at most the number of writes tried (logged before
///   each write, so a worker killed after its write is counted);
/// - tokens: no grant's token of a key repeats, and each worker's tokens of a key grow;
/// - nothing left in `pg_locks`.
fn check(dir: &Path, counters: &HashMap<String, i64>, left: i64) -> Result<Report, Error> {
    let mut report = Report::default();
    let mut values: HashMap<String, Vec<i64>> = HashMap::new();
    let mut maybe_applied: HashMap<String, i64> = HashMap::new();
    let mut tokens: HashMap<String, Vec<i64>> = HashMap::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        let mut last_token: HashMap<String, i64> = HashMap::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["grant", key, token] => {
                    report.grants += 1;
                    let token: i64 = token.parse()?;
                    if last_token.get(key).is_some_and(|last| *last >= token) {
                        report.violations.push(format!(
                            "{key}: a worker's token went from {} to {token}",
                            last_token[key]
                        ));
                    }
                    last_token.insert(key.to_owned(), token);
                    tokens.entry(key.to_owned()).or_default().push(token);
                }
                ["try", key, _] => *maybe_applied.entry(key.to_owned()).or_default() += 1,
                ["ack", key, value, _] => {
                    report.acks += 1;
                    values
                        .entry(key.to_owned())
                        .or_default()
                        .push(value.parse()?);
                }
                ["unacked" | "unknown", ..] => report.unacked += 1,
                ["refused", ..] => report.refused += 1,
                ["lost", _, reason] => *report.losses.entry(reason.to_owned()).or_default() += 1,
                _ => {} // a line cut by a SIGKILL
            }
        }
    }
    for (key, mut written) in values {
        written.sort_unstable();
        let before = written.len();
        written.dedup();
        if written.len() != before {
            report.violations.push(format!("{key}: {} acknowledged increments wrote a value another one wrote too (lost update)", before - written.len()));
        }
        let counter = counters.get(&key).copied().unwrap_or(0);
        if written.last().is_some_and(|highest| counter < *highest) {
            report.violations.push(format!(
                "{key}: counter {counter} below an acknowledged value"
            ));
        }
        if counter > maybe_applied.get(&key).copied().unwrap_or(0) {
            report.violations.push(format!(
                "{key}: counter {counter} above the writes that could have applied"
            ));
        }
    }
    for (key, mut granted) in tokens {
        granted.sort_unstable();
        let before = granted.len();
        granted.dedup();
        if granted.len() != before {
            report.violations.push(format!(
                "{key}: {} fencing tokens handed out twice",
                before - granted.len()
            ));
        }
    }
    if left != 0 {
        report.violations.push(format!(
            "{left} advisory locks left held after every worker exited"
        ));
    }
    Ok(report)
}
