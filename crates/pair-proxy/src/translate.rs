//! The last hop in another API's shape: when this node's engine does not
//! speak the client's API (an Ollama or Anthropic client, an
//! OpenAI-compatible engine), the request goes to it translated
//! ([`pair_translate`]) and its answer comes back translated, chunk by
//! chunk as it arrives. A peer's request is translated where it runs, so
//! a relay carries the client's own shape, except Anthropic's and
//! Responses', which the origin translates (their streams continue after a
//! cut only below translation).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderValue, Method, StatusCode};
use http_body::{Body, Frame};
use pair_core::{ApiFlavor, EngineKind};
use pair_http::h1::Headers;
use pair_http::request::RequestHead;
use pair_link::InferenceRoute;
use pair_link::header::{DROPPED_HEADER, TRANSLATED_HEADER};
use pair_translate::{Answer, EngineTraits, Route, Target, Timing, TranslateError};
use tokio::time::Instant;

use crate::dispatch::{BoxedBody, Hop, UpBody, UpBodyError, Upstream};

/// The translation `hop` needs for a request of `flavor` on `route`, and
/// for which kind of engine: a local engine that does not speak the
/// client's API, on a route that translates; and an Anthropic or
/// Responses request relayed to a peer (`peer_engine`: the kind of its
/// engine that holds the model), so that every stream below translation
/// is one a cut can continue ([`crate::resume`]).
pub(crate) fn needed(
    hop: &Hop,
    flavor: ApiFlavor,
    route: InferenceRoute,
    peer_engine: Option<EngineKind>,
) -> Option<(Route, EngineKind)> {
    match hop {
        Hop::Local(engine) if !engine.kind.speaks(flavor) => {
            Some((route.translated()?, engine.kind))
        }
        Hop::Peer(_) if matches!(flavor, ApiFlavor::Anthropic | ApiFlavor::Responses) => Some((
            route.translated()?,
            peer_engine.unwrap_or(EngineKind::OpenAiCompat),
        )),
        _ => None,
    }
}

/// The engine's route for a translated request (none for the model list,
/// a `GET`).
fn target(t: Target) -> Option<InferenceRoute> {
    match t {
        Target::Chat => Some(InferenceRoute::OpenAiChat),
        Target::Completion => Some(InferenceRoute::OpenAiCompletion),
        Target::Embeddings => Some(InferenceRoute::OpenAiEmbeddings),
        Target::Models => None,
    }
}

/// A request in the engine's shape: its head and body, what turns its
/// answer back, and the client's fields it left out.
pub(crate) struct ForEngine {
    pub head: RequestHead,
    /// The engine's route it is sent on (none for the model list).
    pub route: Option<InferenceRoute>,
    pub body: Bytes,
    pub answer: Answer,
    pub dropped: Vec<String>,
}

/// The request in the engine's shape, and what turns its answer back.
pub(crate) fn request(
    route: Route,
    engine: EngineKind,
    head: &RequestHead,
    body: &[u8],
) -> Result<ForEngine, TranslateError> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let created_at = pair_core::rfc3339(now.as_secs(), now.subsec_nanos());
    let traits = EngineTraits {
        // Ollama's chat templates take system messages anywhere.
        system_anywhere: engine == EngineKind::Ollama,
    };
    let t = pair_translate::request_for(route, body, &created_at, traits)?;
    let route = target(t.target);
    let (method, path) = match route {
        Some(r) => (Method::POST, r.path()),
        None => (Method::GET, "/v1/models"),
    };
    let mut headers = head.headers.clone().into_map(2);
    if method == Method::GET {
        headers.remove(CONTENT_LENGTH);
        headers.remove(CONTENT_TYPE);
    } else {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(t.body.len()));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let head = RequestHead {
        method,
        path_and_query: http::uri::PathAndQuery::from_static(path),
        headers: Headers::Map(headers),
    };
    Ok(ForEngine {
        head,
        route,
        body: Bytes::from(t.body),
        answer: t.answer,
        dropped: t.dropped,
    })
}

/// The engine's answer in the client's shape: a stream of server-sent
/// events is translated as it arrives; anything else (a whole answer, an
/// error) is read whole and translated at its end.
pub(crate) fn answer(
    up: Upstream,
    answer: Answer,
    route: Route,
    dropped: &[String],
    received: Instant,
) -> Upstream {
    let streamed = up.status.is_success()
        && up
            .headers
            .get(&CONTENT_TYPE)
            .is_some_and(|ct| ct.starts_with(b"text/event-stream"));
    let mut headers = up.headers.into_map(2);
    headers.remove(CONTENT_LENGTH);
    let content_type = if streamed {
        answer.content_type()
    } else if matches!(
        route,
        Route::AnthropicMessages | Route::AnthropicCountTokens | Route::OpenAiResponses
    ) {
        "application/json"
    } else {
        "application/json; charset=utf-8"
    };
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(TRANSLATED_HEADER, HeaderValue::from_static(route.label()));
    if !dropped.is_empty()
        && let Ok(v) = HeaderValue::from_str(&dropped.join(","))
    {
        headers.insert(DROPPED_HEADER, v);
    }
    Upstream {
        status: up.status,
        headers: Headers::Map(headers),
        body: UpBody::Translated(BoxedBody(Box::pin(TranslatedBody {
            inner: up.body,
            answer,
            status: up.status,
            streamed,
            received,
            first_token: None,
            whole: BytesMut::new(),
            ready: VecDeque::new(),
            held: None,
            lined: false,
            ended: false,
        }))),
    }
}

/// A 400 for a request that cannot be put in the engine's shape, in the
/// client's own error format, as if the engine had answered it (it is the
/// client's fault: never retried).
pub(crate) fn refused(e: &TranslateError, flavor: ApiFlavor) -> Upstream {
    let message = format!("pair cannot translate this request for the engine: {e}");
    let (ct, body) =
        crate::error::error_body(StatusCode::BAD_REQUEST, flavor, "invalid_request", &message);
    let mut headers = http::HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    Upstream {
        status: StatusCode::BAD_REQUEST,
        headers: Headers::Map(headers),
        body: UpBody::Fixed(Some(body)),
    }
}

/// An answer being translated.
#[derive(Debug)]
pub struct TranslatedBody {
    inner: UpBody,
    answer: Answer,
    status: StatusCode,
    streamed: bool,
    received: Instant,
    first_token: Option<Instant>,
    /// A whole answer, read to its end before it is translated.
    whole: BytesMut,
    ready: VecDeque<Bytes>,
    /// What followed the first event of the first piece of a stream,
    /// translated once that event's line is out.
    held: Option<Bytes>,
    /// A line of the translated stream has been made.
    lined: bool,
    ended: bool,
}

impl TranslatedBody {
    fn timing(&self) -> Timing {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let total = self.received.elapsed();
        let first = self
            .first_token
            .map_or(total, |t| t.saturating_duration_since(self.received));
        Timing {
            total_ns: ns(total),
            first_token_ns: ns(first),
        }
    }

    /// Translates a piece of the engine's stream into `ready`. Until the
    /// client has its first line, the piece is taken one event at a time
    /// and what follows the event that gave a line is held for the next
    /// poll: that line goes out before the rest of a burst is translated.
    fn translate(&mut self, mut data: Bytes) {
        let mut out = Vec::new();
        let timing = self.timing();
        while !self.lined && !self.answer.done() {
            match data.windows(2).position(|w| w == b"\n\n") {
                Some(i) if i + 2 < data.len() => {
                    let event = data.split_to(i + 2);
                    self.answer.push(&event, timing, &mut out);
                    self.lined = !out.is_empty();
                }
                _ => break,
            }
        }
        if self.lined && !out.is_empty() {
            if !data.is_empty() {
                self.held = Some(data);
            }
        } else {
            self.answer.push(&data, timing, &mut out);
            self.lined |= !out.is_empty();
        }
        if !out.is_empty() {
            self.ready.push_back(out.into());
        }
        if self.answer.done() {
            self.ended = true;
        }
    }

    /// Most bytes of a whole answer read before translating it.
    const WHOLE_CAP: usize = 64 << 20;
}

impl Body for TranslatedBody {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpBodyError>>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            if let Some(rest) = this.held.take() {
                this.translate(rest);
                continue;
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    if data.is_empty() {
                        continue;
                    }
                    this.first_token.get_or_insert_with(Instant::now);
                    if this.streamed {
                        this.translate(data);
                    } else if this.whole.len() + data.len() > Self::WHOLE_CAP {
                        this.ended = true;
                        let message = "the engine's answer is too large to translate";
                        this.ready.push_back(
                            this.answer
                                .whole(502, message.as_bytes(), this.timing())
                                .into(),
                        );
                    } else {
                        this.whole.extend_from_slice(&data);
                    }
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    let timing = this.timing();
                    let out = if this.streamed {
                        let mut out = Vec::new();
                        this.answer.finish(timing, &mut out);
                        out
                    } else {
                        this.answer.whole(this.status.as_u16(), &this.whole, timing)
                    };
                    if !out.is_empty() {
                        this.ready.push_back(out.into());
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.ready.is_empty()
    }
}
