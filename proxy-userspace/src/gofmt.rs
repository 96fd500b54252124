//! Text forms the status pages share with Go components: Go's `UnixDate`
//! and `RFC3339Nano` time layouts, `time.Duration` strings, statusz's uptime
//! line and the HTML escaping of `html.EscapeString`. Pure functions.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::Timestamp;

/// Go's zero `time.Time` in RFC 3339 (what upstream shows for "never").
pub const ZERO_TIME_RFC3339: &str = "0001-01-01T00:00:00Z";

fn utc(t: SystemTime) -> Timestamp {
    // Times before 1970 do not occur here (process start, apply times);
    // clamp rather than fail.
    let t = t.max(UNIX_EPOCH);
    Timestamp::try_from(t).unwrap_or(Timestamp::MAX)
}

/// Go `time.UnixDate` in UTC: `Fri Sep  6 06:19:51 UTC 2024` (day padded
/// with a space).
pub fn go_unix_date(t: SystemTime) -> String {
    utc(t).strftime("%a %b %e %H:%M:%S UTC %Y").to_string()
}

/// RFC 3339 with seconds precision in UTC (`metav1.Time`).
pub fn rfc3339_seconds(t: SystemTime) -> String {
    utc(t).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Go `time.RFC3339Nano` in UTC: nanoseconds with trailing zeros trimmed,
/// no fraction at all when it is zero.
pub fn rfc3339_nanos(t: SystemTime) -> String {
    let dt = utc(t);
    let mut out = dt.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    let nanos = t
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    push_fraction(&mut out, nanos, 9);
    out.push('Z');
    out
}

/// `Up` line of statusz: hours unpadded, minutes and seconds two digits.
pub fn uptime(d: Duration) -> String {
    let s = d.as_secs();
    format!("{} hr {:02} min {:02} sec", s / 3600, (s / 60) % 60, s % 60)
}

/// Go `time.Duration.String()`: `0s`, `250ms`, `1.5s`, `1m0s`, `1h0m0s`.
pub fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    if nanos < 1_000_000_000 {
        // Below a second Go switches to the largest unit that is ≤ d.
        let (unit, scale, digits) = match nanos {
            0..1_000 => ("ns", 1, 0),
            1_000..1_000_000 => ("µs", 1_000, 3),
            _ => ("ms", 1_000_000, 6),
        };
        let _ = write!(out, "{}", nanos / scale);
        // The remainder is below `scale` ≤ 10^6 and fits in u32.
        push_fraction(&mut out, (nanos % scale) as u32, digits);
        out.push_str(unit);
        return out;
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    let _ = write!(out, "{s}");
    push_fraction(&mut out, d.subsec_nanos(), 9);
    out.push('s');
    out
}

/// Appends `.fraction` (of `digits` digits, trailing zeros trimmed), or
/// nothing when the fraction is zero.
fn push_fraction(out: &mut String, fraction: u32, digits: usize) {
    if fraction == 0 || digits == 0 {
        return;
    }
    let text = format!("{fraction:0digits$}");
    out.push('.');
    out.push_str(text.trim_end_matches('0'));
}

/// Go `html.EscapeString`: `& < > ' "` only.
pub fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, nanos: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, nanos)
    }

    // 2024-09-06T06:19:51Z, the SPEC's example instant.
    const SEP_6: u64 = 1_725_603_591;

    #[test]
    fn unix_date_pads_the_day_with_a_space() {
        assert_eq!(go_unix_date(at(SEP_6, 0)), "Fri Sep  6 06:19:51 UTC 2024");
        // Two-digit day: no padding; 2025-05-01T10:00:02Z.
        assert_eq!(
            go_unix_date(at(1_746_093_602 + 86_400 * 10, 999_999_999)),
            "Sun May 11 10:00:02 UTC 2025"
        );
    }

    #[test]
    fn rfc3339_forms() {
        assert_eq!(
            rfc3339_seconds(at(SEP_6, 500_000_000)),
            "2024-09-06T06:19:51Z"
        );
        assert_eq!(
            rfc3339_nanos(at(1_746_093_602, 123_456_789)),
            "2025-05-01T10:00:02.123456789Z"
        );
        assert_eq!(
            rfc3339_nanos(at(1_746_093_580, 500_000_000)),
            "2025-05-01T09:59:40.5Z"
        );
        assert_eq!(rfc3339_nanos(at(SEP_6, 0)), "2024-09-06T06:19:51Z");
    }

    #[test]
    fn uptime_pads_minutes_and_seconds_only() {
        assert_eq!(uptime(Duration::from_secs(30)), "0 hr 00 min 30 sec");
        assert_eq!(
            uptime(Duration::from_millis(3_600_000 * 101 + 61_900)),
            "101 hr 01 min 01 sec"
        );
    }

    #[test]
    fn go_durations() {
        let cases: &[(Duration, &str)] = &[
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(1_250), "1.25ms"),
            (Duration::from_secs(1), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(60), "1m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(5400), "1h30m0s"),
            (Duration::new(3601, 1), "1h0m1.000000001s"),
        ];
        for (d, want) in cases {
            assert_eq!(go_duration(*d), *want, "{d:?}");
        }
    }

    #[test]
    fn html_escaping_covers_exactly_five_characters() {
        assert_eq!(
            html_escape(r#"a&b<c>d'e"f+g/h"#),
            "a&amp;b&lt;c&gt;d&#39;e&#34;f+g/h"
        );
        assert_eq!(html_escape("0.1.0+abc"), "0.1.0+abc");
    }
}
