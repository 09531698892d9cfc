//! The shards in the chaos soak (`soak --shards`, `cargo xtask soak --shards`): member
//! processes of a 24-shard `locks-shard` group run beside the counter workers, under the
//! same faults (SIGKILLed and restarted, their lock backends terminated and SIGSTOPped,
//! the server restarted, their network cut).
//!
//! Each shard task records, with the server's `clock_timestamp()`, its start, every
//! progress write it tries (every 20 ms, through `guard_write` with its token) and its
//! stop, each in a transaction of its own that holds the shard's term row (`guard_write`),
//! so a record cannot commit after the next term began unless the guard said so. A task
//! dropped on a loss (or killed with its process) records no stop: its last record bounds
//! it. At the end the checker counts, per shard: overlaps (a record of a task after the
//! next task of the shard started), stale writes accepted (an accepted write whose token
//! is below an earlier accepted one), refused writes, moves, and the share of the time the
//! shard was owned, over the whole run and outside the outages (a server restart or a
//! cut of every worker's network: no member can own anything then); a running task's
//! last record to an outage's start, or to its member's kill, counts as owned (it ran;
//! the strict share without it is printed beside). Each unowned piece
//! outside them is told by its cause: the next term's takeover delay, or how the task
//! before it ended (handed over, or its lock lost) and the fault that reached its lock or
//! its member (the driver reads what a backend held before it terminates or stops it).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::{self, Client};
use locks_shard::locks_port::LostSignal;
use locks_shard::{Owned, ShardGroup, ShardMember};
use locks_shard_postgres::deadpool_postgres::Pool;
use locks_shard_postgres::{PostgresShardTerms, guard_write, install_shard_terms};

use super::causes::{self, Hit, Run, causes};
use super::warm::{keep_warm, trace_pool_size, warm};
use super::{Error, Faults};

/// The shards of the soak's group.
pub(crate) const SHARDS: usize = 24;
/// The member processes.
pub(crate) const MEMBERS: usize = 3;
const GROUP: &str = "soak";
/// How often a task tries a progress write.
pub(crate) const WRITE_EVERY: Duration = Duration::from_millis(20);
/// The least share of the time (outside outages) every shard must be owned.
const OWNED_AT_LEAST: f64 = 0.99;
/// The members' stall patience: past the answer timeout (1 s), how long a held lock
/// whose backend the server shows alive is kept (the chaos loop stops backends for
/// 0.5-3 s).
const STALL_PATIENCE: Duration = Duration::from_millis(2500);
/// How soon after an outage's end every shard must run again: the server frees a silent
/// session's locks within its lease (9.4 s after a cut began, ADR 0016: 6.9 s, and the
/// stall patience more), then the takeover delay (0.5 s) and a tick; a restarted
/// server's locks are free at once.
pub(crate) const RECOVERED_WITHIN: Duration = Duration::from_secs(10);

const SCHEMA: &str = "\
CREATE TABLE soak_shard_runs (id bigserial PRIMARY KEY, shard text NOT NULL, \
    token bigint NOT NULL, member text NOT NULL, since timestamptz NOT NULL, \
    started timestamptz NOT NULL, \
    last_seen timestamptz NOT NULL, stopped timestamptz, \
    accepted bigint NOT NULL DEFAULT 0, refused bigint NOT NULL DEFAULT 0); \
CREATE TABLE soak_shard_progress (shard text PRIMARY KEY, token bigint NOT NULL, \
    writes bigint NOT NULL, stale bigint NOT NULL);";

/// The words the soak's first line says of the shards, if any.
pub(crate) fn banner(shards: bool) -> String {
    if shards {
        format!("{MEMBERS} shard members of {SHARDS} shards, ")
    } else {
        String::new()
    }
}

pub(crate) fn group() -> Result<ShardGroup, Error> {
    Ok(ShardGroup::new(
        GROUP,
        (0..SHARDS).map(|i| format!("tenant-{i}")),
    )?)
}

/// The term table, the runs and the progress rows.
pub(crate) async fn prepare(admin: &Client) -> Result<(), Error> {
    install_shard_terms(admin).await?;
    admin.batch_execute(SCHEMA).await?;
    for shard in group()?.shards() {
        admin
            .execute(
                "INSERT INTO soak_shard_progress VALUES ($1, 0, 0, 0)",
                &[&shard],
            )
            .await?;
    }
    Ok(())
}

/// The server's clock, in seconds since the epoch.
pub(crate) async fn now(admin: &Client) -> Result<f64, Error> {
    Ok(admin
        .query_one("SELECT extract(epoch FROM clock_timestamp())::float8", &[])
        .await?
        .get(0))
}

/// One member process: joins the group as `name` and its pid (a holder id per process,
/// which the members' renewals need), and runs a task per owned shard until the driver
/// (its parent) is gone.
pub(crate) async fn member(url: &str, name: &str) -> Result<(), Error> {
    let parent = std::os::unix::process::parent_id();
    let holder = format!("{name}-{}", std::process::id());
    if std::env::var_os("SOAK_SHARD_TRACE").is_some() {
        // Where a move's time goes: the member's ticks, takes and begins, timestamped.
        let _ = tracing_subscriber::fmt()
            .with_env_filter("locks_shard=trace,warn")
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
    // A writer frozen in its transaction holds its term row, and so the next term: the
    // server ends such a transaction after 1 s.
    let mut config: tokio_postgres::Config = url.parse()?;
    config.options("-c idle_in_transaction_session_timeout=1000");
    let writes = locks_postgres::plain_pool_with_config(config, SHARDS + 2)?;
    let lock_pool = locks_postgres::plain_pool(url, SHARDS + 4)?;
    // Connections for the share of the shards a member may come to hold (a survivor of
    // a killed member: N / (M - 1)) opened before joining, as a service would at start: a
    // member started again takes its share back, and a survivor a dead member's shards,
    // without opening a connection per shard on the way (each opened on a loaded server
    // lengthens the move). And kept so, as a pool with a minimum of idle connections
    // would (bb8's `min_idle`, HikariCP's `minimumIdle`; deadpool has none): those a
    // server restart or a terminated backend closed are opened again in the background,
    // not by the next take of a shard.
    let warm_count = SHARDS.div_ceil(MEMBERS - 1) + 2;
    warm(&[&lock_pool, &writes], warm_count).await;
    tokio::spawn(keep_warm([lock_pool.clone(), writes.clone()], warm_count));
    if std::env::var_os("SOAK_SHARD_TRACE").is_some() {
        tokio::spawn(trace_pool_size(lock_pool.clone(), holder.clone()));
    }
    // As the counter workers' managers: a lost connection is told within 1.5 s. With
    // stall patience: the chaos loop stops a backend for 0.5-3 s, and a shard lock (or
    // the membership permit) whose backend the server shows alive is held, not lost,
    // for up to 2.5 s past the answer timeout (a ping sent after the stop began is
    // answered within 3.5 s).
    let locks = PostgresLockManager::builder(lock_pool)
        .holder_id(&holder)
        .keepalive(Some(Duration::from_millis(500)))
        .answer_timeout(Duration::from_secs(1))
        .stall_patience(STALL_PATIENCE)
        .build();
    let terms = PostgresShardTerms::new(locks_postgres::plain_pool(url, 4)?);
    let member = ShardMember::new(locks, terms, group()?)
        .tick(Duration::from_millis(50))
        .backoff(Duration::from_millis(200));
    // The negative control, SOAK_BREAK=shards: each task's work runs on a tokio task of
    // its own, which dropping the task does not stop, ignores its stop signal and writes
    // without the token's guard. The checker must then report overlaps and stale writes.
    let broken = std::env::var("SOAK_BREAK").is_ok_and(|breaking| breaking == "shards");
    // Each trace line of the member's ticks names its holder (several members write to
    // one stderr).
    let span = tracing::warn_span!("member", holder = %holder);
    let run = member.run(move |owned, stop| {
        let work = task(writes.clone(), holder.clone(), owned, stop, broken);
        async move {
            if broken {
                drop(tokio::spawn(work));
                std::future::pending::<()>().await;
            } else {
                work.await;
            }
        }
    });
    let orphaned = async {
        while std::os::unix::process::parent_id() == parent {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::select! {
        ran = tracing::Instrument::instrument(run, span) => Err(ran.map_or_else(|error| error.to_string(), |never| match never {})
            .into()),
        () = orphaned => Ok(()),
    }
}

/// What a task records in one guarded transaction.
enum Record {
    Start,
    Write(i64),
    Stop(i64),
}

/// A shard's task: records its start, tries a progress write every 20 ms, and when told to
/// stop records its stop and returns. A refused write (a newer term began) ends it too.
/// `broken`: the negative control (no stop, no guard).
async fn task(writes: Pool, holder: String, owned: Owned, stop: LostSignal, broken: bool) {
    let record = async |what| record(&writes, &holder, &owned, what, broken).await;
    let run = loop {
        match record(Record::Start).await {
            Ok((run, _)) => break run,
            Err(_) => tokio::time::sleep(WRITE_EVERY).await,
        }
    };
    loop {
        tokio::time::sleep(WRITE_EVERY).await;
        if stop.is_lost() && !broken {
            let _ = record(Record::Stop(run)).await;
            return;
        }
        if let Ok((_, false)) = record(Record::Write(run)).await {
            let _ = record(Record::Stop(run)).await;
            return;
        }
    }
}

/// One record in a transaction that holds the shard's term row (`guard_write`): the run's
/// id and whether the guard accepted the token (`broken`: no guard, always accepted).
async fn record(
    writes: &Pool,
    holder: &str,
    owned: &Owned,
    what: Record,
    broken: bool,
) -> Result<(i64, bool), Error> {
    let mut client = writes.get().await?;
    let tx = client.transaction().await?;
    let accepted = broken || guard_write(&tx, owned).await?;
    let run = match what {
        Record::Start => tx
            .query_one(
                "INSERT INTO soak_shard_runs (shard, token, member, since, started, last_seen) \
                 VALUES ($1, $2, $3, to_timestamp($4), clock_timestamp(), clock_timestamp()) \
                 RETURNING id",
                &[&&*owned.shard, &owned.token, &holder, &since(owned)],
            )
            .await?
            .get(0),
        Record::Write(run) => {
            if accepted {
                // Stale: below a token whose write was accepted before.
                tx.execute(
                    "UPDATE soak_shard_progress SET writes = writes + 1, \
                     stale = stale + (token > $2)::int, token = greatest(token, $2) \
                     WHERE shard = $1",
                    &[&&*owned.shard, &owned.token],
                )
                .await?;
            }
            tx.execute(
                "UPDATE soak_shard_runs SET last_seen = clock_timestamp(), \
                 accepted = accepted + $2::bool::int, refused = refused + (NOT $2::bool)::int \
                 WHERE id = $1",
                &[&run, &accepted],
            )
            .await?;
            run
        }
        Record::Stop(run) => {
            tx.execute(
                "UPDATE soak_shard_runs SET stopped = clock_timestamp() WHERE id = $1",
                &[&run],
            )
            .await?;
            run
        }
    };
    tx.commit().await?;
    Ok((run, accepted))
}

/// When a term began, in seconds since the epoch (the server's clock).
fn since(owned: &Owned) -> f64 {
    // Nanoseconds since the epoch fit an f64 to well under a microsecond.
    #[allow(clippy::cast_precision_loss)]
    let nanos = owned.since.unix_timestamp_nanos() as f64;
    nanos / 1e9
}

/// Reads the runs and the progress rows, prints the shards' report, and returns the
/// violated bounds. `end` closes the window (the server's clock before the members were
/// killed); the faults' outages are the spans no member could own anything in, and the
/// unowned time outside them is told by the kind of fault before it.
pub(crate) async fn check(admin: &Client, end: f64, faults: &Faults) -> Result<Vec<String>, Error> {
    let runs: Vec<Run> = admin
        .query(
            "SELECT shard, member, token, extract(epoch FROM since)::float8, \
                    extract(epoch FROM started)::float8, \
                    extract(epoch FROM greatest(last_seen, coalesce(stopped, last_seen)))::float8, \
                    stopped IS NOT NULL \
             FROM soak_shard_runs ORDER BY shard, started",
            &[],
        )
        .await?
        .iter()
        .map(|row| Run {
            shard: row.get(0),
            member: row.get(1),
            token: row.get(2),
            since: row.get(3),
            started: row.get(4),
            ended: row.get(5),
            stopped: row.get(6),
        })
        .collect();
    let totals = admin
        .query_one(
            "SELECT (SELECT coalesce(sum(accepted), 0)::bigint FROM soak_shard_runs), \
                    (SELECT coalesce(sum(refused), 0)::bigint FROM soak_shard_runs), \
                    (SELECT coalesce(sum(stale), 0)::bigint FROM soak_shard_progress)",
            &[],
        )
        .await?;
    let (accepted, refused, stale): (i64, i64, i64) = (totals.get(0), totals.get(1), totals.get(2));
    let hits: Vec<(f64, &Hit)> = faults.hits.iter().map(|hit| (epoch(hit.at), hit)).collect();
    let mut unowned_by: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    let mut outages: Vec<(f64, f64)> = faults
        .outages
        .iter()
        .map(|(from, to)| (epoch(*from), epoch(*to)))
        .collect();
    outages.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut by_shard: BTreeMap<&str, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        by_shard.entry(&run.shard).or_default().push(run);
    }
    let mut first_seen: BTreeMap<&str, f64> = BTreeMap::new();
    for run in &runs {
        let first = first_seen.entry(&run.member).or_insert(run.started);
        *first = first.min(run.started);
    }
    let mut violations = Vec::new();
    if by_shard.len() != SHARDS {
        violations.push(format!(
            "only {} of {SHARDS} shards ever ran",
            by_shard.len()
        ));
    }
    // The window opens once every shard ran once.
    let start = by_shard
        .values()
        .filter_map(|runs| runs.first().map(|run| run.started))
        .fold(f64::MIN, f64::max);
    let trace = std::env::var_os("SOAK_SHARD_TRACE").is_some();
    if trace {
        for (at, hit) in &hits {
            println!("hit {at:.3} {hit:?}");
        }
    }
    let mut overlaps = 0;
    let mut moves = 0;
    let (mut least, mut least_up, mut least_strict, mut most_up) =
        (f64::MAX, f64::MAX, f64::MAX, f64::MIN);
    let mut recovery: f64 = 0.0;
    let mut lines = Vec::new();
    for (shard, runs) in &by_shard {
        let shard_overlaps = overlaps_of(runs);
        moves += runs
            .windows(2)
            .filter(|pair| pair[0].member != pair[1].member)
            .count();
        if let Some(pair) = runs.windows(2).find(|pair| pair[1].token <= pair[0].token) {
            violations.push(format!(
                "{shard}: a task with token {} started after one with token {}",
                pair[1].token, pair[0].token
            ));
        }
        // Each outage, and the shard's recovery from it: until its first task after the
        // outage started (unless a task ran across the outage's end), at most the bound;
        // beyond it, the shard counts as unowned. A recovery cut short by the next outage
        // (or the window's end) is not measured.
        let recovering: Vec<(f64, f64)> = outages
            .iter()
            .enumerate()
            .map(|(i, &(from, to))| {
                let next = outages.get(i + 1).map_or(end, |&(next, _)| next);
                let until = recovered(runs, to).unwrap_or(f64::MAX);
                if until <= next {
                    recovery = recovery.max(until - to);
                }
                (from, until.min(to + RECOVERED_WITHIN.as_secs_f64()))
            })
            .collect();
        let owned = covered(runs, start, end, &[]).0;
        let (strict_up, up, unowned) = covered(runs, start, end, &recovering);
        // A running task's last record before an outage to the outage's start, or to the
        // kill of its member: the task ran, and recorded every 20 ms; the owned share
        // counts it as owned (the strict share, printed beside, does not).
        let mut recording = 0.0;
        for (from, to) in unowned {
            // Past the recovery bound: the piece starts where a recovery was cut off.
            let after_outage = recovering
                .iter()
                .any(|&(_, until)| (until - from).abs() < 1e-6);
            for (cause, seconds) in
                causes((from, to), runs, &first_seen, &hits, &outages, after_outage)
            {
                if trace {
                    let next = runs.iter().find(|run| run.started >= to - 1e-6);
                    println!(
                        "piece {shard} {from:.3} {to:.3} {seconds:.3} next {} since {:.3} | {cause}",
                        next.map_or("-", |run| run.member.as_str()),
                        next.map_or(0.0, |run| run.since),
                    );
                }
                if causes::owned(cause) {
                    recording += seconds;
                }
                let entry = unowned_by.entry(cause).or_default();
                entry.0 += seconds / SHARDS as f64;
                entry.1 += 1;
            }
        }
        let owned_up = if up > 0.0 {
            strict_up + recording / up
        } else {
            strict_up
        };
        least = least.min(owned);
        least_up = least_up.min(owned_up);
        least_strict = least_strict.min(strict_up);
        most_up = most_up.max(owned_up);
        if shard_overlaps > 0 {
            violations.push(format!("{shard}: {shard_overlaps} overlaps"));
        }
        if owned_up < OWNED_AT_LEAST {
            violations.push(format!(
                "{shard}: owned {:.2} % of the time outside outages and recoveries (bound {:.0} %)",
                owned_up * 100.0,
                OWNED_AT_LEAST * 100.0
            ));
        }
        overlaps += shard_overlaps;
        lines.push(format!(
            "{shard} {} runs, {shard_overlaps} overlaps, owned {:.2} % ({:.2} % outside outages and recoveries)",
            runs.len(),
            owned * 100.0,
            owned_up * 100.0
        ));
    }
    if recovery > RECOVERED_WITHIN.as_secs_f64() {
        violations.push(format!(
            "a shard ran again {recovery:.1} s after an outage (bound {RECOVERED_WITHIN:?})"
        ));
    }
    if stale != 0 {
        violations.push(format!("{stale} stale progress writes accepted"));
    }
    let down: f64 = outages
        .iter()
        .map(|(from, to)| (to.min(end) - from.max(start)).max(0.0))
        .sum();
    println!(
        "shards: {SHARDS} shards, {MEMBERS} members, {:.0} s window ({:.0} s of it in {} outages); \
         {} tasks, {moves} moves; {accepted} progress writes accepted, {stale} stale accepted, \
         {refused} refused by the token; overlaps: {overlaps}; every shard ran again within \
         {recovery:.1} s of an outage's end (bound {RECOVERED_WITHIN:?}); least owned share: \
         {:.2} % ({:.2} % outside outages and recoveries, bound {:.0} %; shards \
         {:.2}-{:.2} %; strictly, the record period before an outage or a kill unowned: {:.2} %)",
        end - start,
        down,
        outages.len(),
        runs.len(),
        least * 100.0,
        least_up * 100.0,
        OWNED_AT_LEAST * 100.0,
        least_up * 100.0,
        most_up * 100.0,
        least_strict * 100.0
    );
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for hit in &faults.hits {
        *classes.entry(hit.class()).or_default() += 1;
    }
    let classes: Vec<String> = classes
        .iter()
        .map(|(class, count)| format!("{count} {class}"))
        .collect();
    println!("shards: faults on members: {}", classes.join(", "));
    // How long a killed member's sessions outlived its SIGKILL: the floor under what a
    // kill costs its shards (the survivors cannot see it before).
    let after_kill = |of: fn(&Hit) -> Option<SystemTime>| {
        let mut ms: Vec<f64> = (faults.hits.iter())
            .filter_map(|hit| Some((of(hit)?.duration_since(hit.at).ok()?).as_secs_f64() * 1e3))
            .collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| {
            ms.get(((ms.len() as f64 - 1.0) * q).round() as usize)
                .copied()
        };
        match (at(0.5), at(0.9)) {
            (Some(p50), Some(p90)) => format!("{p50:.0} ms (p90 {p90:.0} ms, {} kills)", ms.len()),
            _ => "not measured".to_owned(),
        }
    };
    println!(
        "shards: a killed member process reaped {} after its SIGKILL; its sessions gone from \
         the server {} after it",
        after_kill(|hit| hit.reaped),
        after_kill(|hit| hit.sessions_gone)
    );
    let mut by: Vec<(&str, (f64, usize))> = unowned_by.into_iter().collect();
    by.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
    let total: f64 = by.iter().map(|(_, (seconds, _))| seconds).sum();
    println!(
        "shards: unowned outside outages and recoveries, per shard on average: {total:.2} s, by cause:"
    );
    for (cause, (seconds, pieces)) in by {
        // A piece's mean length, over all shards (`seconds` is per shard).
        #[allow(clippy::cast_precision_loss)]
        let each = seconds * SHARDS as f64 / pieces.max(1) as f64 * 1e3;
        println!("  {seconds:6.2} s  {pieces:5} pieces  {each:4.0} ms each  {cause}");
    }
    if std::env::var_os("SOAK_SHARD_DETAIL").is_some() {
        for line in lines {
            println!("  {line}");
        }
    }
    Ok(violations)
}

/// Seconds since the epoch.
fn epoch(at: SystemTime) -> f64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The tasks of one shard (by start) that recorded something after a later task of the
/// shard started.
fn overlaps_of(runs: &[&Run]) -> usize {
    let mut latest_end = f64::MIN;
    let mut overlaps = 0;
    for run in runs {
        if run.started < latest_end {
            overlaps += 1;
        }
        latest_end = latest_end.max(run.ended);
    }
    overlaps
}

/// When a shard runs again after an outage that ended at `to`: `to` if a task ran across
/// it, else the first start after it (`None`: never again).
fn recovered(runs: &[&Run], to: f64) -> Option<f64> {
    if runs
        .iter()
        .any(|run| (run.started..=run.ended).contains(&to))
    {
        return Some(to);
    }
    runs.iter()
        .map(|run| run.started)
        .find(|&started| started > to)
}

/// The share of `[start, end]` outside `outages` that the runs cover, how long that is,
/// and the pieces they leave uncovered.
fn covered(
    runs: &[&Run],
    start: f64,
    end: f64,
    outages: &[(f64, f64)],
) -> (f64, f64, Vec<(f64, f64)>) {
    // Sweep the window in pieces cut at every run and outage boundary.
    let mut cuts: Vec<f64> = vec![start, end];
    for run in runs {
        cuts.extend([run.started, run.ended]);
    }
    for (from, to) in outages {
        cuts.extend([*from, *to]);
    }
    cuts.retain(|at| (start..=end).contains(at));
    cuts.sort_by(f64::total_cmp);
    cuts.dedup();
    let (mut owned, mut total) = (0.0, 0.0);
    let mut unowned = Vec::new();
    for piece in cuts.windows(2) {
        let middle = f64::midpoint(piece[0], piece[1]);
        if outages
            .iter()
            .any(|(from, to)| (*from..*to).contains(&middle))
        {
            continue;
        }
        let length = piece[1] - piece[0];
        total += length;
        if runs
            .iter()
            .any(|run| (run.started..run.ended).contains(&middle))
        {
            owned += length;
        } else {
            unowned.push((piece[0], piece[1]));
        }
    }
    (
        if total > 0.0 { owned / total } else { 1.0 },
        total,
        unowned,
    )
}
