//! Sending one attempt of a request to one hop: the local engine over
//! keep-alive HTTP/1.1 from the event loop's own pool ([`crate::pool`]), or
//! a peer's cluster port over mutual TLS (hyper-util's pooled client, one
//! per peer).
//!
//! A pool is never capped below the expected concurrency and TCP_NODELAY
//! is on (shared/reference/proxy-performance.md).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pair_core::{NodeId, RetryAdvice};

use crate::pool::{EngineAnswer, EngineBody, EngineError, LocalPool, Outgoing};
use crate::reply::Headers;

pub type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Path prefix under which a peer's cluster port accepts relayed requests.
pub const RELAY_PREFIX: &str = "/pair/v1/relay";

#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP (and TLS) connect.
    pub connect: Duration,
    /// From sending the request to the first byte of the response body.
    pub first_byte: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        // PAIR waits 10 s to connect and 120 s for the first byte. On a LAN a
        // connect that takes over 2 s means the node is gone; the first-byte
        // deadline must cover a cold model load and a queue, so it stays long.
        Self {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(120),
        }
    }
}

/// Where one attempt goes.
#[derive(Clone, Debug)]
pub enum Hop {
    /// An engine on this machine: the running event loop's copy of it
    /// (its address, e.g. `127.0.0.1:11435`, the `Host` value for it, and
    /// the signal that makes its poller re-read the inventory).
    Local(Arc<crate::state::LocalEngine>),
    /// A paired peer's cluster port.
    Peer(Box<PeerLink>),
}

/// A pooled mTLS client to one peer, verifying that peer's pinned identity.
#[derive(Clone)]
pub struct PeerLink {
    pub id: NodeId,
    /// `https://ip:port`.
    pub base: Uri,
    client: TlsClient,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("id", &self.id)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl PeerLink {
    /// `tls` must verify the server as `id` (pair-identity builds it).
    pub fn new(
        id: NodeId,
        addr: std::net::SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        timeouts: Timeouts,
    ) -> Result<Self, DispatchError> {
        let base: Uri = format!("https://{addr}")
            .parse()
            .map_err(|source| DispatchError::BadUri { source })?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_only()
            .enable_http1()
            .wrap_connector(http_connector(timeouts));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self { id, base, client })
    }

    /// A GET or POST to a cluster-port path other than the relay (workload
    /// reports, job events), with a short deadline.
    pub async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Response<Incoming>, DispatchError> {
        let uri = join_uri(&self.base, "", path)?;
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|source| DispatchError::BadRequest { source })?;
        match tokio::time::timeout(deadline, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(source)) => Err(DispatchError::Transport { source }),
            Err(_) => Err(DispatchError::Deadline(deadline)),
        }
    }
}

pub fn http_connector(timeouts: Timeouts) -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    c.set_connect_timeout(Some(timeouts.connect));
    c.enforce_http(false);
    c
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
    #[error("could not connect to the engine")]
    Connect {
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("engine connection error")]
    Engine {
        #[source]
        source: EngineError,
    },
    #[error("upstream transport error")]
    Transport {
        #[source]
        source: hyper_util::client::legacy::Error,
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

    /// Every dispatch failure happens before anything reached the client,
    /// and each depends on the hop (its address, its connection, a relay
    /// URI that a peer hop makes longer), so another candidate may take the
    /// request. Part of the error contract callers (the edge SDK) rely on.
    pub fn retry(&self) -> RetryAdvice {
        RetryAdvice::BeforeFirstByte
    }

    /// A short, stable label for receipts, job records and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            DispatchError::BadUri { .. } | DispatchError::BadRequest { .. } => "bad-request",
            DispatchError::Connect { .. } | DispatchError::NoHost => "connect",
            DispatchError::Transport { source } if source.is_connect() => "connect",
            DispatchError::Transport { .. } | DispatchError::Engine { .. } => "transport",
            DispatchError::Body { .. } => "body",
            DispatchError::Deadline(_) => "first-byte-timeout",
            DispatchError::NoLink(_) => "no-link",
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) in either direction, as names
/// (a lookup by `&str` parses and hashes the string every time).
const HOP_HEADERS: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Not copied onto a request to the next hop: the hop-by-hop headers, the
/// proxy credentials meant for us, and those the client library sets.
const NOT_FORWARDED: [&[u8]; 11] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"host",
    b"content-length",
];

/// Whether a request header stays with this hop (see [`NOT_FORWARDED`]);
/// `name` in any case.
pub(crate) fn is_hop_header(name: &[u8]) -> bool {
    crate::h1::is_one_of(name, &NOT_FORWARDED)
}

/// Removes an upstream answer's hop-by-hop headers before it goes to the
/// client (RFC 9110 §7.6.1): those the answer's `Connection` header names,
/// then the standard ones. This hop's own framing is the server's to
/// choose; a `Connection: close` from an engine must not close the
/// client's keep-alive connection.
pub fn strip_response_hop_headers(h: &mut HeaderMap) {
    // One pass over the (few) names: which hop-by-hop headers are here
    // (usually just `connection`). Removing an absent name still hashes it.
    let mut present = 0u8;
    for k in h.keys() {
        if let Some(i) = HOP_HEADERS.iter().position(|hop| hop == k) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    // Engines mostly send `Connection: keep-alive` or `close`: those name
    // no header, so the usual case collects (allocates) nothing.
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| crate::h1::tokens(v.as_bytes()))
        .filter(|t| !t.eq_ignore_ascii_case(b"keep-alive") && !t.eq_ignore_ascii_case(b"close"))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for (i, name) in HOP_HEADERS.iter().enumerate() {
        if present & (1 << i) != 0 {
            h.remove(name);
        }
    }
}

/// Copies end-to-end headers.
pub fn copy_headers(from: &Headers, to: &mut HeaderMap) {
    match from {
        Headers::Map(m) => {
            for (name, value) in m {
                if !is_hop_header(name.as_str().as_bytes()) {
                    to.append(name.clone(), value.clone());
                }
            }
        }
        Headers::Raw(f) => {
            for (name, value) in f.entries().flatten() {
                if !is_hop_header(name.as_str().as_bytes()) {
                    to.append(name, value);
                }
            }
        }
    }
}

fn join_uri(base: &Uri, prefix: &str, path_and_query: &str) -> Result<Uri, DispatchError> {
    let mut s = String::with_capacity(64 + path_and_query.len());
    s.push_str(base.scheme_str().unwrap_or("http"));
    s.push_str("://");
    if let Some(a) = base.authority() {
        s.push_str(a.as_str());
    }
    s.push_str(prefix);
    s.push_str(path_and_query);
    s.parse().map_err(|source| DispatchError::BadUri { source })
}

/// Request line and headers of the client's request, kept for replay.
#[derive(Clone, Debug)]
pub struct RequestHead {
    pub method: http::Method,
    /// Path and query as the client sent them.
    pub path_and_query: PathAndQuery,
    pub headers: Headers,
}

/// An answer's body from either kind of hop.
#[derive(Debug)]
pub enum UpBody {
    /// Read off a local engine connection ([`crate::pool`]).
    Engine(EngineBody),
    /// Relayed by a peer over its mTLS connection.
    Peer(Incoming),
}

/// How an answer's body failed.
#[derive(Debug, thiserror::Error)]
pub enum UpBodyError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("peer connection: {0}")]
    Peer(#[from] hyper::Error),
}

impl UpBodyError {
    /// A short label for job records and error events.
    pub fn class(&self) -> &'static str {
        match self {
            UpBodyError::Engine(e) => e.class(),
            UpBodyError::Peer(e) if e.is_incomplete_message() => "upstream-closed",
            UpBodyError::Peer(e) if e.is_timeout() => "upstream-timeout",
            UpBodyError::Peer(_) => "upstream-error",
        }
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpBody::Engine(b) => b.is_end_stream(),
            UpBody::Peer(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            UpBody::Engine(b) => b.size_hint(),
            UpBody::Peer(b) => b.size_hint(),
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
) -> Result<Pending<'a>, DispatchError> {
    match hop {
        Hop::Local(engine) => {
            if let Some(client) = local.hyper() {
                let mut req = hyper_request(head, body);
                req.headers_mut()
                    .insert(header::HOST, engine.host().clone());
                *req.uri_mut() = join_uri(&engine.base, "", head.path_and_query.as_str())?;
                let fut = client.request(req);
                return Ok(Box::pin(async move {
                    fut.await
                        .map(Upstream::peer)
                        .map_err(|source| DispatchError::Transport { source })
                }));
            }
            let out = Outgoing::new(engine.host(), head, body);
            Ok(Box::pin(async move {
                Ok(Upstream::engine(local.send(engine.authority(), out).await?))
            }))
        }
        Hop::Peer(link) => {
            let mut req = hyper_request(head, body);
            *req.uri_mut() = join_uri(&link.base, RELAY_PREFIX, head.path_and_query.as_str())?;
            let fut = link.client.request(req);
            Ok(Box::pin(async move {
                fut.await
                    .map(Upstream::peer)
                    .map_err(|source| DispatchError::Transport { source })
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

/// `Host` for an engine: host and port, never the URL's userinfo.
pub(crate) fn host_value(to: &http::uri::Authority) -> Result<HeaderValue, DispatchError> {
    let v = match to.port() {
        Some(p) => HeaderValue::from_str(&format!("{}:{}", to.host(), p.as_str())),
        None => HeaderValue::from_str(to.host()),
    };
    v.map_err(|e| DispatchError::BadRequest { source: e.into() })
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
    match tokio::time::timeout(deadline, request(local, hop, head, body)?).await {
        Ok(r) => r.map(Upstream::into_response),
        Err(_) => Err(DispatchError::Deadline(deadline)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_headers_are_dropped_and_others_kept() {
        let mut from = HeaderMap::new();
        from.insert("connection", HeaderValue::from_static("keep-alive"));
        from.insert("host", HeaderValue::from_static("x"));
        from.insert("content-length", HeaderValue::from_static("3"));
        from.insert("authorization", HeaderValue::from_static("Bearer k"));
        from.insert("content-type", HeaderValue::from_static("application/json"));
        let mut to = HeaderMap::new();
        copy_headers(&Headers::Map(from), &mut to);
        assert_eq!(to.len(), 2);
        assert!(to.contains_key("authorization"));
    }

    #[test]
    fn raw_request_fields_lose_hop_headers_in_any_case() {
        let mut buf = bytes::BytesMut::from(
            &b"POST /v1/chat/completions HTTP/1.1\r\nHOST: x\r\nConnection: keep-alive\r\n\
               Content-Length: 2\r\nAuthorization: Bearer k\r\nProxy-Authorization: p\r\n\
               Content-Type: application/json\r\n\r\n{}"[..],
        );
        let head = crate::h1::parse_request(&mut buf).unwrap().unwrap();
        let raw = Headers::Raw(head.headers);
        let mut to = HeaderMap::new();
        copy_headers(&raw, &mut to);
        let mut names: Vec<&str> = to.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "content-type"]);
        // The engine's request line and headers, written from the fields.
        let out = Outgoing::new(
            &HeaderValue::from_static("127.0.0.1:9"),
            &RequestHead {
                method: http::Method::POST,
                path_and_query: PathAndQuery::from_static("/v1/chat/completions"),
                headers: raw,
            },
            Bytes::from_static(b"{}"),
        );
        let wire = String::from_utf8(out.wire().to_vec()).unwrap();
        assert_eq!(
            wire,
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:9\r\n\
             Authorization: Bearer k\r\nContent-Type: application/json\r\n\
             content-length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn answers_lose_hop_headers_and_those_connection_names() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("close, x-engine-hop"),
        );
        h.insert("x-engine-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        h.insert("content-length", HeaderValue::from_static("12"));
        strip_response_hop_headers(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-length", "content-type"]);
    }

    #[test]
    fn the_engine_host_header_leaves_out_userinfo() {
        let to: http::uri::Authority = "user:secret@127.0.0.1:11435".parse().unwrap();
        assert_eq!(host_value(&to).unwrap(), "127.0.0.1:11435");
        let to: http::uri::Authority = "localhost".parse().unwrap();
        assert_eq!(host_value(&to).unwrap(), "localhost");
    }

    #[test]
    fn relay_uris_keep_the_query() {
        let base: Uri = "https://10.0.0.2:14318".parse().unwrap();
        let u = join_uri(&base, RELAY_PREFIX, "/v1/models?x=1").unwrap();
        assert_eq!(
            u.to_string(),
            "https://10.0.0.2:14318/pair/v1/relay/v1/models?x=1"
        );
    }
}
