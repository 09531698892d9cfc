//! The migration records, shared by every instance, with the phase machine checked in SQL.

use std::fmt;

use deadpool_postgres::Pool;
use locks_port::uuid::Uuid;
use migration_cutover::{Migration, MigrationRepository, Phase, RepositoryError, StoreId};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::TableName;
use crate::db::{DbFailure, repository_query};

/// A [`MigrationRepository`] on the fleet's `migrations` table (see
/// [`install_fleet`](crate::install_fleet)).
///
/// [`save`](MigrationRepository::save) is an upsert whose `UPDATE` runs only `WHERE
/// phase = ANY(phases that may be followed by the new one)` ([`Phase`]'s machine, plus
/// staying in the same phase): a stale instance cannot move a `completed` or `aborted`
/// migration anywhere. [`transition`](Self::transition) is a compare-and-set on the
/// phase. A refused write is a [`RepositoryError`] naming the stored phase. The
/// in-memory records refuse the same saves
/// (`migration_cutover::testing::migration_contract` runs on both).
#[derive(Clone)]
pub struct PostgresMigrationRepository {
    pool: Pool,
    table: TableName,
    get: String,
    save: String,
    transition: String,
}

impl fmt::Debug for PostgresMigrationRepository {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresMigrationRepository")
            .field("table", &self.table.to_string())
            .finish_non_exhaustive()
    }
}

fn read_error(words: String) -> RepositoryError {
    RepositoryError::new("migration read", words)
}

fn phase(text: &str) -> Result<Phase, RepositoryError> {
    Phase::ALL
        .into_iter()
        .find(|phase| phase.as_str() == text)
        .ok_or_else(|| read_error(format!("unknown phase {text:?}")))
}

/// The phases a record in `next` may be saved over ([`Phase::may_replace`]).
fn phase_predecessors(next: Phase) -> Vec<&'static str> {
    Phase::ALL
        .into_iter()
        .filter(|stored| next.may_replace(*stored))
        .map(Phase::as_str)
        .collect()
}

const VALUES: &str = "$1::text::uuid, $2::text::uuid, $3, $4, $5, $6, $7, $8, $9";

impl PostgresMigrationRepository {
    /// The repository on `table` through `pool` (no I/O).
    #[must_use]
    pub fn new(pool: Pool, table: TableName) -> Self {
        let t = table.quoted();
        let set = "tenant_id = EXCLUDED.tenant_id, source_store_id = EXCLUDED.source_store_id,
             target_store_id = EXCLUDED.target_store_id, phase = EXCLUDED.phase,
             events_copied = EXCLUDED.events_copied, created_at = EXCLUDED.created_at,
             updated_at = EXCLUDED.updated_at, last_error = EXCLUDED.last_error";
        let columns = "id, tenant_id, source_store_id, target_store_id, phase, events_copied, \
                       created_at, updated_at, last_error";
        Self {
            get: format!(
                "SELECT id::text, tenant_id::text, source_store_id, target_store_id, phase,
                     events_copied,
                     created_at, updated_at, last_error
                 FROM {t} WHERE id = $1::text::uuid"
            ),
            save: format!(
                "INSERT INTO {t} AS m ({columns}) VALUES ({VALUES})
                 ON CONFLICT (id) DO UPDATE SET {set}
                 WHERE m.phase = ANY($10::text[])
                 RETURNING 1"
            ),
            transition: format!(
                "INSERT INTO {t} AS m ({columns}) VALUES ({VALUES})
                 ON CONFLICT (id) DO UPDATE SET {set}
                 WHERE m.phase = $10
                 RETURNING 1"
            ),
            pool,
            table,
        }
    }

    /// The table.
    #[must_use]
    pub fn table(&self) -> &TableName {
        &self.table
    }

    async fn write(
        &self,
        what: &'static str,
        sql: &str,
        migration: &Migration,
        condition: &(dyn ToSql + Sync),
    ) -> Result<bool, RepositoryError> {
        // As every repository keeps it (the in-memory records too).
        let migration = &migration.as_stored();
        let copied = i64::try_from(migration.events_copied).unwrap_or(i64::MAX);
        let (id, tenant) = (
            migration.id.hyphenated().to_string(),
            migration.tenant_id.hyphenated().to_string(),
        );
        let params: [&(dyn ToSql + Sync); 10] = [
            &id,
            &tenant,
            &migration.source_store_id.as_str(),
            &migration.target_store_id.as_str(),
            &migration.phase.as_str(),
            &copied,
            &migration.created_at,
            &migration.updated_at,
            &migration.last_error,
            condition,
        ];
        let rows = repository_query(&self.pool, what, sql, &params).await?;
        Ok(!rows.is_empty())
    }

    /// Writes `migration` only if the stored record is in phase `from` now (and
    /// `from → migration.phase` is a transition, or the same phase). Returns whether it
    /// was written: `false` means another instance moved the record first. A record not
    /// stored yet is inserted.
    ///
    /// # Errors
    /// [`RepositoryError`] when `from → migration.phase` is not a transition, or on a
    /// backend failure.
    pub async fn transition(
        &self,
        from: Phase,
        migration: &Migration,
    ) -> Result<bool, RepositoryError> {
        const WHAT: &str = "migration transition";
        if from != migration.phase {
            from.transition_to(migration.phase)
                .map_err(|error| RepositoryError::new(WHAT, error))?;
        }
        self.write(WHAT, &self.transition, migration, &from.as_str())
            .await
    }

    fn migration(row: &Row) -> Result<Migration, RepositoryError> {
        let id = |index: usize| {
            let text: &str = row.get(index);
            Uuid::parse_str(text).map_err(|error| read_error(format!("id {text:?}: {error}")))
        };
        Ok(Migration {
            id: id(0)?,
            tenant_id: id(1)?,
            source_store_id: StoreId::new(row.get::<_, String>(2)),
            target_store_id: StoreId::new(row.get::<_, String>(3)),
            phase: phase(row.get(4))?,
            events_copied: u64::try_from(row.get::<_, i64>(5)).unwrap_or(0),
            created_at: row
                .try_get(6)
                .map_err(|error| read_error(error.to_string()))?,
            updated_at: row
                .try_get(7)
                .map_err(|error| read_error(error.to_string()))?,
            last_error: row.get(8),
        })
    }
}

impl MigrationRepository for PostgresMigrationRepository {
    async fn get(&self, id: Uuid) -> Result<Option<Migration>, RepositoryError> {
        const WHAT: &str = "migration read";
        let id = id.hyphenated().to_string();
        let rows = repository_query(&self.pool, WHAT, &self.get, &[&id]).await?;
        rows.first().map(Self::migration).transpose()
    }

    async fn save(&self, migration: &Migration) -> Result<(), RepositoryError> {
        const WHAT: &str = "migration save";
        let allowed = phase_predecessors(migration.phase);
        if self.write(WHAT, &self.save, migration, &allowed).await? {
            return Ok(());
        }
        let stored = self.get(migration.id).await?;
        let words = format!(
            "refused by the database: migration {} is `{}`; `{}` cannot follow it",
            migration.id,
            stored.map_or("gone", |stored| stored.phase.as_str()),
            migration.phase
        );
        Err(RepositoryError::new(WHAT, DbFailure::refused("", words)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_phases_have_no_other_predecessor() {
        assert_eq!(phase_predecessors(Phase::Pending), ["pending"]);
        assert_eq!(
            phase_predecessors(Phase::Cutover),
            ["dual_write", "cutover"]
        );
        assert_eq!(
            phase_predecessors(Phase::Completed),
            ["cutover", "completed"]
        );
    }
}
