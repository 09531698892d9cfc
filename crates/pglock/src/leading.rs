//! `pglock run --leader`'s term as the library's `LeaderElection` holds it: the leading
//! permit around the command, and with `--publish` the term proclaimed on the leader
//! board, so `pglock who --leader` and any observer name this process only while its
//! command runs (ADR 0024).

use deadpool_postgres::Pool;
use locks_leader::{LeaderElection, leading_name, retire_live_term};
use locks_port::{
    AcquireOptions, LeaderBoard, LockAcquisitionError, LostSignal, PermitGuard, Semaphore,
};
use locks_postgres::deadpool_postgres;
use locks_postgres::{PostgresLockManager, PostgresPermit};

use crate::connect::{self, Target};
use crate::exit::{Failure, LOST, SOFTWARE, chain};
use crate::inspect::rfc3339_micros;
use crate::json;
use crate::text::{Say, out};

/// A term that runs the command: the leading permit, and the proclaimed term.
#[derive(Debug)]
pub(crate) struct Term {
    leading: PostgresPermit,
    proclaimed: Option<u64>,
}

impl Term {
    /// Takes the leading permit (unless `lost` fires first: `Ok(None)`), then proclaims
    /// `publish` when given.
    pub(crate) async fn begin(
        manager: &PostgresLockManager,
        key: &str,
        publish: Option<&str>,
        lost: LostSignal,
    ) -> Result<Option<Self>, LockAcquisitionError> {
        // Observers with a board trust its live term while the leading permit is held:
        // a term a dead leader left live is retired first. Without `--publish` the
        // database may have no board, which leaves nothing to retire.
        if let Err(error) = retire_live_term(manager, key).await
            && publish.is_some()
        {
            return Err(error);
        }
        let leading_key = leading_name(key);
        let leading = tokio::select! {
            biased;
            _ = lost => return Ok(None),
            leading = manager.acquire_permit(&leading_key, 1, AcquireOptions::new()) => leading?,
        };
        let proclaimed = match publish {
            None => None,
            Some(value) => match manager.proclaim(key, value).await {
                Ok(term) => Some(term.term),
                Err(error) => {
                    leading.release().await;
                    return Err(error);
                }
            },
        };
        Ok(Some(Self {
            leading,
            proclaimed,
        }))
    }

    /// [`begin`](Self::begin) for `pglock run`: a leadership lost first, or an error, as
    /// the run's failure; says the term's number when one was proclaimed.
    pub(crate) async fn start(
        manager: &PostgresLockManager,
        key: &str,
        publish: Option<&str>,
        lost: LostSignal,
        target: &Target,
        say: Say,
    ) -> Result<Self, Failure> {
        let quoted = crate::text::quoted(key);
        match Self::begin(manager, key, publish, lost).await {
            Ok(Some(term)) => {
                if let Some(number) = term.proclaimed {
                    say.say(format!("term {number} of {quoted} proclaimed"));
                }
                Ok(term)
            }
            Ok(None) => Err(Failure::new(
                LOST,
                format!("the leadership of {quoted} was lost before the command started"),
            )),
            Err(error) => Err(crate::exit::acquisition_failure(&error, &target.config)),
        }
    }

    /// Retires the term and releases the leading permit (the command has stopped).
    pub(crate) async fn end(self, manager: &PostgresLockManager, key: &str) {
        if let Some(term) = self.proclaimed
            && let Err(error) = manager.retire(key, term).await
        {
            eprintln!("pglock: could not retire term {term} of {key:?}: {error}");
        }
        self.leading.release().await;
    }
}

/// Creates the leader board's table if it is missing (only then: creating needs the
/// `CREATE` privilege, using it does not).
pub(crate) async fn ensure_board_table(
    pool: &Pool,
    target: &Target,
    say: Say,
) -> Result<(), Failure> {
    if let Some(client) =
        connect::missing_table(pool, target, locks_postgres::LEADER_BOARD_TABLE).await?
    {
        say.say("creating the leader board's table (advisory_lock_leader_terms)");
        locks_postgres::install_leader_board(&client)
            .await
            .map_err(|error| {
                crate::exit::creation_failure(
                    locks_postgres::LEADER_BOARD_TABLE,
                    &error,
                    &target.config,
                )
            })?;
    }
    Ok(())
}

/// `pglock who --leader NAME [--json]`: who leads the election NAME now, with the term,
/// start and value its leader published when it publishes one.
pub(crate) async fn who(target: &Target, key: &str, json: bool) -> Result<u8, Failure> {
    let pool = connect::pool(target, 1, "pglock")?;
    // Connect first, so an unreachable server or bad credentials exit as for the other
    // commands (69, 77, 78).
    let board = connect::missing_table(&pool, target, locks_postgres::LEADER_BOARD_TABLE)
        .await?
        .is_none();
    let manager = PostgresLockManager::new(pool);
    let failed = |error: LockAcquisitionError| {
        let board = [locks_postgres::LEADER_BOARD_TABLE];
        crate::exit::read_privilege_failure(&board, &error, &target.config)
            .unwrap_or_else(|| Failure::new(SOFTWARE, chain(&error)))
    };
    // An election that has proclaimed a term is read with its board; one that never did
    // (or a database without the board's table) by its leading permit alone. A board
    // that cannot be read is an error, not an election that publishes nothing.
    let published = board && manager.latest(key).await.map_err(failed)?.is_some();
    let leader = if published {
        LeaderElection::new(&manager, key)
            .board(&manager)
            .who_leads()
            .await
    } else {
        LeaderElection::new(&manager, key).who_leads().await
    }
    .map_err(failed)?;
    if json {
        out(json::leader(key, leader.as_ref()))?;
        return Ok(0);
    }
    let quoted = crate::text::quoted(key);
    match leader {
        None => out(format_args!("nobody leads {quoted}\n"))?,
        Some(leader) => {
            let mut line = format!(
                "{} leads {quoted}",
                crate::text::escaped(leader.holder_id.as_deref().unwrap_or("-"))
            );
            if let Some(term) = leader.term {
                line.push_str(&format!(", term {term}"));
            }
            if let Some(since) = leader.since {
                line.push_str(&format!(", since {}", rfc3339_micros(since)));
            }
            if let Some(value) = &leader.value {
                line.push_str(&format!(", published {}", crate::text::quoted(value)));
            }
            out(format_args!("{line}\n"))?;
        }
    }
    Ok(0)
}
