//! Fuzz target: the one stream reader (`pair_translate::frame::Reader`)
//! and the proxy's error events (`pair_proxy::stream::stream_error_event`).
//! For every framing, reading never panics, and the input read in pieces
//! (one byte at a time, and cut at two points taken from its first byte)
//! gives the same events as read whole; those events are a plain reading
//! of the whole input (the HTML standard's for server-sent events), and
//! the events counted are the payloads read. Every error event reads as
//! exactly one event whose JSON carries the exact message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_core::ApiFlavor;
use pair_proxy::stream::stream_error_event;
use pair_translate::frame::{Framing, Kind, Reader, Step};
use serde_json::Value;

const FRAMINGS: [Framing; 3] = [Framing::JsonLines, Framing::Sse, Framing::Whole];
const FLAVORS: [ApiFlavor; 4] =
    [ApiFlavor::Ollama, ApiFlavor::OpenAi, ApiFlavor::Anthropic, ApiFlavor::Responses];

/// The events of `pieces` read in turn to the stream's end, each its kind
/// and payload.
fn read(framing: Framing, pieces: &[&[u8]]) -> Vec<(Kind, Vec<u8>)> {
    let mut reader = Reader::new(framing);
    let (mut events, mut payload) = (Vec::new(), Vec::new());
    let mut take = |step: Step<'_>| match step {
        Step::Data(d) => payload.extend_from_slice(d),
        Step::End(kind) => events.push((kind, std::mem::take(&mut payload))),
    };
    for p in pieces {
        reader.read(p).for_each(&mut take);
    }
    reader.finish().for_each(&mut take);
    events
}

/// The payload events of `pieces` counted as the proxy counts them, piece
/// by piece, payloads unread.
fn count(framing: Framing, pieces: &[&[u8]]) -> usize {
    let mut reader = Reader::new(framing);
    let json = |s: &Step<'_>| *s == Step::End(Kind::Json);
    let counted: usize = pieces.iter().map(|p| reader.read(p).filter(json).count()).sum();
    counted + reader.finish().filter(json).count()
}

/// The input's events read plainly, whole: its lines (ended by CRLF, CR
/// or LF in server-sent events, after a leading byte-order mark; LF in
/// JSON lines), then each event.
fn plain(framing: Framing, input: &[u8]) -> Vec<(Kind, Vec<u8>)> {
    let kind = |d: &[u8]| match d.trim_ascii() {
        b"[DONE]" if framing == Framing::Sse => Kind::Done,
        t if t.is_empty() => Kind::Blank,
        _ => Kind::Json,
    };
    let input = match framing {
        Framing::Sse => input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input),
        _ => input,
    };
    let mut lines = Vec::new();
    let (mut from, mut i) = (0, 0);
    while i < input.len() {
        let end = match (framing, input[i]) {
            (Framing::Sse, b'\r') if input.get(i + 1) == Some(&b'\n') => 2,
            (Framing::Sse, b'\r') | (Framing::Sse | Framing::JsonLines, b'\n') => 1,
            _ => 0,
        };
        if end > 0 {
            lines.push(&input[from..i]);
            from = i + end;
        }
        i += end.max(1);
    }
    let tail = (from < input.len()).then(|| &input[from..]);
    match framing {
        Framing::Whole => tail.map(|t| (kind(t), t.to_vec())).into_iter().collect(),
        Framing::JsonLines => {
            lines.into_iter().chain(tail).map(|l| (kind(l), l.to_vec())).collect()
        }
        Framing::Sse => {
            let (mut events, mut data): (Vec<_>, Option<Vec<u8>>) = (Vec::new(), None);
            for line in lines.into_iter().chain(tail) {
                if line.is_empty() {
                    let d = data.take().unwrap_or_default();
                    events.push((kind(&d), d));
                    continue;
                }
                let (name, value) = match line.iter().position(|&b| b == b':') {
                    Some(c) => (&line[..c], &line[c + 1..]),
                    None => (line, &b""[..]),
                };
                if name == b"data" {
                    let value = value.strip_prefix(b" ").unwrap_or(value);
                    match &mut data {
                        Some(d) => {
                            d.push(b'\n');
                            d.extend_from_slice(value);
                        }
                        None => data = Some(value.to_vec()),
                    }
                }
            }
            if let Some(d) = data {
                events.push((kind(&d), d));
            }
            events
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some((&seed, body)) = data.split_first() {
        let a = usize::from(seed) % (body.len() + 1);
        let b = a + (body.len() - a) / 2;
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        for framing in FRAMINGS {
            let whole = read(framing, &[body]);
            assert_eq!(
                read(framing, &[&body[..a], &body[a..b], &body[b..]]),
                whole,
                "{framing:?} cut at {a} and {b}"
            );
            assert_eq!(read(framing, &bytes), whole, "{framing:?} a byte at a time");
            assert_eq!(whole, plain(framing, body), "{framing:?} read plainly");
            let payloads = whole.iter().filter(|(k, _)| *k == Kind::Json).count();
            assert_eq!(count(framing, &bytes), payloads, "{framing:?} counted");
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
    let events = read(framing, &[&event]);
    assert_eq!(count(framing, &[&event]), 1, "{text:?} is not one event");
    let [(Kind::Json, payload)] = &events[..] else {
        panic!("{text:?} is not one event alone: {events:?}");
    };
    let doc: Value = serde_json::from_slice(payload)
        .unwrap_or_else(|e| panic!("error event is not JSON ({e}): {text:?}"));
    match framing {
        Framing::JsonLines => {
            assert!(text.ends_with('\n'), "no newline: {text:?}");
            assert_eq!(doc["error"].as_str(), Some(message));
        }
        Framing::Sse => {
            assert!(text.ends_with("\n\n"), "SSE event not terminated: {text:?}");
            if flavor == ApiFlavor::Anthropic {
                assert!(text.starts_with("event: error\n"));
                assert_eq!(doc["type"].as_str(), Some("error"));
            }
            let message_at = match flavor {
                ApiFlavor::Responses => &doc["message"],
                _ => &doc["error"]["message"],
            };
            assert_eq!(message_at.as_str(), Some(message));
        }
        Framing::Whole => unreachable!("checked above"),
    }
}
