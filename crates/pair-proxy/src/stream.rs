//! The response body handed to the client: upstream frames pass through as
//! they arrive (nothing buffers a response), progress is counted, and a
//! failure after the first byte ends a stream with an explicit error event
//! instead of a silent truncation that looks like success. Events are
//! found by the one stream [`Reader`], read once as they pass, in place.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pair_core::ApiFlavor;

pub use pair_translate::frame::Framing;
use pair_translate::frame::{Kind, Reader, Step};

use crate::dispatch::{UpBody, UpBodyError};
use crate::engine_report::{Reported, read};

/// The event that ends a stream whose upstream failed after the first byte,
/// in the stream's own framing so SDKs raise it as an error.
pub fn stream_error_event(framing: Framing, flavor: ApiFlavor, message: &str) -> Option<Bytes> {
    let msg = serde_json::Value::from(message);
    let text = match (framing, flavor) {
        (Framing::JsonLines, _) => format!("{{\"error\":{msg}}}\n"),
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
    /// `events` stream events (about one token each) just passed through:
    /// events with a payload other than `[DONE]`, counted as they end.
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
    /// Finds the answer's events as it passes.
    reader: Reader,
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
            .field("framing", &self.reader.framing())
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
            reader: Reader::new(framing),
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
        self.last = Some(LastEvent::new(self.reader.framing()));
        self.translated = made_by_pair;
        self
    }

    fn count(&mut self, chunk: &[u8]) {
        let n = tally(&mut self.last, self.reader.read(chunk));
        self.progress(n);
    }

    fn progress(&mut self, n: u32) {
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

    /// The answer has ended. Completed, what came after its last line end
    /// is its last event (a whole answer's is the answer, not a stream
    /// event: it is not counted).
    fn end(&mut self, ending: Ending) {
        self.ending.get_or_insert(ending);
        if ending == Ending::Completed && self.watcher.is_some() {
            let n = tally(&mut self.last, self.reader.finish());
            if n > 0 && self.reader.framing() != Framing::Whole {
                self.progress(n);
            }
        }
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
                    this.reader.framing(),
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

/// The payload events among `steps`, counted as they end; `last` keeps
/// the last, where one is kept.
fn tally<'a>(last: &mut Option<LastEvent>, steps: impl Iterator<Item = Step<'a>>) -> u32 {
    let mut n = 0u32;
    for step in steps {
        if let Some(l) = last.as_mut() {
            l.step(step);
        }
        if step == Step::End(Kind::Json) {
            n = n.saturating_add(1);
        }
    }
    n
}

/// Most bytes kept of a whole (non-streamed) answer to read its counts
/// from; a longer one is not read.
const WHOLE_MAX: usize = 256 << 10;
/// Most payload bytes kept of one stream event; a longer event is skipped.
const EVENT_MAX: usize = 64 << 10;

/// The last event of an answer going by, from its [`Reader`]'s steps: for
/// a stream, its last payload other than `[DONE]` and Anthropic's
/// `message_stop`; for a whole answer, the answer. Copied into buffers
/// kept for the answer's life: no allocation per event once they have
/// grown to an event's size.
#[derive(Debug)]
pub struct LastEvent {
    /// Most bytes kept of one event.
    max: usize,
    /// The event still arriving.
    pending: Vec<u8>,
    /// The event arriving is too long to keep.
    skip: bool,
    last: Vec<u8>,
}

impl LastEvent {
    pub fn new(framing: Framing) -> Self {
        Self {
            max: if framing == Framing::Whole {
                WHOLE_MAX
            } else {
                EVENT_MAX
            },
            pending: Vec::new(),
            skip: false,
            last: Vec::new(),
        }
    }

    /// Takes the answer's next step.
    pub fn step(&mut self, step: Step<'_>) {
        match step {
            Step::Data(_) if self.skip => {}
            Step::Data(d) if self.pending.len() + d.len() > self.max => {
                self.skip = true;
                self.pending.clear();
            }
            Step::Data(d) => self.pending.extend_from_slice(d),
            Step::End(kind) => {
                // Anthropic's end of stream: the usage is in the
                // message_delta before it.
                if kind == Kind::Json
                    && !self.skip
                    && !self.pending.starts_with(b"{\"type\":\"message_stop\"")
                {
                    std::mem::swap(&mut self.pending, &mut self.last);
                }
                self.pending.clear();
                self.skip = false;
            }
        }
    }

    /// What the engine reported at the end of the answer.
    pub fn reported(&self) -> Option<Reported> {
        if self.last.is_empty() {
            return None;
        }
        read(&self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What a watcher was told.
    #[derive(Debug, Default)]
    struct Told {
        drained: bool,
        ending: Option<Ending>,
        progress: u32,
        events: u32,
        reported: Option<Reported>,
    }

    /// What a watcher heard, shared with the test.
    #[derive(Clone, Default)]
    struct Heard(std::sync::Arc<std::sync::Mutex<Told>>);

    impl Heard {
        fn told(&self) -> std::sync::MutexGuard<'_, Told> {
            self.0.lock().unwrap()
        }
    }

    impl Watcher for Heard {
        fn progress(&mut self, events: u32) {
            self.told().progress += events;
        }
        fn drained(&mut self) {
            self.told().drained = true;
        }
        fn finish(&mut self, ending: Ending, events: u32, reported: Option<Reported>) {
            let mut h = self.told();
            assert!(h.ending.is_none(), "finished twice");
            (h.ending, h.events, h.reported) = (Some(ending), events, reported);
        }
    }

    fn body(
        framing: Framing,
        first: Option<&'static str>,
        rest: Option<&'static str>,
    ) -> (AnswerBody<Heard>, Heard) {
        let heard = Heard::default();
        let b = AnswerBody::new(
            first.map(Bytes::from),
            UpBody::Fixed(rest.map(Bytes::from)),
            framing,
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
            let (mut b, heard) = body(Framing::Whole, first, rest);
            assert!(poll(&mut b).is_some());
            // Its load goes at once; the client may not have it yet.
            let h = heard.told();
            assert_eq!((h.drained, h.ending), (true, None));
            drop(h);
            assert!(!b.is_end_stream());
            assert!(poll(&mut b).is_none());
            assert!(b.is_end_stream());
            let h = heard.told();
            assert_eq!((h.ending, h.events), (Some(Ending::Completed), 0));
            drop(h);
            drop(b);
            // Dropped after the last piece was handed but before the server
            // asked past it (its write failed: the client reset).
            let (mut b, heard) = body(Framing::Whole, first, rest);
            assert!(poll(&mut b).is_some());
            drop(b);
            let h = heard.told();
            assert_eq!((h.drained, h.ending), (true, Some(Ending::Cancelled)));
        }
    }

    #[test]
    fn events_are_counted_as_they_end_whatever_the_chunks() {
        let (b, heard) = body(
            Framing::Sse,
            Some(": ping\r\n\r\ndata: {\"choices\":[]}\r\n\r\ndata: {\"usage\":\n"),
            Some("data: {\"prompt_tokens\":3,\"completion_tokens\":4}}\n"),
        );
        let mut b = b.reading_report(false);
        assert!(poll(&mut b).is_some());
        assert_eq!(heard.told().progress, 1, "the usage event has not ended");
        assert!(poll(&mut b).is_some());
        assert!(poll(&mut b).is_none());
        let h = heard.told();
        assert_eq!(
            (h.progress, h.events),
            (2, 2),
            "the end of the answer ends it"
        );
        assert_eq!(h.reported.and_then(|r| r.output_tokens), Some(4));
    }

    #[test]
    fn error_events_parse_in_their_framing() {
        let nd = stream_error_event(Framing::JsonLines, ApiFlavor::Ollama, "boom \"x\"").unwrap();
        let v: serde_json::Value = serde_json::from_slice(nd.trim_ascii_end()).unwrap();
        assert_eq!(v["error"], "boom \"x\"");

        let sse = stream_error_event(Framing::Sse, ApiFlavor::OpenAi, "boom").unwrap();
        let text = std::str::from_utf8(&sse).unwrap();
        let data = text.strip_prefix("data: ").unwrap().trim_end();
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["error"]["message"], "boom");

        assert!(stream_error_event(Framing::Whole, ApiFlavor::OpenAi, "boom").is_none());
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
        let (mut reader, mut l) = (Reader::new(framing), LastEvent::new(framing));
        for p in pieces {
            reader.read(p).for_each(|s| l.step(s));
        }
        reader.finish().for_each(|s| l.step(s));
        l.reported()
    }

    #[test]
    fn the_last_event_of_each_framing_is_read() {
        let r = last(Framing::JsonLines, &[OLLAMA]).unwrap();
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
        // An event's data lines join; Anthropic's message_stop is passed over.
        let anthropic = b"event: message_delta\ndata: {\"type\":\"message_delta\",\n\
data: \"usage\":{\"input_tokens\":2,\"output_tokens\":9}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(
            last(Framing::Sse, &[anthropic]).and_then(|r| r.output_tokens),
            Some(9)
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
            let (framing, body) = if ndjson { (Framing::JsonLines, OLLAMA) } else { (Framing::Sse, LLAMA_CPP) };
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
