//! The leader board of a table: the latest term of each election, shared by every
//! manager on the table as the board's table is by every process on one database.

use locks_port::time::OffsetDateTime;
use locks_port::{
    LeaderBoard, LockAcquisitionError, Proclamation, check_board_name, check_published_value,
};

use crate::InMemoryLockManager;

/// Terms are recorded on the manager's table, with its holder id, at the system clock's
/// time. Never fails for a valid name and value (there is no backend to fail).
impl LeaderBoard for InMemoryLockManager {
    async fn proclaim(
        &self,
        name: &str,
        value: &str,
    ) -> Result<Proclamation, LockAcquisitionError> {
        check_board_name(name)?;
        check_published_value(name, value)?;
        let holder_id = self.holder_id().map(str::to_owned);
        Ok(self.inner.table.inner.terms.with(|terms| {
            let term = terms
                .get(name)
                .map_or(1, |last| last.term.saturating_add(1));
            let proclaimed = Proclamation::new(
                term,
                holder_id,
                value.to_owned(),
                locks_port::stored_time(OffsetDateTime::now_utc()),
                false,
            );
            terms.insert(name.to_owned(), proclaimed.clone());
            proclaimed
        }))
    }

    async fn retire(&self, name: &str, term: u64) -> Result<(), LockAcquisitionError> {
        check_board_name(name)?;
        self.inner.table.inner.terms.with(|terms| {
            if let Some(latest) = terms.get_mut(name)
                && latest.term == term
            {
                latest.retired = true;
            }
        });
        Ok(())
    }

    async fn latest(&self, name: &str) -> Result<Option<Proclamation>, LockAcquisitionError> {
        check_board_name(name)?;
        Ok(self
            .inner
            .table
            .inner
            .terms
            .with(|terms| terms.get(name).cloned()))
    }
}
