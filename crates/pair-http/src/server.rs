//! Serving one loopback face connection: HTTP/1.1 read and written by hand
//! on [`crate::h1`], so a request costs one read, the routing, and one write.
//!
//! Keep-alive and pipelining as RFC 9112 has them; bodies by
//! Content-Length, read whole (the executor keeps them for replay), capped
//! before they are read. Answers go out as Content-Length when their size
//! is known and chunked otherwise; each chunk of a stream is written as it
//! arrives. What this loop does not serve itself (HTTP/1.0, chunked request
//! bodies, `Expect: 100-continue`, upgrades, heads it cannot parse) is
//! handed, with the bytes already read, to hyper's server for the rest of
//! the connection, so every client gets a correct answer.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{Method, Response, Version, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::conns::{BodyBudget, ClientDeadlines, ConnGuard};
use crate::h1::{self, BodyLen};
use crate::hyper_conn::{SHUTDOWN_GRACE, serve_connection};
use crate::reply::Reply;

/// Data chunks larger than this are written on their own instead of being
/// copied behind their head.
const COPY_LIMIT: usize = 16 * 1024;
/// A read buffer grown past this by a large body is replaced afterwards.
const SHRINK_ABOVE: usize = 64 * 1024;
/// Read ahead (pipelined requests) while an answer is pending, up to this.
const WATCH_LIMIT: usize = 64 * 1024;
/// How long an answer may be pending before the client's socket is
/// watched for a hang-up.
const WATCH_GRACE: std::time::Duration = std::time::Duration::from_millis(20);
/// A refused body (413) is read and dropped after the answer for at most
/// this long in all, and this long between reads (nginx's
/// `lingering_time` and `lingering_timeout`): a client still sending it is
/// not reset before it reads the answer.
const LINGER_FOR: std::time::Duration = std::time::Duration::from_secs(30);
const LINGER_IDLE: std::time::Duration = std::time::Duration::from_secs(5);
/// A body's buffer grows by at most this much per read: memory follows
/// what arrived, not what the head declared.
const BODY_STEP: usize = 256 * 1024;
/// The head deadline of connections hyper serves, which also bounds their
/// idle keep-alive wait (hyper starts it when it waits for a head).
const HYPER_HEAD_DEADLINE: Duration = Duration::from_secs(30);

/// A request, read whole, as the loop hands it over: its header fields as
/// they came (a header map is built only where one is needed).
#[derive(Debug)]
pub struct Whole {
    pub method: Method,
    /// The target in origin form (`/path?query`); any other form goes to
    /// hyper.
    pub target: PathAndQuery,
    pub headers: h1::Fields,
    pub body: Bytes,
    /// When its last byte was read.
    pub received: tokio::time::Instant,
}

/// What answers a face connection's requests.
pub trait Answer:
    hyper::service::Service<
        http::Request<Incoming>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send,
    > + Clone
    + Send
    + Sync
    + 'static
{
    /// Largest request body accepted.
    fn body_cap(&self) -> usize;
    /// How long the client may take.
    fn deadlines(&self) -> ClientDeadlines;
    /// Answers one request. The future lives inside the connection's own
    /// (no allocation, no move per request). `deadline` is the
    /// connection's timer for the answer's own deadlines (moved forward,
    /// never re-armed per request).
    fn answer(&self, req: Whole, deadline: Pin<&mut Sleep>) -> impl Future<Output = Reply> + Send;
    /// The answer to a request whose declared body is over the cap.
    fn too_large(&self, method: &Method, path: &str) -> Response<Body>;
    /// The budget of body bytes held across connections, if any.
    fn body_budget(&self) -> Option<&Arc<BodyBudget>> {
        None
    }
    /// A look at a request's head before its body is read (and takes its
    /// share of the budget): the answer to a request refused on its head
    /// alone, or `None` to read on.
    fn screen(&self, _method: &Method, _path: &str, _headers: &h1::Fields) -> Option<Reply> {
        None
    }
    /// The answer to a request whose body the budget has no room for.
    fn over_budget(&self, _method: &Method, _path: &str) -> Response<Body> {
        let mut resp = Response::new(Body::from(
            "the node holds as much request body as it may; retry shortly",
        ));
        *resp.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
        resp.headers_mut().insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("1"),
        );
        resp
    }
}

/// Serves `tcp` until the client closes it or `shutdown`; then a request
/// in flight gets [`SHUTDOWN_GRACE`] to finish.
pub async fn serve<A: Answer>(
    tcp: TcpStream,
    svc: A,
    slot: ConnGuard,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    // A child token per connection: polled uncontended (see
    // cluster::serve_connection).
    let shutdown = shutdown.child_token();
    let conn = run(tcp, svc, slot, shutdown.clone());
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        biased;
        r = conn.as_mut() => return r,
        () = shutdown.cancelled() => {}
    }
    match tokio::time::timeout(SHUTDOWN_GRACE, conn).await {
        Ok(r) => r,
        Err(_) => Err("shutdown grace elapsed"),
    }
}

async fn run<A: Answer>(
    mut tcp: TcpStream,
    svc: A,
    slot: ConnGuard,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out = Vec::with_capacity(8 * 1024);
    // One of each per connection, not per request: the shutdown signal
    // stays registered with its token, and the two timers (the watch
    // grace, the answer's deadlines) are moved forward for each request
    // (tokio extends an armed timer in place) instead of being put into
    // and taken out of the timer wheel. Each is set before its first use.
    let mut stopping = std::pin::pin!(shutdown.clone().cancelled_owned());
    let mut grace = std::pin::pin!(tokio::time::sleep(WATCH_GRACE));
    let mut deadline = std::pin::pin!(tokio::time::sleep(WATCH_GRACE));
    // The client's own deadlines: idle, head, body (one timer, moved on).
    let deadlines = svc.deadlines();
    let mut limit = std::pin::pin!(tokio::time::sleep(deadlines.idle));
    loop {
        // The next head; an idle connection closes at shutdown, when its
        // slot is needed for a new connection, or when idle too long.
        let mut head_started = false;
        let head = loop {
            if !buf.is_empty() {
                match h1::parse_request(&mut buf) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(_) => return hand_over(tcp, buf, svc, slot, shutdown).await,
                }
            }
            make_room(&mut buf);
            let waiting = buf.is_empty();
            if waiting {
                slot.idle();
                limit.as_mut().reset(Instant::now() + deadlines.idle);
            } else if !head_started {
                head_started = true;
                limit.as_mut().reset(Instant::now() + deadlines.head);
            }
            let n = tokio::select! {
                biased;
                r = tcp.read_buf(&mut buf) => r.map_err(|_| "read failed")?,
                () = stopping.as_mut(), if waiting => return Ok(()),
                () = slot.evicted(), if waiting => return Ok(()),
                () = limit.as_mut() => {
                    return if waiting {
                        Ok(())
                    } else {
                        Err("request head not sent in time")
                    };
                }
            };
            if n == 0 {
                return Ok(());
            }
            slot.busy();
        };
        let target = origin_form(&head.target);
        let (BodyLen::Length(len), Some(target), Version::HTTP_11, false) =
            (head.body, target, head.version, head.special)
        else {
            // Hyper serves the rest, from this head on.
            let mut read = BytesMut::from(&head.raw[..]);
            read.unsplit(buf);
            return hand_over(tcp, read, svc, slot, shutdown).await;
        };
        let head_request = head.method == Method::HEAD;
        if len > svc.body_cap() as u64 {
            // The body is never kept: answer, then drop what the client
            // still sends of it.
            let resp = svc.too_large(&head.method, target.path()).into();
            write_response(&mut tcp, &mut buf, &mut out, resp, head_request, true).await?;
            close_lingering(&mut tcp, &mut buf, len).await;
            return Ok(());
        }
        let len = usize::try_from(len).map_err(|_| "body too large")?;
        if buf.len() < len {
            if let Some(resp) = svc.screen(&head.method, target.path(), &head.headers) {
                write_response(&mut tcp, &mut buf, &mut out, resp, head_request, true).await?;
                close_lingering(&mut tcp, &mut buf, len as u64).await;
                return Ok(());
            }
            // A body still to come holds its share of the node's budget
            // while it arrives; with no room, the client is told to come
            // back rather than let in.
            let permit = match svc.body_budget() {
                None => None,
                Some(budget) => match budget.take(len) {
                    Some(p) => Some(p),
                    None => {
                        let resp = svc.over_budget(&head.method, target.path()).into();
                        write_response(&mut tcp, &mut buf, &mut out, resp, head_request, true)
                            .await?;
                        close_lingering(&mut tcp, &mut buf, len as u64).await;
                        return Ok(());
                    }
                },
            };
            // A body within the budget is given its whole buffer at once
            // (one allocation, no copies as it grows: pages are touched
            // only as bytes arrive); without a budget the buffer grows with
            // what arrived. A client that stalls mid-body is closed by its
            // deadline.
            if permit.is_some() {
                buf.reserve(len - buf.len());
            }
            let start = Instant::now();
            let mut last = start;
            while buf.len() < len {
                let step = (len - buf.len()).min(BODY_STEP);
                if buf.capacity() - buf.len() < step {
                    buf.reserve(step);
                }
                limit
                    .as_mut()
                    .reset(deadlines.body_deadline(start, buf.len() as u64, last));
                let n = tokio::select! {
                    biased;
                    r = tcp.read_buf(&mut buf) => r.map_err(|_| "read failed")?,
                    () = limit.as_mut() => return Err("request body not sent in time"),
                };
                if n == 0 {
                    return Err("client closed before its body's end");
                }
                last = Instant::now();
            }
        }
        let received = tokio::time::Instant::now();
        let req = Whole {
            method: head.method,
            target,
            headers: head.headers,
            body: buf.split_to(len).freeze(),
            received,
        };
        // A client that hangs up cancels its request (as with hyper): the
        // engine slot, the reservation and the load it counts are freed.
        grace.as_mut().reset(received + WATCH_GRACE);
        // Pinned here and lent: the answer's state machine (the whole
        // request path) is not moved again into the watch.
        let answer = std::pin::pin!(svc.answer(req, deadline.as_mut()));
        let Some(resp) = watching(&mut tcp, &mut buf, answer, Some(grace.as_mut())).await else {
            return Ok(());
        };
        let close = !head.keep_alive || shutdown.is_cancelled() || slot.is_evicted();
        let close = write_response(&mut tcp, &mut buf, &mut out, resp, head_request, close).await?;
        if close {
            let _ = tcp.shutdown().await;
            return Ok(());
        }
        // A large body grew the buffer: do not keep its size for the
        // connection's lifetime.
        if buf.capacity() > SHRINK_ABOVE && buf.len() < 8 * 1024 {
            let mut small = BytesMut::with_capacity(8 * 1024);
            small.extend_from_slice(&buf);
            buf = small;
        }
    }
}

/// Answers a connection the node has no room for with `resp` (503) and
/// closes it, reading what the client sent meanwhile for at most a second
/// so it sees the answer rather than a reset.
pub async fn refuse(mut tcp: TcpStream, resp: Response<Body>) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let written = write_response(&mut tcp, &mut buf, &mut out, resp.into(), false, true).await;
    let _ = tcp.shutdown().await;
    if written.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let mut sink = [0u8; 4096];
            while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// A request target in origin form (`/path?query`), the form clients send
/// to an origin server; `None` for the other forms (absolute, authority,
/// asterisk), which hyper serves. Cheaper than a whole `Uri`: no scheme or
/// authority to look for.
fn origin_form(target: &Bytes) -> Option<PathAndQuery> {
    if target.first() != Some(&b'/') {
        return None;
    }
    PathAndQuery::from_maybe_shared(target.clone()).ok()
}

/// Room for the next read (`read_buf` reads only into spare capacity).
fn make_room(buf: &mut BytesMut) {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(8 * 1024);
    }
}

/// Awaits `fut` while watching the client's side of the connection: `None`
/// when the client closed it (`fut` is dropped, which cancels what it was
/// doing). Bytes that arrive meanwhile (a pipelined request) stay in `buf`.
/// `grace`: start watching only once it has elapsed (the first look at
/// the socket after a request is a read that finds nothing, a system call
/// most answers finish without needing).
async fn watching<F: Future>(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    fut: F,
    grace: Option<Pin<&mut Sleep>>,
) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    if let Some(grace) = grace {
        tokio::select! {
            biased;
            out = fut.as_mut() => return Some(out),
            () = grace => {}
        }
    }
    loop {
        if buf.len() >= WATCH_LIMIT {
            // Enough pipelined requests are waiting; stop reading ahead.
            return Some(fut.await);
        }
        make_room(buf);
        tokio::select! {
            biased;
            out = fut.as_mut() => return Some(out),
            r = tcp.read_buf(buf) => match r {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Closes our side of `tcp`, then reads and drops up to `left` more bytes
/// of a refused body (the buffer's first; `u64::MAX`: until the end),
/// until the client closes, goes quiet for [`LINGER_IDLE`] or
/// [`LINGER_FOR`] has passed. Closing with unread bytes would reset the
/// connection, and a client that sends its whole body before reading
/// would see the reset, not the answer.
async fn close_lingering(tcp: &mut TcpStream, buf: &mut BytesMut, left: u64) {
    let _ = tcp.shutdown().await;
    let mut left = left.saturating_sub(buf.len() as u64);
    let end = tokio::time::Instant::now() + LINGER_FOR;
    while left > 0 {
        buf.clear();
        buf.reserve(64 * 1024);
        let by = end.min(tokio::time::Instant::now() + LINGER_IDLE);
        match tokio::time::timeout_at(by, tcp.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => left = left.saturating_sub(n as u64),
            _ => return,
        }
    }
}

/// Writes an answer: Content-Length when its size is known, chunked
/// otherwise, each piece of a stream as it comes, and says whether the
/// connection must close after it (the app asked, or it could not be
/// framed as declared). An error from the body, a body shorter or longer
/// than it declared, or a client that hangs up ends the connection: the
/// client sees an incomplete answer, never a complete-looking one, and
/// the connection never falls out of step.
async fn write_response(
    tcp: &mut TcpStream,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    reply: Reply,
    head_request: bool,
    close: bool,
) -> Result<bool, &'static str> {
    let status = reply.status;
    let close = close || reply.wants_close();
    out.clear();
    h1::write_status_line(out, status);
    reply.write_headers(out, &FRAMING);
    if !reply.headers.contains(&header::DATE) {
        date::write(out);
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    let no_body = h1::bodiless(status, head_request);
    // What a GET would have carried, when a HEAD answer says.
    let declared = if head_request {
        reply.declared_length()
    } else {
        None
    };
    let mut body = reply.body;
    let exact = declared.or(body.size_hint().exact());
    let chunked = exact.is_none() && !no_body;
    match exact {
        // These statuses never have a body, nor framing to say so.
        _ if no_body && !head_request => {}
        Some(n) => h1::write_content_length(out, n),
        None if chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        None => {}
    }
    out.extend_from_slice(b"\r\n");
    if no_body {
        tcp.write_all(out).await.map_err(|_| "write failed")?;
        return Ok(close);
    }
    // Bytes the declared Content-Length still allows.
    let mut left = exact.unwrap_or(u64::MAX);
    while !body.is_end_stream() {
        let Some(frame) = watching(tcp, buf, body.frame(), None).await else {
            return Err("client closed during the answer");
        };
        let Some(frame) = frame else {
            break;
        };
        let Ok(data) = frame.map_err(|_| "answer body failed")?.into_data() else {
            continue; // trailers: not forwarded
        };
        if data.is_empty() {
            continue;
        }
        if data.len() as u64 > left {
            // More than declared: what fits goes out, then the connection
            // ends (the client sees a framing it can check).
            out.extend_from_slice(&data[..usize::try_from(left).unwrap_or(0)]);
            let _ = tcp.write_all(out).await;
            return Err("answer longer than its content-length");
        }
        left -= data.len() as u64;
        if chunked {
            h1::write_chunk_size(out, data.len());
        }
        if data.len() > COPY_LIMIT {
            tcp.write_all(out).await.map_err(|_| "write failed")?;
            out.clear();
            tcp.write_all(&data).await.map_err(|_| "write failed")?;
        } else {
            out.extend_from_slice(&data);
        }
        if chunked {
            out.extend_from_slice(b"\r\n");
        }
        // Streams go out piece by piece; the last piece waits for the
        // terminator so a whole answer is one write.
        if !body.is_end_stream() {
            tcp.write_all(out).await.map_err(|_| "write failed")?;
            out.clear();
        }
    }
    if chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
    if !out.is_empty() {
        tcp.write_all(out).await.map_err(|_| "write failed")?;
    }
    if exact.is_some() && left > 0 {
        return Err("answer shorter than its content-length");
    }
    Ok(close)
}

/// The framing headers an answer's own are not copied from: this loop
/// frames each answer itself.
const FRAMING: [&[u8]; 3] = [b"content-length", b"transfer-encoding", b"connection"];

/// The `Date` header (RFC 9110 §6.6.1), formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    thread_local! {
        static NOW: RefCell<(u64, Vec<u8>)> = const { RefCell::new((0, Vec::new())) };
    }

    pub(super) fn write(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let second = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs();
        NOW.with_borrow_mut(|(at, line)| {
            if *at != second || line.is_empty() {
                *at = second;
                line.clear();
                line.extend_from_slice(b"date: ");
                line.extend_from_slice(httpdate::fmt_http_date(now).as_bytes());
                line.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(line);
        });
    }
}

/// Serves the whole connection with hyper's server (`HttpStack::Hyper`).
pub async fn serve_hyper<A: Answer>(
    tcp: TcpStream,
    svc: A,
    slot: ConnGuard,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    hand_over(tcp, BytesMut::new(), svc, slot, shutdown).await
}

/// The rest of the connection goes to hyper, starting with what was read.
async fn hand_over<A: Answer>(
    tcp: TcpStream,
    read: BytesMut,
    svc: A,
    slot: ConnGuard,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    // Hyper's head deadline also bounds an idle keep-alive wait; its
    // connections stay counted, never evicted (rare: HTTP/1.0, chunked
    // bodies, upgrades).
    slot.busy();
    // A second handle on the socket keeps it open after hyper lets go of
    // its own, for what the client still sends then (the rest of a body
    // hyper refused, 413).
    let (tcp, mut spare) = match duplicate(tcp) {
        Ok(pair) => pair,
        Err(_) => return Err("could not duplicate the socket"),
    };
    let io = Rewind {
        pre: read.freeze(),
        io: tcp,
    };
    let served = serve_connection(
        TokioIo::new(io),
        svc,
        Some(HYPER_HEAD_DEADLINE),
        shutdown,
        None,
    )
    .await;
    close_lingering(&mut spare, &mut BytesMut::new(), u64::MAX).await;
    drop(slot);
    served
}

/// Two tokio handles on one socket (the second a `dup` of the first).
fn duplicate(tcp: TcpStream) -> io::Result<(TcpStream, TcpStream)> {
    let std = tcp.into_std()?;
    let dup = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, TcpStream::from_std(dup)?))
}

/// A stream that first replays bytes already read from it.
struct Rewind {
    pre: Bytes,
    io: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.pre.is_empty() {
            let n = self.pre.len().min(buf.remaining());
            buf.put_slice(&self.pre[..n]);
            self.pre.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::time::Duration;

    /// Answers `fast METHOD PATH BODY` on this loop, `hyper METHOD PATH
    /// BODY` when hyper serves; `/stream` sends three chunks, `/fail` one
    /// chunk then an error, `/short` declares 10 bytes and sends 3,
    /// `/close` asks for the connection to close, `/hang` never answers
    /// (and notes when it is dropped).
    #[derive(Clone, Default)]
    struct Echo {
        cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    /// A body that declares more than it has.
    struct Short(Option<Bytes>);

    impl http_body::Body for Short {
        type Data = Bytes;
        type Error = io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, io::Error>>> {
            Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
        }

        fn size_hint(&self) -> http_body::SizeHint {
            http_body::SizeHint::with_exact(10)
        }
    }

    /// Sets its flag when dropped.
    struct DropFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl hyper::service::Service<http::Request<Incoming>> for Echo {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = Answering2;

        fn call(&self, req: http::Request<Incoming>) -> Self::Future {
            Box::pin(async move {
                if req.uri().path() == "/refuse" {
                    // Answered without reading the body (as a body limit does).
                    let mut r = Response::new(Body::from("refused"));
                    *r.status_mut() = http::StatusCode::PAYLOAD_TOO_LARGE;
                    return Ok(r);
                }
                let (parts, body) = req.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Ok(Response::new(Body::from(format!(
                    "hyper {} {} {}",
                    parts.method,
                    parts.uri.path(),
                    String::from_utf8_lossy(&body)
                ))))
            })
        }
    }

    type Answering2 = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    impl Answer for Echo {
        fn body_cap(&self) -> usize {
            64
        }

        fn deadlines(&self) -> ClientDeadlines {
            ClientDeadlines::default()
        }

        async fn answer(&self, req: Whole, _: Pin<&mut Sleep>) -> Reply {
            let resp = {
                match req.target.path() {
                    "/hang" => {
                        let _flag = DropFlag(self.cancelled.clone());
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                    "/short" => Response::new(Body::new(Short(Some(Bytes::from("abc"))))),
                    "/close" => {
                        let mut r = Response::new(Body::from("bye"));
                        r.headers_mut()
                            .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
                        r
                    }
                    "/stream" => {
                        let parts =
                            ["one ", "two ", "three"].map(|p| Ok::<_, io::Error>(Bytes::from(p)));
                        Response::new(Body::from_stream(futures_util::stream::iter(parts)))
                    }
                    "/fail" => {
                        let parts = [
                            Ok(Bytes::from("partial")),
                            Err(io::Error::other("engine died")),
                        ];
                        Response::new(Body::from_stream(futures_util::stream::iter(parts)))
                    }
                    path => Response::new(Body::from(format!(
                        "fast {} {path} {}",
                        req.method,
                        String::from_utf8_lossy(&req.body)
                    ))),
                }
            };
            resp.into()
        }

        fn too_large(&self, _: &Method, _: &str) -> Response<Body> {
            let mut r = Response::new(Body::from("too large"));
            *r.status_mut() = http::StatusCode::PAYLOAD_TOO_LARGE;
            r
        }
    }

    async fn start() -> (SocketAddr, CancellationToken) {
        let (addr, shutdown, _) = start_echo().await;
        (addr, shutdown)
    }

    async fn start_echo() -> (SocketAddr, CancellationToken, Echo) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let echo = Echo::default();
        let svc = echo.clone();
        let limit = crate::conns::ConnLimit::new(1024);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let slot = limit.admit().expect("under the cap");
                tokio::spawn(serve(tcp, svc.clone(), slot, token.clone()));
            }
        });
        (addr, shutdown, echo)
    }

    /// The answer without its `date` lines (checked to be there).
    fn undated(got: &str, answers: usize) -> String {
        let dates = got.matches("\r\ndate: ").count();
        assert_eq!(dates, answers, "one date per answer: {got}");
        got.split("\r\n")
            .filter(|l| !l.starts_with("date: "))
            .collect::<Vec<_>>()
            .join("\r\n")
    }

    /// Writes `wire` and reads until the server closes the connection.
    async fn exchange(addr: SocketAddr, wire: &str) -> String {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(wire.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
            .await
            .expect("the server closes the connection")
            .unwrap();
        String::from_utf8(got).unwrap()
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_on_one_connection() {
        let (addr, _) = start().await;
        let got = exchange(
            addr,
            "POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhiGET /b HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(
            undated(&got, 2),
            "HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\nfast POST /a hi\
             HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 12\r\n\r\nfast GET /b "
        );
    }

    #[tokio::test]
    async fn streams_are_chunked_and_terminated() {
        let (addr, _) = start().await;
        let got = exchange(addr, "GET /stream HTTP/1.1\r\nconnection: close\r\n\r\n").await;
        let body = got.split_once("\r\n\r\n").unwrap().1;
        assert!(got.contains("transfer-encoding: chunked\r\n"), "{got}");
        assert_eq!(body, "4\r\none \r\n4\r\ntwo \r\n5\r\nthree\r\n0\r\n\r\n");
    }

    #[tokio::test]
    async fn a_body_that_fails_midway_ends_the_connection_without_a_terminator() {
        let (addr, _) = start().await;
        let got = exchange(addr, "GET /fail HTTP/1.1\r\n\r\n").await;
        let body = got.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(
            body, "7\r\npartial\r\n",
            "no last chunk: the client sees the answer is cut"
        );
    }

    #[tokio::test]
    async fn what_this_loop_does_not_serve_goes_to_hyper_with_the_bytes_read() {
        let (addr, _) = start().await;
        // Expect: 100-continue, then a second request on the same connection.
        let got = exchange(
            addr,
            "POST /e HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\nokGET /next HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(got.contains("hyper POST /e ok"), "{got}");
        assert!(got.contains("hyper GET /next "), "{got}");
        // A chunked request body.
        let got = exchange(
            addr,
            "POST /c HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        )
        .await;
        assert!(got.ends_with("hyper POST /c abc"), "{got}");
        // HTTP/1.0.
        let got = exchange(addr, "GET /old HTTP/1.0\r\n\r\n").await;
        assert!(
            got.starts_with("HTTP/1.0 200 OK") && got.ends_with("hyper GET /old "),
            "{got}"
        );
        // A target not in origin form (absolute form, as sent to proxies).
        let got = exchange(
            addr,
            "GET http://x/abs?q=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(got.ends_with("hyper GET /abs "), "{got}");
        // Origin form stays on this loop.
        let got = exchange(
            addr,
            "GET /here?q=1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(got.ends_with("fast GET /here "), "{got}");
        // Nonsense gets hyper's 400.
        let got = exchange(addr, "BLAH\x01 / HTTP/1.1\r\n\r\n").await;
        assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    }

    #[tokio::test]
    async fn an_oversized_body_is_refused_unread_and_the_connection_closed() {
        let (addr, _) = start().await;
        let got = exchange(addr, "POST /big HTTP/1.1\r\ncontent-length: 65\r\n\r\n").await;
        assert!(
            got.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
            "{got}"
        );
        assert!(
            got.contains("connection: close\r\n") && got.ends_with("too large"),
            "{got}"
        );
    }

    /// Reads until the server closes (no reset) and checks the answer was
    /// the 413.
    async fn reads_413_then_close(mut tcp: TcpStream) {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut got))
            .await
            .expect("the server closes the connection")
            .expect("no reset");
        let got = String::from_utf8(got).unwrap();
        assert!(
            got.starts_with("HTTP/1.1 413 Payload Too Large\r\n"),
            "{got}"
        );
    }

    /// A client that sends its whole body before it reads (as the Python
    /// SDKs do) gets the 413, not a reset: the refused body is read and
    /// dropped after the answer.
    #[tokio::test]
    async fn a_client_that_sends_its_whole_oversized_body_reads_the_413() {
        let (addr, _) = start().await;
        let body = vec![b'x'; 8 << 20];
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /big HTTP/1.1\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        // Let the answer and its FIN arrive before the body is sent.
        tokio::time::sleep(Duration::from_millis(50)).await;
        tcp.write_all(&body).await.expect("the whole body is taken");
        reads_413_then_close(tcp).await;
    }

    /// The same on a connection hyper serves (a chunked body here): the
    /// socket outlives hyper's handle and the rest of the body is dropped.
    #[tokio::test]
    async fn a_chunked_body_hyper_refuses_is_drained_not_reset() {
        let (addr, _) = start().await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST /refuse HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let piece = vec![b'x'; 1 << 20];
        for _ in 0..8 {
            tcp.write_all(b"100000\r\n")
                .await
                .expect("chunk size taken");
            tcp.write_all(&piece).await.expect("chunk taken");
            tcp.write_all(b"\r\n").await.expect("chunk end taken");
        }
        tcp.write_all(b"0\r\n\r\n").await.expect("last chunk taken");
        reads_413_then_close(tcp).await;
    }

    #[tokio::test]
    async fn head_answers_carry_their_length_but_no_body() {
        let (addr, _) = start().await;
        let got = exchange(addr, "HEAD /h HTTP/1.1\r\nconnection: close\r\n\r\n").await;
        assert!(got.contains("content-length: 13\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\n"), "{got}");
    }

    /// Sends a request that never gets an answer on `tcp`, checks it is
    /// still running, hangs up, and waits for the answer to be dropped.
    async fn hang_up_cancels(mut tcp: TcpStream, echo: &Echo) {
        let cancelled = || echo.cancelled.load(std::sync::atomic::Ordering::SeqCst);
        tcp.write_all(b"GET /hang HTTP/1.1\r\n\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!cancelled(), "cancelled before the hang-up");
        drop(tcp);
        let t = std::time::Instant::now();
        while !cancelled() {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the answer was not dropped"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_cancels_its_request() {
        let (addr, _, echo) = start_echo().await;
        hang_up_cancels(TcpStream::connect(addr).await.unwrap(), &echo).await;
    }

    /// The watch grace's timer is one per connection, moved forward for
    /// each request: a hang-up is still seen on a later request, whether
    /// the timer was still armed from the last one or had fired while the
    /// connection sat idle.
    #[tokio::test]
    async fn a_hang_up_is_seen_on_a_later_request_of_a_connection() {
        for idle in [Duration::ZERO, WATCH_GRACE * 3] {
            let (addr, _, echo) = start_echo().await;
            let mut tcp = TcpStream::connect(addr).await.unwrap();
            tcp.write_all(b"GET /a HTTP/1.1\r\n\r\n").await.unwrap();
            let mut buf = [0u8; 256];
            let n = tcp.read(&mut buf).await.unwrap();
            assert!(buf[..n].ends_with(b"fast GET /a "), "{idle:?}");
            tokio::time::sleep(idle).await;
            hang_up_cancels(tcp, &echo).await;
        }
    }

    #[tokio::test]
    async fn an_answer_shorter_than_declared_closes_the_connection() {
        let (addr, _) = start().await;
        // The second request is never answered: the first one's framing
        // failed and the connection ended.
        let got = exchange(addr, "GET /short HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n").await;
        assert!(got.ends_with("content-length: 10\r\n\r\nabc"), "{got}");
    }

    #[tokio::test]
    async fn an_app_asking_to_close_closes() {
        let (addr, _) = start().await;
        let got = exchange(addr, "GET /close HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n").await;
        assert!(
            got.contains("connection: close\r\n") && got.ends_with("bye"),
            "{got}"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_closes_at_shutdown() {
        let (addr, shutdown) = start().await;
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET /a HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 256];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].ends_with(b"fast GET /a "));
        shutdown.cancel();
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest))
            .await
            .expect("closed at shutdown")
            .unwrap();
        assert!(rest.is_empty());
    }
}
