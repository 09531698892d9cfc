//! The migration records' contract, one case that every [`MigrationRepository`] runs:
//! the in-memory records in this crate's tests, the PostgreSQL ones in
//! `migration-cutover-postgres`'s. A test on the in-memory records sees the refusals
//! production makes.

use time::{Date, Duration, Month, OffsetDateTime, Time, UtcOffset};
use uuid::Uuid;

use super::contract::{Broken, Case, Expect, describe};
use crate::{Migration, MigrationRepository, Phase, RepositoryError};

/// What every refusal of a save names.
const SAVE: &str = "migration save";

/// The words of a refused timestamp, PostgreSQL's (`timestamptz`'s range).
const OUT_OF_RANGE: &str = "timestamp out of range";

/// The words of refused text, PostgreSQL's (`text` cannot hold a NUL byte).
const NUL: &str = "0x00";

/// A new record (a new id, of a new tenant) in `phase`, stamped at a whole second, which
/// every repository keeps exactly.
fn record(phase: Phase) -> Migration {
    let at = OffsetDateTime::from_unix_timestamp(1_765_000_000).expect("a time in range");
    Migration {
        id: Uuid::new_v4(),
        tenant_id: Uuid::new_v4(),
        source_store_id: "shared".into(),
        target_store_id: "dedicated".into(),
        phase,
        events_copied: 0,
        created_at: at,
        updated_at: at,
        last_error: None,
    }
}

/// The earliest instant a record's times may name: PostgreSQL's `timestamptz` begins at
/// 4714-11-24 00:00 UTC BC (the year -4713).
fn earliest() -> OffsetDateTime {
    let day = Date::from_calendar_date(-4713, Month::November, 24).expect("a date in range");
    day.with_time(Time::MIDNIGHT).assume_utc()
}

/// Whether `error` is a refused save whose words hold `words`.
fn refused_with(error: &RepositoryError, words: &str) -> bool {
    error.what() == SAVE && error.to_string().contains(words)
}

impl Case<Migration> {
    /// A record in phase `from`, to be saved over by itself moved on to `to`, one more
    /// second later, with events copied and an error.
    fn moved(name: String, from: Phase, to: Phase, expect: Expect) -> Self {
        let stored = record(from);
        let next = Migration {
            phase: to,
            events_copied: 7,
            updated_at: stored.updated_at + Duration::SECOND,
            last_error: Some("the next save".into()),
            ..stored.clone()
        };
        Self {
            name,
            stored,
            next,
            expect,
        }
    }

    /// A `pending` record, to be saved over by `change` of it, which the contract
    /// refuses.
    fn refused(name: &str, change: impl FnOnce(&mut Migration)) -> Self {
        let stored = record(Phase::Pending);
        let mut next = stored.clone();
        change(&mut next);
        Self {
            name: name.to_owned(),
            stored,
            next,
            expect: Expect::Refused,
        }
    }

    /// `save` of `next` over `stored`, saved first (a record not stored yet is inserted
    /// in any phase); a refusal must pass `refusal`.
    async fn save<M: MigrationRepository>(
        &self,
        migrations: &M,
        broken: &mut Broken,
        refusal: impl FnOnce(&RepositoryError) -> bool,
    ) {
        let stored = &self.stored;
        migrations
            .save(stored)
            .await
            .unwrap_or_else(|error| panic!("a new record {stored:?}: {error}"));
        let answer = migrations.save(&self.next).await.map(|()| true);
        let now = migrations.get(stored.id).await.expect("migration read");
        self.answered(broken, answer, now, refusal);
    }

    /// `save` of `next` as a new record (under a new id), which the contract refuses:
    /// the refusal must pass `refusal`, and nothing be stored.
    async fn insert<M: MigrationRepository>(
        &self,
        migrations: &M,
        broken: &mut Broken,
        refusal: impl FnOnce(&RepositoryError) -> bool,
    ) {
        let new = Migration {
            id: Uuid::new_v4(),
            ..self.next.clone()
        };
        let answer = migrations.save(&new).await;
        let now = migrations.get(new.id).await.expect("migration read");
        let holds = matches!(&answer, Err(error) if refusal(error)) && now.is_none();
        broken.check(holds, || {
            let (name, answer) = (&self.name, describe(&answer));
            format!(
                "{name}, as a new record: Refused by the contract, answered {answer}, \
                 stored now {now:?}"
            )
        });
    }
}

/// A record stamped at the earliest instant a store keeps is saved, and read back so.
async fn the_earliest_instant_is_kept<M: MigrationRepository>(migrations: &M, broken: &mut Broken) {
    let earliest = Migration {
        created_at: earliest(),
        updated_at: earliest(),
        ..record(Phase::Pending)
    };
    let answer = migrations.save(&earliest).await;
    let now = migrations.get(earliest.id).await;
    let holds = answer.is_ok() && matches!(&now, Ok(Some(now)) if *now == earliest);
    broken.check(holds, || {
        let answer = describe(&answer);
        format!("a record stamped at the earliest instant: answered {answer}, read {now:?}")
    });
}

/// A record stamped in another offset than UTC, below the microsecond, and with more
/// events than a `bigint` holds reads back as [`Migration::as_stored`] says: in UTC, to
/// the microsecond, the count at `i64::MAX`; before 2000 too, where that is the later
/// microsecond (as the driver binds such a time: [`locks_port::stored_time`]).
async fn a_record_reads_back_as_stored<M: MigrationRepository>(
    migrations: &M,
    broken: &mut Broken,
) {
    let offset = UtcOffset::from_hms(2, 0, 0).expect("an offset");
    let at = |nanos| {
        OffsetDateTime::from_unix_timestamp_nanos(nanos)
            .expect("a time in range")
            .to_offset(offset)
    };
    // 2025-12-06, then 500 ns before 2000-01-01 and 999 ns before 1970-01-01 (UTC).
    let stamps = [
        (at(1_765_000_000_123_456_789), at(1_765_000_000_123_457_788)),
        (at(946_684_799_999_999_500), at(-999)),
    ];
    for (created_at, updated_at) in stamps {
        let saved = Migration {
            events_copied: u64::MAX,
            created_at,
            updated_at,
            ..record(Phase::Pending)
        };
        let answer = migrations.save(&saved).await;
        let now = migrations.get(saved.id).await;
        let expected = saved.as_stored();
        let holds = answer.is_ok() && matches!(&now, Ok(Some(now)) if *now == expected);
        broken.check(holds, || {
            let answer = describe(&answer);
            format!(
                "a record stamped {created_at} and {updated_at} with u64::MAX events: \
                 answered {answer}, read {now:?}, expected {expected:?}"
            )
        });
    }
}

/// The migration records' contract on `migrations` (fresh ids, so a shared table
/// serves):
///
/// - a record not stored yet is inserted by [`save`](MigrationRepository::save) in any
///   phase, and [`get`](MigrationRepository::get) reads it back as
///   [`Migration::as_stored`] says (times in UTC to the microsecond, the count of
///   events at most `i64::MAX`); an id not stored reads `None`;
/// - `save` replaces the stored record only if it keeps the phase or the [`Phase`]
///   machine lets it follow (so nothing leaves `completed`, `aborted` or `failed`); else
///   a [`RepositoryError`] of `"migration save"` naming the stored phase, record
///   unchanged;
/// - a record whose store ids or last error hold a NUL byte, or whose times fall before
///   4714-11-24 00:00 UTC BC (PostgreSQL's `timestamptz` starts there; the earliest
///   instant itself is kept), is refused with a [`RepositoryError`] of
///   `"migration save"` (its words hold `0x00`, or `timestamp out of range`):
///   nothing is inserted, the stored record is unchanged.
///
/// # Panics
/// Listing every case that broke.
pub async fn migration_contract<M: MigrationRepository>(migrations: &M) {
    let mut broken = Broken::default();
    for from in Phase::ALL {
        for to in Phase::ALL {
            let expect = if from == to || from.can_transition_to(to) {
                Expect::Written
            } else {
                Expect::Refused
            };
            let case = Case::moved(format!("save `{to}` over `{from}`"), from, to, expect);
            let from = format!("`{from}`");
            let refusal = |error: &RepositoryError| refused_with(error, &from);
            case.save(migrations, &mut broken, refusal).await;
        }
    }
    for (case, words) in refused_records() {
        let refusal = |error: &RepositoryError| refused_with(error, words);
        case.save(migrations, &mut broken, refusal).await;
        case.insert(migrations, &mut broken, refusal).await;
    }
    the_earliest_instant_is_kept(migrations, &mut broken).await;
    a_record_reads_back_as_stored(migrations, &mut broken).await;
    let nobody = migrations.get(Uuid::new_v4()).await;
    broken.check(matches!(nobody, Ok(None)), || {
        format!("a record never saved: read {nobody:?}")
    });
    broken.assert_none("migration records'");
}

/// Records the repository refuses, as a save over a stored `pending` record, and the
/// words of the refusal.
fn refused_records() -> Vec<(Case<Migration>, &'static str)> {
    let before = earliest() - Duration::SECOND;
    let first_day = Date::MIN.with_time(Time::MIDNIGHT).assume_utc();
    vec![
        (
            Case::refused("a source store id holding a NUL byte", |next| {
                next.source_store_id = "sha\0red".into();
            }),
            NUL,
        ),
        (
            Case::refused("a target store id holding a NUL byte", |next| {
                next.target_store_id = "dedi\0cated".into();
            }),
            NUL,
        ),
        (
            Case::refused("a last error holding a NUL byte", |next| {
                next.last_error = Some("bad\0words".into());
            }),
            NUL,
        ),
        (
            Case::refused("created a second before 4714-11-24 BC", |next| {
                next.created_at = before;
            }),
            OUT_OF_RANGE,
        ),
        (
            Case::refused("updated a second before 4714-11-24 BC", |next| {
                next.updated_at = before;
            }),
            OUT_OF_RANGE,
        ),
        (
            Case::refused("created on the first day `time` knows", |next| {
                next.created_at = first_day;
            }),
            OUT_OF_RANGE,
        ),
    ]
}
