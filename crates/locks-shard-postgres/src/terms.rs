//! The term table and the [`ShardTerms`] store on it.

use std::future::Future;
use std::time::Duration;

use deadpool_postgres::Pool;
use locks_shard::locks_port::{LockAcquisitionError, PermitHolder};
use locks_shard::{Begun, ShardTerms, Term};
use time::OffsetDateTime;

use crate::errors;
use crate::members::{
    ENTER, MEMBERS_SCHEMA, MEMBERS_UPGRADE, RENEW, RENEW_LOOK, ROSTER, members_class, seconds,
};

/// The term table (in the connection's `search_path` schema).
pub const TERMS_TABLE: &str = "locks_shard_terms";

/// The statement that creates the term table, for migration tools: what
/// [`install_shard_terms`] runs. One row per shard: the token of its latest term, who
/// began it (membership slot, holder id), when (the server's clock), whether its owner
/// ended it, and how soon its owner is told of a loss (`loss_notice_ms`, valid only while
/// `loss_notice_token` is the row's token: a member of a version that does not record it
/// leaves the pair behind, which then says nothing). A table created before the pair
/// existed gains it with [`TERMS_UPGRADE`].
pub const TERMS_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS locks_shard_terms (\
     group_name text NOT NULL, \
     shard text NOT NULL, \
     token bigint NOT NULL CHECK (token > 0), \
     member_slot integer NOT NULL, \
     holder_id text, \
     since timestamptz NOT NULL, \
     ended boolean NOT NULL DEFAULT false, \
     loss_notice_ms integer, \
     loss_notice_token bigint, \
     PRIMARY KEY (group_name, shard))";

/// Adds the loss-notice columns to a term table created before they existed (run by
/// [`install_shard_terms`] after [`TERMS_SCHEMA`]; does nothing on a table that has them).
pub const TERMS_UPGRADE: &str = "ALTER TABLE locks_shard_terms \
     ADD COLUMN IF NOT EXISTS loss_notice_ms integer, \
     ADD COLUMN IF NOT EXISTS loss_notice_token bigint";

/// The key whose transaction lock [`install_shard_terms`] holds while it creates the
/// tables.
const INSTALL_KEY: &str = "locks-shard-postgres:install:locks_shard_terms";

/// How long the store waits for any one answer of the server, by default.
pub const DEFAULT_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The next term of a shard: one more than the last token (1 for the first), its owner's
/// loss notice in milliseconds (`$5`, or NULL; after a term that did not end, the longer
/// of it and that term's, NULL if either is: `locks_shard::carried_loss_notice`), and
/// whether the term before it was ended (true when there was none) with that term's loss
/// notice (NULL unless recorded with its token). The old row is read in the same
/// statement; only the shard's lock holder begins terms, so nobody races it.
const BEGIN: &str = "WITH old AS (SELECT ended, \
         CASE WHEN loss_notice_token = token THEN loss_notice_ms END AS notice \
       FROM locks_shard_terms WHERE group_name = $1 AND shard = $2) \
     INSERT INTO locks_shard_terms AS t \
       (group_name, shard, token, member_slot, holder_id, since, ended, \
        loss_notice_ms, loss_notice_token) \
     VALUES ($1, $2, 1, $3, $4, clock_timestamp(), false, $5, 1) \
     ON CONFLICT (group_name, shard) DO UPDATE SET token = t.token + 1, \
       member_slot = EXCLUDED.member_slot, holder_id = EXCLUDED.holder_id, \
       since = EXCLUDED.since, ended = false, \
       loss_notice_ms = CASE WHEN t.ended THEN EXCLUDED.loss_notice_ms \
         WHEN t.loss_notice_token IS DISTINCT FROM t.token OR t.loss_notice_ms IS NULL \
           OR EXCLUDED.loss_notice_ms IS NULL THEN NULL \
         ELSE GREATEST(EXCLUDED.loss_notice_ms, t.loss_notice_ms) END, \
       loss_notice_token = t.token + 1 \
     RETURNING token, since, COALESCE((SELECT ended FROM old), true), \
       (SELECT notice FROM old), loss_notice_ms";
const END: &str = "UPDATE locks_shard_terms SET ended = true \
     WHERE group_name = $1 AND shard = $2 AND token = $3";
const REJOINED: &str = "UPDATE locks_shard_terms SET member_slot = $4 \
     WHERE group_name = $1 AND shard = $2 AND token = $3 AND NOT ended RETURNING 1";
const TERMS: &str = "SELECT shard, token, member_slot, holder_id, since, ended, \
       CASE WHEN loss_notice_token = token THEN loss_notice_ms END \
     FROM locks_shard_terms WHERE group_name = $1";

/// Creates the term table and the member table ([`MEMBERS_SCHEMA`]) if they do not exist,
/// and adds the columns a table of an earlier version lacks ([`TERMS_UPGRADE`],
/// [`MEMBERS_UPGRADE`](crate::MEMBERS_UPGRADE)). Run it once per database (a migration, a
/// deploy step); the store never creates it on its own. Idempotent, and safe to run from
/// several processes at once (under a transaction-scoped advisory lock: two concurrent
/// `CREATE TABLE IF NOT EXISTS` can fail on the catalog).
///
/// # Errors
/// The driver's error when the statement fails (for example, no `CREATE` privilege).
pub async fn install_shard_terms(
    client: &tokio_postgres::Client,
) -> Result<(), tokio_postgres::Error> {
    locks_postgres::install_under_lock(
        client,
        INSTALL_KEY,
        &format!("{TERMS_SCHEMA}; {TERMS_UPGRADE}; {MEMBERS_SCHEMA}; {MEMBERS_UPGRADE}"),
    )
    .await
}

/// Whether the tables exist but lack a column that [`TERMS_UPGRADE`] or
/// [`MEMBERS_UPGRADE`](crate::MEMBERS_UPGRADE) adds (made by an earlier version): then a
/// member's entries and terms are refused for the missing column until
/// [`install_shard_terms`] runs. `false` when they are current, or when a table is missing
/// (that is for [`install_shard_terms`] too, and a tool tells the two apart itself). One
/// read of the catalog.
///
/// # Errors
/// The driver's error when the read fails.
pub async fn shard_tables_need_upgrade(
    client: &tokio_postgres::Client,
) -> Result<bool, tokio_postgres::Error> {
    const ADDED: &str = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
         AND (SELECT count(*) FROM pg_attribute a WHERE NOT a.attisdropped AND ( \
           (a.attrelid = to_regclass($1)::oid \
             AND a.attname IN ('loss_notice_ms', 'loss_notice_token')) \
           OR (a.attrelid = to_regclass($2)::oid AND a.attname = 'holder_id'))) < 3";
    let row = client
        .query_one(ADDED, &[&TERMS_TABLE, &crate::MEMBERS_TABLE])
        .await?;
    Ok(row.get(0))
}

/// The [`ShardTerms`] store on PostgreSQL: the table [`TERMS_TABLE`], the server's
/// `clock_timestamp()` as each term's start. Each operation is one statement on a pooled
/// connection.
#[derive(Debug, Clone)]
pub struct PostgresShardTerms {
    pool: Pool,
    answer_timeout: Duration,
}

impl PostgresShardTerms {
    /// A store on the pool's database (the table must exist: [`install_shard_terms`]).
    #[must_use]
    pub fn new(pool: Pool) -> Self {
        Self {
            pool,
            answer_timeout: DEFAULT_ANSWER_TIMEOUT,
        }
    }

    /// How long each operation waits for the server (checkout included) before it
    /// fails; [`DEFAULT_ANSWER_TIMEOUT`] by default. A duration too long for the
    /// runtime's timer means no limit.
    #[must_use]
    pub fn answer_timeout(mut self, timeout: Duration) -> Self {
        self.answer_timeout = timeout;
        self
    }

    async fn bounded<T>(
        &self,
        group: &str,
        what: &str,
        operation: impl Future<Output = Result<T, LockAcquisitionError>>,
    ) -> Result<T, LockAcquisitionError> {
        locks_postgres::answer_within(self.answer_timeout, operation, || {
            errors::timed_out(group, what, self.answer_timeout)
        })
        .await
    }

    async fn query(
        &self,
        group: &str,
        what: &str,
        statement: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, LockAcquisitionError> {
        self.bounded(group, what, async {
            let client = self
                .pool
                .get()
                .await
                .map_err(|error| errors::pool(group, what, error))?;
            let statement = client
                .prepare_cached(statement)
                .await
                .map_err(|error| errors::driver(group, what, error))?;
            client
                .query(&statement, params)
                .await
                .map_err(|error| errors::driver(group, what, error))
        })
        .await
    }
}

fn slot_param(member: u32) -> i32 {
    i32::try_from(member).unwrap_or(i32::MAX)
}

/// A loss notice as the table keeps it: whole milliseconds, rounded up (saturating).
fn notice_param(notice: Option<Duration>) -> Option<i32> {
    notice.map(|notice| {
        let ms = notice.as_nanos().div_ceil(1_000_000);
        i32::try_from(ms).unwrap_or(i32::MAX)
    })
}

/// A loss notice read from the table (a negative one, which no member writes, as none).
fn notice_of(ms: Option<i32>) -> Option<Duration> {
    ms.and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
}

fn read_term(group: &str, row: &tokio_postgres::Row) -> Result<Term, LockAcquisitionError> {
    let read = |error| errors::driver(group, "reading a shard term", error);
    let slot: i32 = row.try_get(2).map_err(read)?;
    Ok(Term::new(
        row.try_get::<_, String>(0).map_err(read)?,
        row.try_get(1).map_err(read)?,
        u32::try_from(slot).unwrap_or(0),
        row.try_get(3).map_err(read)?,
        row.try_get::<_, OffsetDateTime>(4).map_err(read)?,
        row.try_get(5).map_err(read)?,
    )
    .with_loss_notice(notice_of(row.try_get(6).map_err(read)?)))
}

impl ShardTerms for PostgresShardTerms {
    async fn begin(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
    ) -> Result<Begun, LockAcquisitionError> {
        self.begin_with_notice(group, shard, member, holder_id, None)
            .await
    }

    async fn begin_with_notice(
        &self,
        group: &str,
        shard: &str,
        member: u32,
        holder_id: Option<&str>,
        loss_notice: Option<Duration>,
    ) -> Result<Begun, LockAcquisitionError> {
        let what = "beginning a shard term";
        let slot = slot_param(member);
        let notice = notice_param(loss_notice);
        let rows = self
            .query(
                group,
                what,
                BEGIN,
                &[&group, &shard, &slot, &holder_id, &notice],
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            LockAcquisitionError::new(
                group,
                locks_shard::locks_port::AcquisitionErrorKind::Backend,
                format!("{what}: the server returned no row"),
            )
        })?;
        let read = |error| errors::driver(group, what, error);
        let term = Term::new(
            shard,
            row.try_get(0).map_err(read)?,
            member,
            holder_id.map(str::to_owned),
            row.try_get(1).map_err(read)?,
            false,
        )
        .with_loss_notice(notice_of(row.try_get(4).map_err(read)?));
        Ok(Begun::new(term, row.try_get(2).map_err(read)?)
            .with_previous_loss_notice(notice_of(row.try_get(3).map_err(read)?)))
    }

    async fn end(&self, group: &str, shard: &str, token: i64) -> Result<(), LockAcquisitionError> {
        self.query(group, "ending a shard term", END, &[&group, &shard, &token])
            .await
            .map(drop)
    }

    async fn rejoined(
        &self,
        group: &str,
        shard: &str,
        token: i64,
        member: u32,
    ) -> Result<bool, LockAcquisitionError> {
        let slot = slot_param(member);
        self.query(
            group,
            "recording a kept shard term's new member slot",
            REJOINED,
            &[&group, &shard, &token, &slot],
        )
        .await
        .map(|rows| !rows.is_empty())
    }

    async fn terms(&self, group: &str) -> Result<Vec<Term>, LockAcquisitionError> {
        self.query(group, "reading the shard terms", TERMS, &[&group])
            .await?
            .iter()
            .map(|row| read_term(group, row))
            .collect()
    }

    /// Writes the member's row in the member table ([`MEMBERS_TABLE`](crate::MEMBERS_TABLE)):
    /// its slot and its sessions' `application_name`, expiring with its renewals, or
    /// never for a member that does not renew.
    async fn enter(
        &self,
        group: &str,
        member: u32,
        holder_id: Option<&str>,
        expiry: Option<Duration>,
    ) -> Result<(), LockAcquisitionError> {
        let slot = slot_param(member);
        let name = holder_id.map_or_else(String::new, locks_postgres::holder_application_name);
        let expiry = expiry.and_then(seconds);
        self.query(
            group,
            "entering a shard group member",
            ENTER,
            &[&group, &slot, &name, &expiry, &holder_id],
        )
        .await
        .map(drop)
    }

    /// The member table's rows whose slot is held, each slot probed with a shared try
    /// of it (let go at once), never `pg_locks`: one statement whose cost grows with the
    /// group's rows, not with the locks held on the server.
    async fn roster(
        &self,
        group: &str,
        members_name: &str,
    ) -> Result<Option<Vec<PermitHolder>>, LockAcquisitionError> {
        let what = "reading the shard group's roster";
        let class = members_class(members_name);
        let read = |error| errors::driver(group, what, error);
        self.query(group, what, ROSTER, &[&group, &class])
            .await?
            .iter()
            .map(|row| {
                let slot: i32 = row.try_get(0).map_err(read)?;
                let name: String = row.try_get(1).map_err(read)?;
                let whole: Option<String> = row.try_get(2).map_err(read)?;
                // The whole holder id, when the row's writer recorded it with its
                // application name (a writer of an earlier version updates the name
                // alone); else the name's (a long id only its start and a hash).
                let holder_id = whole
                    .filter(|id| locks_postgres::holder_application_name(id) == name)
                    .or_else(|| {
                        name.strip_prefix(locks_postgres::HOLDER_APPLICATION_NAME_PREFIX)
                            .map(str::to_owned)
                    });
                Ok(PermitHolder::new(
                    u32::try_from(slot).unwrap_or(0),
                    holder_id,
                    None,
                ))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// Renews the member's row and ends the sessions of expired members that still hold
    /// their membership slot, with `pg_terminate_backend` (the role needs to be allowed
    /// to: the same role as the members', or `pg_signal_backend`). One statement that
    /// never reads `pg_locks`; a second, which does (to find those members' sessions),
    /// only when an expired member's slot is held.
    ///
    /// This member's renewal is the first statement's: once it is committed, a failure
    /// of the second (the role may not end those sessions, or the connection broke) is a
    /// WARN and 0 sessions ended, not a failed renewal; else a stuck member this role
    /// may not end would make every healthy member stop its tasks at its self-stop.
    async fn renew(
        &self,
        group: &str,
        member: u32,
        holder_id: &str,
        expiry: Duration,
    ) -> Result<u64, LockAcquisitionError> {
        let what = "renewing a shard group member";
        let slot = slot_param(member);
        let name = locks_postgres::holder_application_name(holder_id);
        let members = locks_shard::ShardGroup::members_name_of(group);
        let class = members_class(&members);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
            [&group, &slot, &name, &seconds(expiry), &class, &holder_id];
        let count = async |statement| {
            let rows = self.query(group, what, statement, &params).await?;
            rows.first().map_or(Ok(0), |row| {
                row.try_get::<_, i64>(0)
                    .map_err(|error| errors::driver(group, what, error))
            })
        };
        if count(RENEW_LOOK).await? == 0 {
            return Ok(0);
        }
        match count(RENEW).await {
            Ok(ended) => Ok(u64::try_from(ended).unwrap_or(0)),
            Err(error) => {
                tracing::warn!(group, error = %error,
                    "this member is renewed, but the sessions of a member whose renewal \
                     expired while it holds its slot could not be ended; its shards stay \
                     with it until its sessions end");
                Ok(0)
            }
        }
    }
}
