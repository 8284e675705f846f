//! Reading a streamed body as events, whatever pieces it arrives in: the
//! one reader of server-sent events (OpenAI's `data: {...}` ending
//! `data: [DONE]`, Anthropic's named events) and of Ollama's JSON lines,
//! for the proxy's counts, translation and continuation alike.
//!
//! Server-sent events are read as the [HTML standard] says: a line ends
//! at LF, CR or CRLF; the values of an event's `data` fields, less one
//! space after the colon, join with LF; a blank line ends the event;
//! comments (`:`) and other fields carry nothing; a byte-order mark that
//! starts the stream is dropped. A JSON line ends at LF
//! and is an event. The end of the stream ends an unfinished line and
//! event, so a stream cut short still hands over what it had.
//!
//! A [`Reader`] copies nothing: it hands each event's payload over in
//! place, piece by piece, and says where the event ends. A [`Splitter`]
//! collects its events whole.
//!
//! [HTML standard]: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation

use memchr::{memchr, memchr2};

/// How an API frames its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Server-sent events (`text/event-stream`): OpenAI's and Anthropic's
    /// streams.
    Sse,
    /// One JSON object per line (`application/x-ndjson`): Ollama's streams.
    JsonLines,
    /// A single document: one event, ended by the end of the body.
    Whole,
}

impl Framing {
    /// The framing a content type names; anything but a stream is whole.
    pub fn from_content_type(ct: Option<&[u8]>) -> Self {
        let ct = ct.unwrap_or(b"");
        if ct.starts_with(b"application/x-ndjson") {
            Framing::JsonLines
        } else if ct.starts_with(b"text/event-stream") {
            Framing::Sse
        } else {
            Framing::Whole
        }
    }
}

/// What a [`Reader`] finds, in stream order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step<'a> {
    /// The next bytes of the current event's payload.
    Data(&'a [u8]),
    /// The current event ended (at a blank line, at a JSON line's end, or
    /// at the end of the stream).
    End(Kind),
}

/// What an event carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A payload other than `[DONE]`: a chunk's JSON, not yet parsed.
    Json,
    /// `[DONE]` (server-sent events): the stream says it is complete.
    Done,
    /// Only whitespace, or nothing: a blank line, a keep-alive comment.
    Blank,
}

/// The stream reader: its state between pieces, so the same steps come
/// out for any split of the same bytes. Pure (no I/O), property-tested
/// and fuzzed.
#[derive(Clone, Debug)]
pub struct Reader {
    framing: Framing,
    line: Line,
    /// The last byte read ended a line at a CR: an LF next is its end too.
    cr: bool,
    /// The current event has a `data` field (JSON lines, whole: a byte).
    data: bool,
    look: Look,
}

/// Where a server-sent event's line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// At the stream's start, past the first `n` bytes of a byte-order
    /// mark.
    Bom(u8),
    /// At its start (0), or in a field name whose `n` bytes so far are
    /// the first of `data`.
    Name(u8),
    /// In a line that carries no payload: a comment, another field.
    Skip,
    /// In a `data` value; `lead` until its first byte (a space there is
    /// dropped).
    Value { lead: bool },
}

/// What the current event's payload is, as far as its bytes so far say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Look {
    /// Only whitespace.
    Blank,
    /// Whitespace, then the first `n` bytes of `[DONE]` (all six: then
    /// only whitespace).
    Done(u8),
    /// Anything else.
    Json,
}

const BOM: &[u8; 3] = b"\xEF\xBB\xBF";
const DATA: &[u8; 4] = b"data";
const DONE: &[u8; 6] = b"[DONE]";

impl Look {
    /// Takes the next payload bytes; `done`: whether `[DONE]` ends a
    /// stream in this framing.
    fn see(&mut self, bytes: &[u8], done: bool) {
        for &b in bytes {
            *self = match *self {
                Look::Json => return,
                Look::Blank if b.is_ascii_whitespace() => Look::Blank,
                Look::Blank if done && b == b'[' => Look::Done(1),
                Look::Done(6) if b.is_ascii_whitespace() => Look::Done(6),
                Look::Done(n) if n < 6 && b == DONE[usize::from(n)] => Look::Done(n + 1),
                _ => Look::Json,
            };
        }
    }

    fn kind(self) -> Kind {
        match self {
            Look::Blank => Kind::Blank,
            Look::Done(6) => Kind::Done,
            Look::Done(_) | Look::Json => Kind::Json,
        }
    }
}

impl Reader {
    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            line: Line::Bom(0),
            cr: false,
            data: false,
            look: Look::Blank,
        }
    }

    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// The steps of the stream's next piece, read as they are taken.
    pub fn read<'r, 'a>(&'r mut self, bytes: &'a [u8]) -> Steps<'r, 'a> {
        Steps {
            reader: self,
            bytes,
            at: 0,
        }
    }

    /// The stream ended: an unfinished line and event end here.
    pub fn finish(&mut self) -> impl Iterator<Item = Step<'static>> + use<> {
        self.cr = false;
        let line = match self.framing {
            Framing::Sse if !matches!(self.line, Line::Name(0) | Line::Bom(0)) => self.line_end(),
            _ => None,
        };
        let end = self.data.then(|| self.end());
        line.into_iter().chain(end)
    }

    /// A server-sent event's line ended.
    fn line_end(&mut self) -> Option<Step<'static>> {
        match std::mem::replace(&mut self.line, Line::Name(0)) {
            Line::Name(0) | Line::Bom(0) => Some(self.end()),
            Line::Name(4) => self.data_line(),
            _ => None,
        }
    }

    /// A `data` field starts: after another, its value joins with LF.
    fn data_line(&mut self) -> Option<Step<'static>> {
        let join = self.data.then(|| {
            self.look.see(b"\n", true);
            Step::Data(b"\n")
        });
        self.data = true;
        join
    }

    fn end(&mut self) -> Step<'static> {
        let kind = self.look.kind();
        self.data = false;
        self.look = Look::Blank;
        Step::End(kind)
    }

    /// The payload bytes `bytes` starts with, up to a line end.
    fn value<'a>(&mut self, bytes: &'a [u8], len: usize) -> Step<'a> {
        let value = &bytes[..len];
        self.data = true;
        self.look.see(value, self.framing == Framing::Sse);
        Step::Data(value)
    }
}

/// The steps of one piece of a stream ([`Reader::read`]).
#[derive(Debug)]
pub struct Steps<'r, 'a> {
    reader: &'r mut Reader,
    bytes: &'a [u8],
    at: usize,
}

impl Steps<'_, '_> {
    /// How far into the piece the steps so far have read: after an
    /// [`Step::End`], just past the line end that ended the event (a CR
    /// that ends the piece ends it there; an LF after it, in the next
    /// piece, is read as part of that line end).
    pub fn at(&self) -> usize {
        self.at
    }
}

impl<'a> Iterator for Steps<'_, 'a> {
    type Item = Step<'a>;

    fn next(&mut self) -> Option<Step<'a>> {
        let r = &mut *self.reader;
        loop {
            let rest = &self.bytes[self.at..];
            let &b = rest.first()?;
            match r.framing {
                Framing::Whole => {
                    self.at = self.bytes.len();
                    return Some(r.value(rest, rest.len()));
                }
                Framing::JsonLines if b == b'\n' => {
                    self.at += 1;
                    return Some(r.end());
                }
                Framing::JsonLines => {
                    let len = memchr(b'\n', rest).unwrap_or(rest.len());
                    self.at += len;
                    return Some(r.value(rest, len));
                }
                Framing::Sse => {}
            }
            if std::mem::take(&mut r.cr) && b == b'\n' {
                self.at += 1;
                continue;
            }
            if b == b'\n' || b == b'\r' {
                self.at += 1;
                if b == b'\r' {
                    if self.bytes.get(self.at) == Some(&b'\n') {
                        self.at += 1;
                    } else {
                        r.cr = true;
                    }
                }
                match r.line_end() {
                    Some(step) => return Some(step),
                    None => continue,
                }
            }
            match r.line {
                Line::Bom(0) if b != BOM[0] => r.line = Line::Name(0),
                Line::Bom(n) => {
                    self.at += 1;
                    r.line = if b != BOM[usize::from(n)] {
                        Line::Skip
                    } else if usize::from(n) + 1 == BOM.len() {
                        Line::Name(0)
                    } else {
                        Line::Bom(n + 1)
                    };
                }
                Line::Name(n) => {
                    self.at += 1;
                    if b == b':' && n == 4 {
                        r.line = Line::Value { lead: true };
                        if let Some(join) = r.data_line() {
                            return Some(join);
                        }
                    } else if usize::from(n) < DATA.len() && b == DATA[usize::from(n)] {
                        r.line = Line::Name(n + 1);
                    } else {
                        r.line = Line::Skip;
                    }
                }
                Line::Skip => self.at += memchr2(b'\n', b'\r', rest).unwrap_or(rest.len()),
                Line::Value { lead } => {
                    r.line = Line::Value { lead: false };
                    let rest = if lead && b == b' ' {
                        self.at += 1;
                        &rest[1..]
                    } else {
                        rest
                    };
                    let len = memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                    if len > 0 {
                        self.at += len;
                        return Some(r.value(rest, len));
                    }
                }
            }
        }
    }
}

/// One event of a streamed answer, collected by a [`Splitter`].
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

/// A [`Reader`] whose events are collected whole: the same events for any
/// split of the same bytes. Blank events are left out; nothing is taken
/// after `[DONE]` or an event too large.
#[derive(Debug)]
pub struct Splitter {
    reader: Reader,
    payload: Vec<u8>,
    over: bool,
}

impl Splitter {
    /// The largest single event taken (its payload).
    pub const MAX_EVENT: usize = 16 << 20;

    pub fn new(framing: Framing) -> Self {
        Self {
            reader: Reader::new(framing),
            payload: Vec::new(),
            over: false,
        }
    }

    /// Takes the next bytes; complete events go to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        for step in self.reader.read(bytes) {
            if self.over {
                return;
            }
            collect(&mut self.payload, &mut self.over, step, out);
        }
    }

    /// The body ended: an unfinished event is the last, and a stream of
    /// server-sent events that did not say it was complete is
    /// [`Event::Truncated`].
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        for step in self.reader.finish() {
            if !self.over {
                collect(&mut self.payload, &mut self.over, step, out);
            }
        }
        if !self.over && self.reader.framing() == Framing::Sse {
            out.push(Event::Truncated);
        }
        self.over = true;
    }
}

/// Adds one step to the event collected in `payload`; `over` once no more
/// is taken.
fn collect(payload: &mut Vec<u8>, over: &mut bool, step: Step<'_>, out: &mut Vec<Event>) {
    match step {
        Step::Data(d) if payload.len() + d.len() > Splitter::MAX_EVENT => {
            *over = true;
            *payload = Vec::new();
            out.push(Event::TooLarge);
        }
        Step::Data(d) => payload.extend_from_slice(d),
        Step::End(Kind::Json) => out.push(Event::Json(std::mem::take(payload))),
        Step::End(Kind::Done) => {
            *over = true;
            out.push(Event::Done);
        }
        Step::End(Kind::Blank) => payload.clear(),
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

    /// Every event of `stream` cut at `cuts`, blank ones too, with the
    /// offset of its end in the whole stream (`None`: the stream's end).
    fn steps(
        stream: &[u8],
        cuts: &[usize],
        framing: Framing,
    ) -> Vec<(Kind, Vec<u8>, Option<usize>)> {
        let (mut reader, mut out, mut payload, mut base) =
            (Reader::new(framing), Vec::new(), Vec::new(), 0);
        for piece in cut(stream, cuts) {
            let mut steps = reader.read(piece);
            while let Some(step) = steps.next() {
                match step {
                    Step::Data(d) => payload.extend_from_slice(d),
                    Step::End(kind) => {
                        out.push((kind, std::mem::take(&mut payload), Some(base + steps.at())));
                    }
                }
            }
            base += piece.len();
        }
        for step in reader.finish() {
            match step {
                Step::Data(d) => payload.extend_from_slice(d),
                Step::End(kind) => out.push((kind, std::mem::take(&mut payload), None)),
            }
        }
        out
    }

    /// Server-sent events as the standard reads them, the whole stream at
    /// once: the reference the reader is held to.
    fn standard(stream: &[u8]) -> Vec<Event> {
        let stream = stream.strip_prefix(BOM).unwrap_or(stream);
        let mut lines = Vec::new();
        let (mut from, mut i) = (0, 0);
        while i < stream.len() {
            let end = match stream[i] {
                b'\r' if stream.get(i + 1) == Some(&b'\n') => 2,
                b'\r' | b'\n' => 1,
                _ => 0,
            };
            if end > 0 {
                lines.push(&stream[from..i]);
                from = i + end;
            }
            i += end.max(1);
        }
        if from < stream.len() {
            lines.push(&stream[from..]);
        }
        lines.push(b"");
        let (mut out, mut data): (Vec<Event>, Option<Vec<u8>>) = (Vec::new(), None);
        for line in lines {
            if line.is_empty() {
                let Some(d) = data.take() else { continue };
                if d.trim_ascii() == DONE {
                    out.push(Event::Done);
                    return out;
                }
                if !d.iter().all(u8::is_ascii_whitespace) {
                    out.push(Event::Json(d));
                }
                continue;
            }
            let (name, value) = match line.iter().position(|&b| b == b':') {
                Some(c) => (&line[..c], &line[c + 1..]),
                None => (line, &b""[..]),
            };
            if name == DATA {
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
        out.push(Event::Truncated);
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
        assert_eq!(
            split(b" {\"a\":\n1}\n", &[3], Framing::Whole),
            vec![json(" {\"a\":\n1}\n")],
            "a whole document is one event"
        );
    }

    #[test]
    fn server_sent_events_read_as_the_standard_says() {
        let sse = |s: &[u8]| split(s, &[], Framing::Sse);
        assert_eq!(
            sse(b"data: {\"a\":\ndata: 1}\n\ndata: [DONE]\n\n"),
            vec![json("{\"a\":\n1}"), Event::Done],
            "data lines join with LF"
        );
        assert_eq!(
            sse(b"data: 1\r\rdata: 2\r\n\r\ndata: 3\n\ndata:[DONE]\r\r"),
            vec![json("1"), json("2"), json("3"), Event::Done],
            "lines end at CR, CRLF and LF"
        );
        assert_eq!(
            sse(b": hi\ndata: 1\n:data: x\ndata: 2\n\n"),
            vec![json("1\n2"), Event::Truncated],
            "comments carry nothing and end no event"
        );
        assert_eq!(
            sse(b"data:{}\n\ndata:  x\n\n"),
            vec![json("{}"), json(" x"), Event::Truncated],
            "one space after the colon is dropped, if there"
        );
        assert_eq!(
            sse(b"event: e\nid: 1\nretry: 5\ndatum: x\ndat: y\ndata\ndata: z\n\n"),
            vec![json("\nz"), Event::Truncated],
            "other fields carry nothing; a bare `data` is an empty value"
        );
        assert_eq!(
            split(
                b"\xEF\xBB\xBFdata: 1\n\n\xEF\xBB\xBFdata: 2\n\n",
                &[1, 2],
                Framing::Sse
            ),
            vec![json("1"), Event::Truncated],
            "a byte-order mark is dropped where it starts the stream only"
        );
        assert_eq!(
            sse(b"data: [DO\ndata: NE]\n\ndata: [DONE] x\n\ndata:  [DONE] \n\n"),
            vec![json("[DO\nNE]"), json("[DONE] x"), Event::Done],
            "only [DONE] alone ends the stream"
        );
    }

    #[test]
    fn events_end_just_past_their_last_line_end() {
        let s: &[u8] = b"data: 1\r\n\r\n: ping\n\ndata: 2\r\r\ndata: 3";
        let json = |p: &str, at| (Kind::Json, p.as_bytes().to_vec(), at);
        let mut want = vec![
            json("1", Some(11)),
            (Kind::Blank, Vec::new(), Some(19)),
            json("2", Some(29)),
            json("3", None),
        ];
        assert_eq!(steps(s, &[], Framing::Sse), want);
        assert_eq!(steps(s, &[5, 20], Framing::Sse), want);
        want[0].2 = Some(10);
        assert_eq!(
            steps(s, &[10], Framing::Sse),
            want,
            "an event ended by a CR ends there when the LF is in the next piece"
        );
        let lines = steps(b"{}\r\n\n{}", &[], Framing::JsonLines);
        assert_eq!(
            lines,
            vec![
                (Kind::Json, b"{}\r".to_vec(), Some(4)),
                (Kind::Blank, Vec::new(), Some(5)),
                (Kind::Json, b"{}".to_vec(), None)
            ]
        );
    }

    #[test]
    fn counts_events_per_framing() {
        let count = |framing, pieces: &[&[u8]]| {
            let mut r = Reader::new(framing);
            pieces
                .iter()
                .map(|p| r.read(p).filter(|s| *s == Step::End(Kind::Json)).count())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            count(Framing::JsonLines, &[b"{\"a\":1}\n{\"a\":2}\n\n"]),
            [2]
        );
        assert_eq!(
            count(
                Framing::Sse,
                &[b"data: {}\n\ndata: {}\n", b"\ndata: [DONE]\n\n"]
            ),
            [1, 1]
        );
        assert_eq!(count(Framing::Whole, &[b"{}\n"]), [0]);
    }

    #[test]
    fn framing_from_content_type() {
        assert_eq!(
            Framing::from_content_type(Some(b"text/event-stream; charset=utf-8")),
            Framing::Sse
        );
        assert_eq!(
            Framing::from_content_type(Some(b"application/x-ndjson")),
            Framing::JsonLines
        );
        assert_eq!(Framing::from_content_type(None), Framing::Whole);
    }

    proptest! {
        #[test]
        fn a_stream_in_any_pieces_splits_as_it_does_whole(
            cuts in prop::collection::vec(0usize..200, 0..12),
            body in prop::collection::vec(prop::sample::select(b"data: {}[DONE]\r\n:x".to_vec()), 0..120),
        ) {
            for framing in [Framing::Sse, Framing::JsonLines, Framing::Whole] {
                prop_assert_eq!(split(SSE, &cuts, framing), split(SSE, &[], framing));
                prop_assert_eq!(split(LINES, &cuts, framing), split(LINES, &[], framing));
                prop_assert_eq!(split(&body, &cuts, framing), split(&body, &[], framing));
                let events = |cuts: &[usize]| {
                    steps(&body, cuts, framing).into_iter().map(|(k, p, _)| (k, p)).collect::<Vec<_>>()
                };
                prop_assert_eq!(events(&cuts), events(&[]));
            }
            prop_assert_eq!(split(&body, &cuts, Framing::Sse), standard(&body));
        }
    }
}
