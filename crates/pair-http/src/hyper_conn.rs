//! Connections that hyper's server serves, and accepting connections: the
//! cluster port's, and what the hand-framed face loop hands over (HTTP/1.0,
//! chunked bodies, `Expect`, upgrades). One connection ends when its
//! client does, when it is revoked (a peer unpaired), or at shutdown
//! after a grace for what is in flight.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// In-flight streams get this long to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Resolves when a connection's right to stay open is withdrawn.
pub type Revoked = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The next connection (TCP_NODELAY set), or `None` once `shutdown` fires.
/// Accept errors (EMFILE and friends) back off instead of spinning.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    what: &'static str,
) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return None,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((tcp, remote)) => {
                let _ = tcp.set_nodelay(true);
                return Some((tcp, remote));
            }
            Err(e) => {
                tracing::warn!(error = %e, what, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one HTTP/1.1 connection with an axum router until it ends, it
/// is `revoked`, or `shutdown` (then in-flight requests get a grace).
pub async fn serve_router<IO>(
    io: TokioIo<IO>,
    router: Router,
    header_deadline: Option<Duration>,
    shutdown: CancellationToken,
    revoked: Option<Revoked>,
) -> Result<(), &'static str>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = router.map_request(|r: http::Request<Incoming>| r.map(axum::body::Body::new));
    let svc = TowerToHyperService::new(svc.map_err(|e: Infallible| match e {}));
    serve_connection(io, svc, header_deadline, shutdown, revoked).await
}

/// [`serve_router`] for any hyper service. `header_deadline` bounds each
/// head and, since hyper starts it when it waits for one, each idle
/// keep-alive wait too.
pub async fn serve_connection<IO, S>(
    io: TokioIo<IO>,
    svc: S,
    header_deadline: Option<Duration>,
    shutdown: CancellationToken,
    revoked: Option<Revoked>,
) -> Result<(), &'static str>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = axum::body::Body>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    if let Some(d) = header_deadline {
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(Some(d));
    }
    let conn = builder.serve_connection(io, svc);
    let mut conn = std::pin::pin!(conn);
    let revoked = async move {
        match revoked {
            Some(r) => r.await,
            None => std::future::pending().await,
        }
    };
    // The node-wide token's mutex would be taken by every connection on
    // every poll, from every loop; a child token per connection is polled
    // uncontended. The connection comes first: it is what usually woke us.
    let shutdown = shutdown.child_token();
    tokio::select! {
        biased;
        r = conn.as_mut() => return r.map_err(|_| "http error"),
        () = revoked => return Err("connection revoked"),
        () = shutdown.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    match tokio::time::timeout(SHUTDOWN_GRACE, conn).await {
        Ok(r) => r.map_err(|_| "http error"),
        Err(_) => Err("shutdown grace elapsed"),
    }
}
