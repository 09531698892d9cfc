//! The nightly job: one instance of the fleet runs it, the others skip it.
use std::time::Duration;

use locks_postgres::prelude::*;

#[derive(Debug, PartialEq)]
pub enum Outcome {
    Done,
    Skipped,
    Lost(LostReason),
}

/// Generic over the manager, so a unit test runs it on the in-memory double.
pub async fn nightly<L: DistributedLock>(locks: &L) -> Result<Outcome, LockAcquisitionError> {
    let Some(guard) = locks.try_acquire("job:nightly").await? else {
        return Ok(Outcome::Skipped); // another instance is running it
    };
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(2)) => {} // ... the job ...
        reason = guard.lost() => return Ok(Outcome::Lost(reason)), // stop: no lock, no job
    }
    guard.release().await;
    Ok(Outcome::Done)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL").unwrap_or("postgres://app@localhost/app".into());
    let pool = locks_postgres::plain_pool(&url, 4)?; // each held lock keeps a connection
    let locks = PostgresLockManager::builder(pool)
        .holder_id("nightly-1")
        .build();
    println!("{:?}", nightly(&locks).await?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use locks_memory::InMemoryLockManager;

    use super::*;

    #[tokio::test]
    async fn a_lost_lock_stops_the_job() {
        let locks = InMemoryLockManager::new();
        let lose = async {
            while !locks.is_held("job:nightly") {
                tokio::task::yield_now().await;
            }
            locks.lose("job:nightly", LostReason::ConnectionClosed)
        };
        let (outcome, lost) = tokio::join!(nightly(&locks), lose);
        assert!(lost);
        assert_eq!(
            outcome.unwrap(),
            Outcome::Lost(LostReason::ConnectionClosed)
        );
    }

    #[tokio::test]
    async fn a_running_job_is_skipped_and_errors_reach_the_caller() {
        let locks = InMemoryLockManager::new();
        let _other_instance = locks.try_acquire("job:nightly").await.unwrap();
        assert_eq!(nightly(&locks).await.unwrap(), Outcome::Skipped);
        locks.fail_next_acquire(AcquisitionErrorKind::Unreachable);
        let error = nightly(&locks).await.unwrap_err();
        assert_eq!(error.kind(), AcquisitionErrorKind::Unreachable);
    }
}
