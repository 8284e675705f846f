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
            framing,
            buf: BytesMut::new(),
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

/// Typed chunks of a streamed answer, with who served it.
#[derive(Debug)]
pub struct Chunks<T> {
    pub node: NodeId,
    pub node_name: String,
    pub first_byte: Duration,
    pub attempts: usize,
    body: BodyStream,
    framing: Framing,
    buf: BytesMut,
    ready: VecDeque<Result<T>>,
    ended: bool,
    _t: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Chunks<T> {
    /// Moves every complete event in the buffer to `ready`.
    fn split(&mut self, at_end: bool) {
        loop {
            let (end, skip) = match self.framing {
                Framing::JsonLines => match memchr_nl(&self.buf) {
                    Some(i) => (i, 1),
                    None => break,
                },
                Framing::Sse => match find_event_end(&self.buf) {
                    Some(x) => x,
                    None => break,
                },
            };
            let event = self.buf.split_to(end + skip);
            self.event(&event[..end]);
            if self.ended {
                return;
            }
        }
        if at_end {
            let rest = std::mem::take(&mut self.buf);
            if !rest.iter().all(u8::is_ascii_whitespace) {
                self.event(&rest);
            }
        }
    }

    fn event(&mut self, raw: &[u8]) {
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
                    self.ended = true;
                    return;
                }
                joined.into_bytes()
            }
        };
        if payload.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let item = match serde_json::from_slice::<serde_json::Value>(&payload) {
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
        };
        self.ready.push_back(item);
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
            match Pin::new(&mut self.body).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(data))) => {
                    self.buf.extend_from_slice(&data);
                    self.split(false);
                }
                Poll::Ready(Some(Err(e))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    self.split(true);
                    let truncated = self.framing == Framing::Sse && !self.ended;
                    self.ended = true;
                    if truncated && self.ready.is_empty() {
                        return Poll::Ready(Some(Err(Error::Interrupted {
                            node: self.node_name.clone(),
                            detail: "the stream ended without [DONE]".into(),
                        })));
                    }
                }
            }
        }
    }
}

fn memchr_nl(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
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

    /// Splits `stream` at `cuts` and runs it through the chunker.
    fn parse(
        stream: &[u8],
        cuts: &[usize],
        framing: Framing,
    ) -> Vec<std::result::Result<serde_json::Value, String>> {
        let mut c: Chunks<serde_json::Value> = Chunks {
            node: NodeId::from_u128(1),
            node_name: "n".into(),
            first_byte: Duration::ZERO,
            attempts: 1,
            body: BodyStream {
                first: None,
                body: None,
                node: "n".into(),
                done: true,
            },
            framing,
            buf: BytesMut::new(),
            ready: VecDeque::new(),
            ended: false,
            _t: PhantomData,
        };
        let mut at = 0;
        let mut out = Vec::new();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        points.sort_unstable();
        points.push(stream.len());
        for p in points {
            if c.ended {
                break;
            }
            c.buf.extend_from_slice(&stream[at..p.max(at)]);
            at = p.max(at);
            c.split(false);
        }
        if !c.ended {
            c.split(true);
        }
        while let Some(i) = c.ready.pop_front() {
            out.push(i.map_err(|e| e.to_string()));
        }
        out
    }

    const SSE: &[u8] =
        b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"a\":2}\r\n\r\ndata: [DONE]\n\n";
    const LINES: &[u8] = b"{\"a\":1}\n{\"a\":2}\n\n{\"a\":3}";

    #[test]
    fn events_and_lines_parse_and_the_stream_error_is_an_interruption() {
        let sse = parse(SSE, &[], Framing::Sse);
        assert_eq!(sse.len(), 2);
        assert_eq!(sse[1].as_ref().unwrap()["a"], 2);
        let lines = parse(LINES, &[], Framing::JsonLines);
        assert_eq!(lines.len(), 3);
        let cut = parse(
            b"{\"a\":1}\n{\"error\":\"pair: the serving node failed mid-stream\"}\n",
            &[],
            Framing::JsonLines,
        );
        assert!(
            cut[1]
                .as_ref()
                .unwrap_err()
                .contains("broke after it began"),
            "{cut:?}"
        );
    }

    proptest! {
        #[test]
        fn a_stream_in_any_pieces_parses_as_it_does_whole(cuts in prop::collection::vec(0usize..200, 0..12)) {
            prop_assert_eq!(parse(SSE, &cuts, Framing::Sse), parse(SSE, &[], Framing::Sse));
            prop_assert_eq!(parse(LINES, &cuts, Framing::JsonLines), parse(LINES, &[], Framing::JsonLines));
        }
    }
}
