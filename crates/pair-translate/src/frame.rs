//! Cutting a streamed body into events: OpenAI's server-sent events
//! (`data: {...}`, ending `data: [DONE]`) and Ollama's JSON lines. The same
//! events come out however the bytes were cut.

use bytes::BytesMut;

/// How an API frames its streamed chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// OpenAI: server-sent events, `data: {...}`, ending `data: [DONE]`.
    Sse,
    /// Ollama: one JSON object per line.
    JsonLines,
}

/// One event of a streamed answer, as framed on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A chunk's JSON (not yet parsed).
    Json(Vec<u8>),
    /// The stream said it is complete (`data: [DONE]`).
    Done,
    /// The bytes ended before the stream said it was complete.
    Truncated,
    /// One event grew past [`Splitter::MAX_EVENT`] bytes.
    TooLarge,
}

/// Cuts a streamed body into events, whatever pieces it arrives in: the
/// same events for any split of the same bytes. Pure (no I/O), so it is
/// property-tested and fuzzed.
#[derive(Debug)]
pub struct Splitter {
    framing: Framing,
    buf: BytesMut,
    /// How far `buf` was searched for an event's end.
    scanned: usize,
    over: bool,
}

impl Splitter {
    /// The largest single event taken.
    pub const MAX_EVENT: usize = 16 << 20;

    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            buf: BytesMut::new(),
            scanned: 0,
            over: false,
        }
    }

    /// Takes the next bytes; complete events go to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        if self.over {
            return;
        }
        self.buf.extend_from_slice(bytes);
        loop {
            let from = self.scanned.saturating_sub(3);
            let found = match self.framing {
                Framing::JsonLines => self.buf[from..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map(|i| (from + i, 1)),
                Framing::Sse => find_event_end(&self.buf[from..]).map(|(i, n)| (from + i, n)),
            };
            let Some((end, sep)) = found else {
                self.scanned = self.buf.len();
                if self.buf.len() > Self::MAX_EVENT {
                    self.over = true;
                    out.push(Event::TooLarge);
                }
                return;
            };
            let raw = self.buf.split_to(end + sep);
            self.scanned = 0;
            self.event(&raw[..end], out);
            if self.over {
                return;
            }
        }
    }

    /// The body ended: what is left is the last event.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if self.over {
            return;
        }
        let rest = std::mem::take(&mut self.buf);
        if !rest.iter().all(u8::is_ascii_whitespace) {
            self.event(&rest, out);
        }
        if !self.over && self.framing == Framing::Sse {
            out.push(Event::Truncated);
        }
        self.over = true;
    }

    fn event(&mut self, raw: &[u8], out: &mut Vec<Event>) {
        let payload: Vec<u8> = match self.framing {
            Framing::JsonLines => raw.to_vec(),
            Framing::Sse => {
                let text = String::from_utf8_lossy(raw);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    return; // a comment or a bare event name
                }
                let joined = data.join("\n");
                if joined.trim() == "[DONE]" {
                    self.over = true;
                    out.push(Event::Done);
                    return;
                }
                joined.into_bytes()
            }
        };
        if !payload.iter().all(u8::is_ascii_whitespace) {
            out.push(Event::Json(payload));
        }
    }
}

/// The end of the first server-sent event in `b` and its separator's
/// length (a blank line, `\n\n` or `\r\n\r\n`).
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = b.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(c)) => Some(if a.0 <= c.0 { a } else { c }),
        (a, c) => a.or(c),
    }
}

/// `bytes` cut at `points` (sorted, each taken modulo the length + 1),
/// for tests that feed a stream in arbitrary pieces.
#[cfg(test)]
pub(crate) fn cut<'a>(bytes: &'a [u8], points: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = points.iter().map(|p| p % (bytes.len() + 1)).collect();
    at.sort_unstable();
    at.push(bytes.len());
    let mut from = 0;
    at.into_iter()
        .map(|to| {
            let piece = &bytes[from..to];
            from = to;
            piece
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The events of `stream` cut at `cuts`.
    fn split(stream: &[u8], cuts: &[usize], framing: Framing) -> Vec<Event> {
        let (mut sp, mut out) = (Splitter::new(framing), Vec::new());
        for piece in cut(stream, cuts) {
            sp.push(piece, &mut out);
        }
        sp.finish(&mut out);
        out
    }

    fn json(s: &str) -> Event {
        Event::Json(s.as_bytes().to_vec())
    }

    const SSE: &[u8] =
        b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"a\":2}\r\n\r\ndata: [DONE]\n\n";
    const LINES: &[u8] = b"{\"a\":1}\n{\"a\":2}\n\n{\"a\":3}";

    #[test]
    fn events_lines_and_the_end_of_a_stream() {
        assert_eq!(
            split(SSE, &[], Framing::Sse),
            vec![json(r#"{"a":1}"#), json(r#"{"a":2}"#), Event::Done]
        );
        assert_eq!(
            split(LINES, &[], Framing::JsonLines),
            vec![json(r#"{"a":1}"#), json(r#"{"a":2}"#), json(r#"{"a":3}"#)]
        );
        assert_eq!(
            split(b"data: {\"a\":1}\n\ndata: {\"a\"", &[], Framing::Sse),
            vec![json(r#"{"a":1}"#), json(r#"{"a""#), Event::Truncated],
            "an SSE stream cut before [DONE] says so"
        );
    }

    proptest! {
        #[test]
        fn a_stream_in_any_pieces_splits_as_it_does_whole(
            cuts in prop::collection::vec(0usize..200, 0..12),
            body in prop::collection::vec(prop::sample::select(b"data: {}[DONE]\r\n:x".to_vec()), 0..120),
        ) {
            for framing in [Framing::Sse, Framing::JsonLines] {
                prop_assert_eq!(split(SSE, &cuts, framing), split(SSE, &[], framing));
                prop_assert_eq!(split(LINES, &cuts, framing), split(LINES, &[], framing));
                prop_assert_eq!(split(&body, &cuts, framing), split(&body, &[], framing));
            }
        }
    }
}
