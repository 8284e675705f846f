//! Fuzz target: stream framing (`pair_proxy::stream`). `Framing::events_in`
//! counts events in arbitrary upstream chunks without panicking, and counts
//! split at a line boundary add up; `stream_error_event` turns any message
//! into an event that parses as JSON carrying that exact message, and counts
//! as exactly one event.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_core::ApiFlavor;
use pair_proxy::stream::{Framing, stream_error_event};
use serde_json::Value;

const FRAMINGS: [Framing; 3] = [Framing::Ndjson, Framing::Sse, Framing::Whole];
const FLAVORS: [ApiFlavor; 3] = [ApiFlavor::Ollama, ApiFlavor::OpenAi, ApiFlavor::Anthropic];

fuzz_target!(|data: &[u8]| {
    let newlines = data.iter().filter(|b| **b == b'\n').count();
    for framing in FRAMINGS {
        let n = framing.events_in(data) as usize;
        match framing {
            Framing::Ndjson => assert_eq!(n, newlines),
            Framing::Sse => assert!(n <= newlines + 1),
            Framing::Whole => assert_eq!(n, 0),
        }
        // A chunk boundary right after a newline never changes the count.
        if let Some(i) = data.iter().position(|b| *b == b'\n') {
            let (a, b) = data.split_at(i + 1);
            assert_eq!(framing.events_in(a) + framing.events_in(b), framing.events_in(data));
        }
    }

    let message = String::from_utf8_lossy(data);
    for framing in FRAMINGS {
        for flavor in FLAVORS {
            check_error_event(framing, flavor, &message);
        }
    }
});

fn check_error_event(framing: Framing, flavor: ApiFlavor, message: &str) {
    let Some(event) = stream_error_event(framing, flavor, message) else {
        assert_eq!(framing, Framing::Whole, "only whole documents have no error event");
        return;
    };
    let text = std::str::from_utf8(&event).unwrap_or_else(|e| panic!("event is not UTF-8: {e}"));
    assert_eq!(framing.events_in(&event), 1, "{text:?} is not one event");
    match framing {
        Framing::Ndjson => {
            let line = text.strip_suffix('\n').unwrap_or_else(|| panic!("no newline: {text:?}"));
            assert!(!line.contains('\n'), "message broke the line: {text:?}");
            let doc = parse(line);
            assert_eq!(doc["error"].as_str(), Some(message));
        }
        Framing::Sse => {
            assert!(text.ends_with("\n\n"), "SSE event not terminated: {text:?}");
            let data_lines: Vec<&str> =
                text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            assert_eq!(data_lines.len(), 1, "{text:?}");
            let doc = parse(data_lines[0]);
            assert_eq!(doc["error"]["message"].as_str(), Some(message));
            if flavor == ApiFlavor::Anthropic {
                assert!(text.starts_with("event: error\n"));
                assert_eq!(doc["type"].as_str(), Some("error"));
            }
        }
        Framing::Whole => unreachable!("checked above"),
    }
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("error event is not JSON ({e}): {text:?}"))
}
