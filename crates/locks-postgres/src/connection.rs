//! A pooled connection that is only ever given back to the pool when it is known to
//! hold no advisory lock; on every other path it is detached and closed.

use deadpool_postgres::Object;
use tokio_postgres::NoTls;

use crate::sql::Statement;

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
        let object = self
            .object
            .as_ref()
            .expect("a session holds its connection until it is consumed");
        self.in_flight = true;
        let answer = Self::execute(object, statement).await;
        // Reached only when the statement finished (answer or error): no cancel needed.
        self.in_flight = false;
        answer
    }

    async fn execute(
        object: &Object,
        statement: Statement,
    ) -> Result<Answer, tokio_postgres::Error> {
        let prepared = object.prepare_cached(statement.text()).await?;
        let lock_id = statement.lock_id();
        match statement {
            Statement::Lock {
                lock_timeout_ms, ..
            } => {
                let lock_timeout = lock_timeout_ms.to_string();
                object
                    .execute(&prepared, &[&lock_id, &lock_timeout])
                    .await?;
                Ok(Answer::Locked)
            }
            _ => {
                debug_assert!(statement.answers_bool());
                let row = object.query_one(&prepared, &[&lock_id]).await?;
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
