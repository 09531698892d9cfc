//! Waits a member keeps from one tick to the next, one per key (a shard it claims, a
//! member it watches), each given up as soon as a tick no longer wants it.

use std::collections::BTreeMap;
use std::future::Future;

use futures_util::StreamExt;
use futures_util::future::{AbortHandle, BoxFuture, abortable};
use futures_util::stream::FuturesUnordered;

/// Futures keyed by `K`, polled together; one per key at a time.
pub(crate) struct Waits<'s, K, T> {
    waiting: FuturesUnordered<BoxFuture<'s, Option<(u64, K, T)>>>,
    handles: BTreeMap<K, (u64, AbortHandle)>,
    next_id: u64,
}

impl<K, T> Default for Waits<'_, K, T> {
    fn default() -> Self {
        Self {
            waiting: FuturesUnordered::new(),
            handles: BTreeMap::new(),
            next_id: 0,
        }
    }
}

impl<'s, K: Ord + Copy + Send + 's, T: Send + 's> Waits<'s, K, T> {
    pub(crate) fn contains(&self, key: K) -> bool {
        self.handles.contains_key(&key)
    }

    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    pub(crate) fn keys(&self) -> Vec<K> {
        self.handles.keys().copied().collect()
    }

    /// Gives up every wait but those on `keep`.
    pub(crate) fn keep_only(&mut self, keep: &[K]) {
        self.handles.retain(|key, (_, handle)| {
            let kept = keep.contains(key);
            if !kept {
                handle.abort();
            }
            kept
        });
    }

    /// Waits on `key` (which must not be waited on already).
    pub(crate) fn push(&mut self, key: K, wait: impl Future<Output = T> + Send + 's) {
        let (wait, handle) = abortable(wait);
        let id = self.next_id;
        self.next_id += 1;
        self.handles.insert(key, (id, handle));
        self.waiting.push(Box::pin(async move {
            wait.await.ok().map(|out| (id, key, out))
        }));
    }

    /// The next wait that came to an end, with its key; pending while there is none. A
    /// wait given up ends without a word.
    pub(crate) async fn next(&mut self) -> (K, T) {
        loop {
            match self.waiting.next().await {
                Some(Some((id, key, out))) => {
                    if self.handles.get(&key).is_some_and(|(kept, _)| *kept == id) {
                        self.handles.remove(&key);
                    }
                    return (key, out);
                }
                Some(None) => {}
                None => return std::future::pending().await,
            }
        }
    }
}

impl<K: std::fmt::Debug, T> std::fmt::Debug for Waits<'_, K, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.handles.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_given_up_ends_without_a_word_and_the_others_go_on() {
        let mut waits: Waits<'_, u32, &str> = Waits::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        waits.push(1, async {
            std::future::pending::<()>().await;
            "never"
        });
        waits.push(2, async {
            let _ = rx.await;
            "two"
        });
        assert_eq!((waits.len(), waits.keys()), (2, vec![1, 2]));
        waits.keep_only(&[2]);
        assert!(!waits.contains(1) && waits.contains(2));
        tx.send(()).expect("sent");
        assert_eq!(waits.next().await, (2, "two"));
        assert_eq!(waits.len(), 0);
        let nothing =
            tokio::time::timeout(std::time::Duration::from_millis(20), waits.next()).await;
        assert!(nothing.is_err(), "pending while there is none");
    }
}
