//! A small deterministic generator for the adapters' randomised tests (random subsets
//! of keys in random order), so a failing run can be replayed from its seed.

/// A linear congruential generator: deterministic, no dependencies, not for anything
/// but tests.
///
/// ```
/// use locks_conformance::Lcg;
///
/// let keys: Vec<String> = (0..10).map(|n| format!("key:{n}")).collect();
/// let subset = Lcg::new(7).subset(&keys, 2, 5);
/// assert!((2..=5).contains(&subset.len()));
/// assert_eq!(subset, Lcg::new(7).subset(&keys, 2, 5), "the same seed, the same subset");
/// ```
#[derive(Debug, Clone)]
pub struct Lcg(u64);

impl Lcg {
    /// A generator started from `seed`.
    #[must_use]
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A number in `0..below` (`0` when `below` is `0`).
    pub fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let below = u64::try_from(below).unwrap_or(u64::MAX).max(1);
        usize::try_from((self.0 >> 33) % below).unwrap_or(0)
    }

    /// Between `min` and `max` distinct keys of `keys` (as many as there are, at most),
    /// in random order.
    pub fn subset<'k>(&mut self, keys: &'k [String], min: usize, max: usize) -> Vec<&'k str> {
        let size = (min + self.next(max.saturating_sub(min) + 1)).min(keys.len());
        let mut subset: Vec<&str> = Vec::with_capacity(size);
        while subset.len() < size {
            let key = keys[self.next(keys.len())].as_str();
            if !subset.contains(&key) {
                subset.push(key);
            }
        }
        subset
    }
}
