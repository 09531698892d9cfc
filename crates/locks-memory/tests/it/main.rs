//! The integration tests of `locks-memory`: the port's contract suite, then what only
//! the in-memory manager promises (FIFO order, synchronous drop, table cleanup).

mod conformance;
mod fifo;
mod lifecycle;
mod losses;
mod many;
mod suite_self_check;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Polls `future` once, so that it starts waiting (joins a lock's queue); `true` if it
/// is still pending.
pub(crate) async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}
