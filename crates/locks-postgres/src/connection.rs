//! A pooled connection that is only ever given back to the pool when it is known to
//! hold no advisory lock; on every other path it is detached and closed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::TryStreamExt;
use locks_port::LossNotifier;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, SimpleQueryMessage};

use crate::limit::{Bounded, Expired, Limit};
use crate::pool::{self, Pooled as Object};
use crate::query::{Query, SESSION_SETUP};
use crate::watchdog::{Watch, Watched};

mod known;

pub(crate) use known::{Backend, Connections};
use known::{Known, Spare};

/// `$query`'s statement on the connection `$object` (marker `$marker`, prepared
/// statements `$cached`): the cached one, used where it lies (no reference-count round
/// trip per statement), else prepared now and cached; a failure to prepare returns
/// from the enclosing statement with the driver's error. A macro, not a helper future:
/// a future of its own around the lookup cost the lock cycle 63-70 instructions.
macro_rules! cached_or_prepared {
    ($object:expr, $marker:expr, $cached:expr, $query:expr) => {
        match slot($cached, $query) {
            Some(prepared) => prepared,
            empty => empty.insert(prepare($object, $query.sql($marker)).await?),
        }
    };
}

/// A checked-out connection.
///
/// The safety net of the whole adapter: unless [`Session::into_pool`] is called,
/// dropping it detaches the connection from the pool and closes it, and the server
/// frees whatever the session held. If a statement was in flight (an advisory-lock
/// wait), a cancel request is sent first so the server leaves the lock queue at once
/// instead of being granted the lock later.
#[derive(Debug)]
pub(crate) struct Session {
    /// The connection and what is known of it; `None` once consumed.
    conn: Option<Box<Known>>,
    in_flight: bool,
    /// Whether a statement has run since the checkout.
    used: bool,
    home: Arc<Connections>,
}

/// A checked-out session's connection and what is known of it, borrowed for one
/// statement ([`Session::parts`]).
struct Parts<'s> {
    object: &'s Object,
    marker: &'s str,
    prepared: &'s mut Vec<Option<tokio_postgres::Statement>>,
    watch: Option<&'s Watch>,
    in_flight: &'s mut bool,
}

/// What the set-up gives each server session besides its marker.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetupValues<'a> {
    /// `locks:<holder id>`, or `None` to leave `application_name` alone.
    pub(crate) application_name: Option<&'a str>,
    /// The lease's server timers (see [`crate::lease::ServerTimers::as_settings`]), or
    /// `None` to leave the server's own.
    pub(crate) timers: Option<&'a [Option<String>; 6]>,
    /// Whether to read the session's [`Backend`] (stall patience needs it).
    pub(crate) identify: bool,
}

impl SetupValues<'_> {
    fn timer(&self, index: usize) -> Option<&str> {
        self.timers.and_then(|timers| timers[index].as_deref())
    }
}

/// What a set-up pipelined with a statement found (see
/// [`Session::query_after_setup`]): the set-up's outcome and the statement's answer, or
/// no answer within the limit.
pub(crate) type AfterSetup<A> = Result<
    (
        Result<SetUp, tokio_postgres::Error>,
        Result<A, tokio_postgres::Error>,
    ),
    Expired,
>;

/// What the set-up found on the server session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SetUp {
    /// Set up; the session carries this connection's marker.
    Done,
    /// The server is a read-only standby (in recovery).
    Standby,
    /// The server session carries another connection's marker: it is shared with
    /// another client (a transaction-pooling proxy).
    Foreign,
}

impl Session {
    pub(crate) fn new(object: Object, home: &Arc<Connections>) -> Self {
        let mut known = home.take(&object);
        // A kept `Known` holds no connection (`into_pool` took it out; should one be
        // there, it goes first). The object (a few hundred bytes) is then written into
        // the box straight from the argument: assigned over an `Option` that might need
        // dropping, it was copied twice, through a temporary. What `replace` gives back
        // is that `None`: nothing is forgotten.
        if known.object.is_some() {
            known.object = None;
        }
        std::mem::forget(known.object.replace(object));
        Self {
            conn: Some(known),
            in_flight: false,
            used: false,
            home: Arc::clone(home),
        }
    }

    /// Whether no statement has run on the connection since its checkout (it holds
    /// no lock yet).
    pub(crate) fn is_fresh(&self) -> bool {
        !self.used
    }

    /// The connection, its marker, its prepared statements, its watch and the
    /// in-flight flag.
    fn parts(&mut self) -> Parts<'_> {
        self.used = true;
        let Some(Known {
            object: Some(object),
            marker,
            prepared,
            watch,
            ..
        }) = self.conn.as_deref_mut()
        else {
            unreachable!("a session holds its connection until it is consumed")
        };
        Parts {
            object,
            marker,
            prepared,
            watch: watch.as_deref(),
            in_flight: &mut self.in_flight,
        }
    }

    /// Whether the connection has been set up (by this process's managers).
    pub(crate) fn is_set_up(&self) -> bool {
        self.conn.as_ref().is_some_and(|known| known.set_up)
    }

    /// The server session, as the set-up read it (`None`: not asked, or not set up).
    pub(crate) fn backend(&self) -> Option<Backend> {
        self.conn.as_ref().and_then(|known| known.backend)
    }

    /// Records whether the connection is set up; `false` makes the next statement
    /// run the set-up again.
    pub(crate) fn mark_set_up(&mut self, set_up: bool) {
        if let Some(known) = self.conn.as_deref_mut() {
            known.set_up = set_up;
        }
    }

    /// Runs `query` (prepared once per connection, then one round trip) with `params`
    /// within `limit` (held by the connection's watch), and hands back its one row (a
    /// query answers exactly one: any other number is an error) once the statement has
    /// ended: a statement that writes is committed when this answers.
    ///
    /// If the future is dropped before the answer arrives, or the limit passes first
    /// ([`Expired`]), the statement is still in flight: dropping the session cancels
    /// it and closes the connection.
    pub(crate) async fn query_within(
        &mut self,
        query: &'static Query,
        params: &[&(dyn ToSql + Sync)],
        limit: Limit,
    ) -> Result<Result<Row, tokio_postgres::Error>, Expired> {
        self.in_flight(limit, |object, marker, cached| async move {
            let prepared = cached_or_prepared!(object, marker, cached, query);
            object.query_one(prepared, params).await
        })
        .await
    }

    /// [`query_within`](Self::query_within) for a statement whose row is its whole
    /// outcome: the row is read by `read` where it arrives (`None`: the statement
    /// answered no row), and the statement's end (its command tag and the server's
    /// ready-for-query, which follow the row) is not waited for: the connection drops
    /// them unparsed. Only for statements whose effect does not wait for a commit, as
    /// the advisory lock functions: a session-level advisory lock is taken or freed
    /// when the function runs, and stays so even if its transaction then fails.
    /// Statements later sent on the connection run after this one's end, as ever.
    ///
    /// A plain function handing back [`in_flight`](Self::in_flight)'s future: one
    /// layer of future less around every lock statement.
    pub(crate) fn read_within<'p, T>(
        &mut self,
        query: &'static Query,
        params: impl AsRef<[&'p (dyn ToSql + Sync)]>,
        limit: Limit,
        read: impl FnOnce(Option<Row>) -> Result<T, tokio_postgres::Error>,
    ) -> impl Future<Output = Result<Result<T, tokio_postgres::Error>, Expired>> {
        self.in_flight(limit, move |object, marker, cached| async move {
            let prepared = cached_or_prepared!(object, marker, cached, query);
            let params = params.as_ref().iter().copied();
            let rows = object.query_raw(prepared, params).await?;
            read(std::pin::pin!(rows).try_next().await?)
        })
    }

    /// Sets a new connection up for holding locks ([`SESSION_SETUP`]: no statement,
    /// idle or idle-in-transaction timeout ends a wait or a hold; `application_name`
    /// publishes the holder; the lease's TCP timers; `locks.session` marks the server
    /// session as this connection's) with `query` pipelined behind it: one round trip
    /// for both (two when the statements are not prepared yet), within `limit` (on
    /// expiry the statements are in flight, as in [`query_within`](Self::query_within)).
    pub(crate) async fn query_after_setup(
        &mut self,
        values: SetupValues<'_>,
        query: &'static Query,
        params: &[&(dyn ToSql + Sync)],
        limit: Limit,
    ) -> AfterSetup<Row> {
        self.in_flight(limit, |object, marker, cached| async move {
            let (setup, lock) = (
                slot(cached, &SESSION_SETUP).clone(),
                slot(cached, query).clone(),
            );
            let (setup, lock) = tokio::join!(
                prepared(object, setup, || SESSION_SETUP.sql(marker)),
                prepared(object, lock, || query.sql(marker)),
            );
            match (setup, lock) {
                (Ok(setup), Ok(lock)) => {
                    let setting_up = async {
                        let row = object
                            .query_one(
                                &setup,
                                &[
                                    &values.application_name,
                                    &marker,
                                    &values.timer(0),
                                    &values.timer(1),
                                    &values.timer(2),
                                    &values.timer(3),
                                    &values.timer(4),
                                    &values.identify,
                                    &values.timer(5),
                                ],
                            )
                            .await?;
                        let in_recovery: bool = row.try_get(0)?;
                        let owner: Option<&str> = row.try_get(1)?;
                        let pid: i32 = row.try_get(2)?;
                        let started: Option<std::time::SystemTime> = row.try_get(3)?;
                        let set_up = match (in_recovery, owner) {
                            (true, _) => SetUp::Standby,
                            (false, Some(_)) => SetUp::Done,
                            (false, None) => SetUp::Foreign,
                        };
                        Ok((set_up, started.map(|started| Backend { pid, started })))
                    };
                    let answers = tokio::join!(setting_up, object.query_one(&lock, params));
                    *slot(cached, &SESSION_SETUP) = Some(setup);
                    *slot(cached, query) = Some(lock);
                    answers
                }
                // Nothing ran; the statement's own error (if any) is the one to report.
                (Err(error), Ok(_)) | (Ok(_), Err(error)) => (Ok((SetUp::Done, None)), Err(error)),
                (Err(error), Err(other)) => (Err(error), Err(other)),
            }
        })
        .await
        .map(|(set_up, answer)| (set_up.map(|set_up| self.identified(set_up)), answer))
    }

    /// Records the server session the set-up read, and hands back the set-up's outcome.
    fn identified(&mut self, (set_up, backend): (SetUp, Option<Backend>)) -> SetUp {
        if let Some(known) = self.conn.as_deref_mut() {
            known.backend = backend;
        }
        set_up
    }

    /// Runs `sql` as a simple query (no parameters, not prepared: the semaphore's
    /// wait, a `DO` block with its numbers and the connection's marker in its text)
    /// within `limit` (held by the connection's watch), and hands back its messages.
    ///
    /// As with [`query_within`](Self::query_within), a future dropped before the answer,
    /// or a limit that passes first ([`Expired`]), leaves the statement in flight:
    /// dropping the session cancels it and closes the connection.
    pub(crate) async fn simple_query_within(
        &mut self,
        sql: &str,
        limit: Limit,
    ) -> Result<Result<Vec<SimpleQueryMessage>, tokio_postgres::Error>, Expired> {
        self.in_flight(limit, |object, _, _| object.simple_query(sql))
            .await
    }

    /// Runs `statement` on the connection (given its marker and its prepared
    /// statements) within `limit`, held by the connection's watch, with the in-flight
    /// flag set until it finishes: a future dropped before then, or a limit that passes
    /// first ([`Expired`]), leaves the flag set, and dropping the session cancels the
    /// statement and closes the connection.
    ///
    /// A plain function handing back [`InFlight`], which clears the flag: no `async`
    /// state machine of its own around every statement.
    fn in_flight<'s, T, F>(
        &'s mut self,
        limit: Limit,
        statement: impl FnOnce(&'s Object, &'s str, &'s mut Vec<Option<tokio_postgres::Statement>>) -> F,
    ) -> impl Future<Output = Result<T, Expired>>
    where
        F: Future<Output = T>,
    {
        let Parts {
            object,
            marker,
            prepared,
            watch,
            in_flight,
        } = self.parts();
        *in_flight = true;
        let running = statement(object, marker, prepared);
        InFlight {
            within: within(watch, limit, running),
            in_flight,
        }
    }

    /// The connection's session marker, for statements of its own that must check it
    /// (the semaphore's).
    pub(crate) fn marker(&self) -> &str {
        self.conn.as_deref().map_or("", |known| &known.marker)
    }

    /// Whether the connection has ended (a local check, no I/O): the server closed it
    /// or the socket failed.
    pub(crate) fn is_closed(&self) -> bool {
        self.conn
            .as_ref()
            .and_then(|known| known.object.as_ref())
            .is_none_or(|object| object.is_closed())
    }

    /// The slot kept with the connection, if any (taken: it is kept again only by
    /// [`into_pool_keeping`](Self::into_pool_keeping)).
    pub(crate) fn take_spare(&mut self) -> Option<Spare> {
        self.conn
            .as_deref_mut()
            .and_then(|known| known.spare.take())
    }

    /// The loss notifier kept with the connection, if any.
    pub(crate) fn take_spare_notifier(&mut self) -> Option<LossNotifier> {
        self.conn
            .as_deref_mut()
            .and_then(|known| known.spare_notifier.take())
    }

    /// [`into_pool`](Self::into_pool), keeping `spare` (a slot with no session in it)
    /// and its last lock's `notifier` with the connection for its next lock.
    pub(crate) fn into_pool_keeping(mut self, spare: Spare, notifier: LossNotifier) {
        if let Some(known) = self.conn.as_deref_mut() {
            known.spare = Some(spare);
            known.spare_notifier = Some(notifier);
        }
        self.into_pool();
    }

    /// Gives the connection back to the pool. Only call this when the session is known
    /// to hold no advisory lock.
    pub(crate) fn into_pool(mut self) {
        if let Some(mut known) = self.conn.take()
            && let Some(object) = known.object.as_ref()
        {
            let id = pool::id(object);
            // Dropped in place (back to the pool), not moved out first.
            known.object = None;
            self.home.give_back(id, known);
        }
    }

    /// Closes the connection now (the server frees what the session held).
    pub(crate) fn close(self) {
        drop(self);
    }
}

/// `statement` within `limit`: held by the connection's watch, or by a timer of its own.
/// A plain function, not an `async fn`: one layer of future less around every statement.
fn within<F: Future>(watch: Option<&Watch>, limit: Limit, statement: F) -> Within<'_, F> {
    match watch {
        Some(watch) => Within::Watched {
            watched: watch.run(limit, statement),
        },
        None => Within::Timed {
            timed: limit.run(statement),
        },
    }
}

pin_project_lite::pin_project! {
    /// The future of [`within`].
    #[project = WithinProjection]
    enum Within<'w, F> {
        Watched { #[pin] watched: Watched<'w, F> },
        Timed { #[pin] timed: Bounded<F> },
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            WithinProjection::Watched { watched } => watched.poll(cx),
            WithinProjection::Timed { timed } => timed.poll(cx),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Session::in_flight`]: the statement within its limit; the
    /// session's in-flight flag is cleared once the statement finished (answer or
    /// error), and stays set if the limit passed first or the future is dropped.
    struct InFlight<'s, F> {
        #[pin]
        within: Within<'s, F>,
        in_flight: &'s mut bool,
    }
}

impl<F: Future> Future for InFlight<'_, F> {
    type Output = Result<F::Output, Expired>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer = std::task::ready!(this.within.poll(cx));
        if answer.is_ok() {
            // The statement finished: no cancel needed.
            **this.in_flight = false;
        }
        Poll::Ready(answer)
    }
}

/// Prepares `text` (boxed: kept out of the common path's future).
async fn prepare(
    object: &Object,
    text: String,
) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
    Box::pin(object.prepare(&text)).await
}

/// The prepared statement: the cached one, or prepared now from `text` (boxed: kept
/// out of the common path's future).
async fn prepared(
    object: &Object,
    cached: Option<tokio_postgres::Statement>,
    text: impl FnOnce() -> String,
) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
    match cached {
        Some(prepared) => Ok(prepared),
        None => prepare(object, text()).await,
    }
}

/// The place of `query`'s prepared statement among a connection's `prepared` ones.
#[inline]
fn slot<'c>(
    prepared: &'c mut Vec<Option<tokio_postgres::Statement>>,
    query: &Query,
) -> &'c mut Option<tokio_postgres::Statement> {
    let index = query.index();
    if index >= prepared.len() {
        prepared.resize_with(index + 1, || None);
    }
    &mut prepared[index]
}

impl Drop for Session {
    fn drop(&mut self) {
        let Some(object) = self.conn.take().and_then(|mut known| known.object.take()) else {
            return;
        };
        let client = pool::detach(object);
        if self.in_flight {
            // Ends a server-side wait at once, with the pool's TLS connector.
            self.home.canceller().cancel_and_close(client);
        } else {
            drop(client);
        }
    }
}
