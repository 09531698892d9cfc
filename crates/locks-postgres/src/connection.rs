//! A pooled connection that is only ever given back to the pool when it is known to
//! hold no advisory lock; on every other path it is detached and closed.

use deadpool_postgres::Object;
use tokio_postgres::NoTls;

use crate::sql::{SESSION_SETUP, Statement};

/// A checked-out connection.
///
/// The safety net of the whole adapter: unless [`Session::into_pool`] is called,
/// dropping it detaches the connection from the pool and closes it, and the server
/// frees whatever the session held. If a statement was in flight (an advisory-lock
/// wait), a cancel request is sent first so the server leaves the lock queue at once
/// instead of being granted the lock later.
#[derive(Debug)]
pub(crate) struct Session {
    object: Option<Object>,
    in_flight: bool,
}

/// What one lock statement answered.
pub(crate) enum Answer {
    /// `pg_advisory_lock` returned: the lock is held.
    Locked,
    /// A boolean function answered (`pg_try_advisory_lock`, `pg_advisory_unlock`).
    Bool(bool),
}

impl Session {
    pub(crate) fn new(object: Object) -> Self {
        Self {
            object: Some(object),
            in_flight: false,
        }
    }

    /// Runs one lock statement (prepared once per connection, then one round trip)
    /// and reads its answer.
    ///
    /// While the future runs the session counts as "in flight": if it is dropped, the
    /// drop of the session cancels the statement and closes the connection.
    pub(crate) async fn run(
        &mut self,
        statement: Statement,
    ) -> Result<Answer, tokio_postgres::Error> {
        let object = match self.object.as_ref() {
            Some(object) => object,
            None => unreachable!("a session holds its connection until it is consumed"),
        };
        self.in_flight = true;
        let answer = Self::execute(object, statement).await;
        // Reached only when the statement finished (answer or error): no cancel needed.
        self.in_flight = false;
        answer
    }

    /// Sets a new connection up for holding locks ([`SESSION_SETUP`]: no statement,
    /// idle or idle-in-transaction timeout ends a wait or a hold; `application_name`
    /// publishes the holder) with `statement` pipelined behind it: one round trip for
    /// both. The first answer says whether the server is a read-only standby.
    pub(crate) async fn run_after_setup(
        &mut self,
        application_name: Option<&str>,
        statement: Statement,
    ) -> (
        Result<bool, tokio_postgres::Error>,
        Result<Answer, tokio_postgres::Error>,
    ) {
        let object = match self.object.as_ref() {
            Some(object) => object,
            None => unreachable!("a session holds its connection until it is consumed"),
        };
        let setup = async {
            let prepared = object.prepare_cached(SESSION_SETUP).await?;
            let row = object.query_one(&prepared, &[&application_name]).await?;
            row.try_get::<_, bool>(0)
        };
        self.in_flight = true;
        let answers = tokio::join!(setup, Self::execute(object, statement));
        self.in_flight = false;
        answers
    }

    /// The connection (for statements of its own, like the set-up).
    pub(crate) fn object(&self) -> &Object {
        match self.object.as_ref() {
            Some(object) => object,
            None => unreachable!("a session holds its connection until it is consumed"),
        }
    }

    /// Whether the connection has ended (a local check, no I/O): the server closed it
    /// or the socket failed.
    pub(crate) fn is_closed(&self) -> bool {
        self.object.as_ref().is_none_or(|object| object.is_closed())
    }

    async fn execute(
        object: &deadpool_postgres::ClientWrapper,
        statement: Statement,
    ) -> Result<Answer, tokio_postgres::Error> {
        let prepared = object.prepare_cached(statement.text()).await?;
        match (statement, statement.lock_id()) {
            (
                Statement::Lock {
                    lock_timeout_ms, ..
                },
                Some(lock_id),
            ) => {
                let lock_timeout = lock_timeout_ms.to_string();
                object
                    .execute(&prepared, &[&lock_id, &lock_timeout])
                    .await?;
                Ok(Answer::Locked)
            }
            (_, Some(lock_id)) => {
                let row = object.query_one(&prepared, &[&lock_id]).await?;
                Ok(Answer::Bool(row.try_get(0)?))
            }
            (_, None) => {
                let row = object.query_one(&prepared, &[]).await?;
                Ok(Answer::Bool(row.try_get(0)?))
            }
        }
    }

    /// Gives the connection back to the pool. Only call this when the session is known
    /// to hold no advisory lock.
    pub(crate) fn into_pool(mut self) {
        drop(self.object.take());
    }

    /// Closes the connection now (the server frees what the session held).
    pub(crate) fn close(self) {
        drop(self);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(object) = self.object.take() else {
            return;
        };
        let client = Object::take(object);
        if self.in_flight
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let token = client.cancel_token();
            runtime.spawn(async move {
                // Best effort: ends a server-side wait at once. If it fails (no
                // plain-text cancel path), closing the socket still frees the lock
                // once the backend notices.
                let _ = token.cancel_query(NoTls).await;
                drop(client);
            });
            return;
        }
        drop(client);
    }
}
