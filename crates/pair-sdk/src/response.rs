//! A node's answer: its head, which node served it and how soon, and its
//! body as bytes, a stream of bytes, or a stream of typed chunks (OpenAI's
//! server-sent events, Ollama's JSON lines). A body that breaks after its
//! first byte, or ends with the node's in-stream error, is an
//! [`Error::Interrupted`]: nothing is resent.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use http::{HeaderMap, StatusCode};
use http_body::Body as _;
use hyper::body::Incoming;
use pair_core::NodeId;
use serde::de::DeserializeOwned;

use crate::error::{Attempts, Error, Result};

/// A node's answer.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The node that served it.
    pub node: NodeId,
    pub node_name: String,
    /// Dispatches it took (1: the first node answered).
    pub attempts: usize,
    /// From sending to the serving node until its head (or, for a
    /// stream, its first chunk) arrived.
    pub first_byte: Duration,
    first: Option<Bytes>,
    body: Incoming,
}

impl Response {
    pub(crate) fn new(
        resp: http::Response<Incoming>,
        first: Option<Bytes>,
        node: NodeId,
        node_name: String,
        attempts: usize,
        first_byte: Duration,
    ) -> Self {
        let (parts, body) = resp.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            node,
            node_name,
            attempts,
            first_byte,
            first,
            body,
        }
    }

    /// The body as it arrives.
    pub fn into_stream(self) -> BodyStream {
        BodyStream {
            first: self.first,
            body: Some(self.body),
            node: self.node_name,
            done: false,
        }
    }

    /// The whole body.
    pub async fn bytes(self) -> Result<Bytes> {
        use futures_util::StreamExt;
        let mut all = BytesMut::new();
        let mut s = self.into_stream();
        while let Some(chunk) = s.next().await {
            all.extend_from_slice(&chunk?);
        }
        Ok(all.freeze())
    }

    /// The body as JSON of type `T`; a status other than 2xx is an
    /// [`Error::Status`] with the node's body.
    pub async fn json<T: DeserializeOwned>(self, model: &str) -> Result<T> {
        let (status, node) = (self.status, self.node_name.clone());
        let body = self.bytes().await?;
        if !status.is_success() {
            return Err(status_error(model, &node, status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| Error::BadAnswer {
            node,
            detail: e.to_string(),
        })
    }

    /// The body as typed chunks, in the framing of its API.
    pub fn chunks<T: DeserializeOwned>(self, model: &str, framing: Framing) -> Result<Chunks<T>> {
        if !self.status.is_success() {
            return Err(status_error(
                model,
                &self.node_name,
                self.status,
                self.first.as_deref().unwrap_or_default(),
            ));
        }
        let (node, node_name, first_byte, attempts) = (
            self.node,
            self.node_name.clone(),
            self.first_byte,
            self.attempts,
        );
        Ok(Chunks {
            node,
            node_name,
            first_byte,
            attempts,
            body: self.into_stream(),
            splitter: Splitter::new(framing),
            events: Vec::new(),
            ready: VecDeque::new(),
            ended: false,
            _t: PhantomData,
        })
    }
}

fn status_error(model: &str, node: &str, status: StatusCode, body: &[u8]) -> Error {
    Error::Status {
        model: model.to_owned(),
        node: node.to_owned(),
        status: status.as_u16(),
        body: String::from_utf8_lossy(body).into_owned(),
        attempts: Attempts::default(),
    }
}

/// A node's body, data frames as they arrive.
#[derive(Debug)]
pub struct BodyStream {
    first: Option<Bytes>,
    body: Option<Incoming>,
    node: String,
    done: bool,
}

impl Stream for BodyStream {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(first)));
        }
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Err(e))) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(Error::Interrupted {
                        node: self.node.clone(),
                        detail: e.to_string(),
                    })));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
            }
        }
    }
}

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

/// Typed chunks of a streamed answer, with who served it.
#[derive(Debug)]
pub struct Chunks<T> {
    pub node: NodeId,
    pub node_name: String,
    pub first_byte: Duration,
    pub attempts: usize,
    body: BodyStream,
    splitter: Splitter,
    events: Vec<Event>,
    ready: VecDeque<Result<T>>,
    ended: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Chunks<T> {
    /// Turns the splitter's events into chunks (or the error that ends
    /// the stream).
    fn take_events(&mut self) {
        for event in std::mem::take(&mut self.events) {
            if self.ended {
                break;
            }
            let item = match event {
                Event::Done => {
                    self.ended = true;
                    continue;
                }
                Event::Truncated => {
                    self.ended = true;
                    Err(Error::Interrupted {
                        node: self.node_name.clone(),
                        detail: "the stream ended before it said it was complete".into(),
                    })
                }
                Event::TooLarge => {
                    self.ended = true;
                    Err(Error::BadAnswer {
                        node: self.node_name.clone(),
                        detail: format!("a chunk over {} bytes", Splitter::MAX_EVENT),
                    })
                }
                Event::Json(payload) => self.chunk(&payload),
            };
            self.ready.push_back(item);
        }
    }

    fn chunk(&mut self, payload: &[u8]) -> Result<T> {
        match serde_json::from_slice::<serde_json::Value>(payload) {
            Err(e) => Err(Error::BadAnswer {
                node: self.node_name.clone(),
                detail: format!("chunk is not JSON: {e}"),
            }),
            Ok(v) if v.get("error").is_some() && v.get("choices").is_none() => {
                // The node's in-stream error: the answer is incomplete.
                self.ended = true;
                let e = &v["error"];
                let detail = e
                    .get("message")
                    .and_then(|m| m.as_str())
                    .or_else(|| e.as_str())
                    .unwrap_or("error event")
                    .to_owned();
                Err(Error::Interrupted {
                    node: self.node_name.clone(),
                    detail,
                })
            }
            Ok(v) => serde_json::from_value(v).map_err(|e| Error::BadAnswer {
                node: self.node_name.clone(),
                detail: format!("unexpected chunk: {e}"),
            }),
        }
    }
}

// Nothing in it is pinned: chunks are owned values moved out whole.
impl<T> Unpin for Chunks<T> {}

impl<T: DeserializeOwned> Stream for Chunks<T> {
    type Item = Result<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Poll::Ready(Some(item));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            let this = &mut *self;
            match Pin::new(&mut this.body).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => this.splitter.push(&data, &mut this.events),
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    this.splitter.finish(&mut this.events);
                    this.take_events();
                    this.ended = true;
                    continue;
                }
            }
            this.take_events();
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The events of `stream` cut at `cuts`.
    fn split(stream: &[u8], cuts: &[usize], framing: Framing) -> Vec<Event> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        points.sort_unstable();
        points.push(stream.len());
        let (mut sp, mut out, mut at) = (Splitter::new(framing), Vec::new(), 0);
        for p in points {
            sp.push(&stream[at..p], &mut out);
            at = p;
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
