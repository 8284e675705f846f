//! The floor for the face benchmark: the least a model-routing reverse
//! proxy can do per request with this stack (hyper HTTP/1.1 server, body
//! read whole and capped, the top-level `model` picked out, hyper-util's
//! pooled client to one upstream, the answer streamed back). No routing,
//! no failover, no receipts, no job records, no metrics.
//!
//! `scripts/bench/proxy.sh` runs it beside nginx and pair-node (variant
//! `floor`), so the face's overhead is read against what this machine
//! allows in the same run, not against numbers from another box.
//!
//! Usage: `floor_forwarder LISTEN_ADDR UPSTREAM_BASE [current|multi]`

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Upstream = Client<HttpConnector, Full<Bytes>>;

#[derive(serde::Deserialize)]
struct ModelOnly<'a> {
    #[serde(borrow)]
    model: std::borrow::Cow<'a, str>,
}

async fn forward(
    client: Upstream,
    base: Uri,
    req: Request<Incoming>,
) -> Result<Response<http_body_util::combinators::BoxBody<Bytes, hyper::Error>>, Infallible> {
    let bad = |status: StatusCode| {
        let mut r = Response::new(
            Full::new(Bytes::from_static(b"{\"error\":\"bad request\"}"))
                .map_err(|never| match never {})
                .boxed(),
        );
        *r.status_mut() = status;
        Ok(r)
    };
    let (parts, body) = req.into_parts();
    let Ok(body) = Limited::new(body, 32 << 20).collect().await else {
        return bad(StatusCode::PAYLOAD_TOO_LARGE);
    };
    let body = body.to_bytes();
    if !body.is_empty()
        && serde_json::from_slice::<ModelOnly<'_>>(&body).map_or(true, |m| m.model.is_empty())
    {
        return bad(StatusCode::BAD_REQUEST);
    }
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{base}{}", pq.trim_start_matches('/')).parse::<Uri>() else {
        return bad(StatusCode::BAD_REQUEST);
    };
    let mut up = Request::new(Full::new(body));
    *up.method_mut() = parts.method;
    *up.uri_mut() = uri;
    for (k, v) in &parts.headers {
        if k != http::header::HOST && k != http::header::CONNECTION {
            up.headers_mut().append(k, v.clone());
        }
    }
    match client.request(up).await {
        Ok(resp) => Ok(resp.map(BodyExt::boxed)),
        Err(_) => bad(StatusCode::BAD_GATEWAY),
    }
}

async fn serve(listen: SocketAddr, base: Uri) -> std::io::Result<()> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let client = client.clone();
        let base = base.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| forward(client.clone(), base.clone(), req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(base)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: floor_forwarder LISTEN_ADDR UPSTREAM_BASE [current|multi]");
        std::process::exit(64);
    };
    let listen: SocketAddr = listen.parse().map_err(std::io::Error::other)?;
    let base: Uri = base.parse().map_err(std::io::Error::other)?;
    let rt = match args.get(3).map(String::as_str) {
        Some("multi") => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
    };
    rt.block_on(serve(listen, base))
}
