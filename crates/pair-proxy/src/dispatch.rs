//! Sending one attempt of a request to one hop: the local engine over
//! keep-alive HTTP/1.1 from the event loop's own pool
//! ([`pair_http::client`]), or a peer's cluster port over mutual TLS
//! ([`pair_link::PeerLink`], hyper-util's pooled client, one per peer).
//! Neither pool is capped below the expected concurrency, and TCP_NODELAY
//! is on in both.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http::uri::Authority;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use http_body_util::Full;
use hyper::body::Incoming;
use pair_cluster::Progress;
use pair_core::{EngineKind, JobId, NodeId};
use pair_http::client::{ClientError, EngineAnswer, EngineBody, LocalPool, Outgoing, Timeouts};
use pair_http::h1::Headers;
use pair_http::request::{RequestHead, copy_headers, strip_response_hop_headers};
use pair_link::PeerLink;
use pair_scheduler::drive::Classified;

/// An engine on this machine, behind the node's proxy.
#[derive(Clone, Debug)]
pub struct LocalEngine {
    pub kind: EngineKind,
    /// e.g. `http://127.0.0.1:11435`.
    pub base: Uri,
    /// Asks this engine's poller to re-read its inventory now: signalled
    /// when the engine answers 404 for a model this node advertised.
    pub refresh: Option<Arc<tokio::sync::Notify>>,
    /// Whether it is getting anywhere (stamped by its answers; shared with
    /// the node's report, which takes a stalled engine out of routing).
    pub progress: Arc<Progress>,
    /// `base`'s authority (the pool key) and the `Host` value for it, made
    /// once here rather than per request.
    to: Authority,
    host: HeaderValue,
}

impl LocalEngine {
    pub fn new(
        kind: EngineKind,
        base: Uri,
        refresh: Option<Arc<tokio::sync::Notify>>,
        progress: Arc<Progress>,
    ) -> Result<Self, DispatchError> {
        let to = base.authority().cloned().ok_or(DispatchError::NoHost)?;
        let host = pair_http::request::host_value(&to)
            .map_err(|e| DispatchError::BadRequest { source: e.into() })?;
        Ok(Self {
            kind,
            base,
            refresh,
            progress,
            to,
            host,
        })
    }

    /// The hop that sends a request to this engine: `self` is the running
    /// loop's copy ([`crate::state::ProxyState::engines`]), so the
    /// reference count taken is that loop's own.
    pub(crate) fn hop(self: &Arc<Self>) -> Hop {
        Hop::Local(Arc::clone(self))
    }

    /// The engine's address (the pool's key).
    pub(crate) fn authority(&self) -> &Authority {
        &self.to
    }

    /// The `Host` value for it.
    pub(crate) fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// A copy for one event loop that shares no buffer with this one
    /// (`Authority` and `HeaderValue` clones share their bytes, and with
    /// them a reference count every loop would write per request). The
    /// poller's signal stays shared: it is not cloned per request.
    pub(crate) fn copy_for_loop(&self) -> Arc<Self> {
        let copy = |to: &Authority, host: &HeaderValue| {
            Some((
                Authority::try_from(to.as_str()).ok()?,
                HeaderValue::from_bytes(host.as_bytes()).ok()?,
            ))
        };
        let (to, host) = copy(&self.to, &self.host)
            // Cannot fail (both were valid); a shared copy if it did.
            .unwrap_or_else(|| (self.to.clone(), self.host.clone()));
        Arc::new(Self {
            kind: self.kind,
            base: self.base.clone(),
            refresh: self.refresh.clone(),
            progress: Arc::clone(&self.progress),
            to,
            host,
        })
    }
}

pub use pair_link::header::JOB_HEADER;

/// Where one attempt goes.
#[derive(Clone, Debug)]
pub enum Hop {
    /// An engine on this machine: the running event loop's copy of it
    /// (its address, e.g. `127.0.0.1:11435`, the `Host` value for it, and
    /// the signal that makes its poller re-read the inventory).
    Local(Arc<LocalEngine>),
    /// A paired peer's cluster port.
    Peer(Box<PeerLink>),
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("invalid upstream address")]
    BadUri {
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("could not build the upstream request")]
    BadRequest {
        #[source]
        source: http::Error,
    },
    #[error("the engine's address names no host")]
    NoHost,
    #[error("engine connection error")]
    Engine {
        #[source]
        source: ClientError,
    },
    #[error("peer hop")]
    Peer {
        #[source]
        source: pair_link::ClusterError,
    },
    #[error("upstream body error before the first byte")]
    Body {
        #[source]
        source: hyper::Error,
    },
    #[error("no first byte within {0:?}")]
    Deadline(Duration),
    #[error("no route to peer {0} (not paired or not reachable)")]
    NoLink(NodeId),
    #[error("the answer's body failed before its first byte")]
    Cut,
    /// Batch work cut before its first byte for interactive work.
    #[error("cut before its first byte for interactive work")]
    Preempted,
    /// The peer gave up before any answer from its engine, and said why.
    #[error("the peer gave up before an answer: {}", .0.what)]
    PeerGaveUp(&'static pair_core::FailureClass),
}

impl DispatchError {
    /// The error with its whole source chain, for messages to users.
    pub fn detail(&self) -> String {
        let mut out = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }
}

/// Every dispatch failure happens before anything reached the client, and
/// each depends on the hop (its address, its connection, a relay URI that
/// a peer hop makes longer), so another candidate may take the request.
impl Classified for DispatchError {
    /// A short, stable label for receipts, job records and metrics; a
    /// peer's failure classifies itself as the edge SDK reads it.
    fn class(&self) -> &'static str {
        match self {
            DispatchError::BadUri { .. } | DispatchError::BadRequest { .. } => "bad-request",
            DispatchError::NoHost => "no-link",
            DispatchError::Engine {
                source: ClientError::Connect { .. },
            } => "connect",
            DispatchError::Engine { source } if engine_reset(source) => "reset",
            DispatchError::Engine { .. } => "transport",
            DispatchError::Peer { source } => source.class(),
            DispatchError::Body { .. } | DispatchError::Cut => "body",
            DispatchError::Preempted => PREEMPTED,
            DispatchError::Deadline(_) => "first-byte-timeout",
            DispatchError::NoLink(_) => "no-link",
            DispatchError::PeerGaveUp(c) => c.label,
        }
    }

    fn advice(&self) -> pair_core::RetryAdvice {
        match self {
            DispatchError::PeerGaveUp(c) => c.advice(),
            _ => pair_core::RetryAdvice::BeforeFirstByte,
        }
    }

    /// Whether the node refused only for now (a refused or reset
    /// connection, closed before any answer): it may take the request again
    /// after a back-off.
    fn transient(&self) -> bool {
        match self {
            DispatchError::Engine { source } => match source {
                ClientError::Connect { source } => {
                    source.kind() == std::io::ErrorKind::ConnectionRefused
                }
                other => engine_reset(other),
            },
            DispatchError::Peer { source } => source.transient(),
            DispatchError::PeerGaveUp(c) => c.transient,
            _ => false,
        }
    }
}

/// What a relayed attempt tells the peer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Relayed {
    /// The job it is, so the peer records it under the same id.
    pub job: Option<JobId>,
    /// No other node is left if this attempt fails
    /// ([`pair_link::ALONE_HEADER`]).
    pub alone: bool,
    /// The reservation it runs under, `(epoch, seq)`
    /// ([`pair_link::RESERVATION_HEADER`]).
    pub reservation: Option<(u64, u64)>,
    /// Only into a free slot ([`pair_link::FREE_SLOT_HEADER`]), as work
    /// of this priority.
    pub free_slot: Option<pair_core::Priority>,
    /// A batch answer the node may cut ([`pair_link::CUTTABLE_HEADER`]),
    /// of this many tokens as planned.
    pub cuttable: Option<u32>,
}

/// The failure class of batch work cut before its first byte to give its
/// slot to interactive work.
pub(crate) const PREEMPTED: &str = "preempted";

/// The class a peer gave for giving up on a relayed request before any
/// answer from its engine ([`pair_link::FAILED_HEADER`]); `None` for
/// an answer its engine gave, and for a local engine's.
pub(crate) fn peer_failure(hop: &Hop, up: &Upstream) -> Option<&'static pair_core::FailureClass> {
    if !matches!(hop, Hop::Peer(_)) {
        return None;
    }
    link_failure(&up.headers)
}

/// The class in a peer's [`pair_link::FAILED_HEADER`], when there is
/// one.
fn link_failure(headers: &Headers) -> Option<&'static pair_core::FailureClass> {
    let v = headers.get(&pair_link::FAILED_HEADER)?;
    let label = std::str::from_utf8(v).ok()?;
    // A class this node does not know (a newer peer's) moves on as a
    // transport failure would.
    pair_core::failure_class(label).or_else(|| pair_core::failure_class("transport"))
}

/// An engine connection closed or reset before its answer's head.
fn engine_reset(e: &ClientError) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    match e {
        ClientError::Closed => true,
        ClientError::Io(e) => matches!(e.kind(), ConnectionReset | BrokenPipe),
        _ => false,
    }
}

/// An answer's body from either kind of hop.
#[derive(Debug)]
pub enum UpBody {
    /// Read off a local engine connection ([`pair_http::client`]).
    Engine(EngineBody),
    /// Relayed by a peer over its mTLS connection.
    Peer(Incoming),
    /// Another answer's body wrapped: a local engine's answer in the
    /// client's API shape, or a stream that moves on a cut
    /// ([`crate::resume`]).
    Translated(BoxedBody),
    /// An answer this node made itself (taken once).
    Fixed(Option<Bytes>),
}

/// A body that wraps another answer's (a translated one).
pub struct BoxedBody(
    pub std::pin::Pin<Box<dyn http_body::Body<Data = Bytes, Error = UpBodyError> + Send>>,
);

impl std::fmt::Debug for BoxedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoxedBody")
    }
}

/// How an answer's body failed.
#[derive(Debug, thiserror::Error)]
pub enum UpBodyError {
    #[error(transparent)]
    Engine(#[from] ClientError),
    #[error("peer connection: {0}")]
    Peer(#[from] hyper::Error),
    /// Nothing came for the stream's no-progress bound after its start.
    #[error("no progress for {0:?} mid-answer")]
    Stalled(std::time::Duration),
    /// Cut to give its slot to interactive work (`--queue preempt`).
    #[error("cut for interactive work")]
    Preempted,
}

impl UpBodyError {
    /// A short label for job records and error events.
    pub fn class(&self) -> &'static str {
        match self {
            UpBodyError::Engine(e) => e.class(),
            UpBodyError::Peer(e) if e.is_incomplete_message() => "upstream-closed",
            UpBodyError::Peer(e) if e.is_timeout() => "upstream-timeout",
            UpBodyError::Peer(_) => "upstream-error",
            UpBodyError::Stalled(_) => "stalled",
            UpBodyError::Preempted => "preempted",
        }
    }
}

impl UpBody {
    /// This stream, failing with [`UpBodyError::Stalled`] when no frame
    /// comes for `bound` after its first one: an engine (or a peer) that
    /// went silent mid-answer is a cut, continued elsewhere or ended with
    /// an error event, never a client left waiting. Until the first frame,
    /// the attempt's own stall allowance (which knows a long prefill is
    /// coming) applies.
    pub fn watched(self, bound: std::time::Duration) -> UpBody {
        UpBody::Translated(BoxedBody(Box::pin(Watched {
            inner: self,
            bound,
            timer: None,
        })))
    }
}

/// [`UpBody::watched`]'s body.
struct Watched {
    inner: UpBody,
    bound: std::time::Duration,
    /// Armed at the first frame, moved on at each.
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, UpBodyError>>> {
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            std::task::Poll::Pending => {
                if let Some(timer) = this.timer.as_mut()
                    && timer.as_mut().poll(cx).is_ready()
                {
                    return std::task::Poll::Ready(Some(Err(UpBodyError::Stalled(this.bound))));
                }
                std::task::Poll::Pending
            }
            ready => {
                let at = tokio::time::Instant::now() + this.bound;
                match this.timer.as_mut() {
                    Some(timer) => timer.as_mut().reset(at),
                    None => this.timer = Some(Box::pin(tokio::time::sleep_until(at))),
                }
                ready
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

impl http_body::Body for UpBody {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, UpBodyError>>> {
        match self.get_mut() {
            UpBody::Engine(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(UpBodyError::from))),
            UpBody::Peer(b) => std::pin::Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(UpBodyError::from))),
            UpBody::Translated(b) => b.0.as_mut().poll_frame(cx),
            UpBody::Fixed(b) => {
                std::task::Poll::Ready(b.take().map(|d| Ok(http_body::Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Engine(b) => b.is_end_stream(),
            UpBody::Peer(b) => b.is_end_stream(),
            UpBody::Translated(b) => b.0.is_end_stream(),
            UpBody::Fixed(b) => b.is_none(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpBody::Engine(b) => b.size_hint(),
            UpBody::Peer(b) => b.size_hint(),
            UpBody::Translated(_) => http_body::SizeHint::default(),
            UpBody::Fixed(b) => {
                http_body::SizeHint::with_exact(b.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// An answer's head from either kind of hop, and its body.
#[derive(Debug)]
pub struct Upstream {
    pub status: StatusCode,
    /// A local engine's fields as it sent them, or a peer's map; neither
    /// with hop-by-hop headers.
    pub headers: Headers,
    pub body: UpBody,
}

impl Upstream {
    fn engine(a: EngineAnswer) -> Self {
        Upstream {
            status: a.status,
            headers: Headers::Raw(a.fields),
            body: UpBody::Engine(a.body),
        }
    }

    fn peer(resp: Response<Incoming>) -> Self {
        let (parts, body) = resp.into_parts();
        let mut map = parts.headers;
        strip_response_hop_headers(&mut map);
        Upstream {
            status: parts.status,
            headers: Headers::Map(map),
            body: UpBody::Peer(body),
        }
    }

    /// As a response (headers made into a map).
    pub fn into_response(self) -> Response<UpBody> {
        let mut resp = Response::new(self.body);
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.into_map(0);
        resp
    }
}

/// An attempt in flight: the response head arrives when it is ready.
pub type Pending<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Upstream, DispatchError>> + Send + 'a>>;

/// Starts one attempt. No deadline of its own; callers put one around it.
/// Local engines get an origin-form request on this loop's pool; peers the
/// relay URI on their mTLS client.
pub fn request<'a>(
    local: &'a LocalPool,
    hop: &'a Hop,
    head: &RequestHead,
    body: Bytes,
    relayed: Relayed,
) -> Result<Pending<'a>, DispatchError> {
    match hop {
        Hop::Local(engine) => {
            if let Some(client) = local.hyper() {
                let mut req = hyper_request(head, body);
                req.headers_mut()
                    .insert(header::HOST, engine.host().clone());
                *req.uri_mut() =
                    pair_link::link::join_uri(&engine.base, "", head.path_and_query.as_str())
                        .map_err(|source| DispatchError::Peer { source })?;
                let fut = client.request(req);
                return Ok(Box::pin(async move {
                    fut.await
                        .map(Upstream::peer)
                        .map_err(|source| DispatchError::Peer {
                            source: pair_link::ClusterError::Transport { source },
                        })
                }));
            }
            let out = Outgoing::new(engine.host(), head, body);
            Ok(Box::pin(async move {
                local
                    .send(engine.authority(), out)
                    .await
                    .map(Upstream::engine)
                    .map_err(|source| DispatchError::Engine { source })
            }))
        }
        Hop::Peer(link) => {
            let mut req = hyper_request(head, body);
            if let Some((epoch, seq)) = relayed.reservation {
                req.headers_mut().insert(
                    pair_link::RESERVATION_HEADER,
                    pair_link::reservation_value(epoch, seq),
                );
            }
            if relayed.alone {
                req.headers_mut()
                    .insert(pair_link::ALONE_HEADER, HeaderValue::from_static("1"));
            }
            if let Some(priority) = relayed.free_slot {
                req.headers_mut().insert(
                    pair_link::FREE_SLOT_HEADER,
                    HeaderValue::from_static(priority.as_str()),
                );
            }
            if let Some(planned) = relayed.cuttable {
                req.headers_mut()
                    .insert(pair_link::CUTTABLE_HEADER, HeaderValue::from(planned));
            }
            // The node that runs it records the job under the same id.
            if let Some(job) = relayed.job {
                let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
                if let Ok(v) =
                    HeaderValue::from_str(job.as_uuid().hyphenated().encode_lower(&mut buf))
                {
                    req.headers_mut().insert(JOB_HEADER, v);
                }
            }
            *req.uri_mut() = link
                .relay_uri(head.path_and_query.as_str())
                .map_err(|source| DispatchError::Peer { source })?;
            let fut = link.send(req);
            Ok(Box::pin(async move {
                fut.await
                    .map(Upstream::peer)
                    .map_err(|source| DispatchError::Peer { source })
            }))
        }
    }
}

/// The client's request as hyper's client sends it (its URI still to set):
/// method, end-to-end headers, the body.
fn hyper_request(head: &RequestHead, body: Bytes) -> Request<Full<Bytes>> {
    let len = body.len();
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = head.method.clone();
    let headers = req.headers_mut();
    headers.reserve(head.headers.len() + 2);
    copy_headers(&head.headers, headers);
    // The body goes on byte for byte: the client's own Content-Length is
    // still right and costs nothing (hyper would format a new one).
    if len > 0 {
        let length = head
            .headers
            .get(&header::CONTENT_LENGTH)
            .filter(|v| {
                std::str::from_utf8(v)
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    == Some(len)
            })
            .and_then(|v| HeaderValue::from_bytes(v).ok())
            .unwrap_or_else(|| HeaderValue::from(len));
        headers.insert(header::CONTENT_LENGTH, length);
    }
    req
}

/// Sends one attempt and waits (up to the first-byte deadline) for the
/// response head; the answer comes without hop-by-hop headers.
pub async fn send(
    local: &LocalPool,
    hop: &Hop,
    head: &RequestHead,
    body: Bytes,
    timeouts: Timeouts,
) -> Result<Response<UpBody>, DispatchError> {
    let deadline = timeouts.first_byte;
    match tokio::time::timeout(
        deadline,
        request(local, hop, head, body, Relayed::default())?,
    )
    .await
    {
        Ok(r) => r.map(Upstream::into_response),
        Err(_) => Err(DispatchError::Deadline(deadline)),
    }
}

/// A local engine answered 404 for a model this node advertised: have its
/// poller re-read the inventory now rather than at the next poll, so the
/// snapshot stops advertising what is gone.
pub(crate) fn refresh_inventory(hop: &Hop) {
    if let Hop::Local(engine) = hop
        && let Some(r) = &engine.refresh
    {
        r.notify_one();
    }
}

/// Up to `cap` bytes of a body that will not be streamed (an answer kept
/// for an error), read for at most `within`.
pub(crate) async fn read_prefix(body: &mut UpBody, cap: usize, within: Duration) -> Bytes {
    let read = async {
        let mut got = bytes::BytesMut::new();
        while got.len() < cap {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        got.extend_from_slice(&d);
                    }
                }
                _ => break,
            }
        }
        got.truncate(cap);
        got.freeze()
    };
    tokio::time::timeout(within, read).await.unwrap_or_default()
}

/// Reads until the first data frame (trailers-only bodies end the same way).
pub(crate) async fn first_data(body: &mut UpBody) -> Result<Option<Bytes>, DispatchError> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(UpBodyError::Preempted)) => return Err(DispatchError::Preempted),
            Some(Err(_)) => return Err(DispatchError::Cut),
            Some(Ok(f)) => {
                if let Ok(data) = f.into_data()
                    && !data.is_empty()
                {
                    return Ok(Some(data));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dispatch_failure_may_go_to_another_node() {
        for e in [
            DispatchError::NoHost,
            DispatchError::NoLink(NodeId::from_u128(1)),
            DispatchError::Deadline(std::time::Duration::from_secs(1)),
        ] {
            assert!(e.advice().may_retry(), "{e}");
        }
    }

    /// Every class this node's failures take is one of the table's, and
    /// a peer's class read off the link fails the attempt as it would
    /// here: moved on, refused for now or not, by the table.
    #[test]
    fn failures_are_classed_by_the_one_table_on_both_sides_of_a_hop() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let here = [
            DispatchError::NoHost,
            DispatchError::NoLink(NodeId::from_u128(1)),
            DispatchError::Deadline(std::time::Duration::from_secs(1)),
            DispatchError::Cut,
            DispatchError::Preempted,
            DispatchError::Engine {
                source: ClientError::Connect { source: refused },
            },
            DispatchError::Engine {
                source: ClientError::Closed,
            },
        ];
        for e in &here {
            let class = pair_core::failure_class(e.class())
                .unwrap_or_else(|| panic!("{} is not in the table", e.class()));
            assert_eq!(e.transient(), class.transient, "{}", e.class());
            assert_eq!(e.advice(), class.advice(), "{}", e.class());
        }
        let link = |class: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                pair_link::FAILED_HEADER,
                HeaderValue::from_str(class).unwrap(),
            );
            Headers::Map(headers)
        };
        for class in pair_core::FAILURE_CLASSES {
            let got = link_failure(&link(class.label)).expect("a peer's class");
            let e = DispatchError::PeerGaveUp(got);
            assert_eq!(e.class(), class.label);
            assert_eq!(e.transient(), class.transient);
            assert_eq!(e.advice().may_retry(), class.moves_on);
        }
        // A class this node does not know moves on as a transport failure.
        assert_eq!(
            link_failure(&link("newer-class")).map(|c| c.label),
            Some("transport")
        );
        // An engine's own 504, no class on it, is an answer.
        assert!(link_failure(&Headers::Map(http::HeaderMap::new())).is_none());
    }
}
