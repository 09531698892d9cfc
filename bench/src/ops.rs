//! The ways of taking and giving back one lock that the cycle, instruction-count and
//! latency scenarios compare: the library's calls and raw `tokio-postgres` statements.

use locks_port::{AcquireOptions, DistributedLock, LockGuard};
use locks_postgres::PostgresLockManager;
use locks_postgres::tokio_postgres::{Client, SimpleQueryMessage};

use crate::BoxError;
use crate::db::RawStatements;

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
        }
        Ok(())
    }
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

    /// The server process behind this op's one connection.
    pub(crate) async fn backend_pid(&self) -> Result<i32, BoxError> {
        Ok(match self {
            Self::Acquire { manager, .. } | Self::TryAcquire { manager, .. } => {
                let connection = manager.pool().get().await?;
                connection
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await?
                    .get(0)
            }
            Self::RawPrepared { client, .. }
            | Self::RawSimple { client, .. }
            | Self::RawText { client, .. } => client
                .query_one("SELECT pg_backend_pid()", &[])
                .await?
                .get(0),
        })
    }
}
