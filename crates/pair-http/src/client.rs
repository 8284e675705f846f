//! Keep-alive HTTP/1.1 connections from one event loop to the local
//! engines: the hot path's upstream client, framed by hand on
//! [`crate::h1`].
//!
//! Each event loop (`pair_runtime::runtime`) owns one pool; a connection belongs
//! to the request using it (its [`EngineBody`] reads the answer straight
//! off the socket, on the task that serves the client: no driver task, no
//! channel between them) and comes back to the pool when the answer has
//! been read to its end. The pool holds only idle connections: the newest
//! goes first, long-idle ones are closed as the list is scanned (and by the
//! daemon's sweep on quiet loops). A connection the engine closed while it
//! sat idle for a while is noticed before use (a read that does not block
//! finds its end), and if a reused connection still fails before any byte
//! of the answer came back, the request goes out once more on a new
//! connection: a keep-alive race, not an engine failure.

use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::HeaderValue;
use http::uri::Authority;
use http::{Method, StatusCode};
use http_body::{Frame, SizeHint};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::h1::{self, BodyLen, Chunked, Fields, FramingError};
use crate::request::{RequestHead, is_hop_header};

/// Idle connections one loop keeps; past this, a finished connection is
/// closed (a burst beyond any sane engine's concurrency).
const MAX_IDLE: usize = 256;
/// A connection unused this long is closed when next seen.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the daemon sweeps idle connections out of quiet loops' pools.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// A connection idle for less than this is used without first checking
/// that the engine kept it open (a system call on the request's path); if
/// it did not, the request is retried on a new connection anyway.
const PROBE_AFTER: Duration = Duration::from_secs(1);
/// Bodies up to this size go out in the same write as the head.
const COALESCE: usize = 16 * 1024;

/// How long a client waits.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP (and TLS) connect.
    pub connect: Duration,
    /// The least time an answer may show no progress before its first
    /// byte: the request path waits longer where the scheduler predicts a
    /// queue or a model load, and as long as the engine makes progress on
    /// any request.
    pub first_byte: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        // PAIR waits 10 s to connect and 120 s for the first byte. On a LAN a
        // connect that takes over 2 s means the node is gone. The first-byte
        // floor is the bound for silence with no reason: a model loading,
        // token counters moving, tokens on any request, or a prefill or
        // queue the scheduler predicts (three times over) are waited for
        // past it. The longest reasonless silence of a healthy engine
        // measured (reference/engine-figures.md §1: a whole 2 k context
        // prefilled on the 2-core CPU box, 0.03 s + 2.65 ms a token, 5.5 s
        // with no token) fits in it twice over.
        Self {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(10),
        }
    }
}

/// hyper-util's plain-HTTP connector as pair uses it: TCP_NODELAY, the
/// connect timeout, any scheme (a TLS connector wraps it).
pub fn http_connector(timeouts: Timeouts) -> hyper_util::client::legacy::connect::HttpConnector {
    let mut c = hyper_util::client::legacy::connect::HttpConnector::new();
    c.set_nodelay(true);
    c.set_connect_timeout(Some(timeouts.connect));
    c.enforce_http(false);
    c
}

/// What went wrong on an engine connection.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("could not connect to the engine")]
    Connect {
        #[source]
        source: std::io::Error,
    },
    #[error("the engine closed the connection before the answer's end")]
    Closed,
    #[error("engine connection: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Framing(#[from] FramingError),
}

impl ClientError {
    /// A short label for job records and metrics.
    pub fn class(&self) -> &'static str {
        match self {
            ClientError::Connect { .. } => "connect",
            ClientError::Closed => "upstream-closed",
            ClientError::Io(_) | ClientError::Framing(_) => "upstream-error",
        }
    }
}

/// One connection to an engine and what has been read from it.
#[derive(Debug)]
struct Conn {
    tcp: TcpStream,
    buf: BytesMut,
}

impl Conn {
    /// Whether an idle connection is still open: the engine has neither
    /// closed it nor sent anything unasked. Costs a system call only when
    /// the socket was last seen readable.
    fn still_open(&mut self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

#[derive(Debug)]
struct Idle {
    to: Authority,
    conn: Conn,
    since: Instant,
}

/// hyper-util's pooled client for plain HTTP: what the hand-framed pool
/// is measured against (`HttpStack::Hyper`).
pub type PlainClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<Bytes>,
>;

/// Which HTTP/1.1 implementation serves the faces and calls the local
/// engines: the hand-framed one (default) or hyper's server and
/// hyper-util's client, kept so the two are measured side by side
/// (`scripts/bench/proxy.sh`, docs/benchmarks/proxy.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HttpStack {
    #[default]
    Native,
    Hyper,
}

/// One event loop's connections to the local engines.
#[derive(Debug)]
pub struct LocalPool {
    connect_timeout: Duration,
    /// `HttpStack::Hyper`: requests go through this client instead.
    hyper: Option<PlainClient>,
    idle: Mutex<Vec<Idle>>,
    /// Requests sent again because a pooled connection failed under them.
    resent: std::sync::atomic::AtomicU64,
    /// Handed to answers so they can bring their connection back.
    me: Weak<LocalPool>,
}

/// How one exchange on one connection failed.
enum Failed {
    /// A reused connection failed before any byte of the answer: the
    /// engine had closed it. Another connection may take the request.
    Stale,
    Error(ClientError),
}

impl LocalPool {
    pub fn new(timeouts: Timeouts) -> Arc<Self> {
        Self::with_stack(timeouts, HttpStack::Native)
    }

    pub fn with_stack(timeouts: Timeouts, stack: HttpStack) -> Arc<Self> {
        let hyper = (stack == HttpStack::Hyper).then(|| {
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(IDLE_TIMEOUT)
                .build(http_connector(timeouts))
        });
        Arc::new_cyclic(|me| Self {
            hyper,
            connect_timeout: timeouts.connect,
            idle: Mutex::new(Vec::new()),
            resent: std::sync::atomic::AtomicU64::new(0),
            me: me.clone(),
        })
    }

    /// hyper-util's client, when this pool stands in for it.
    pub fn hyper(&self) -> Option<&PlainClient> {
        self.hyper.as_ref()
    }

    /// Idle connections held now.
    pub fn len(&self) -> usize {
        self.idle.lock().map_or(0, |c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests sent a second time because the pooled connection they
    /// went out on turned out closed (a keep-alive race with the engine).
    pub fn resent(&self) -> u64 {
        self.resent.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Closes connections idle past the idle timeout (a quiet loop would
    /// otherwise keep them until its next request) or closed by the engine.
    pub fn sweep(&self) {
        let now = Instant::now();
        if let Ok(mut idle) = self.idle.lock() {
            idle.retain_mut(|c| now.duration_since(c.since) <= IDLE_TIMEOUT && c.conn.still_open());
        }
    }

    /// The newest idle connection to `to` that is still open.
    fn take(&self, to: &Authority) -> Option<Conn> {
        let mut idle = self.idle.lock().ok()?;
        let now = Instant::now();
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            let age = now.duration_since(idle[i].since);
            if age > IDLE_TIMEOUT {
                idle.swap_remove(i);
                continue;
            }
            // Byte-equal first (the same engine's authority, as it always
            // is): `Authority`'s own comparison folds case byte by byte.
            let same = idle[i].to.as_str() == to.as_str() || idle[i].to == *to;
            if same {
                let Idle { mut conn, .. } = idle.swap_remove(i);
                if age < PROBE_AFTER || conn.still_open() {
                    return Some(conn);
                }
            }
        }
        None
    }

    fn put(&self, to: Authority, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < MAX_IDLE
        {
            idle.push(Idle {
                to,
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Sends a request to the engine at `to` and waits for the answer's
    /// head.
    pub async fn send(&self, to: &Authority, req: Outgoing) -> Result<EngineAnswer, ClientError> {
        // At most one pooled connection is tried: if the engine closed it
        // under the request, the request goes out once more, on a new
        // connection (an engine that reads requests and hangs up must not
        // see one request once per idle connection).
        if let Some(conn) = self.take(to) {
            match self.exchange(to, conn, true, &req).await {
                Ok(resp) => return Ok(resp),
                Err(Failed::Stale) => {
                    self.resent
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(Failed::Error(e)) => return Err(e),
            }
        }
        let conn = self.connect(to).await?;
        match self.exchange(to, conn, false, &req).await {
            Ok(resp) => Ok(resp),
            Err(Failed::Error(e)) => Err(e),
            Err(Failed::Stale) => Err(ClientError::Closed),
        }
    }

    async fn connect(&self, to: &Authority) -> Result<Conn, ClientError> {
        let port = to.port_u16().unwrap_or(80);
        let connect = TcpStream::connect((
            to.host().trim_start_matches('[').trim_end_matches(']'),
            port,
        ));
        let tcp = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(source)) => return Err(ClientError::Connect { source }),
            Err(_) => {
                return Err(ClientError::Connect {
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no connection within {:?}", self.connect_timeout),
                    ),
                });
            }
        };
        tcp.set_nodelay(true)
            .map_err(|source| ClientError::Connect { source })?;
        Ok(Conn {
            tcp,
            buf: BytesMut::with_capacity(8 * 1024),
        })
    }

    /// Writes the request and reads the answer's head.
    async fn exchange(
        &self,
        to: &Authority,
        mut conn: Conn,
        reused: bool,
        req: &Outgoing,
    ) -> Result<EngineAnswer, Failed> {
        // Nothing came back on a reused connection: the engine had closed
        // it (another connection may take the request).
        let fail = |source: ClientError, got_nothing: bool| {
            if reused && got_nothing {
                Failed::Stale
            } else {
                Failed::Error(source)
            }
        };
        if let Err(e) = conn.tcp.write_all(&req.wire).await {
            return Err(fail(e.into(), true));
        }
        if !req.rest.is_empty()
            && let Err(e) = conn.tcp.write_all(&req.rest).await
        {
            return Err(fail(e.into(), true));
        }
        let head = loop {
            if !conn.buf.is_empty() {
                match h1::parse_response(&mut conn.buf, req.head_request) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(e) => return Err(fail(e.into(), false)),
                }
            }
            let got_nothing = conn.buf.is_empty();
            match tokio::io::AsyncReadExt::read_buf(&mut conn.tcp, &mut conn.buf).await {
                Ok(0) => return Err(fail(ClientError::Closed, got_nothing)),
                Ok(_) => {}
                Err(e) => return Err(fail(e.into(), got_nothing)),
            }
        };
        let state = match head.body {
            BodyLen::Length(n) => State::Length(n),
            BodyLen::Chunked => State::Chunked(Chunked::Size),
            BodyLen::Close => State::Close,
        };
        let mut body = EngineBody {
            conn: Some(conn),
            state,
            keep_alive: head.keep_alive,
            to: to.clone(),
            pool: self.me.clone(),
        };
        if matches!(body.state, State::Length(0)) {
            body.finish();
        }
        Ok(EngineAnswer {
            status: head.status,
            fields: head.fields,
            body,
        })
    }
}

/// A request to an engine in HTTP/1.1 wire form, made before the attempt
/// so the attempt borrows nothing: the client's end-to-end headers, this
/// hop's `Host`, a Content-Length for the body, and the body itself (in the
/// same write as the head when small).
#[derive(Debug)]
pub struct Outgoing {
    wire: Vec<u8>,
    rest: Bytes,
    head_request: bool,
}

impl Outgoing {
    pub fn new(host: &HeaderValue, head: &RequestHead, body: Bytes) -> Self {
        let mut wire = Vec::with_capacity(512 + body.len().min(COALESCE));
        wire.extend_from_slice(head.method.as_str().as_bytes());
        wire.push(b' ');
        wire.extend_from_slice(head.path_and_query.as_str().as_bytes());
        wire.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        wire.extend_from_slice(host.as_bytes());
        wire.extend_from_slice(b"\r\n");
        head.headers.write(&mut wire, is_hop_header);
        let bodied = matches!(head.method, Method::POST | Method::PUT | Method::PATCH);
        if bodied || !body.is_empty() {
            h1::write_content_length(&mut wire, body.len() as u64);
        }
        wire.extend_from_slice(b"\r\n");
        let rest = if body.len() > COALESCE {
            body
        } else {
            wire.extend_from_slice(&body);
            Bytes::new()
        };
        Self {
            wire,
            rest,
            head_request: head.method == Method::HEAD,
        }
    }
}

/// An engine's answer: its head as read (the header fields left as they
/// came, see [`h1::ParsedResponse`]) and its body.
#[derive(Debug)]
pub struct EngineAnswer {
    pub status: StatusCode,
    pub fields: Fields,
    pub body: EngineBody,
}

#[cfg(test)]
impl Outgoing {
    /// What goes out first: request line, headers, and a small body.
    pub(crate) fn wire(&self) -> &[u8] {
        &self.wire
    }
}

#[derive(Debug)]
enum State {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// An engine's answer body, read off its connection as the client takes
/// it; the connection goes back to its pool once the body has ended.
#[derive(Debug)]
pub struct EngineBody {
    conn: Option<Conn>,
    state: State,
    keep_alive: bool,
    to: Authority,
    pool: Weak<LocalPool>,
}

impl EngineBody {
    /// The body has ended: the connection goes back to the pool if the
    /// engine keeps it open and sent nothing past the body.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take()
            && self.keep_alive
            && conn.buf.is_empty()
            && let Some(pool) = self.pool.upgrade()
        {
            pool.put(self.to.clone(), conn);
        }
    }

    /// The connection cannot carry anything more: dropped, body over.
    fn abandon(&mut self) {
        self.conn = None;
        self.state = State::Done;
    }

    /// Data already buffered, in this body's framing.
    fn buffered(&mut self) -> Result<Option<Bytes>, ClientError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(None);
        };
        match &mut self.state {
            State::Length(left) => {
                if conn.buf.is_empty() {
                    return Ok(None);
                }
                let n = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(conn.buf.len());
                *left -= n as u64;
                let data = conn.buf.split_to(n).freeze();
                if *left == 0 {
                    self.finish();
                }
                Ok(Some(data))
            }
            State::Chunked(dec) => {
                let data = dec.decode(&mut conn.buf)?;
                if *dec == Chunked::Done {
                    self.finish();
                }
                Ok(data)
            }
            State::Close => Ok((!conn.buf.is_empty()).then(|| conn.buf.split().freeze())),
            State::Done => Ok(None),
        }
    }
}

impl http_body::Body for EngineBody {
    type Data = Bytes;
    type Error = ClientError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientError>>> {
        let this = self.get_mut();
        loop {
            match this.buffered() {
                Ok(Some(data)) if !data.is_empty() => {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(_) => {}
                Err(e) => {
                    this.abandon();
                    return Poll::Ready(Some(Err(e)));
                }
            }
            if matches!(this.state, State::Done) {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if conn.buf.capacity() - conn.buf.len() < 4096 {
                conn.buf.reserve(8 * 1024);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.tcp), cx, &mut conn.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    let ended = matches!(this.state, State::Close);
                    this.abandon();
                    return Poll::Ready(if ended {
                        None
                    } else {
                        Some(Err(ClientError::Closed))
                    });
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.abandon();
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A length body reaching 0 is finished at once (`finish`).
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A keep-alive HTTP/1.1 engine on loopback that counts connections and
    /// answers each request with `ok <path>`; after `per_conn` answers it
    /// closes the connection (0: never). Answers to `/slow` wait 300 ms;
    /// `/stream` sends its head and a first chunk, then ends 300 ms later.
    async fn engine(per_conn: usize) -> (Authority, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut tcp, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut served = 0;
                    loop {
                        let mut chunk = [0u8; 4096];
                        let n = match tcp.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                            buf.drain(..end + 4);
                            let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                            if path == "/slow" {
                                tokio::time::sleep(Duration::from_millis(300)).await;
                            }
                            // Reads the request, then closes without an
                            // answer, on a connection that served before.
                            if path == "/vanish-if-reused" && served > 0 {
                                return;
                            }
                            let canned: Option<&[u8]> = match path.as_str() {
                                "/chunked" => Some(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
                                "/cut" => Some(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"),
                                "/to-close" => Some(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end"),
                                _ => None,
                            };
                            if let Some(canned) = canned {
                                if tcp.write_all(canned).await.is_err() || path != "/chunked" {
                                    return;
                                }
                                served += 1;
                                continue;
                            }
                            if path == "/stream" {
                                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n";
                                if tcp.write_all(head.as_bytes()).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(300)).await;
                                if tcp.write_all(b"0\r\n\r\n").await.is_err() {
                                    return;
                                }
                                continue;
                            }
                            let body = format!("ok {path}");
                            let resp = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if tcp.write_all(resp.as_bytes()).await.is_err() {
                                return;
                            }
                            served += 1;
                            if per_conn > 0 && served == per_conn {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr.to_string().parse().unwrap(), accepted)
    }

    fn get(to: &Authority, path: &str) -> Outgoing {
        let head = RequestHead {
            method: Method::GET,
            path_and_query: path.parse().unwrap(),
            headers: h1::Headers::Map(http::HeaderMap::new()),
        };
        Outgoing::new(
            &HeaderValue::from_str(to.as_str()).unwrap(),
            &head,
            Bytes::new(),
        )
    }

    async fn text(resp: EngineAnswer) -> String {
        let b = resp.body.collect().await.unwrap().to_bytes();
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn sequential_requests_share_one_connection() {
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        for i in 0..5 {
            let resp = pool.send(&to, get(&to, &format!("/r{i}"))).await.unwrap();
            assert_eq!(text(resp).await, format!("ok /r{i}"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.len(), 1);
    }

    #[tokio::test]
    async fn a_connection_is_not_reused_while_its_answer_streams() {
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        // The first answer's head is in, its body still on the wire.
        let first = pool.send(&to, get(&to, "/stream")).await.unwrap();
        let second = pool.send(&to, get(&to, "/b")).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(text(second).await, "ok /b");
        assert_eq!(text(first).await, "first");
        // Both are ready again: no third connection.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let third = pool.send(&to, get(&to, "/c")).await.unwrap();
        assert_eq!(text(third).await, "ok /c");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_requests_get_their_own_connections() {
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let (a, b) = tokio::join!(
            pool.send(&to, get(&to, "/slow")),
            pool.send(&to, get(&to, "/slow"))
        );
        assert_eq!(text(a.unwrap()).await, "ok /slow");
        assert_eq!(text(b.unwrap()).await, "ok /slow");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_engine_closed_is_replaced_without_an_error() {
        // The engine closes every connection after one answer.
        let (to, accepted) = engine(1).await;
        let pool = LocalPool::new(Timeouts::default());
        for i in 0..3 {
            let resp = pool.send(&to, get(&to, &format!("/r{i}"))).await.unwrap();
            assert_eq!(text(resp).await, format!("ok /r{i}"));
            // Idle under a second: not probed, so the closed connection is
            // found when the request gets no answer on it, and the
            // request goes out again on a new one.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert!(pool.len() <= 1, "closed connections are dropped");
    }

    #[tokio::test]
    async fn a_sweep_drops_closed_connections_and_keeps_live_ones() {
        let (closing, _) = engine(1).await;
        let (open, _) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        for to in [&open, &closing] {
            let resp = pool.send(to, get(to, "/x")).await.unwrap();
            assert_eq!(text(resp).await, "ok /x");
        }
        assert_eq!(pool.len(), 2);
        tokio::time::sleep(Duration::from_millis(50)).await;
        pool.sweep();
        assert_eq!(
            pool.len(),
            1,
            "the closed connection went, the idle one stayed"
        );
    }

    #[tokio::test]
    async fn chunked_answers_decode_and_give_their_connection_back() {
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let resp = pool.send(&to, get(&to, "/chunked")).await.unwrap();
        assert_eq!(text(resp).await, "abcde");
        assert_eq!(pool.len(), 1, "back in the pool once read to its end");
        let resp = pool.send(&to, get(&to, "/after")).await.unwrap();
        assert_eq!(text(resp).await, "ok /after");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_an_error_and_its_connection_is_dropped() {
        let (to, _) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let resp = pool.send(&to, get(&to, "/cut")).await.unwrap();
        let err = resp.body.collect().await.unwrap_err();
        assert!(matches!(err, ClientError::Closed), "{err}");
        assert_eq!(err.class(), "upstream-closed");
        assert!(pool.is_empty());
    }

    #[tokio::test]
    async fn an_answer_without_length_runs_to_the_close() {
        let (to, _) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let resp = pool.send(&to, get(&to, "/to-close")).await.unwrap();
        assert_eq!(text(resp).await, "until the end");
        assert!(
            pool.is_empty(),
            "a close-delimited connection is not reused"
        );
    }

    #[tokio::test]
    async fn a_reused_connection_closed_under_a_request_is_retried_on_a_new_one() {
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let resp = pool.send(&to, get(&to, "/a")).await.unwrap();
        assert_eq!(text(resp).await, "ok /a");
        // The engine reads this one on the pooled connection and closes it
        // without answering; a fresh connection gets the answer.
        let resp = pool.send(&to, get(&to, "/vanish-if-reused")).await.unwrap();
        assert_eq!(text(resp).await, "ok /vanish-if-reused");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.resent(), 1);
    }

    #[tokio::test]
    async fn a_connection_idle_over_a_second_is_checked_before_use() {
        // The engine closes each connection after one answer. Past the
        // probe threshold the closed connection is found before the
        // request is written: nothing is sent twice.
        let (to, accepted) = engine(1).await;
        let pool = LocalPool::new(Timeouts::default());
        let resp = pool.send(&to, get(&to, "/a")).await.unwrap();
        assert_eq!(text(resp).await, "ok /a");
        tokio::time::sleep(PROBE_AFTER + Duration::from_millis(100)).await;
        let resp = pool.send(&to, get(&to, "/b")).await.unwrap();
        assert_eq!(text(resp).await, "ok /b");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(
            pool.resent(),
            0,
            "found closed by the probe, not by a failed send"
        );
    }

    #[tokio::test]
    async fn an_engine_hanging_up_on_requests_sees_each_at_most_twice() {
        // Five idle connections, then an engine that reads a request on a
        // reused connection and hangs up.
        let (to, accepted) = engine(0).await;
        let pool = LocalPool::new(Timeouts::default());
        let sent: Vec<_> = (0..5).map(|_| pool.send(&to, get(&to, "/slow"))).collect();
        for resp in futures_util::future::join_all(sent).await {
            assert_eq!(text(resp.unwrap()).await, "ok /slow");
        }
        assert_eq!(pool.len(), 5);
        let before = accepted.load(Ordering::SeqCst);
        let resp = pool.send(&to, get(&to, "/vanish-if-reused")).await.unwrap();
        assert_eq!(text(resp).await, "ok /vanish-if-reused");
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            before + 1,
            "one pooled try, then one new connection"
        );
        assert_eq!(pool.resent(), 1);
        assert_eq!(pool.len(), 5, "four untouched, one new back in the pool");
    }

    #[test]
    fn requests_carry_host_length_and_end_to_end_headers_only() {
        let mut headers = http::HeaderMap::new();
        headers.insert("connection", HeaderValue::from_static("keep-alive"));
        headers.insert("host", HeaderValue::from_static("127.0.0.1:1234"));
        headers.insert("content-length", HeaderValue::from_static("999"));
        headers.insert("authorization", HeaderValue::from_static("Bearer k"));
        let head = RequestHead {
            method: Method::POST,
            path_and_query: "/v1/chat/completions?x=1".parse().unwrap(),
            headers: h1::Headers::Map(headers),
        };
        let out = Outgoing::new(
            &HeaderValue::from_static("127.0.0.1:11435"),
            &head,
            Bytes::from_static(b"{\"model\":\"m\"}"),
        );
        assert_eq!(
            String::from_utf8(out.wire).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: 127.0.0.1:11435\r\nauthorization: Bearer k\r\ncontent-length: 13\r\n\r\n{\"model\":\"m\"}"
        );
        let big = Bytes::from(vec![b'x'; COALESCE + 1]);
        let out = Outgoing::new(&HeaderValue::from_static("h"), &head, big.clone());
        assert_eq!(out.rest, big, "a large body is written on its own");
    }

    #[tokio::test]
    async fn a_dead_engine_is_a_connect_error() {
        let spare = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to: Authority = spare.local_addr().unwrap().to_string().parse().unwrap();
        drop(spare);
        let pool = LocalPool::new(Timeouts::default());
        let err = pool.send(&to, get(&to, "/")).await.unwrap_err();
        assert_eq!(err.class(), "connect");
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
    }

    #[test]
    fn raw_request_fields_lose_hop_headers_in_any_case() {
        use crate::h1::Headers;
        let mut buf = bytes::BytesMut::from(
            &b"POST /v1/chat/completions HTTP/1.1\r\nHOST: x\r\nConnection: keep-alive\r\n\
               Content-Length: 2\r\nAuthorization: Bearer k\r\nProxy-Authorization: p\r\n\
               Content-Type: application/json\r\n\r\n{}"[..],
        );
        let head = crate::h1::parse_request(&mut buf).unwrap().unwrap();
        let raw = Headers::Raw(head.headers);
        let mut to = http::HeaderMap::new();
        crate::request::copy_headers(&raw, &mut to);
        let mut names: Vec<&str> = to.keys().map(http::HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "content-type"]);
        // The engine's request line and headers, written from the fields.
        let out = Outgoing::new(
            &HeaderValue::from_static("127.0.0.1:9"),
            &RequestHead {
                method: http::Method::POST,
                path_and_query: http::uri::PathAndQuery::from_static("/v1/chat/completions"),
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
}
