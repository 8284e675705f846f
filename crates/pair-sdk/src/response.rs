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
use pair_core::NodeId;
use serde::de::DeserializeOwned;

use crate::error::{Attempts, Error, Result};
pub use pair_translate::frame::{Event, Framing, Splitter};

/// A node's answer body: its stream as it comes, or one that goes on from
/// another node when it is cut.
pub type AnswerBody = http_body_util::combinators::UnsyncBoxBody<Bytes, hyper::Error>;

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
    body: AnswerBody,
}

impl Response {
    pub(crate) fn new(
        resp: http::Response<AnswerBody>,
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
    body: Option<AnswerBody>,
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
