//! Schedules and their slots: a fixed period from the Unix epoch plus an offset, or a cron
//! expression, always evaluated in UTC on the clock the caller passes (the ledger's).

use std::fmt;
use std::time::Duration;

use time::OffsetDateTime;

/// The shortest period a schedule accepts.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// The longest period a schedule accepts (366 days).
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// How many slots back [`Schedule::slots_between`] counts at most.
pub const MAX_COUNTED_SLOTS: u64 = 100_000;

/// When a job is due: a fixed period with an offset, or a cron expression.
///
/// A period divides time since the Unix epoch: `every 2s` has slots starting at even
/// seconds, `every 1h at :05` at five past each hour (UTC). Cron expressions are read by
/// [`croner`] (five fields, or six with seconds first) and evaluated in UTC. The clock
/// that names the current slot is the ledger's (the database's), never the host's.
///
/// ```
/// use locks_schedule::Schedule;
///
/// let hourly: Schedule = "every 1h at :05".parse().unwrap();
/// let fast: Schedule = "2s".parse().unwrap();
/// let nightly: Schedule = "30 2 * * *".parse().unwrap();
/// let t = time::macros::datetime!(2026-12-04 06:17:31.5 UTC);
/// assert_eq!(hourly.slot_at(t).unwrap().start(), time::macros::datetime!(2026-12-04 06:05 UTC));
/// assert_eq!(fast.slot_at(t).unwrap().start(), time::macros::datetime!(2026-12-04 06:17:30 UTC));
/// assert_eq!(nightly.slot_at(t).unwrap().start(), time::macros::datetime!(2026-12-04 02:30 UTC));
/// assert!("every 0s".parse::<Schedule>().is_err());
/// ```
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
    text: String,
}

#[derive(Clone)]
enum Kind {
    Every { period: i128, offset: i128 },
    Cron(Box<croner::Cron>),
}

/// One occurrence of a schedule: from its start (its name) to the next slot's start.
///
/// Shown (`Display`) as its start in RFC 3339 to the microsecond, UTC
/// (`2026-12-05T05:57:40.000000Z`): the form in lock keys and `PGLOCK_SLOT`, so it never
/// changes. `Debug` shows both ends in RFC 3339 too.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    start: OffsetDateTime,
    next: OffsetDateTime,
}

impl Slot {
    /// A slot from `start` up to (not including) `next`, both kept in UTC (the slot's
    /// name is its start in UTC, whatever offset `start` has).
    ///
    /// # Errors
    /// [`ScheduleError`] when `next` is not after `start`, or either is beyond the dates
    /// `time` represents once in UTC.
    pub fn new(start: OffsetDateTime, next: OffsetDateTime) -> Result<Self, ScheduleError> {
        let refuse = |reason: &str| {
            ScheduleError::new(format!("{}..{}", rfc3339(start), rfc3339(next)), reason)
        };
        if next <= start {
            return Err(refuse("a slot must end after it starts"));
        }
        let utc = |t: OffsetDateTime| t.checked_to_offset(time::UtcOffset::UTC);
        let (Some(start), Some(next)) = (utc(start), utc(next)) else {
            return Err(refuse(
                "a slot must be within the dates time represents in UTC",
            ));
        };
        Ok(Self { start, next })
    }

    /// When the slot starts: its name in the ledger.
    #[must_use]
    pub fn start(&self) -> OffsetDateTime {
        self.start
    }

    /// When the next slot starts.
    #[must_use]
    pub fn next(&self) -> OffsetDateTime {
        self.next
    }

    /// Whether `t` falls in the slot.
    #[must_use]
    pub fn contains(&self, t: OffsetDateTime) -> bool {
        self.start <= t && t < self.next
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("start", &format_args!("{}", rfc3339(self.start)))
            .field("next", &format_args!("{}", rfc3339(self.next)))
            .finish()
    }
}

/// `t` in RFC 3339, UTC (`2026-12-05T05:57:40Z`, a fraction only when there is one): how
/// this crate shows a time to people, instead of `OffsetDateTime`'s own
/// `2026-12-05 5:57:40.0 +00:00:00`. Years beyond RFC 3339's four digits fall back to
/// that form.
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    // `to_offset` panics when the date in UTC is beyond `time`'s range (the last hours of
    // year 9999 west of UTC, the first of year -9999 east of it): those show as they are.
    t.checked_to_offset(time::UtcOffset::UTC)
        .and_then(|utc| {
            utc.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| t.to_string())
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&slot_name(self.start))
    }
}

/// The name of the slot starting at `start`: its start in RFC 3339 to the microsecond,
/// UTC (`2026-12-05T05:57:40.000000Z`), as [`Slot`] shows itself. The name depends on
/// the start alone, so a slot's lock key is the same under any schedule.
pub(crate) fn slot_name(start: OffsetDateTime) -> String {
    let start = start
        .checked_to_offset(time::UtcOffset::UTC)
        .unwrap_or(start);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        start.year(),
        u8::from(start.month()),
        start.day(),
        start.hour(),
        start.minute(),
        start.second(),
        start.microsecond()
    )
}

/// A schedule that could not be parsed or evaluated; names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid schedule {input:?}: {reason}")]
pub struct ScheduleError {
    input: String,
    reason: String,
}

impl ScheduleError {
    pub(crate) fn new(input: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            input: input.into(),
            reason: reason.into(),
        }
    }

    /// The text (or value) that was refused.
    #[must_use]
    pub fn input(&self) -> &str {
        &self.input
    }

    /// Why.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl Schedule {
    /// Slots of `period` from the Unix epoch (offset zero).
    ///
    /// # Errors
    /// [`ScheduleError`] when `period` is outside [`MIN_PERIOD`]..=[`MAX_PERIOD`] or not a
    /// whole number of microseconds (the ledger's resolution).
    pub fn every(period: Duration) -> Result<Self, ScheduleError> {
        let text = format!("every {period:?}");
        if !(MIN_PERIOD..=MAX_PERIOD).contains(&period) {
            return Err(ScheduleError::new(
                text,
                format!("the period must be from {MIN_PERIOD:?} to {MAX_PERIOD:?}"),
            ));
        }
        if !period.subsec_nanos().is_multiple_of(1000) {
            return Err(ScheduleError::new(
                text,
                "the period must be a whole number of microseconds",
            ));
        }
        Ok(Self {
            kind: Kind::Every {
                period: i128::try_from(period.as_nanos()).unwrap_or(i128::MAX),
                offset: 0,
            },
            text,
        })
    }

    /// The same period, its slots starting `offset` after each multiple of the period.
    ///
    /// # Errors
    /// [`ScheduleError`] when `offset` is not shorter than the period, not a whole number
    /// of microseconds, or the schedule is a cron expression.
    pub fn at(self, offset: Duration) -> Result<Self, ScheduleError> {
        let Kind::Every { period, .. } = self.kind else {
            return Err(ScheduleError::new(
                self.text,
                "an offset applies to a period, not to a cron expression",
            ));
        };
        let text = format!("{} at +{offset:?}", self.text);
        let nanos = i128::try_from(offset.as_nanos()).unwrap_or(i128::MAX);
        if nanos >= period || !offset.subsec_nanos().is_multiple_of(1000) {
            return Err(ScheduleError::new(
                text,
                "the offset must be shorter than the period, in whole microseconds",
            ));
        }
        Ok(Self {
            kind: Kind::Every {
                period,
                offset: nanos,
            },
            text,
        })
    }

    /// A cron expression: five fields (minute hour day month weekday) or six with seconds
    /// first, as [`croner`] reads them, evaluated in UTC.
    ///
    /// # Errors
    /// [`ScheduleError`] with croner's reason when the expression is not valid.
    pub fn cron(expression: &str) -> Result<Self, ScheduleError> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expression)
            .map_err(|error| ScheduleError::new(expression, error.to_string()))?;
        Ok(Self {
            kind: Kind::Cron(Box::new(cron)),
            text: expression.to_owned(),
        })
    }

    /// The fixed period, if the schedule is one.
    #[must_use]
    pub fn period(&self) -> Option<Duration> {
        match self.kind {
            Kind::Every { period, .. } => u64::try_from(period).ok().map(Duration::from_nanos),
            Kind::Cron(_) => None,
        }
    }

    /// The slot that contains `t`.
    ///
    /// # Errors
    /// [`ScheduleError`] when a cron expression has no occurrence around `t` (for example
    /// `0 0 30 2 *`, the 30th of February) or `t` is out of the dates it can compute.
    pub fn slot_at(&self, t: OffsetDateTime) -> Result<Slot, ScheduleError> {
        match &self.kind {
            Kind::Every { period, offset } => {
                let since = t.unix_timestamp_nanos() - offset;
                let start = since.div_euclid(*period) * period + offset;
                let slot = (|| {
                    let start = OffsetDateTime::from_unix_timestamp_nanos(start).ok()?;
                    let next = OffsetDateTime::from_unix_timestamp_nanos(
                        start.unix_timestamp_nanos() + period,
                    )
                    .ok()?;
                    Some(Slot { start, next })
                })();
                slot.ok_or_else(|| {
                    ScheduleError::new(&self.text, format!("no slot at {}", rfc3339(t)))
                })
            }
            Kind::Cron(cron) => {
                // Cron has whole seconds; croner rounds a fraction up, so drop it here.
                let at = to_chrono(t.replace_nanosecond(0).unwrap_or(t)).ok_or_else(|| {
                    ScheduleError::new(&self.text, format!("{} is out of range", rfc3339(t)))
                })?;
                let cron_error = |error: croner::errors::CronError| {
                    ScheduleError::new(&self.text, error.to_string())
                };
                let start = cron
                    .find_previous_occurrence(&at, true)
                    .map_err(cron_error)?;
                let next = cron.find_next_occurrence(&at, false).map_err(cron_error)?;
                let (Some(start), Some(next)) = (from_chrono(start), from_chrono(next)) else {
                    return Err(ScheduleError::new(
                        &self.text,
                        format!("no slot at {}", rfc3339(t)),
                    ));
                };
                Slot::new(start, next).map_err(|error| ScheduleError::new(&self.text, error.reason))
            }
        }
    }

    /// The slot before `slot`.
    ///
    /// # Errors
    /// As [`slot_at`](Self::slot_at).
    pub fn previous(&self, slot: &Slot) -> Result<Slot, ScheduleError> {
        let before = slot
            .start
            .checked_sub(time::Duration::microseconds(1))
            .ok_or_else(|| {
                ScheduleError::new(
                    &self.text,
                    format!("no slot before {}", rfc3339(slot.start)),
                )
            })?;
        self.slot_at(before)
    }

    /// How many slots start after `after` and before `before` (both slot starts), counting
    /// at most [`MAX_COUNTED_SLOTS`].
    #[must_use]
    pub fn slots_between(&self, after: OffsetDateTime, before: OffsetDateTime) -> u64 {
        match &self.kind {
            Kind::Every { period, .. } => {
                let gap = (before.unix_timestamp_nanos() - after.unix_timestamp_nanos()) / period;
                u64::try_from(gap - 1).unwrap_or(0).min(MAX_COUNTED_SLOTS)
            }
            Kind::Cron(_) => {
                let mut count = 0;
                let mut at = before;
                while count < MAX_COUNTED_SLOTS {
                    let Some(slot) = (at.checked_sub(time::Duration::microseconds(1)))
                        .and_then(|before| self.slot_at(before).ok())
                    else {
                        break;
                    };
                    if slot.start <= after {
                        break;
                    }
                    count += 1;
                    at = slot.start;
                }
                count
            }
        }
    }
}

fn to_chrono(t: OffsetDateTime) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond())
}

fn from_chrono(t: chrono::DateTime<chrono::Utc>) -> Option<OffsetDateTime> {
    let nanos = i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos());
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

impl Schedule {
    /// The same schedule, shown as `text` (what the user wrote).
    pub(crate) fn with_text(self, text: &str) -> Self {
        Self {
            text: text.to_owned(),
            ..self
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schedule").field(&self.text).finish()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn periods_divide_the_epoch() {
        let schedule: Schedule = "2s".parse().unwrap();
        let slot = schedule
            .slot_at(datetime!(2026-01-01 00:00:03.999 UTC))
            .unwrap();
        assert_eq!(slot.start(), datetime!(2026-01-01 00:00:02 UTC));
        assert_eq!(slot.next(), datetime!(2026-01-01 00:00:04 UTC));
        let before_epoch = schedule
            .slot_at(datetime!(1969-12-31 23:59:59 UTC))
            .unwrap();
        assert_eq!(before_epoch.start(), datetime!(1969-12-31 23:59:58 UTC));
        assert_eq!(
            schedule.previous(&slot).unwrap().start(),
            datetime!(2026-01-01 00:00:00 UTC)
        );
    }

    #[test]
    fn offsets_shift_the_slots() {
        let schedule: Schedule = "every 1d at 02:30".parse().unwrap();
        let slot = schedule.slot_at(datetime!(2026-01-02 01:00 UTC)).unwrap();
        assert_eq!(slot.start(), datetime!(2026-01-01 02:30 UTC));
        let plus: Schedule = "every 1h at +5m".parse().unwrap();
        assert_eq!(
            plus.slot_at(datetime!(2026-01-01 10:04 UTC))
                .unwrap()
                .start(),
            datetime!(2026-01-01 09:05 UTC)
        );
    }

    #[test]
    fn bounds_are_refused_with_the_input_named() {
        for bad in [
            "0s",
            "367d",
            "every 1h at :60",
            "every 1m at :05",
            "every x",
            "1.5s",
            "every 1s at 00:00:01",
        ] {
            let error = bad.parse::<Schedule>().expect_err(bad);
            assert_eq!(error.input(), bad, "{error}");
        }
        assert!("366d".parse::<Schedule>().is_ok());
        assert!("1ms".parse::<Schedule>().is_ok());
        assert!(Schedule::every(Duration::from_nanos(1_500_001)).is_err());
        assert!(Schedule::every(Duration::MAX).is_err());
        assert!("99999999999999999999s".parse::<Schedule>().is_err());
        assert!("61 * * * *".parse::<Schedule>().is_err());
        assert!(
            Schedule::cron("0 0 * * *")
                .unwrap()
                .at(Duration::from_secs(1))
                .is_err()
        );
    }

    #[test]
    fn times_show_in_rfc_3339() {
        let slot = Slot::new(
            datetime!(2026-12-05 05:57:40 UTC),
            datetime!(2026-12-05 05:57:41.5 UTC),
        )
        .unwrap();
        assert_eq!(
            format!("{slot:?}"),
            "Slot { start: 2026-12-05T05:57:40Z, next: 2026-12-05T05:57:41.5Z }"
        );
        assert_eq!(
            slot.to_string(),
            "2026-12-05T05:57:40.000000Z",
            "lock keys keep it"
        );
        let backwards = Slot::new(slot.next(), slot.start()).unwrap_err();
        assert_eq!(
            backwards.input(),
            "2026-12-05T05:57:41.5Z..2026-12-05T05:57:40Z"
        );
        let record = crate::RunRecord::new(
            "job",
            slot.start(),
            "me",
            1,
            datetime!(2026-12-05 05:57:40.25 UTC),
            crate::Outcome::Running,
        );
        let shown = format!("{record:?}");
        assert!(
            shown.contains("slot: 2026-12-05T05:57:40Z, holder: \"me\", attempt: 1, started: 2026-12-05T05:57:40.25Z, finished: None"),
            "{shown}"
        );
        let offset = datetime!(2026-12-05 07:57:40 +02:00);
        assert_eq!(rfc3339(offset), "2026-12-05T05:57:40Z", "always UTC");
    }

    #[test]
    fn extreme_times_are_errors_not_panics() {
        let schedule: Schedule = "every 366d at +365d".parse().unwrap();
        let _ = schedule.slot_at(OffsetDateTime::from_unix_timestamp(253_402_300_799).unwrap());
        let cron = Schedule::cron("0 0 30 2 *").unwrap();
        assert!(cron.slot_at(datetime!(2026-01-01 00:00 UTC)).is_err());
    }

    #[test]
    fn the_slot_before_the_earliest_is_an_error_not_a_panic() {
        let earliest = time::PrimitiveDateTime::MIN.assume_utc();
        let fast: Schedule = "1ms".parse().unwrap();
        let first = fast.slot_at(earliest).expect("the earliest slot");
        assert_eq!(first.start(), earliest);
        let error = fast.previous(&first).expect_err("no slot before the first");
        assert_eq!(error.input(), "1ms");
        let cron = Schedule::cron("* * * * *").unwrap();
        assert_eq!(cron.slots_between(earliest, earliest), 0);
    }

    #[test]
    fn times_off_utc_at_the_edges_are_errors_not_panics() {
        let fast: Schedule = "1ms".parse().unwrap();
        let west = time::PrimitiveDateTime::MAX.assume_offset(time::macros::offset!(-1));
        let east = time::PrimitiveDateTime::MIN.assume_offset(time::macros::offset!(+1));
        for t in [west, east] {
            let error = fast.slot_at(t).expect_err("beyond the dates in UTC");
            assert!(error.reason().starts_with("no slot at "), "{error}");
        }
    }

    #[test]
    fn a_slot_shows_its_start_in_utc_whatever_its_offset() {
        let utc = Slot::new(
            datetime!(2026-12-05 05:57:40 UTC),
            datetime!(2026-12-05 05:57:41 UTC),
        )
        .unwrap();
        let east = Slot::new(
            datetime!(2026-12-05 07:57:40 +02:00),
            datetime!(2026-12-05 07:57:41 +02:00),
        )
        .unwrap();
        assert_eq!(east, utc, "the same instants");
        assert_eq!(east.to_string(), "2026-12-05T05:57:40.000000Z");
        assert_eq!(east.to_string(), utc.to_string(), "one lock key per slot");
        let last = time::PrimitiveDateTime::MAX.assume_offset(time::macros::offset!(-1));
        let beyond = Slot::new(last - time::Duration::hours(1), last).unwrap_err();
        assert_eq!(
            beyond.reason(),
            "a slot must be within the dates time represents in UTC"
        );
    }

    #[test]
    fn counts_stop_at_their_bound() {
        let start = datetime!(2026-01-01 00:00 UTC);
        let day = datetime!(2026-01-02 00:00 UTC);
        let fast: Schedule = "1ms".parse().unwrap();
        assert_eq!(fast.slots_between(start, day), MAX_COUNTED_SLOTS);
        let every_second = Schedule::cron("* * * * * *").unwrap();
        assert_eq!(every_second.slots_between(start, day), 86_399);
        let two_days = datetime!(2026-01-03 00:00 UTC);
        assert_eq!(
            every_second.slots_between(start, two_days),
            MAX_COUNTED_SLOTS
        );
        assert_eq!(fast.slots_between(day, start), 0, "backwards is none");
    }

    #[test]
    fn cron_slots_and_counts() {
        let schedule = Schedule::cron("*/15 * * * *").unwrap();
        let slot = schedule.slot_at(datetime!(2026-01-01 10:20 UTC)).unwrap();
        assert_eq!(slot.start(), datetime!(2026-01-01 10:15 UTC));
        assert_eq!(slot.next(), datetime!(2026-01-01 10:30 UTC));
        assert_eq!(
            schedule.slots_between(
                datetime!(2026-01-01 09:00 UTC),
                datetime!(2026-01-01 10:15 UTC)
            ),
            4
        );
        let every: Schedule = "15m".parse().unwrap();
        assert_eq!(
            every.slots_between(
                datetime!(2026-01-01 09:00 UTC),
                datetime!(2026-01-01 10:15 UTC)
            ),
            4
        );
        assert_eq!(slot.to_string(), "2026-01-01T10:15:00.000000Z");
    }
}
