//! The race on the in-memory lock manager: instances share one lock table, as processes
//! share one database.

use std::future::{Future, ready};

use locks_memory::{InMemoryLockManager, InMemoryLockTable};

use crate::harness::{Backend, a_lock_that_does_not_exclude_is_caught, exactly_one_cuts_over};

#[derive(Debug, Default)]
struct Memory {
    table: InMemoryLockTable,
}

impl Backend for Memory {
    type Lock = InMemoryLockManager;

    fn instance(&self, name: &str) -> impl Future<Output = Self::Lock> + Send {
        ready(self.table.manager_with_holder_id(name))
    }

    /// Every lock held or waited for on the table (the race's is the only key).
    fn leftover(&self, _key: &str) -> impl Future<Output = usize> + Send {
        ready(self.table.len())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_in_memory_instances_race_and_exactly_one_cuts_over() {
    exactly_one_cuts_over("in-memory", &Memory::default(), 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_an_in_memory_lock_that_does_not_exclude_the_race_sees_a_double_cutover() {
    a_lock_that_does_not_exclude_is_caught("in-memory", Memory::default(), 2).await;
}
