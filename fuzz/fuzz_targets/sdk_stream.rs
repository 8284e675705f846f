//! Fuzz target: the edge SDK's stream splitter
//! (`pair_sdk::response::Splitter`, the one stream reader of
//! `pair_translate::frame` collecting events whole), which cuts a node's
//! streamed answer (server-sent events, JSON lines or a whole document)
//! into events. Never panics, and the events do not depend on how the
//! bytes were cut: the input split at two points derived from its first
//! bytes, or fed a byte at a time, gives the same events as whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_sdk::response::{Event, Framing, Splitter};

fn events(framing: Framing, pieces: &[&[u8]]) -> Vec<Event> {
    let mut s = Splitter::new(framing);
    let mut out = Vec::new();
    for p in pieces {
        s.push(p, &mut out);
    }
    s.finish(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let a = usize::from(cut) % (body.len() + 1);
    let b = a + (body.len() - a) / 2;
    let bytes: Vec<&[u8]> = body.chunks(1).collect();
    for framing in [Framing::Sse, Framing::JsonLines, Framing::Whole] {
        let whole = events(framing, &[body]);
        let cut = events(framing, &[&body[..a], &body[a..b], &body[b..]]);
        assert_eq!(whole, cut, "{framing:?} split at {a} and {b}");
        assert_eq!(whole, events(framing, &bytes), "{framing:?} a byte at a time");
        if framing == Framing::Sse {
            assert!(
                matches!(whole.last(), Some(Event::Done | Event::Truncated | Event::TooLarge)),
                "an SSE stream always ends with how it ended"
            );
        }
    }
});
