//! A pool checkout within the call's deadline: an idle connection at once, else a wait
//! for a free slot (as long as it takes, until the deadline, or not at all for a try),
//! and opening a connection held to the deadline too.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use locks_port::timeout_reason;

use crate::connection::{Connections, Session};
use crate::errors::{pool_exhausted, unreachable, with_timeout};
use crate::inner::Inner;
use crate::limit::{Deadline, Expired};
use crate::pool::{self, PoolError, Pooled, checkout_error};
use locks_port::LockAcquisitionError;

/// How an acquisition attempt ends before the bookkeeping.
pub(crate) type Attempt = Result<Session, LockAcquisitionError>;

/// How long a checkout may wait for a free pool slot.
#[derive(Clone, Copy)]
pub(crate) enum PoolWait {
    /// As long as it takes (an acquire without timeout).
    Forever,
    /// Until the acquisition's deadline.
    Until(Deadline),
    /// Not at all (`try_acquire` never waits).
    No,
}

/// Checks a connection out. Waiting for a free slot and opening a new connection
/// both count against the deadline (without one, or with a zero timeout, opening is
/// bounded by the connect timeout). The pool's own timeouts are not used, so a pool
/// built without a runtime works too.
pub(crate) async fn checkout(
    inner: &Inner,
    key: &str,
    wait: PoolWait,
    deadline: Option<Deadline>,
) -> Attempt {
    checked_out!(inner, key, wait, deadline)
}

/// [`checkout`] written out where it is used (an expression with `.await`, for an
/// `async` body): the uncontended acquisition's checkout of an idle connection,
/// without a layer of future of its own; the rest ([`after_first_look`]) is boxed.
/// As `cached_or_prepared!` in `connection.rs`.
macro_rules! checked_out {
    ($inner:expr, $key:expr, $wait:expr, $deadline:expr) => {{
        let (inner, key, wait, deadline): (
            &$crate::inner::Inner,
            &str,
            $crate::checkout::PoolWait,
            Option<$crate::limit::Deadline>,
        ) = ($inner, $key, $wait, $deadline);
        match inner.lease() {
            Err(lease) => Err($crate::errors::lease_refused(key, lease, deadline)),
            Ok(_) => {
                // Opening a connection is held to the caller's deadline itself: the
                // margin is for a live session's answer, which decides whether a lock
                // was granted. A zero timeout is a try (it waits for nobody) and opens
                // as `try_acquire` does.
                let opening = deadline.filter(|deadline| !deadline.timeout.is_zero());
                let connecting = $crate::limit::Deadline::limit(
                    opening,
                    std::time::Duration::ZERO,
                    inner.settings().connect_timeout,
                );
                // Not boxed: the pool's future (it may open a connection) is large,
                // but copying it into the limit costs less than allocating it on
                // every checkout.
                let checkout = $crate::pool::idle_or_new(inner.pool());
                match connecting
                    .run($crate::checkout::into_session(
                        checkout,
                        inner.connections(),
                    ))
                    .await
                {
                    // An idle connection: the common case, already a session.
                    Ok(Ok(session)) => Ok(session),
                    first => {
                        let rest =
                            $crate::checkout::after_first_look(inner, key, wait, deadline, first);
                        Box::pin(rest).await
                    }
                }
            }
        }
    }};
}
pub(crate) use checked_out;

/// A checkout that found no idle connection at once (`first`: what the pool said): a
/// wait for a free slot, or the failure.
pub(crate) async fn after_first_look(
    inner: &Inner,
    key: &str,
    wait: PoolWait,
    deadline: Option<Deadline>,
    first: Result<Result<Session, PoolError>, Expired>,
) -> Attempt {
    let settings = inner.settings();
    let pool_size = || pool::max_size(inner.pool());
    let checked_out = match first {
        Ok(Ok(session)) => return Ok(session),
        Err(Expired) => return Err(unreachable(key, deadline, settings.connect_timeout)),
        Ok(Err(error)) if pool::is_busy(&error) => match wait {
            PoolWait::No => {
                let what = "no pool connection was free";
                return Err(pool_exhausted(key, what, pool_size(), None));
            }
            PoolWait::Forever => wait_for_slot(inner).await,
            PoolWait::Until(deadline) => {
                let limit = Deadline::limit(Some(deadline), Duration::ZERO, Duration::ZERO);
                match limit.run(wait_for_slot(inner)).await {
                    Ok(result) => result,
                    Err(Expired) => {
                        let what = format!(
                            "{} waiting for a pool connection",
                            timeout_reason(deadline.timeout)
                        );
                        return Err(pool_exhausted(key, &what, pool_size(), Some(deadline)));
                    }
                }
            }
        },
        Ok(Err(error)) => Err(error),
    };
    match checked_out {
        Ok(object) => Ok(Session::new(object, inner.connections())),
        Err(error) => Err(with_timeout(checkout_error(key, error), deadline)),
    }
}

/// `checkout` made into a [`Session`] of `home`'s where the pool hands the connection
/// over (see [`IntoSession`]).
pub(crate) fn into_session<F>(checkout: F, home: &Arc<Connections>) -> IntoSession<'_, F> {
    IntoSession { checkout, home }
}

pin_project_lite::pin_project! {
    /// A checkout's future that makes the pooled connection into a [`Session`] as it
    /// comes out of the pool: the pooled object (a few hundred bytes) is moved once, into
    /// the session's box, instead of through every layer of future above (the limit,
    /// the acquisition), each move a copy of it.
    pub(crate) struct IntoSession<'h, F> {
        #[pin]
        checkout: F,
        home: &'h Arc<Connections>,
    }
}

impl<F: Future<Output = Result<Pooled, PoolError>>> Future for IntoSession<'_, F> {
    type Output = Result<Session, PoolError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.checkout.poll(cx) {
            Poll::Ready(Ok(object)) => Poll::Ready(Ok(Session::new(object, this.home))),
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Waits for a free pool slot for as long as it takes; a connection opened for it
/// is bounded by the connect timeout where the pool has a runtime for timeouts.
async fn wait_for_slot(inner: &Inner) -> Result<Pooled, PoolError> {
    let settings = inner.settings();
    pool::free_slot(
        inner.pool(),
        settings.connect_timeout,
        settings.answer_timeout,
    )
    .await
}
