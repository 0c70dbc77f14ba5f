//! Times as the CLI prints them: RFC 3339 (UTC, to the second) and how long ago, from the
//! Unix milliseconds the APIs carry.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `unix_ms` as `2026-11-25T03:20:00Z (5m 3s ago)`, against `now`. Zero (never set) is
/// `never`; a time ahead of `now` (clocks apart) says `in the future`.
pub(crate) fn when_at(unix_ms: u64, now: SystemTime) -> String {
    if unix_ms == 0 {
        return "never".to_owned();
    }
    // RFC 3339 ends with the year 9999.
    const LAST_SECOND: u64 = 253_402_300_799;
    if unix_ms / 1_000 > LAST_SECOND {
        return format!("{unix_ms} ms after 1970 (out of range)");
    }
    let then = UNIX_EPOCH + Duration::from_millis(unix_ms);
    let stamp = humantime::format_rfc3339_seconds(then);
    match now.duration_since(then) {
        Ok(age) => format!(
            "{stamp} ({} ago)",
            humantime::format_duration(Duration::from_secs(age.as_secs()))
        ),
        Err(_) => format!("{stamp} (in the future)"),
    }
}

/// `unix_ms` as RFC 3339 alone (UTC, to the millisecond), for lines that follow events as
/// they come.
pub(crate) fn rfc3339(unix_ms: u64) -> String {
    const LAST_MS: u64 = 253_402_300_799_999;
    if unix_ms > LAST_MS {
        return format!("{unix_ms} ms after 1970 (out of range)");
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// [`when_at`] against the system clock.
pub(crate) fn when(unix_ms: u64) -> String {
    when_at(unix_ms, SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_rfc3339_with_their_age() {
        let now = UNIX_EPOCH + Duration::from_millis(1_795_464_606_530);
        assert_eq!(
            when_at(1_795_464_303_530, now),
            "2026-11-23T20:05:03Z (5m 3s ago)"
        );
        assert_eq!(when_at(0, now), "never");
        assert_eq!(
            when_at(1_795_464_706_530, now),
            "2026-11-23T20:11:46Z (in the future)"
        );
        assert!(when_at(u64::MAX, now).contains("out of range"));
    }
}
