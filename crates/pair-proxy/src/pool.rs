//! Keep-alive HTTP/1.1 connections from one event loop to the local
//! engines: the hot path's upstream client.
//!
//! Each event loop ([`crate::loops`]) owns one pool, and each connection's
//! driver task runs on that loop, so no lock here is ever contended and no
//! wake-up crosses threads. A connection stays in the pool while it
//! serves a request; a request takes the most recently added connection
//! that is ready (hyper says so once the previous answer was read to its
//! end), so no check-in step can be forgotten. Closed connections are
//! dropped as the list is scanned; a connection the engine closed while it
//! sat idle is noticed when the request cannot be written to it, and the
//! request goes out on a new connection instead (it never reached the
//! engine; hyper hands such a request back, and no test provokes that race
//! deterministically). Replaces hyper-util's general-purpose pooled client
//! on this path, which per request hashed the pool key (SipHash), ran a
//! checkout future and boxed a connection-info extension: 40.9 vs 43.4 µs
//! CPU per request in an A/B (docs/benchmarks/proxy.md). Peers keep
//! hyper-util's client (TLS).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use tower::Service;

use crate::dispatch::{DispatchError, Timeouts, http_connector};

/// Connections one loop keeps; past this, a request's connection is used
/// once and closed (a burst beyond any sane engine's concurrency).
const MAX_CONNS: usize = 256;
/// A connection unused this long is closed when next seen.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How often the daemon sweeps idle connections out of quiet loops' pools.
pub const SWEEP_EVERY: Duration = Duration::from_secs(30);

type Req = Request<Full<Bytes>>;
/// What a pooled send yields: the answer's head, or the request back if it
/// was never written.
type Sent = Result<Response<Incoming>, hyper::client::conn::TrySendError<Req>>;

struct Conn {
    to: Authority,
    sender: SendRequest<Full<Bytes>>,
    used: Instant,
}

impl Conn {
    /// Whether to keep this connection: not closed, and busy or idle for
    /// less than [`IDLE_TIMEOUT`]. A busy one (a long stream) is stamped
    /// as used now, so its idle time counts from the end of its answer.
    fn still_useful(&mut self, now: Instant) -> bool {
        if self.sender.is_closed() {
            return false;
        }
        if !self.sender.is_ready() {
            self.used = now;
            return true;
        }
        now.duration_since(self.used) <= IDLE_TIMEOUT
    }
}

/// One event loop's connections to the local engines.
pub struct LocalPool {
    connector: HttpConnector,
    conns: Mutex<Vec<Conn>>,
}

impl std::fmt::Debug for LocalPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.conns.lock().map_or(0, |c| c.len());
        f.debug_struct("LocalPool")
            .field("connections", &n)
            .finish_non_exhaustive()
    }
}

impl LocalPool {
    pub fn new(timeouts: Timeouts) -> Self {
        Self {
            connector: http_connector(timeouts),
            conns: Mutex::new(Vec::new()),
        }
    }

    /// Connections held now (busy or idle).
    pub fn len(&self) -> usize {
        self.conns.lock().map_or(0, |c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes connections idle longer than the idle timeout (a quiet loop
    /// would otherwise keep them until its next request). Busy ones are
    /// stamped as used now.
    pub fn sweep(&self) {
        let now = Instant::now();
        if let Ok(mut conns) = self.conns.lock() {
            conns.retain_mut(|c| c.still_useful(now));
        }
    }

    /// Sends `req` (origin-form target, `Host` set) to the engine at `to`
    /// and waits for the answer's head.
    pub async fn send(
        &self,
        to: &Authority,
        req: Req,
    ) -> Result<Response<Incoming>, DispatchError> {
        let req = match self.start_pooled(to, req) {
            Ok(sent) => match sent.await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    // Never written: the connection had just closed.
                    Some(back) => back,
                    None => {
                        return Err(DispatchError::Http {
                            source: e.into_error(),
                        });
                    }
                },
            },
            Err(req) => req,
        };
        self.send_new(to, req).await
    }

    /// Starts `req` on the newest ready connection to `to`, dropping closed
    /// and long-idle ones on the way; hands `req` back when there is none.
    #[allow(clippy::result_large_err)]
    fn start_pooled(
        &self,
        to: &Authority,
        req: Req,
    ) -> Result<impl Future<Output = Sent> + use<>, Req> {
        let Ok(mut conns) = self.conns.lock() else {
            return Err(req);
        };
        let now = Instant::now();
        let mut i = conns.len();
        while i > 0 {
            i -= 1;
            let c = &mut conns[i];
            if !c.still_useful(now) {
                conns.swap_remove(i);
                continue;
            }
            if c.sender.is_ready() && c.to == *to {
                c.used = now;
                return Ok(c.sender.try_send_request(req));
            }
        }
        Err(req)
    }

    /// A new connection (its driver on this loop), kept in the pool if
    /// there is room.
    async fn send_new(
        &self,
        to: &Authority,
        req: Req,
    ) -> Result<Response<Incoming>, DispatchError> {
        let uri = Uri::builder()
            .scheme("http")
            .authority(to.clone())
            .path_and_query("/")
            .build()
            .map_err(|source| DispatchError::BadRequest { source })?;
        let mut connector = self.connector.clone();
        let io = connector
            .call(uri)
            .await
            .map_err(|source| DispatchError::Connect {
                source: Box::new(source),
            })?;
        let (mut sender, conn) = http1::handshake::<_, Full<Bytes>>(io)
            .await
            .map_err(|source| DispatchError::Http { source })?;
        tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "engine connection ended");
            }
        });
        let sent = sender.send_request(req);
        if let Ok(mut conns) = self.conns.lock()
            && conns.len() < MAX_CONNS
        {
            conns.push(Conn {
                to: to.clone(),
                sender,
                used: Instant::now(),
            });
        }
        sent.await.map_err(|source| DispatchError::Http { source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::Arc;
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

    fn get(to: &Authority, path: &str) -> Req {
        Request::builder()
            .uri(path)
            .header(http::header::HOST, to.as_str())
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    async fn text(resp: Response<Incoming>) -> String {
        let b = resp.into_body().collect().await.unwrap().to_bytes();
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
            // Let the driver see the close (as time between requests would).
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
    async fn a_dead_engine_is_a_connect_error() {
        let spare = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to: Authority = spare.local_addr().unwrap().to_string().parse().unwrap();
        drop(spare);
        let pool = LocalPool::new(Timeouts::default());
        let err = pool.send(&to, get(&to, "/")).await.unwrap_err();
        assert_eq!(err.class(), "connect");
        assert!(err.retry().may_retry());
    }
}
