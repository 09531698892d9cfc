//! The lock ids of recently used keys. Deriving a lock id hashes the key with
//! SHA-256 (bit-exact with the Python original); services lock the same few keys
//! again and again, so a manager remembers the last ones it derived.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use locks_port::KeyDerivation;

/// How many keys a manager remembers. Past that the cache starts again empty: at most
/// this many keys' text (plus about 40 bytes each) stays in memory.
pub(crate) const CAPACITY: usize = 1024;

/// A manager's derivation and its cache of derived ids.
#[derive(Debug)]
pub(crate) struct LockIds {
    derivation: KeyDerivation,
    /// The keys are shared: a grant's [`LockInfo`](locks_port::LockInfo) and the
    /// bookkeeping take a clone of the cached one instead of copying the text.
    recent: Mutex<HashMap<Arc<str>, i64, foldhash::fast::RandomState>>,
}

impl LockIds {
    pub(crate) fn new(derivation: KeyDerivation) -> Self {
        Self {
            derivation,
            recent: Mutex::default(),
        }
    }

    pub(crate) fn derivation(&self) -> KeyDerivation {
        self.derivation
    }

    /// The lock id of `key`, as [`KeyDerivation::lock_id`] derives it.
    pub(crate) fn lock_id(&self, key: &str) -> i64 {
        self.lookup(key).0
    }

    /// The lock id of `key` and the key as a shared string.
    pub(crate) fn lookup(&self, key: &str) -> (i64, Arc<str>) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((shared, &lock_id)) = recent.get_key_value(key) {
            return (lock_id, Arc::clone(shared));
        }
        let lock_id = self.derivation.lock_id(key);
        if recent.len() >= CAPACITY {
            recent.clear();
        }
        let shared: Arc<str> = Arc::from(key);
        recent.insert(Arc::clone(&shared), lock_id);
        (lock_id, shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_ids_are_the_derived_ones_past_the_capacity() {
        for derivation in [KeyDerivation::CURRENT] {
            let ids = LockIds::new(derivation);
            for round in 0..2 {
                for n in 0..CAPACITY + 10 {
                    let key = format!("tenant:{n}");
                    assert_eq!(ids.lock_id(&key), derivation.lock_id(&key), "{round} {key}");
                }
            }
            assert!(ids.recent.lock().unwrap().len() <= CAPACITY);
        }
    }
}
