//! `pglock run --shards SHARDS GROUP -- CMD`: a member of the shard group GROUP
//! (`locks-shard`, ADR 0027) that runs the command once per shard it owns, each through
//! the supervisor (ADR 0020), so no command outlives this process.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::Duration;

use locks_port::LostReason;
use locks_postgres::deadpool_postgres::Pool;
use locks_shard::{Owned, ShardGroup, ShardMember};
use locks_shard_postgres::{
    MEMBERS_TABLE, PostgresShardTerms, TERMS_TABLE, install_shard_terms, shard_tables_need_upgrade,
};
use nix::sys::signal::Signal;

use crate::cli::RunArgs;
use crate::connect::{self, Target};
use crate::exit::{Failure, NOPERM, SOFTWARE, USAGE, chain};
use crate::group::Group;
use crate::run::holder_id;
use crate::signals::{Signals, signal_code};
use crate::text::Say;

/// How long a command that exited on its own waits before its shard is let go (and so
/// taken again, here or elsewhere), so a command that fails at once does not spin.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The shards of `--shards`: `N` means `0` to `N-1`; otherwise names separated by commas.
pub(crate) fn shard_names(spec: &str) -> Result<Vec<String>, Failure> {
    if let Ok(count) = spec.trim().parse::<usize>() {
        if count == 0 || count > locks_shard::MAX_SHARDS {
            return Err(Failure::new(
                USAGE,
                format!(
                    "--shards: 1 to {} shards, not {count}",
                    locks_shard::MAX_SHARDS
                ),
            ));
        }
        return Ok((0..count).map(|i| i.to_string()).collect());
    }
    let names: Vec<String> = spec.split(',').map(|name| name.trim().to_owned()).collect();
    if names.iter().any(String::is_empty) {
        return Err(Failure::new(
            USAGE,
            format!("--shards: an empty name in {spec:?}"),
        ));
    }
    Ok(names)
}

/// The command for one shard: `{shard}` replaced in every argument (arguments are bytes,
/// not necessarily UTF-8; the rest of each is kept as it is).
fn program_for(program: &[OsString], shard: &str) -> Vec<OsString> {
    const PLACEHOLDER: &[u8] = b"{shard}";
    program
        .iter()
        .map(|arg| {
            let mut rest = arg.as_bytes();
            let mut replaced = Vec::with_capacity(rest.len());
            while !rest.is_empty() {
                if rest.starts_with(PLACEHOLDER) {
                    replaced.extend_from_slice(shard.as_bytes());
                    rest = &rest[PLACEHOLDER.len()..];
                } else {
                    replaced.push(rest[0]);
                    rest = &rest[1..];
                }
            }
            OsString::from_vec(replaced)
        })
        .collect()
}

/// `pglock run --shards`: until INT or TERM (then 128+N), or a configuration error.
pub(crate) async fn run(
    target: &Target,
    args: &RunArgs,
    spec: &str,
    say: Say,
) -> Result<u8, Failure> {
    let mut signals = Signals::install()?;
    let names = shard_names(spec)?;
    let group = ShardGroup::new(args.key.clone(), &names)
        .map_err(|error| Failure::new(USAGE, format!("--shards: {}", error.reason())))?;
    let holder = holder_id(target);
    let application = format!("locks:{holder}");
    let pool = connect::pool(target, names.len() + 4, &application)?;
    let manager =
        crate::lease::Settings::of_run(args, &pool, &holder, target.connect_timeout, false)
            .manager()?;
    let terms_pool = connect::pool(target, 2, "pglock-shards")?;
    // A signal while connecting or checking the tables ends pglock as while waiting.
    tokio::select! {
        number = signals.recv() => return Ok(signal_code(number)),
        ready = tables_ready(&terms_pool, target, say) => ready?,
    }
    let member = ShardMember::new(manager, PostgresShardTerms::new(terms_pool), group)
        .drain_grace(args.grace.saturating_add(Duration::from_secs(1)));
    let program = args.program();
    let grace = args.grace;
    say.say(format!(
        "joining the shard group {} as {holder}",
        crate::text::quoted(&args.key)
    ));
    let task = move |owned: Owned, stop: locks_port::LostSignal| {
        let program = program_for(&program, &owned.shard);
        shard_command(program, owned, stop, grace, say)
    };
    let mut received = None;
    let left = member
        .run_until(task, async {
            received = Some(signals.recv().await);
        })
        .await;
    match (left, received) {
        (Err(error), _) => Err(Failure::new(USAGE, chain(&error))),
        (Ok(()), Some(number)) => Ok(signal_code(number)),
        (Ok(()), None) => Ok(0),
    }
}

/// The privileges a member needs on each table of the group's store: the terms, and the
/// roster (whose expired entries it deletes).
const NEEDED: [(&str, &str); 2] = [
    (TERMS_TABLE, "SELECT, INSERT, UPDATE"),
    (MEMBERS_TABLE, "SELECT, INSERT, UPDATE, DELETE"),
];

/// Creates the store's tables when one is missing, then checks that the role may use
/// them: a member without a privilege would retry its join for ever, saying nothing
/// (the library logs it, and pglock shows no library log).
async fn tables_ready(pool: &Pool, target: &Target, say: Say) -> Result<(), Failure> {
    for (table, _) in NEEDED {
        if let Some(client) = connect::missing_table(pool, target, table).await? {
            say.say(format!(
                "creating the shard group's tables ({table} was missing)"
            ));
            install_shard_terms(&client)
                .await
                .map_err(|error| crate::exit::creation_failure(table, &error, &target.config))?;
        }
    }
    let client = pool
        .get()
        .await
        .map_err(|error| connect::pool_failure(&error, target))?;
    // Tables an earlier version made lack the columns added since: a member's entry would
    // be refused for one, and the library's log of it is not shown.
    let old = (shard_tables_need_upgrade(&client).await)
        .map_err(|error| Failure::new(SOFTWARE, chain(&error)))?;
    if old {
        say.say("upgrading the shard group's tables (made by an earlier version)");
        install_shard_terms(&client)
            .await
            .map_err(|error| crate::exit::creation_failure(TERMS_TABLE, &error, &target.config))?;
    }
    // One round trip: `has_table_privilege` with a list says whether any is held, so
    // each (table, privilege) pair is asked on its own, in order.
    let pairs: Vec<(&str, &str)> = (NEEDED.iter())
        .flat_map(|&(table, privileges)| privileges.split(", ").map(move |p| (table, p)))
        .collect();
    let (tables, privileges): (Vec<&str>, Vec<&str>) = pairs.iter().copied().unzip();
    let held: Vec<bool> = client
        .query_one(
            "SELECT array_agg(has_table_privilege(t, p) ORDER BY i) \
             FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS needed(t, p, i)",
            &[&tables, &privileges],
        )
        .await
        .map_err(|error| Failure::new(SOFTWARE, chain(&error)))?
        .get(0);
    let lacking: Vec<(&str, &str)> = (NEEDED.iter().copied())
        .filter(|&(table, _)| {
            (pairs.iter().zip(&held)).any(|(&(of, _), &held)| of == table && !held)
        })
        .collect();
    if lacking.is_empty() {
        return Ok(());
    }
    let role = target.config.get_user().unwrap_or("ROLE");
    let grants: Vec<String> = (lacking.iter())
        .map(|(table, privileges)| format!("GRANT {privileges} ON {table} TO {role}"))
        .collect();
    Err(Failure::new(
        NOPERM,
        format!("--shards: the role needs: {}", grants.join("; ")),
    ))
}

/// One shard's command, for as long as this process owns the shard: dropped (the shard
/// lost), the supervisor's death pipe closes and it SIGKILLs the command's processes.
async fn shard_command(
    program: Vec<OsString>,
    owned: Owned,
    stop: locks_port::LostSignal,
    grace: Duration,
    say: Say,
) {
    let shard = crate::text::quoted(&owned.shard);
    let env = [
        ("PGLOCK_SHARD", owned.shard.to_string()),
        ("PGLOCK_SHARD_TOKEN", owned.token.to_string()),
    ];
    let mut group = match Group::spawn(&program, &env).await {
        Ok(group) => group,
        Err(failure) => {
            eprintln!("pglock: shard {shard}: {}", failure.message);
            wait_or_stop(&stop).await;
            return;
        }
    };
    say.say(format!(
        "shard {shard}: the command runs (token {})",
        owned.token
    ));
    tokio::select! {
        status = group.wait() => {
            say.say(format!("shard {shard}: the command ended ({status})"));
            wait_or_stop(&stop).await;
        }
        reason = stop.clone() => {
            if reason == LostReason::Released {
                // Handed over: the command may finish within the grace.
                say.say(format!("shard {shard}: moving; SIGTERM to the command"));
                group.signal(Signal::SIGTERM);
                if tokio::time::timeout(grace, group.wait()).await.is_err() {
                    group.signal(Signal::SIGKILL);
                    group.wait().await;
                }
            } else {
                say.say(format!("shard {shard}: lost ({}); SIGKILL to the command", reason.as_str()));
                group.signal(Signal::SIGKILL);
                group.wait().await;
            }
        }
    }
}

/// After the command ended on its own: keeps the shard a moment (or until told to stop).
async fn wait_or_stop(stop: &locks_port::LostSignal) {
    tokio::select! {
        _ = stop.clone() => {}
        () = tokio::time::sleep(RESTART_PAUSE) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_a_count_or_names() {
        assert_eq!(shard_names("3").unwrap(), ["0", "1", "2"]);
        assert_eq!(shard_names("eu, us").unwrap(), ["eu", "us"]);
        assert!(shard_names("0").is_err());
        assert!(shard_names("a,,b").is_err());
        assert_eq!(
            program_for(&["run".into(), "--tenant={shard}".into()], "eu"),
            ["run", "--tenant=eu"]
        );
    }
}
