//! The ways of taking and giving back one lock (or one group of locks) that the cycle,
//! instruction-count and latency scenarios compare: the library's calls and raw
//! `tokio-postgres` statements.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use locks_port::{AcquireOptions, DistributedLock, KeyDerivation, LockGuard, ReleaseOutcome};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::types::ToSql;
use locks_postgres::tokio_postgres::{Client, SimpleQueryMessage};

use crate::BoxError;
use crate::db::RawStatements;
use crate::groups::OldWay;

/// One way of taking and giving back a lock.
pub(crate) enum Op {
    Acquire {
        manager: PostgresLockManager,
        key: String,
        options: AcquireOptions,
    },
    TryAcquire {
        manager: PostgresLockManager,
        key: String,
    },
    RawPrepared {
        client: Client,
        statements: RawStatements,
        id: i64,
        try_lock: bool,
    },
    RawSimple {
        client: Client,
        id: i64,
        try_lock: bool,
    },
    RawText {
        client: Client,
        lock: String,
        unlock: String,
    },
    /// The library's `acquire_many` of `keys` + the group's release.
    AcquireMany {
        manager: PostgresLockManager,
        keys: Vec<String>,
        options: AcquireOptions,
    },
    /// `acquire_many` of `keys` the old way (see [`OldWay`]).
    OldWay { old: OldWay, keys: Vec<String> },
    /// The locks of `ids` (ascending) and then their unlocks, prepared, on one
    /// connection: one after another, or each set `pipelined` (sent at once).
    RawMany {
        client: Client,
        statements: RawStatements,
        ids: Vec<i64>,
        pipelined: bool,
    },
}

impl Op {
    /// One lock + unlock.
    pub(crate) async fn cycle(&self) -> Result<(), BoxError> {
        match self {
            Self::Acquire {
                manager,
                key,
                options,
            } => {
                let guard = manager.acquire(key, *options).await?;
                guard.release().await;
            }
            Self::TryAcquire { manager, key } => {
                let guard = manager
                    .try_acquire(key)
                    .await?
                    .ok_or("an uncontended try_acquire found the lock held")?;
                guard.release().await;
            }
            Self::RawPrepared {
                client,
                statements,
                id,
                try_lock,
            } => {
                if *try_lock {
                    let granted: bool = client.query_one(&statements.try_lock, &[id]).await?.get(0);
                    if !granted {
                        return Err("an uncontended pg_try_advisory_lock was refused".into());
                    }
                } else {
                    client.execute(&statements.lock, &[id]).await?;
                }
                let released: bool = client.query_one(&statements.unlock, &[id]).await?.get(0);
                if !released {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::RawSimple {
                client,
                id,
                try_lock,
            } => {
                let function = if *try_lock {
                    "pg_try_advisory_lock"
                } else {
                    "pg_advisory_lock"
                };
                let answer = client
                    .simple_query(&format!("SELECT {function}({id})"))
                    .await?;
                if *try_lock && first_value(&answer).as_deref() != Some("t") {
                    return Err("an uncontended pg_try_advisory_lock was refused".into());
                }
                let answer = client
                    .simple_query(&format!("SELECT pg_advisory_unlock({id})"))
                    .await?;
                if first_value(&answer).as_deref() != Some("t") {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::RawText {
                client,
                lock,
                unlock,
            } => {
                client.simple_query(lock).await?;
                let answer = client.simple_query(unlock).await?;
                if first_value(&answer).as_deref() != Some("t") {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
            Self::OldWay { old, keys } => old.cycle(keys).await?,
            Self::AcquireMany {
                manager,
                keys,
                options,
            } => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let locks = manager.acquire_many(&keys, *options).await?;
                if locks.release().await != ReleaseOutcome::Unlocked {
                    return Err("the group's release did not unlock every lock".into());
                }
            }
            Self::RawMany {
                client,
                statements,
                ids,
                pipelined,
            } => {
                let params: Vec<[&(dyn ToSql + Sync); 1]> =
                    ids.iter().map(|id| [id as _]).collect();
                let released: Vec<bool> = if *pipelined {
                    let locks = params.iter().map(|p| client.execute(&statements.lock, p));
                    for locked in all_at_once(locks.collect()).await {
                        locked?;
                    }
                    let unlocks = params
                        .iter()
                        .map(|p| client.query_one(&statements.unlock, p));
                    let mut released = Vec::with_capacity(ids.len());
                    for row in all_at_once(unlocks.collect()).await {
                        released.push(row?.get(0));
                    }
                    released
                } else {
                    for p in &params {
                        client.execute(&statements.lock, p).await?;
                    }
                    let mut released = Vec::with_capacity(ids.len());
                    for p in &params {
                        released.push(client.query_one(&statements.unlock, p).await?.get(0));
                    }
                    released
                };
                if !released.iter().all(|&r| r) {
                    return Err("pg_advisory_unlock answered false".into());
                }
            }
        }
        Ok(())
    }
}

/// Polls every one of `futures` until all are done, and gives their outputs in order.
/// Statements of futures polled together on one connection are pipelined by
/// tokio-postgres: sent in the order of the first polls, without waiting for answers.
async fn all_at_once<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut finished = true;
        for (future, output) in pending.iter_mut().zip(&mut done) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => finished = false,
                }
            }
        }
        if finished {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

fn first_value(messages: &[SimpleQueryMessage]) -> Option<String> {
    messages.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    })
}

impl Op {
    /// The library's uncontended `acquire` + `release`.
    pub(crate) fn library(
        manager: PostgresLockManager,
        key: String,
        options: AcquireOptions,
    ) -> Self {
        Self::Acquire {
            manager,
            key,
            options,
        }
    }

    /// Raw prepared `pg_advisory_lock($1)` + `pg_advisory_unlock($1)` on `client`.
    pub(crate) async fn raw_prepared(client: Client, id: i64) -> Result<Self, BoxError> {
        let statements = RawStatements::prepare(&client).await?;
        Ok(Self::RawPrepared {
            client,
            statements,
            id,
            try_lock: false,
        })
    }

    /// Raw prepared `pg_advisory_lock_shared($1)` + `pg_advisory_unlock_shared($1)` on
    /// `client`.
    pub(crate) async fn raw_prepared_shared(client: Client, id: i64) -> Result<Self, BoxError> {
        let statements = RawStatements::prepare_shared(&client).await?;
        Ok(Self::RawPrepared {
            client,
            statements,
            id,
            try_lock: false,
        })
    }

    /// The library's uncontended `acquire_many` of `keys` + the group's release.
    pub(crate) fn library_many(
        manager: PostgresLockManager,
        keys: Vec<String>,
        options: AcquireOptions,
    ) -> Self {
        Self::AcquireMany {
            manager,
            keys,
            options,
        }
    }

    /// What a careful client sends for the same on `client`: prepared
    /// `pg_advisory_lock($1)` for each lock id of `keys` in ascending order (the
    /// library's one global order, duplicates merged), then `pg_advisory_unlock($1)`
    /// for each; `pipelined` sends each set at once.
    pub(crate) async fn raw_many(
        client: Client,
        keys: &[String],
        pipelined: bool,
    ) -> Result<Self, BoxError> {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let ids = KeyDerivation::CURRENT
            .lock_order(&keys)
            .into_keys()
            .collect();
        let statements = RawStatements::prepare(&client).await?;
        Ok(Self::RawMany {
            client,
            statements,
            ids,
            pipelined,
        })
    }

    /// The server process behind this op's one connection.
    pub(crate) async fn backend_pid(&self) -> Result<i32, BoxError> {
        Ok(match self {
            Self::Acquire { manager, .. }
            | Self::TryAcquire { manager, .. }
            | Self::AcquireMany { manager, .. } => {
                let connection = manager.pool().get().await?;
                connection
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await?
                    .get(0)
            }
            Self::RawPrepared { client, .. }
            | Self::RawSimple { client, .. }
            | Self::RawText { client, .. }
            | Self::RawMany { client, .. } => client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0),
            Self::OldWay { old, .. } => old.backend_pid().await?,
        })
    }
}
