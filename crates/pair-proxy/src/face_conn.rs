//! Serving one loopback face connection: HTTP/1.1 read and written by hand
//! on [`crate::h1`], so a request costs one read, the routing, and one write
//! (about 10 µs of CPU less than hyper's server connection on the benchmark
//! box; docs/benchmarks/proxy.md, "Fourth round").
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

use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Response, StatusCode, Version, header};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::cluster::{SHUTDOWN_GRACE, serve_connection};
use crate::h1::{self, BodyLen};

/// Data chunks larger than this are written on their own instead of being
/// copied behind their head.
const COPY_LIMIT: usize = 16 * 1024;

/// A request, read whole, as the loop hands it over.
pub(crate) type WholeRequest = http::Request<Bytes>;

/// What answers a face connection's requests.
pub(crate) trait Answer:
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
    /// Answers one request. The future lives inside the connection's own
    /// (no allocation, no move per request).
    fn answer(&self, req: WholeRequest) -> impl Future<Output = Response<Body>> + Send;
    /// The answer to a request whose declared body is over the cap.
    fn too_large(&self, method: &Method, path: &str) -> Response<Body>;
}

/// Serves `tcp` until the client closes it or `shutdown`; then a request
/// in flight gets [`SHUTDOWN_GRACE`] to finish.
pub(crate) async fn serve<A: Answer>(
    tcp: TcpStream,
    svc: A,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    // A child token per connection: polled uncontended (see
    // cluster::serve_connection).
    let shutdown = shutdown.child_token();
    let conn = run(tcp, svc, shutdown.clone());
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
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out = Vec::with_capacity(8 * 1024);
    loop {
        // The next head; an idle connection closes at shutdown.
        let head = loop {
            if !buf.is_empty() {
                match h1::parse_request(&mut buf) {
                    Ok(Some(head)) => break head,
                    Ok(None) => {}
                    Err(_) => return hand_over(tcp, buf, svc, shutdown).await,
                }
            }
            if buf.capacity() - buf.len() < 1024 {
                buf.reserve(8 * 1024);
            }
            let n = tokio::select! {
                biased;
                r = tcp.read_buf(&mut buf) => r.map_err(|_| "read failed")?,
                () = shutdown.cancelled(), if buf.is_empty() => return Ok(()),
            };
            if n == 0 {
                return Ok(());
            }
        };
        let uri = http::Uri::from_maybe_shared(head.target.clone());
        let (BodyLen::Length(len), Ok(uri), Version::HTTP_11, false) =
            (head.body, uri, head.version, head.special)
        else {
            // Hyper serves the rest, from this head on.
            let mut read = BytesMut::from(&head.raw[..]);
            read.unsplit(buf);
            return hand_over(tcp, read, svc, shutdown).await;
        };
        let head_request = head.method == Method::HEAD;
        if len > svc.body_cap() as u64 {
            // The body is never read: answer and close.
            let resp = svc.too_large(&head.method, uri.path());
            write_response(&mut tcp, &mut out, resp, head_request, true).await?;
            let _ = tcp.shutdown().await;
            return Ok(());
        }
        let len = usize::try_from(len).map_err(|_| "body too large")?;
        if buf.len() < len {
            buf.reserve(len - buf.len());
        }
        while buf.len() < len {
            if tcp.read_buf(&mut buf).await.map_err(|_| "read failed")? == 0 {
                return Err("client closed before its body's end");
            }
        }
        let body = buf.split_to(len).freeze();
        let mut req = http::Request::new(body);
        *req.method_mut() = head.method;
        *req.uri_mut() = uri;
        *req.headers_mut() = head.headers;
        let resp = svc.answer(req).await;
        let close = !head.keep_alive || shutdown.is_cancelled();
        write_response(&mut tcp, &mut out, resp, head_request, close).await?;
        if close {
            let _ = tcp.shutdown().await;
            return Ok(());
        }
    }
}

/// Writes an answer: Content-Length when its size is known, chunked
/// otherwise, each piece of a stream as it comes. An error from the body
/// ends the connection (the client sees an incomplete answer, never a
/// complete-looking one).
async fn write_response(
    tcp: &mut TcpStream,
    out: &mut Vec<u8>,
    resp: Response<Body>,
    head_request: bool,
    close: bool,
) -> Result<(), &'static str> {
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    out.clear();
    h1::write_status_line(out, status);
    h1::write_headers(
        out,
        parts.headers.iter().filter(|(name, _)| {
            **name != header::CONTENT_LENGTH
                && **name != header::TRANSFER_ENCODING
                && **name != header::CONNECTION
        }),
    );
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    let no_body = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let exact = if head_request {
        // What a GET would have carried, when the answer says.
        parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .or(body.size_hint().exact())
    } else {
        body.size_hint().exact()
    };
    let chunked = exact.is_none() && !no_body;
    match exact {
        // These statuses never have a body, nor framing to say so.
        _ if no_body && !head_request => {}
        Some(n) => {
            out.extend_from_slice(b"content-length: ");
            h1::write_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        None if chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        None => {}
    }
    out.extend_from_slice(b"\r\n");
    if no_body {
        return tcp.write_all(out).await.map_err(|_| "write failed");
    }
    while !body.is_end_stream() {
        let Some(frame) = body.frame().await else {
            break;
        };
        let Ok(data) = frame.map_err(|_| "answer body failed")?.into_data() else {
            continue; // trailers: not forwarded
        };
        if data.is_empty() {
            continue;
        }
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
    Ok(())
}

/// The rest of the connection goes to hyper, starting with what was read.
async fn hand_over<A: Answer>(
    tcp: TcpStream,
    read: BytesMut,
    svc: A,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    let io = Rewind {
        pre: read.freeze(),
        io: tcp,
    };
    serve_connection(TokioIo::new(io), svc, None, shutdown, None).await
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
    /// chunk then an error.
    #[derive(Clone)]
    struct Echo;

    impl hyper::service::Service<http::Request<Incoming>> for Echo {
        type Response = Response<Body>;
        type Error = Infallible;
        type Future = Answering2;

        fn call(&self, req: http::Request<Incoming>) -> Self::Future {
            Box::pin(async move {
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

        async fn answer(&self, req: WholeRequest) -> Response<Body> {
            {
                match req.uri().path() {
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
                        req.method(),
                        String::from_utf8_lossy(req.body())
                    ))),
                }
            }
        }

        fn too_large(&self, _: &Method, _: &str) -> Response<Body> {
            let mut r = Response::new(Body::from("too large"));
            *r.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
            r
        }
    }

    async fn start() -> (SocketAddr, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                tokio::spawn(serve(tcp, Echo, token.clone()));
            }
        });
        (addr, shutdown)
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
            got,
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

    #[tokio::test]
    async fn head_answers_carry_their_length_but_no_body() {
        let (addr, _) = start().await;
        let got = exchange(addr, "HEAD /h HTTP/1.1\r\nconnection: close\r\n\r\n").await;
        assert!(got.contains("content-length: 13\r\n"), "{got}");
        assert!(got.ends_with("\r\n\r\n"), "{got}");
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
