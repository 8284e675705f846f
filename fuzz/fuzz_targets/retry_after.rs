//! Fuzz target: the `Retry-After` parser (`pair_scheduler::drive::retry_after`)
//! on a header value from an engine or a relaying peer, read at three
//! clocks (the epoch, 2026, the last second of 9999). Never panics; a value
//! of digits is that many seconds whatever the clock; any other accepted
//! value is an HTTP date, and the wait is what is left until it (zero once
//! it has passed), so a later clock never waits longer. Both forms round
//! trip: the seconds written back, and the date formatted with
//! `httpdate::fmt_http_date`, parse to the same wait. Seconds past `u64`
//! are as long a wait as there is (the failover core adds waits
//! saturating).
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use pair_scheduler::drive::retry_after;

const CLOCKS: [u64; 3] = [0, 1_767_225_600, 253_402_300_799];

fuzz_target!(|data: &[u8]| {
    let waits: Vec<Option<Duration>> = CLOCKS
        .iter()
        .map(|&s| retry_after(data, UNIX_EPOCH + Duration::from_secs(s)))
        .collect();
    let Some(first) = waits[0] else {
        assert!(
            waits.iter().all(Option::is_none),
            "accepted at one clock only"
        );
        return;
    };
    let text = std::str::from_utf8(data)
        .expect("accepted bytes are UTF-8")
        .trim_ascii();

    if text.bytes().all(|b| b.is_ascii_digit()) {
        let secs = text.parse::<u64>().unwrap_or(u64::MAX);
        for w in &waits {
            assert_eq!(*w, Some(Duration::from_secs(secs)), "{text:?}");
        }
        let again = retry_after(secs.to_string().as_bytes(), SystemTime::now());
        assert_eq!(again, Some(first), "seconds round trip");
        return;
    }

    let at = httpdate::parse_http_date(text)
        .unwrap_or_else(|e| panic!("{text:?} accepted but not a date: {e}"));
    let formatted = httpdate::fmt_http_date(at);
    for (&s, w) in CLOCKS.iter().zip(&waits) {
        let now = UNIX_EPOCH + Duration::from_secs(s);
        let left = at.duration_since(now).unwrap_or_default();
        assert_eq!(*w, Some(left), "{text:?} at {s}");
        assert_eq!(
            retry_after(formatted.as_bytes(), now),
            Some(left),
            "date round trip: {text:?} -> {formatted:?}"
        );
    }
    assert!(
        waits.windows(2).all(|p| p[1] <= p[0]),
        "a later clock waits longer: {waits:?}"
    );
});
