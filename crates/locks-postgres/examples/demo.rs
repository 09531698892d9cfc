//! A guided tour of the PostgreSQL lock manager against a real server.
//!
//! Run it with `cargo xtask demo` (which starts a throwaway PostgreSQL when no
//! `LOCKS_DATABASE_URL` is set), or directly:
//! `cargo run -p locks-postgres --example demo -- --url postgres://...`.
//!
//! It shows, with timestamps: two instances contending on one key, the waiter getting
//! the lock the moment it is released; a bounded wait timing out with its error text;
//! a process holding a lock killed with SIGKILL and the lock freed by the server; a
//! dropped wait leaving nothing behind; a holder whose session is terminated under it
//! noticing the loss at once and stopping its work; shared readers with a writer that
//! is not starved, and several keys taken at once in one global order; a semaphore of two
//! permits among three instances, and a leader whose session ends replaced by a standby.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use locks_leader::{LeaderElection, Leadership};
use locks_postgres::PostgresLockManager;
use locks_postgres::locks_port::{
    AcquireOptions, DistributedLock, LockGuard, LockRegistry, PermitGuard, Semaphore,
};
use locks_postgres::tokio_postgres::{self, NoTls};
use time::OffsetDateTime;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Clock(Instant);

impl Clock {
    fn say(&self, who: &str, what: impl std::fmt::Display) {
        let now = OffsetDateTime::now_utc();
        println!(
            "{:02}:{:02}:{:02}.{:03} UTC  +{:>7.1} ms  {who:<11} {what}",
            now.hour(),
            now.minute(),
            now.second(),
            now.millisecond(),
            self.0.elapsed().as_secs_f64() * 1000.0,
        );
    }
}

fn instance(url: &str, name: &str) -> Result<PostgresLockManager, Error> {
    Ok(
        PostgresLockManager::builder(locks_postgres::plain_pool(url, 2)?)
            .holder_id(name)
            .build(),
    )
}

/// Sessions holding (`granted`) or waiting for the advisory lock of `key`.
async fn lock_rows(admin: &tokio_postgres::Client, key: &str) -> Result<(i64, i64), Error> {
    let bits = u64::from_be_bytes(locks_port_lock_id(key).to_be_bytes());
    let (high, low) = (
        i64::try_from(bits >> 32)?,
        i64::try_from(bits & 0xFFFF_FFFF)?,
    );
    let row = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) \
             FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 \
             AND classid::bigint = $1 AND objid::bigint = $2",
            &[&high, &low],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

fn locks_port_lock_id(key: &str) -> i64 {
    locks_postgres::locks_port::lock_id(key)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|arg| arg == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let url = flag("--url")
        .or_else(|| std::env::var("LOCKS_DATABASE_URL").ok())
        .ok_or("pass --url postgres://... or set LOCKS_DATABASE_URL (cargo xtask demo does it for you)")?;
    if let Some(key) = flag("--hold") {
        return hold_until_killed(&url, &key).await;
    }
    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(connection);
    let version: String = admin.query_one("SHOW server_version", &[]).await?.get(0);
    println!("PostgreSQL {version} at {}\n", redact(&url));

    let clock = Clock(Instant::now());
    contention(&url, &clock).await?;
    bounded_wait(&url, &clock).await?;
    killed_holder(&url, &admin, &clock).await?;
    dropped_wait(&url, &admin, &clock).await?;
    lost_lock(&url, &admin, &clock).await?;
    readers_and_groups(&url, &clock).await?;
    permits_and_a_leader(&url, &admin, &clock).await?;
    println!("\nDone: every lock of this demo is released.");
    Ok(())
}

async fn contention(url: &str, clock: &Clock) -> Result<(), Error> {
    println!("1. Two instances contend on one key; the waiter gets it the moment it is released");
    let key = "demo:cutover:tenant-123";
    let a = instance(url, "instance-a")?;
    let b = instance(url, "instance-b")?;
    let held = a.acquire(key, AcquireOptions::new()).await?;
    clock.say(
        "instance-a",
        format_args!("acquired '{key}' (lock id {})", held.info().lock_id()),
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let guard = b
                .acquire(
                    key,
                    AcquireOptions::new().with_timeout(Duration::from_secs(10)),
                )
                .await;
            (Instant::now(), guard)
        }
    });
    clock.say("instance-b", "waiting in the server's queue (timeout 10 s)");
    tokio::time::sleep(Duration::from_millis(500)).await;
    clock.say("instance-a", "releasing");
    let released_at = Instant::now();
    held.release().await;
    let (granted_at, guard) = waiter.await?;
    let guard = guard?;
    clock.say(
        "instance-b",
        format_args!(
            "acquired '{key}' {:.2} ms after the release call began",
            granted_at.duration_since(released_at).as_secs_f64() * 1000.0
        ),
    );
    guard.release().await;
    println!();
    Ok(())
}

async fn bounded_wait(url: &str, clock: &Clock) -> Result<(), Error> {
    println!("2. A bounded wait times out with a clear error");
    let key = "demo:report:nightly";
    let a = instance(url, "instance-a")?;
    let b = instance(url, "instance-b")?;
    let held = a.acquire(key, AcquireOptions::new()).await?;
    clock.say("instance-a", format_args!("acquired '{key}'"));
    clock.say("instance-b", "acquire with timeout 0.3 s");
    match b
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_millis(300)),
        )
        .await
    {
        Ok(_) => return Err("the bounded wait should have timed out".into()),
        Err(error) => clock.say(
            "instance-b",
            format_args!("error: {error} (kind {:?})", error.kind()),
        ),
    }
    held.release().await;
    println!();
    Ok(())
}

async fn killed_holder(
    url: &str,
    admin: &tokio_postgres::Client,
    clock: &Clock,
) -> Result<(), Error> {
    println!("3. A process holding a lock is killed (SIGKILL); the server frees the lock");
    let key = "demo:singleton-job";
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--url", url, "--hold", key])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no child stdout")?).read_line(&mut line)?;
    clock.say(
        "process",
        format_args!("pid {} {}", child.id(), line.trim()),
    );
    let b = instance(url, "instance-b")?;
    let busy = b.try_acquire(key).await?;
    clock.say(
        "instance-b",
        format_args!(
            "try_acquire: {}",
            if busy.is_some() {
                "acquired (unexpected)"
            } else {
                "held elsewhere"
            }
        ),
    );
    drop(busy);
    let (granted, _) = lock_rows(admin, key).await?;
    clock.say("pg_locks", format_args!("{granted} session holds '{key}'"));
    child.kill()?;
    let killed_at = Instant::now();
    child.wait()?;
    clock.say("process", "killed with SIGKILL");
    let guard = b
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(10)),
        )
        .await?;
    clock.say(
        "instance-b",
        format_args!(
            "acquired '{key}' {:.1} ms after the kill",
            killed_at.elapsed().as_secs_f64() * 1000.0
        ),
    );
    guard.release().await;
    println!();
    Ok(())
}

async fn dropped_wait(
    url: &str,
    admin: &tokio_postgres::Client,
    clock: &Clock,
) -> Result<(), Error> {
    println!("4. A dropped wait leaves nothing behind");
    let key = "demo:tenant-456";
    let a = instance(url, "instance-a")?;
    let b = instance(url, "instance-b")?;
    let held = a.acquire(key, AcquireOptions::new()).await?;
    clock.say("instance-a", format_args!("acquired '{key}'"));
    let outcome = tokio::time::timeout(
        Duration::from_millis(300),
        b.acquire(key, AcquireOptions::new()),
    )
    .await;
    clock.say(
        "instance-b",
        format_args!(
            "acquire (no timeout) dropped by its caller after 300 ms: {}",
            if outcome.is_err() {
                "future dropped"
            } else {
                "unexpected result"
            }
        ),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (granted, waiting) = lock_rows(admin, key).await?;
    clock.say(
        "pg_locks",
        format_args!("{granted} holding, {waiting} waiting (the dropped waiter left the queue)"),
    );
    held.release().await;
    clock.say("instance-a", "released");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (granted, waiting) = lock_rows(admin, key).await?;
    clock.say(
        "pg_locks",
        format_args!("{granted} holding, {waiting} waiting: nobody got the lock behind our back"),
    );
    let status = b.pool().status();
    clock.say(
        "instance-b",
        format_args!(
            "pool: {} of {} connections open, {} idle",
            status.size, status.max_size, status.available
        ),
    );
    let guard = b
        .acquire(
            key,
            AcquireOptions::new().with_timeout(Duration::from_secs(5)),
        )
        .await?;
    clock.say(
        "instance-b",
        format_args!("acquired '{key}' normally; held locks: {}", b.is_held(key)),
    );
    guard.release().await;
    Ok(())
}

/// Two readers share a key; a writer queues behind them and a late reader queues
/// behind the writer (no writer starvation); then two instances take overlapping key
/// sets in opposite orders with `acquire_many`, which orders them by lock id: no
/// deadlock.
async fn readers_and_groups(url: &str, clock: &Clock) -> Result<(), Error> {
    println!("\n6. Shared readers, a writer that is not starved, and several keys at once");
    let (a, b, c) = (
        instance(url, "reader-a")?,
        instance(url, "writer")?,
        instance(url, "reader-b")?,
    );
    let key = "demo:catalog";
    let first = a.acquire(key, AcquireOptions::shared()).await?;
    let second = c.acquire(key, AcquireOptions::shared()).await?;
    clock.say(
        "readers",
        "reader-a and reader-b hold 'demo:catalog' shared, together",
    );
    let writer = tokio::spawn({
        let (b, clock_start) = (b.clone(), clock.0);
        async move {
            let guard = b.acquire(key, AcquireOptions::new()).await?;
            Clock(clock_start).say("writer", "got 'demo:catalog' exclusively");
            guard.release().await;
            Ok::<_, Error>(())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = c
        .try_acquire_with(key, locks_postgres::locks_port::LockMode::Shared)
        .await?;
    clock.say(
        "reader-b",
        format!(
            "a third shared try while the writer waits: {}",
            if late.is_some() {
                "granted (!)"
            } else {
                "refused: it would jump the queued writer"
            }
        ),
    );
    drop(late);
    first.release().await;
    clock.say("reader-a", "released; the writer still waits for reader-b");
    clock.say("reader-b", "releasing");
    second.release().await;
    writer.await??;

    let (left, right) = (instance(url, "left")?, instance(url, "right")?);
    let keys = ["demo:account:1", "demo:account:2", "demo:account:3"];
    let reversed = ["demo:account:3", "demo:account:2", "demo:account:1"];
    let (one, two) = tokio::join!(
        async {
            for _ in 0..20 {
                left.acquire_many(&keys, Duration::from_secs(10))
                    .await?
                    .release()
                    .await;
            }
            Ok::<_, Error>(())
        },
        async {
            for _ in 0..20 {
                right
                    .acquire_many(&reversed, Duration::from_secs(10))
                    .await?
                    .release()
                    .await;
            }
            Ok::<_, Error>(())
        }
    );
    one?;
    two?;
    clock.say(
        "groups",
        "20 + 20 acquire_many of 3 keys asked in opposite orders: no deadlock",
    );
    Ok(())
}

/// A holder inside its critical section while an operator terminates its backend: the
/// guard's `lost()` fires within the health check interval, the work stops, and the
/// manager already knows it holds nothing.
async fn lost_lock(url: &str, admin: &tokio_postgres::Client, clock: &Clock) -> Result<(), Error> {
    println!("\n5. A lost lock is noticed by its holder");
    let worker = instance(url, "worker")?;
    let key = "demo:lost-lock";
    let guard = worker.acquire(key, AcquireOptions::new()).await?;
    clock.say("worker", "holds the lock; working in steps of 100 ms");
    let pid: i32 = admin
        .query_one(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'locks:worker' \
             AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
            &[],
        )
        .await?
        .get(0);
    let terminate = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        clock.say("operator", format!("SELECT pg_terminate_backend({pid})"));
        admin
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
    };
    let work = async {
        let mut steps = 0_u32;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            steps += 1;
            if steps.is_multiple_of(2) {
                clock.say("worker", format!("step {steps} done"));
            }
        }
    };
    let (lost, terminated) = tokio::join!(
        async {
            tokio::select! {
                () = work => unreachable!("the work loops until the lock is lost"),
                reason = guard.lost() => reason,
            }
        },
        terminate
    );
    terminated?;
    clock.say(
        "worker",
        format!(
            "told: {lost}; stopped working (is_held = {}, held = {})",
            worker.is_held(key),
            worker.held_lock_count()
        ),
    );
    clock.say(
        "worker",
        format!("release() says {:?}", guard.release().await),
    );
    Ok(())
}

/// The child role of section 3: take the lock, say so, and wait to be killed.
async fn hold_until_killed(url: &str, key: &str) -> Result<(), Error> {
    let manager = instance(url, "doomed-process")?;
    let guard = manager.acquire(key, AcquireOptions::new()).await?;
    println!("holds '{key}' (lock id {})", guard.info().lock_id());
    tokio::time::sleep(Duration::from_secs(600)).await;
    drop(guard);
    Ok(())
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

async fn permits_and_a_leader(
    url: &str,
    admin: &tokio_postgres::Client,
    clock: &Clock,
) -> Result<(), Error> {
    println!("\n7. A semaphore of 2 among three instances, then a leader and its standby");
    let name = "demo:reports";
    let (a, b, c) = (
        instance(url, "instance-a")?,
        instance(url, "instance-b")?,
        instance(url, "instance-c")?,
    );
    let first = a.acquire_permit(name, 2, AcquireOptions::new()).await?;
    let second = b.acquire_permit(name, 2, AcquireOptions::new()).await?;
    clock.say(
        "instance-a",
        format_args!("holds permit {} of 2", first.info().slot()),
    );
    clock.say(
        "instance-b",
        format_args!("holds permit {} of 2", second.info().slot()),
    );
    let waiter = tokio::spawn({
        let c = c.clone();
        async move {
            let permit = c.acquire_permit(name, 2, Duration::from_secs(10)).await;
            (Instant::now(), permit)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let holders = c.permit_holders(name).await?;
    clock.say(
        "observer",
        format_args!("{} held, {} waiting", holders.held.len(), holders.waiting),
    );
    match c.acquire_permit(name, 3, Duration::ZERO).await {
        Err(error) => clock.say("instance-c", format_args!("asking with N = 3: {error}")),
        Ok(_) => return Err("a different N must be refused".into()),
    }
    clock.say("instance-a", "releasing its permit");
    let released_at = Instant::now();
    first.release().await;
    let (granted_at, permit) = waiter.await?;
    let permit = permit?;
    clock.say(
        "instance-c",
        format_args!(
            "got permit {} {:.2} ms after the release call began",
            permit.info().slot(),
            granted_at.duration_since(released_at).as_secs_f64() * 1000.0
        ),
    );
    drop((second, permit));

    let leadership = "demo:scheduler";
    let leader = LeaderElection::new(a.clone(), leadership);
    let standby = LeaderElection::new(b.clone(), leadership);
    let (mut leads, mut stands) = (leader.subscribe(), standby.subscribe());
    let leading = tokio::spawn(async move {
        leader
            .run(|_lost| async { std::future::pending::<()>().await })
            .await
    });
    leads.wait_for(Leadership::is_leading).await?;
    clock.say("instance-a", "leads; instance-b campaigns as a standby");
    let standing = tokio::spawn(async move {
        standby
            .run(|_lost| async { std::future::pending::<()>().await })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let class = a.semaphore_class(leadership);
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
             AND objsubid = 2 AND classid = $1::int4::oid AND objid = 0 AND granted",
            &[&class],
        )
        .await?;
    clock.say("operator", "terminated the leader's session");
    leads.wait_for(|state| !state.is_leading()).await?;
    clock.say(
        "instance-a",
        "noticed: its task is stopped, it follows and campaigns again",
    );
    stands.wait_for(Leadership::is_leading).await?;
    clock.say("instance-b", "leads (after the 500 ms takeover delay)");
    leading.abort();
    standing.abort();
    Ok(())
}
