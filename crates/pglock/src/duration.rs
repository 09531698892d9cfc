//! Durations on the command line: `500ms`, `2s`, `1m30s`, `1h`, or bare seconds as in
//! `flock -w 1.5`.

use std::time::Duration;

/// Parses a duration: one or more `<number><unit>` parts (units `ms`, `s`, `m`, `min`,
/// `h`; numbers may have a fraction), or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration (try 500ms, 2s, 1m or 1.5)".to_owned());
    }
    let mut total = 0.0_f64;
    let mut rest = text;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("invalid duration `{text}` (try 500ms, 2s, 1m or 1.5)"))?;
        let scale = match unit.trim() {
            "" if after.is_empty() && rest.len() == text.len() => 1.0,
            "ms" => 0.001,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "invalid duration `{text}`: unknown unit `{unit}` (use ms, s, m or h)"
                ));
            }
        };
        total += value * scale;
        rest = after;
    }
    Duration::try_from_secs_f64(total)
        .map_err(|error| format!("invalid duration `{text}`: {error}"))
}

/// A duration for people: `850ms`, `3.2s`, `1m12s`, `2h05m`.
pub(crate) fn show(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let secs = duration.as_secs();
    if secs < 10 {
        return format!("{:.1}s", duration.as_secs_f64());
    }
    if secs < 60 {
        return format!("{secs}s");
    }
    if secs < 3600 {
        return format!("{}m{:02}s", secs / 60, secs % 60);
    }
    format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_units_and_bare_seconds() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("2s", Duration::from_secs(2)),
            ("1m", Duration::from_secs(60)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("1.5", Duration::from_millis(1500)),
            ("0", Duration::ZERO),
            ("0.25s", Duration::from_millis(250)),
            ("10", Duration::from_secs(10)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_nonsense_without_panicking() {
        for text in [
            "", "s", "-1", "1x", "ms5", "1.2.3s", "1e400", "1 2", "nan", "5m3",
        ] {
            assert!(parse_duration(text).is_err(), "{text} was accepted");
        }
    }

    #[test]
    fn shows_durations_briefly() {
        assert_eq!(show(Duration::from_millis(850)), "850ms");
        assert_eq!(show(Duration::from_millis(3250)), "3.2s");
        assert_eq!(show(Duration::from_secs(42)), "42s");
        assert_eq!(show(Duration::from_secs(72)), "1m12s");
        assert_eq!(show(Duration::from_secs(7500)), "2h05m");
    }
}
