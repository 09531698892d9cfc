//! Schedules from text: `2s`, `every 1h at :05`, `every 1d at 02:30`, or cron.

use std::str::FromStr;
use std::time::Duration;

use crate::{Schedule, ScheduleError};

impl FromStr for Schedule {
    type Err = ScheduleError;

    /// `2s`, `every 90s`, `every 1h at :05`, `every 1d at 02:30`, `every 1h30m at +10m`, or
    /// a cron expression (anything with a space that is not `every …`).
    fn from_str(text: &str) -> Result<Self, ScheduleError> {
        let trimmed = text.trim();
        let refuse = |reason: &str| ScheduleError::new(text, reason);
        let period_text = trimmed.strip_prefix("every ").map(str::trim);
        let Some(rest) = period_text.or((!trimmed.contains(' ')).then_some(trimmed)) else {
            return Self::cron(trimmed);
        };
        let (period, offset) = match rest.split_once(" at ") {
            Some((period, offset)) => (period.trim(), Some(offset.trim())),
            None => (rest, None),
        };
        let period = parse_duration(period).ok_or_else(|| {
            refuse("a period is a number and a unit (ms, s, m, h, d), such as 2s or 1h30m")
        })?;
        let schedule = Self::every(period).map_err(|error| refuse(error.reason()))?;
        let schedule = match offset {
            None => schedule,
            Some(offset) => {
                let offset = parse_offset(offset).ok_or_else(|| {
                    refuse("an offset is :MM, :MM:SS, HH:MM, HH:MM:SS or +DURATION")
                })?;
                schedule
                    .at(offset)
                    .map_err(|error| refuse(error.reason()))?
            }
        };
        Ok(schedule.with_text(trimmed))
    }
}

/// `1h30m`, `2s`, `250ms`: numbers each followed by a unit.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return None,
        };
        rest = &rest[unit_len..];
        total = total.checked_add(unit.checked_mul(u32::try_from(number).ok()?)?)?;
    }
    Some(total)
}

fn parse_offset(text: &str) -> Option<Duration> {
    if let Some(duration) = text.strip_prefix('+') {
        return parse_duration(duration);
    }
    let fields: Vec<&str> = text.split(':').collect();
    let number = |field: &str| -> Option<u64> {
        (field.len() == 2 && field.bytes().all(|b| b.is_ascii_digit()))
            .then(|| field.parse().ok())
            .flatten()
    };
    let (hours, minutes, seconds) = match fields.as_slice() {
        ["", minutes] => (0, number(minutes)?, 0),
        ["", minutes, seconds] => (0, number(minutes)?, number(seconds)?),
        [hours, minutes] => (number(hours)?, number(minutes)?, 0),
        [hours, minutes, seconds] => (number(hours)?, number(minutes)?, number(seconds)?),
        _ => return None,
    };
    (minutes < 60 && seconds < 60)
        .then(|| Duration::from_secs(hours * 3600 + minutes * 60 + seconds))
}
