//! The response body handed to the client: upstream frames pass through as
//! they arrive (nothing buffers a response), progress is counted, and a
//! failure after the first byte ends a stream with an explicit error event
//! instead of a silent truncation that looks like success.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pair_core::ApiFlavor;

use crate::dispatch::{UpBody, UpBodyError};
use crate::engine_report::{Reported, read};

/// How the answer is framed, from its content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `application/x-ndjson` (Ollama streams).
    Ndjson,
    /// `text/event-stream` (OpenAI and Anthropic streams).
    Sse,
    /// A single document.
    Whole,
}

impl Framing {
    pub fn from_content_type(ct: Option<&[u8]>) -> Self {
        let ct = ct.unwrap_or(b"");
        if ct.starts_with(b"application/x-ndjson") {
            Framing::Ndjson
        } else if ct.starts_with(b"text/event-stream") {
            Framing::Sse
        } else {
            Framing::Whole
        }
    }

    /// Stream events in a chunk: one per NDJSON line or SSE `data:` line. In
    /// token streams that is one token per event, give or take the last.
    pub fn events_in(self, chunk: &[u8]) -> u32 {
        let n = match self {
            Framing::Ndjson => chunk.iter().filter(|&&b| b == b'\n').count(),
            Framing::Sse => chunk
                .split(|&b| b == b'\n')
                .filter(|l| l.starts_with(b"data:") && !l.starts_with(b"data: [DONE]"))
                .count(),
            Framing::Whole => 0,
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// The event that ends a stream whose upstream failed after the first byte,
/// in the stream's own framing so SDKs raise it as an error.
pub fn stream_error_event(framing: Framing, flavor: ApiFlavor, message: &str) -> Option<Bytes> {
    let msg = serde_json::Value::from(message);
    let text = match (framing, flavor) {
        (Framing::Ndjson, _) => format!("{{\"error\":{msg}}}\n"),
        (Framing::Sse, ApiFlavor::Anthropic) => format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":{msg}}}}}\n\n"
        ),
        (Framing::Sse, ApiFlavor::Responses) => format!(
            "event: error\ndata: {{\"type\":\"error\",\"code\":\"stream_interrupted\",\"message\":{msg},\"param\":null,\"sequence_number\":0}}\n\n"
        ),
        (Framing::Sse, _) => format!(
            "data: {{\"error\":{{\"message\":{msg},\"type\":\"upstream_error\",\"code\":\"stream_interrupted\"}}}}\n\n"
        ),
        (Framing::Whole, _) => return None,
    };
    Some(Bytes::from(text))
}

/// How an answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// The upstream failed after the first byte; `class` names how.
    Failed {
        class: &'static str,
    },
    /// The client went away before the end.
    Cancelled,
}

/// What an answer does when its upstream fails after the first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnCut {
    /// Ends with an error event in the stream's own framing (a whole
    /// document is aborted): what a client sees.
    ErrorEvent,
    /// Aborts, so the node that relayed the request here sees the failure
    /// itself (and tells its client in the client's own framing).
    Abort,
}

/// Told about progress, that the upstream answer has ended, and, exactly
/// once, how the client's answer ended.
pub trait Watcher: Send + 'static {
    /// `events` stream events (about one token each) just passed through.
    fn progress(&mut self, events: u32);
    /// The upstream's last piece is on its way to the client: the node's
    /// work on it is over (its load can go), though the client may not
    /// have it yet.
    fn drained(&mut self) {}
    /// `reported`: what the engine said of its work at the answer's end
    /// (completed answers read for it only).
    fn finish(&mut self, ending: Ending, events: u32, reported: Option<Reported>);
}

/// The body handed to the client: an upstream body passed through.
pub struct AnswerBody<W: Watcher> {
    first: Option<Bytes>,
    inner: UpBody,
    framing: Framing,
    flavor: ApiFlavor,
    on_cut: OnCut,
    watcher: Option<W>,
    events: u32,
    /// The answer's last event, kept to read the engine's report from.
    last: Option<LastEvent>,
    /// The answer was translated by pair: its report's durations are not
    /// the engine's.
    translated: bool,
    /// How it ended, once known (nothing more is read after).
    ending: Option<Ending>,
    /// The upstream's last piece has been handed to the server.
    drained: bool,
    /// The server stops at the declared length without asking past the
    /// last piece (hyper's, serving the relay): handed whole, the answer
    /// was served.
    stops_at_length: bool,
}

impl<W: Watcher> std::fmt::Debug for AnswerBody<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerBody")
            .field("framing", &self.framing)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl<W: Watcher> AnswerBody<W> {
    /// `first` is the first data frame, already read to commit the attempt.
    pub fn new(
        first: Option<Bytes>,
        inner: UpBody,
        framing: Framing,
        flavor: ApiFlavor,
        on_cut: OnCut,
        watcher: W,
    ) -> Self {
        Self {
            first,
            inner,
            framing,
            flavor,
            on_cut,
            watcher: Some(watcher),
            events: 0,
            last: None,
            translated: false,
            ending: None,
            drained: false,
            stops_at_length: false,
        }
    }

    /// For a server that stops at the declared length without asking past
    /// the last piece (hyper's, on the relay): an answer handed over whole
    /// ends completed when the server drops it. The node that relayed it
    /// knows what its own client got, and its record of the job wins.
    #[must_use]
    pub fn served_by_length(mut self) -> Self {
        self.stops_at_length = true;
        self
    }

    /// Keeps the answer's last event, to learn from what the engine
    /// reports there; of an answer pair made (a translation), only the
    /// engine's counts ([`Reported::counts_only`]).
    #[must_use]
    pub fn reading_report(mut self, made_by_pair: bool) -> Self {
        self.last = Some(LastEvent::new(self.framing));
        self.translated = made_by_pair;
        self
    }

    fn count(&mut self, chunk: &[u8]) {
        if let Some(l) = self.last.as_mut() {
            l.push(chunk);
        }
        let n = self.framing.events_in(chunk);
        self.events = self.events.saturating_add(n);
        if let Some(w) = self.watcher.as_mut() {
            w.progress(n);
        }
    }

    /// The upstream's last piece is being handed over: the watcher hears
    /// it at once, before the server writes it, so a client's next request
    /// sees this one's load gone. How the answer ended is told later, when
    /// the server asks past the last piece (it was written) or drops the
    /// body before that (the client went away).
    fn drain(&mut self) {
        self.drained = true;
        if let Some(w) = self.watcher.as_mut() {
            w.drained();
        }
    }

    /// The answer has ended.
    fn end(&mut self, ending: Ending) {
        self.ending.get_or_insert(ending);
        if let Some(mut w) = self.watcher.take() {
            let reported = match ending {
                Ending::Completed => self
                    .last
                    .as_ref()
                    .and_then(LastEvent::reported)
                    .map(|r| if self.translated { r.counts_only() } else { r }),
                _ => None,
            };
            w.finish(ending, self.events, reported);
        }
    }
}

impl<W: Watcher> Drop for AnswerBody<W> {
    fn drop(&mut self) {
        // Servers ask past the last piece ([`Body::is_end_stream`] stays
        // false until they do): dropped before that, the client did not
        // get it all.
        if self.ending.is_none() {
            let served = self.stops_at_length && self.drained && self.first.is_none();
            self.end(if served {
                Ending::Completed
            } else {
                Ending::Cancelled
            });
        }
    }
}

impl<W: Watcher + Unpin> Body for AnswerBody<W> {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            this.count(&first);
            if this.inner.is_end_stream() {
                this.drain();
            }
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if this.ending.is_some() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.count(data);
                }
                if this.inner.is_end_stream() {
                    this.drain();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                let class = err.class();
                tracing::warn!(error = %err, class, "upstream failed mid-stream");
                this.end(Ending::Failed { class });
                if this.on_cut == OnCut::Abort {
                    return Poll::Ready(Some(Err(err)));
                }
                match stream_error_event(
                    this.framing,
                    this.flavor,
                    &format!(
                        "pair: the serving node failed mid-stream ({class}); the answer is incomplete"
                    ),
                ) {
                    Some(event) => Poll::Ready(Some(Ok(Frame::data(event)))),
                    // A single document cannot carry an error after its
                    // start: abort the connection so the client sees one.
                    None => Poll::Ready(Some(Err(err))),
                }
            }
            Poll::Ready(None) => {
                this.end(Ending::Completed);
                Poll::Ready(None)
            }
        }
    }

    /// Not until the server has asked past the last piece: that it asks
    /// is what says the piece was written.
    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.ending.is_some()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let n = self.first.as_ref().map_or(0, |f| f.len() as u64);
        let mut hint = SizeHint::new();
        // Upper first: set_lower asserts lower <= upper.
        if let Some(u) = inner.upper() {
            hint.set_upper(u.saturating_add(n));
        }
        hint.set_lower(inner.lower().saturating_add(n));
        hint
    }
}

/// Most bytes kept of a whole (non-streamed) answer to read its counts
/// from; a longer one is not read.
const WHOLE_MAX: usize = 256 << 10;
/// Most bytes of one unfinished line held; a longer line is skipped.
const LINE_MAX: usize = 64 << 10;

/// The last event of an answer going by: for a stream, its last complete
/// JSON line (an SSE `data:` line other than `[DONE]`); for a whole
/// answer, the answer.
#[derive(Debug)]
pub struct LastEvent {
    framing: Framing,
    /// The line still arriving.
    pending: Vec<u8>,
    last: Vec<u8>,
    /// A whole answer too long to keep.
    gave_up: bool,
}

impl LastEvent {
    pub fn new(framing: Framing) -> Self {
        Self {
            framing,
            pending: Vec::new(),
            last: Vec::new(),
            gave_up: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.gave_up {
            return;
        }
        if self.framing == Framing::Whole {
            if self.last.len() + chunk.len() > WHOLE_MAX {
                self.gave_up = true;
                self.last = Vec::new();
            } else {
                self.last.extend_from_slice(chunk);
            }
            return;
        }
        let Some(end) = chunk.iter().rposition(|&b| b == b'\n') else {
            if self.pending.len() + chunk.len() > LINE_MAX {
                self.pending.clear();
            } else {
                self.pending.extend_from_slice(chunk);
            }
            return;
        };
        let (complete, rest) = (&chunk[..end], &chunk[end + 1..]);
        // The lines this chunk completes, the last event among them: all
        // but the first are whole in the chunk; the first began in
        // `pending`.
        let first_end = complete.iter().position(|&b| b == b'\n');
        let later = first_end.map_or(&[][..], |i| &complete[i + 1..]);
        let found = later
            .rsplit(|&b| b == b'\n')
            .find_map(|line| payload(self.framing, line));
        // Copied into buffers kept for the answer's life: no allocation per
        // event once they have grown to an event's size.
        if let Some(p) = found {
            self.last.clear();
            self.last.extend_from_slice(p);
        } else {
            let first = &complete[..first_end.unwrap_or(complete.len())];
            if self.pending.len() + first.len() <= LINE_MAX {
                self.pending.extend_from_slice(first);
                if let Some(p) = payload(self.framing, &self.pending) {
                    self.last.clear();
                    self.last.extend_from_slice(p);
                }
            }
        }
        self.pending.clear();
        if rest.len() <= LINE_MAX {
            self.pending.extend_from_slice(rest);
        }
    }

    /// What the engine reported at the end of the answer.
    pub fn reported(&self) -> Option<Reported> {
        if self.gave_up || self.last.is_empty() {
            return None;
        }
        read(&self.last)
    }
}

/// An event's JSON in one line of a stream, if it holds one.
fn payload(framing: Framing, line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let json = match framing {
        Framing::Sse => {
            let data = line.strip_prefix(b"data:")?;
            let data = data.strip_prefix(b" ").unwrap_or(data);
            // OpenAI's end of stream, and Anthropic's (the usage is in the
            // message_delta before it).
            if data == b"[DONE]" || data.starts_with(b"{\"type\":\"message_stop\"") {
                return None;
            }
            data
        }
        Framing::Ndjson | Framing::Whole => line,
    };
    json.iter()
        .any(|b| !b.is_ascii_whitespace())
        .then_some(json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a watcher heard, shared with the test.
    #[derive(Clone, Default)]
    struct Heard(std::sync::Arc<std::sync::Mutex<(bool, Option<Ending>)>>);

    impl Watcher for Heard {
        fn progress(&mut self, _: u32) {}
        fn drained(&mut self) {
            self.0.lock().unwrap().0 = true;
        }
        fn finish(&mut self, ending: Ending, _: u32, _: Option<Reported>) {
            let mut h = self.0.lock().unwrap();
            assert!(h.1.is_none(), "finished twice");
            h.1 = Some(ending);
        }
    }

    fn body(first: Option<&'static str>, rest: Option<&'static str>) -> (AnswerBody<Heard>, Heard) {
        let heard = Heard::default();
        let b = AnswerBody::new(
            first.map(Bytes::from),
            UpBody::Fixed(rest.map(Bytes::from)),
            Framing::Whole,
            ApiFlavor::OpenAi,
            OnCut::ErrorEvent,
            heard.clone(),
        );
        (b, heard)
    }

    fn poll(b: &mut AnswerBody<Heard>) -> Option<Bytes> {
        let waker = std::task::Waker::noop();
        match Pin::new(b).poll_frame(&mut Context::from_waker(waker)) {
            Poll::Ready(Some(Ok(f))) => f.into_data().ok(),
            Poll::Ready(None) => None,
            other => panic!("{:?}", other.map(|f| f.map(|r| r.is_ok()))),
        }
    }

    #[test]
    fn an_answer_is_completed_only_once_the_server_asks_past_its_last_piece() {
        // A whole answer read before committing, and a stream's last frame.
        for (first, rest) in [(Some("whole"), None), (None, Some("last"))] {
            let (mut b, heard) = body(first, rest);
            assert!(poll(&mut b).is_some());
            // Its load goes at once; the client may not have it yet.
            assert_eq!(*heard.0.lock().unwrap(), (true, None));
            assert!(!b.is_end_stream());
            assert!(poll(&mut b).is_none());
            assert!(b.is_end_stream());
            assert_eq!(heard.0.lock().unwrap().1, Some(Ending::Completed));
            drop(b);
            // Dropped after the last piece was handed but before the server
            // asked past it (its write failed: the client reset).
            let (mut b, heard) = body(first, rest);
            assert!(poll(&mut b).is_some());
            drop(b);
            assert_eq!(*heard.0.lock().unwrap(), (true, Some(Ending::Cancelled)));
        }
    }

    #[test]
    fn counts_events_per_framing() {
        assert_eq!(Framing::Ndjson.events_in(b"{\"a\":1}\n{\"a\":2}\n"), 2);
        assert_eq!(
            Framing::Sse.events_in(b"data: {}\n\ndata: {}\n\ndata: [DONE]\n\n"),
            2
        );
        assert_eq!(Framing::Whole.events_in(b"{}\n"), 0);
    }

    #[test]
    fn error_events_parse_in_their_framing() {
        let nd = stream_error_event(Framing::Ndjson, ApiFlavor::Ollama, "boom \"x\"").unwrap();
        let v: serde_json::Value = serde_json::from_slice(nd.trim_ascii_end()).unwrap();
        assert_eq!(v["error"], "boom \"x\"");

        let sse = stream_error_event(Framing::Sse, ApiFlavor::OpenAi, "boom").unwrap();
        let text = std::str::from_utf8(&sse).unwrap();
        let data = text.strip_prefix("data: ").unwrap().trim_end();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["error"]["message"], "boom");

        assert!(stream_error_event(Framing::Whole, ApiFlavor::OpenAi, "boom").is_none());
    }

    #[test]
    fn framing_from_content_type() {
        assert_eq!(
            Framing::from_content_type(Some(b"text/event-stream; charset=utf-8")),
            Framing::Sse
        );
        assert_eq!(
            Framing::from_content_type(Some(b"application/x-ndjson")),
            Framing::Ndjson
        );
        assert_eq!(Framing::from_content_type(None), Framing::Whole);
    }

    const OLLAMA: &[u8] = b"{\"model\":\"m\",\"response\":\"Hi\",\"done\":false}\n\
{\"model\":\"m\",\"response\":\"\",\"done\":true,\"done_reason\":\"stop\",\"total_duration\":900000000,\
\"prompt_eval_count\":26,\"prompt_eval_duration\":130000000,\"eval_count\":290,\"eval_duration\":4700000000}\n";

    const LLAMA_CPP: &[u8] =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\
\"timings\":{\"prompt_n\":12,\"prompt_ms\":40.5,\"predicted_n\":33,\"predicted_ms\":410.2}}\n\n\
data: [DONE]\n\n";

    fn last(framing: Framing, pieces: &[&[u8]]) -> Option<Reported> {
        let mut l = LastEvent::new(framing);
        for p in pieces {
            l.push(p);
        }
        l.reported()
    }

    #[test]
    fn the_last_event_of_each_framing_is_read() {
        let r = last(Framing::Ndjson, &[OLLAMA]).unwrap();
        assert_eq!((r.prompt_tokens, r.output_tokens), (Some(26), Some(290)));
        let r = last(Framing::Sse, &[LLAMA_CPP]).unwrap();
        assert_eq!((r.prompt_tokens, r.output_tokens), (Some(12), Some(33)));
        let whole = br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#;
        assert_eq!(
            last(Framing::Whole, &[&whole[..9], &whole[9..]])
                .unwrap()
                .output_tokens,
            Some(7)
        );
        // A stream whose last event reports nothing reports nothing.
        assert_eq!(
            last(Framing::Sse, &[b"data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"choices\":[]}\n\ndata: [DONE]\n\n"]),
            None
        );
    }

    proptest! {
        /// However the answer is cut into pieces, the last event is found.
        #[test]
        fn any_cut_finds_the_same_last_event(
            cuts in prop::collection::vec(0usize..LLAMA_CPP.len(), 0..8),
            ndjson in any::<bool>(),
        ) {
            let (framing, body) = if ndjson { (Framing::Ndjson, OLLAMA) } else { (Framing::Sse, LLAMA_CPP) };
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % body.len()).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in cuts {
                pieces.push(&body[at..c]);
                at = c;
            }
            pieces.push(&body[at..]);
            prop_assert_eq!(last(framing, &pieces), last(framing, &[body]));
            prop_assert!(last(framing, &[body]).is_some());
        }
    }
}
