//! The floor for the face benchmark: the least a model-routing reverse
//! proxy can do per request with this stack (hyper HTTP/1.1 server, body
//! read whole and capped, the top-level `model` picked out, one upstream,
//! the answer streamed back). No routing, no failover, no receipts, no job
//! records, no metrics.
//!
//! Two upstream modes: `pool` (default; hyper-util's pooled client, what
//! pair-node uses) and `pinned` (one upstream connection per client
//! connection, made with `hyper::client::conn::http1` on first use; no pool
//! checkout, no stale-connection retry: a measurement, not a product).
//!
//! An optional fourth argument runs the forwarder on that many worker
//! threads, each a current-thread runtime with its own upstream pool; one
//! acceptor hands client connections round-robin to them (thread per core,
//! no task ever moves between threads).
//!
//! `scripts/bench/proxy.sh` runs it beside nginx and pair-node (variant
//! `floor`), so the face's overhead is read against what this machine
//! allows in the same run, not against numbers from another box.
//!
//! Usage: `floor_forwarder LISTEN_ADDR UPSTREAM_BASE [pool|pinned] [WORKERS]`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[path = "support/workers.rs"]
mod workers;

type Answer = Response<BoxBody<Bytes, hyper::Error>>;

/// Where a client connection's requests go.
#[derive(Clone)]
enum Upstream {
    Pool(Box<Client<HttpConnector, Full<Bytes>>>),
    /// This client connection's own upstream connection, once made.
    Pinned(
        SocketAddr,
        Arc<tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>>,
    ),
}

#[derive(serde::Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

fn bad(status: StatusCode) -> Answer {
    let mut r = Response::new(
        Full::new(Bytes::from_static(b"{\"error\":\"bad request\"}"))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

/// The client's request, checked, as the upstream request.
async fn prepare(base: &Uri, req: Request<Incoming>) -> Result<Request<Full<Bytes>>, StatusCode> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, 32 << 20)
        .collect()
        .await
        .map_err(|_| StatusCode::PAYLOAD_TOO_LARGE)?
        .to_bytes();
    if !body.is_empty()
        && serde_json::from_slice::<ModelOnly<'_>>(&body).map_or(true, |m| m.model.is_empty())
    {
        return Err(StatusCode::BAD_REQUEST);
    }
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = format!("{base}{}", pq.trim_start_matches('/'))
        .parse::<Uri>()
        .map_err(|_| StatusCode::BAD_REQUEST)?;
    let mut up = Request::new(Full::new(body));
    *up.method_mut() = parts.method;
    for (k, v) in &parts.headers {
        if k != http::header::HOST && k != http::header::CONNECTION {
            up.headers_mut().append(k, v.clone());
        }
    }
    if let Some(a) = uri.authority()
        && let Ok(h) = http::HeaderValue::from_str(a.as_str())
    {
        up.headers_mut().insert(http::header::HOST, h);
    }
    *up.uri_mut() = uri;
    Ok(up)
}

async fn forward(
    upstream: Upstream,
    base: Uri,
    req: Request<Incoming>,
) -> Result<Answer, Infallible> {
    let up = match prepare(&base, req).await {
        Ok(up) => up,
        Err(status) => return Ok(bad(status)),
    };
    let sent = match upstream {
        Upstream::Pool(client) => client.request(up).await.map_err(|_| ()),
        Upstream::Pinned(addr, conn) => send_pinned(addr, &conn, up).await,
    };
    Ok(match sent {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(()) => bad(StatusCode::BAD_GATEWAY),
    })
}

async fn send_pinned(
    addr: SocketAddr,
    conn: &tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
    up: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, ()> {
    let mut guard = conn.lock().await;
    if guard.as_ref().is_none_or(SendRequest::is_closed) {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|_| ())?;
        let _ = tcp.set_nodelay(true);
        let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|_| ())?;
        tokio::spawn(driver);
        *guard = Some(sender);
    }
    let sender = guard.as_mut().ok_or(())?;
    sender.ready().await.map_err(|_| ())?;
    let answer = sender.send_request(up);
    drop(guard);
    answer.await.map_err(|_| ())
}

fn pool() -> Upstream {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Upstream::Pool(Box::new(
        Client::builder(TokioExecutor::new()).build(connector),
    ))
}

fn serve_conn(tcp: tokio::net::TcpStream, upstream: Upstream, base: Uri) {
    let _ = tcp.set_nodelay(true);
    tokio::spawn(async move {
        let svc = service_fn(move |req| forward(upstream.clone(), base.clone(), req));
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(tcp), svc)
            .await;
    });
}

async fn serve(listen: SocketAddr, base: Uri, pinned: bool) -> std::io::Result<()> {
    let pool = pool();
    let upstream_addr: SocketAddr = base
        .authority()
        .map_or("", |a| a.as_str())
        .parse()
        .map_err(std::io::Error::other)?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let upstream = if pinned {
            Upstream::Pinned(upstream_addr, Arc::default())
        } else {
            pool.clone()
        };
        serve_conn(tcp, upstream, base.clone());
    }
}

/// Thread per core: `workers` current-thread runtimes, each with its own
/// pool; the acceptor (this thread) deals connections out round-robin.
async fn serve_workers(listen: SocketAddr, base: Uri, workers: usize) -> std::io::Result<()> {
    let handles = workers::spawn(workers)?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let mut next = 0;
    loop {
        let (tcp, _) = listener.accept().await?;
        let tcp = tcp.into_std()?;
        let base = base.clone();
        handles[next % workers].spawn(async move {
            thread_local! {
                static POOL: Upstream = pool();
            }
            if let Ok(tcp) = tokio::net::TcpStream::from_std(tcp) {
                serve_conn(tcp, POOL.with(Clone::clone), base);
            }
        });
        next += 1;
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(base)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: floor_forwarder LISTEN_ADDR UPSTREAM_BASE [pool|pinned] [WORKERS]");
        std::process::exit(64);
    };
    let listen: SocketAddr = listen.parse().map_err(std::io::Error::other)?;
    let base: Uri = base.parse().map_err(std::io::Error::other)?;
    let pinned = args.get(3).is_some_and(|m| m == "pinned");
    let workers: usize = args.get(4).and_then(|w| w.parse().ok()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if workers > 0 {
        rt.block_on(serve_workers(listen, base, workers))
    } else {
        rt.block_on(serve(listen, base, pinned))
    }
}
