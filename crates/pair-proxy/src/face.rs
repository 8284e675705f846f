//! The local faces: the Ollama face (11434) and the OpenAI / LM Studio face
//! (1234), plain HTTP for apps on this machine only. Inference routes go
//! through the failover executor, listings are merged across the cluster,
//! everything else passes through to the local engine unchanged.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use futures_util::future::{Either, join_all};
use http::{HeaderValue, Method, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use pair_core::{ApiFlavor, EngineKind};
use serde_json::Value;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use pair_http::conns::ClientDeadlines;
use pair_http::hyper_conn::{accept, serve_router};

use crate::dispatch::{self, Hop};
use crate::error::json_error;
use crate::forward::{self, Inference};
use crate::listing::{self, engine_answers};
use crate::route::{self, Listing, RouteClass};
use crate::state::ProxyState;
use pair_http::Reply;
use pair_http::RequestHead;
use pair_http::client::HttpStack;
use pair_http::h1::Headers;
use pair_http::server::{self as face_conn, Whole};

/// Which API a face speaks natively (for its own errors and passthrough).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    /// Port 11434: the Ollama API, plus the OpenAI routes Ollama serves.
    Ollama,
    /// Port 1234: OpenAI / LM Studio.
    OpenAi,
}

impl Face {
    fn flavor(self) -> ApiFlavor {
        match self {
            Face::Ollama => ApiFlavor::Ollama,
            Face::OpenAi => ApiFlavor::OpenAi,
        }
    }

    /// Engines this face passes unclassified requests to, best first.
    fn passthrough_kinds(self) -> &'static [EngineKind] {
        match self {
            Face::Ollama => &[EngineKind::Ollama],
            Face::OpenAi => &[
                EngineKind::LmStudio,
                EngineKind::OpenAiCompat,
                EngineKind::Ollama,
            ],
        }
    }
}

#[derive(Clone)]
struct FaceState {
    st: Arc<ProxyState>,
    face: Face,
}

impl FaceState {
    /// The 403 for a request the node's [`crate::gate::FaceGate`] refuses
    /// (a `Host` that is not this machine, a foreign `Origin` on a control
    /// route), in the flavour of the API it called; `None` when it may
    /// pass. Checked before anything else, at every door of the face.
    fn refusal(
        &self,
        method: &Method,
        path: &str,
        host: Option<&[u8]>,
        origin: Option<&[u8]>,
    ) -> Option<Response<Body>> {
        let refusal = self.st.gate.check(path, host, origin).err()?;
        let flavor = match route::classify(method, path) {
            RouteClass::Inference { flavor, .. } => flavor,
            _ => self.face.flavor(),
        };
        tracing::info!(
            ?refusal,
            path,
            host = %String::from_utf8_lossy(host.unwrap_or_default()),
            origin = %String::from_utf8_lossy(origin.unwrap_or_default()),
            "refused a request on a local face"
        );
        Some(json_error(
            StatusCode::FORBIDDEN,
            flavor,
            "forbidden",
            refusal.message(),
            None,
        ))
    }
}

/// The face's router. `control` holds the daemon's own routes (`/_pair/...`,
/// `/ui`), merged in. Only loopback connections ever reach it: [`serve`]
/// decides once per connection.
pub fn router(st: Arc<ProxyState>, face: Face, control: Router) -> Router {
    let fs = FaceState { st, face };
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(handle)
        .with_state(fs)
        .merge(control)
}

/// How long a connection from another machine may take to send its head
/// (its answer is a 403 whatever it sends).
const FORBIDDEN_HEAD_DEADLINE: Duration = Duration::from_secs(10);

/// What a connection from another machine gets, whatever it asks: 403 with
/// a JSON error in the face's own flavour.
fn forbidden(face: Face) -> Router {
    Router::new().fallback(move || async move {
        json_error(
            StatusCode::FORBIDDEN,
            face.flavor(),
            "forbidden",
            "pair's local faces only accept connections from this machine; other machines join the cluster by pairing",
            None,
        )
    })
}

/// Whether a client connected from this machine (IPv4-mapped IPv6 loopback
/// included, for faces bound to `[::]`).
fn is_local(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

async fn log_end(peer: SocketAddr, conn: impl Future<Output = Result<(), &'static str>>) {
    if let Err(reason) = conn.await {
        tracing::debug!(%peer, reason, "face connection closed");
    }
}

/// What serves a loopback connection ([`face_conn`]): inference requests
/// go straight to the executor (no router matching, no body boxing: this
/// is the path every token takes); everything else goes through the
/// face's router, as does all of a connection handed to hyper.
#[derive(Clone)]
struct FaceService {
    fs: FaceState,
    app: Router,
    /// This connection's own handle on the node state, which its answers
    /// hold until they end (see [`forward::StateRef`]); made per
    /// connection by [`FaceService::for_connection`].
    st: forward::StateRef,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for FaceService {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, Self::Error>> + Send>,
    >;

    /// The connections `face_conn` hands to hyper (HTTP/1.0, chunked or
    /// `Expect` requests, upgrades): rare, so the router serves them all
    /// (its fallback routes inference the same way).
    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        use tower::ServiceExt;
        let h = req.headers();
        if let Some(refused) = self.fs.refusal(
            req.method(),
            req.uri().path(),
            h.get(header::HOST).map(HeaderValue::as_bytes),
            h.get(header::ORIGIN).map(HeaderValue::as_bytes),
        ) {
            return Box::pin(std::future::ready(Ok(refused)));
        }
        if let class @ RouteClass::Inference { .. } =
            route::classify(req.method(), req.uri().path())
        {
            // Inference without the router, as on the hand-framed path.
            let fs = self.fs.clone();
            return Box::pin(
                async move { Ok(serve_request(&fs, class, req.map(Body::new)).await) },
            );
        }
        Box::pin(self.app.clone().oneshot(req.map(Body::new)))
    }
}

/// What a face answers besides inference (boxed: not the path every
/// token takes).
type OtherAnswer<'a> = Pin<Box<dyn Future<Output = Reply> + Send + 'a>>;

impl face_conn::Answer for FaceService {
    fn body_cap(&self) -> usize {
        self.fs.st.body_cap
    }

    fn deadlines(&self) -> ClientDeadlines {
        self.fs.st.deadlines
    }

    fn answer(&self, req: Whole, deadline: Pin<&mut Sleep>) -> impl Future<Output = Reply> + Send {
        if let Some(refused) = self.fs.refusal(
            &req.method,
            req.target.path(),
            req.headers.get(&header::HOST),
            req.headers.get(&header::ORIGIN),
        ) {
            let refused: OtherAnswer<'_> = Box::pin(std::future::ready(Reply::from(refused)));
            return Either::Right(refused);
        }
        let RouteClass::Inference {
            flavor,
            work,
            route,
        } = route::classify(&req.method, req.target.path())
        else {
            let app: OtherAnswer<'_> = Box::pin(self.answer_app(req));
            return Either::Right(app);
        };
        // The executor's own future, with no layer around it: its state
        // (the whole request path, about 2 KiB) is built where the
        // connection pins it and never moved. Routed on the fields as they
        // came: no header map is built.
        let head = RequestHead {
            method: req.method,
            path_and_query: req.target,
            headers: Headers::Raw(req.headers),
        };
        Either::Left(forward::execute(
            &self.st,
            Inference {
                head,
                body: req.body,
                flavor,
                work,
                route,
                received: req.received,
            },
            forward::Plan::Cluster,
            deadline,
        ))
    }

    fn too_large(&self, method: &Method, path: &str) -> Response<Body> {
        let flavor = match route::classify(method, path) {
            RouteClass::Inference { flavor, .. } => flavor,
            _ => self.fs.face.flavor(),
        };
        too_large(self.fs.st.body_cap, flavor)
    }
}

impl FaceService {
    /// A copy for one connection, with a handle on the node state of its
    /// own.
    fn for_connection(&self) -> Self {
        Self {
            fs: self.fs.clone(),
            app: self.app.clone(),
            st: Arc::new(Arc::clone(&self.fs.st)),
        }
    }

    /// Everything but inference (listings, the UI, the control API, the
    /// engine's own routes): the face's router, with a header map.
    async fn answer_app(&self, req: Whole) -> Reply {
        let headers = match req.headers.to_map(0) {
            Ok(h) => h,
            Err(e) => {
                return json_error(
                    StatusCode::BAD_REQUEST,
                    self.fs.face.flavor(),
                    "invalid_request",
                    &e.to_string(),
                    None,
                )
                .into();
            }
        };
        let mut http_req = http::Request::new(Body::from(req.body));
        *http_req.method_mut() = req.method;
        *http_req.uri_mut() = http::Uri::from(req.target);
        *http_req.headers_mut() = headers;
        use tower::ServiceExt;
        match self.app.clone().oneshot(http_req).await {
            Ok(resp) => resp.into(),
            Err(never) => match never {},
        }
    }
}

/// Serves a face until `shutdown`, then lets in-flight requests finish
/// (bounded by [`pair_http::hyper_conn::SHUTDOWN_GRACE`]). HTTP/1.1 with
/// keep-alive and TCP_NODELAY; the loopback check is made once per
/// connection, not per request.
pub async fn serve(
    listener: tokio::net::TcpListener,
    st: Arc<ProxyState>,
    face: Face,
    control: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = router(Arc::clone(&st), face, control);
    let local = FaceService {
        st: Arc::new(Arc::clone(&st)),
        fs: FaceState { st, face },
        app,
    };
    let conns = TaskTracker::new();
    let loops = Arc::clone(&local.fs.st.loops);
    while let Some((tcp, peer)) = accept(&listener, &shutdown, "face").await {
        let shutdown = shutdown.clone();
        let Some(slot) = local.fs.st.conns.admit() else {
            tracing::warn!(%peer, cap = local.fs.st.conns.cap(), "connection cap reached with every connection busy: answered 503");
            conns.spawn(face_conn::refuse(tcp, busy(face)));
            continue;
        };
        if is_local(peer) {
            let svc = local.clone();
            let hyper = svc.fs.st.http_stack == HttpStack::Hyper;
            loops.spawn(&conns, tcp, move |tcp| {
                // Made on the connection's own loop.
                let svc = svc.for_connection();
                async move {
                    if hyper {
                        log_end(peer, face_conn::serve_hyper(tcp, svc, slot, shutdown)).await;
                    } else {
                        log_end(peer, face_conn::serve(tcp, svc, slot, shutdown)).await;
                    }
                }
            });
        } else {
            tracing::info!(%peer, "refused a non-loopback client on a local face");
            conns.spawn(log_end(peer, async move {
                let served = serve_router(
                    TokioIo::new(tcp),
                    forbidden(face),
                    Some(FORBIDDEN_HEAD_DEADLINE),
                    shutdown,
                    None,
                )
                .await;
                drop(slot);
                served
            }));
        }
    }
    drop(listener);
    conns.close();
    conns.wait().await;
    Ok(())
}

async fn metrics(State(fs): State<FaceState>) -> impl IntoResponse {
    let m = &fs.st.metrics;
    m.pending.set(i64::from(fs.st.load.in_flight()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn handle(State(fs): State<FaceState>, req: Request) -> Response<Body> {
    let class = route::classify(req.method(), req.uri().path());
    serve_request(&fs, class, req).await
}

/// Routes one request the router dispatched.
async fn serve_request(fs: &FaceState, class: RouteClass, req: Request) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let flavor = match class {
        RouteClass::Inference { flavor, .. } => flavor,
        _ => fs.face.flavor(),
    };
    let body = match read_capped(body, &parts.headers, fs.st.body_cap, &fs.st.deadlines).await {
        Ok(b) => b,
        Err(resp) => return resp(flavor),
    };
    let head = RequestHead {
        method: parts.method,
        path_and_query: path_and_query(&parts.uri),
        headers: Headers::Map(parts.headers),
    };
    let deadline = std::pin::pin!(tokio::time::sleep(fs.st.timeouts.first_byte));
    serve_whole(fs, class, head, body, deadline)
        .await
        .into_response()
}

fn path_and_query(uri: &http::Uri) -> http::uri::PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"))
}

/// Routes one request whose body has been read.
async fn serve_whole(
    fs: &FaceState,
    class: RouteClass,
    head: RequestHead,
    body: Bytes,
    deadline: Pin<&mut Sleep>,
) -> Reply {
    let st = &fs.st;
    match class {
        RouteClass::Inference {
            flavor,
            work,
            route,
        } => {
            forward::execute(
                &Arc::new(Arc::clone(st)),
                Inference {
                    head,
                    body,
                    flavor,
                    work,
                    route,
                    received: tokio::time::Instant::now(),
                },
                forward::Plan::Cluster,
                deadline,
            )
            .await
        }
        RouteClass::Listing(kind) => merged_listing(st, kind).await.into(),
        RouteClass::Passthrough => passthrough(st, fs.face, head, body).await.into(),
    }
}

/// 503 for a connection beyond the cap, in the face's flavour.
fn busy(face: Face) -> Response<Body> {
    let mut resp = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        face.flavor(),
        "too_many_connections",
        "pair-node holds as many connections as it may (--max-connections), every one busy; retry shortly",
        None,
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// 413 in the face's flavour.
fn too_large(cap: usize, flavor: ApiFlavor) -> Response<Body> {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        flavor,
        "body_too_large",
        &format!("request body exceeds the {} MiB limit", cap / (1024 * 1024)),
        None,
    )
}

type ErrorFn = Box<dyn FnOnce(ApiFlavor) -> Response<Body> + Send>;

/// Reads the whole body up to `cap` bytes (kept for replay on failover).
pub(crate) async fn read_capped<B>(
    body: B,
    headers: &http::HeaderMap,
    cap: usize,
    deadlines: &ClientDeadlines,
) -> Result<Bytes, ErrorFn>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let too_big = move |flavor| too_large(cap, flavor);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(Box::new(too_big));
    }
    // As on the hand-framed path: a body must keep arriving, and its
    // buffer grows with what arrived.
    let start = tokio::time::Instant::now();
    let mut body = std::pin::pin!(http_body_util::Limited::new(body, cap));
    let mut got = bytes::BytesMut::new();
    loop {
        let by = deadlines.body_deadline(start, got.len() as u64);
        let frame =
            match tokio::time::timeout_at(by, http_body_util::BodyExt::frame(&mut body)).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(None) => return Ok(got.freeze()),
                Ok(Some(Err(e))) => {
                    if e.is::<http_body_util::LengthLimitError>() {
                        return Err(Box::new(too_big));
                    }
                    return Err(Box::new(move |flavor| {
                        json_error(
                            StatusCode::BAD_REQUEST,
                            flavor,
                            "body_read_failed",
                            &format!("could not read the request body: {e}"),
                            None,
                        )
                    }));
                }
                Err(_) => {
                    return Err(Box::new(|flavor| {
                        json_error(
                            StatusCode::REQUEST_TIMEOUT,
                            flavor,
                            "body_too_slow",
                            "the request body stopped arriving",
                            None,
                        )
                    }));
                }
            };
        if let Ok(data) = frame.into_data() {
            got.extend_from_slice(&data);
        }
    }
}

async fn passthrough(
    st: &Arc<ProxyState>,
    face: Face,
    head: RequestHead,
    body: Bytes,
) -> Response<Body> {
    let engines = st.engines();
    let Some(engine) = face
        .passthrough_kinds()
        .iter()
        .find_map(|k| engines.iter().find(|e| e.kind == *k))
    else {
        return json_error(
            StatusCode::BAD_GATEWAY,
            face.flavor(),
            "no_local_engine",
            &format!(
                "{} is not a routed path and this node has no local engine to pass it to",
                head.path_and_query
            ),
            None,
        );
    };
    let hop = engine.hop();
    match dispatch::send(st.local_pool(), &hop, &head, body, st.timeouts).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => json_error(
            StatusCode::BAD_GATEWAY,
            face.flavor(),
            "engine_unreachable",
            &format!("the local engine did not answer: {}", e.detail()),
            None,
        ),
    }
}

/// This node's own listing: its engines that answer `kind`, merged.
pub async fn local_listing(st: &ProxyState, kind: Listing) -> Vec<Value> {
    let engines = st.engines();
    let calls = engines
        .iter()
        .filter(|e| engine_answers(kind, e.kind))
        .map(|e| {
            let hop = e.hop();
            async move { fetch_json(st, &hop, kind).await }
        });
    join_all(calls).await.into_iter().flatten().collect()
}

async fn merged_listing(st: &Arc<ProxyState>, kind: Listing) -> Response<Body> {
    let mut docs = local_listing(st, kind).await;
    let cluster = st.cluster();
    let peers = st.peer_links();
    let remote = cluster
        .nodes()
        .iter()
        .filter(|n| n.id != st.node.id && n.liveness.is_routable())
        .filter_map(|n| peers.get(&n.id).cloned())
        .map(|link| {
            let st = Arc::clone(st);
            async move { fetch_json(&st, &Hop::Peer(Box::new(link)), kind).await }
        });
    docs.extend(join_all(remote).await.into_iter().flatten());
    let merged = listing::merge(kind, &docs);
    let mut resp = Response::new(Body::from(merged.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

const LISTING_DEADLINE: Duration = Duration::from_secs(3);

async fn fetch_json(st: &ProxyState, hop: &Hop, kind: Listing) -> Option<Value> {
    use http_body_util::BodyExt;
    let path = match kind {
        Listing::OllamaTags => "/api/tags",
        Listing::OllamaPs => "/api/ps",
        Listing::OpenAiModels => "/v1/models",
    };
    let head = RequestHead {
        method: Method::GET,
        path_and_query: http::uri::PathAndQuery::from_static(path),
        headers: Headers::Map(http::HeaderMap::new()),
    };
    let mut timeouts = st.timeouts;
    timeouts.first_byte = LISTING_DEADLINE;
    let fut = async {
        let resp = dispatch::send(st.local_pool(), hop, &head, Bytes::new(), timeouts)
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&bytes).ok()
    };
    tokio::time::timeout(LISTING_DEADLINE, fut)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn state() -> Arc<ProxyState> {
        crate::state::tests::state(
            pair_http::runtime::EventLoops::single(),
            Arc::new(pair_jobs::JobLog::in_memory()),
        )
    }

    async fn call(from: [u8; 4], face: Face, req: http::Request<Body>) -> (StatusCode, Value) {
        let app = if is_local(SocketAddr::from((from, 40000))) {
            router(state(), face, Router::new())
        } else {
            forbidden(face)
        };
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn post(path: &str, body: &'static str) -> http::Request<Body> {
        http::Request::post(path).body(Body::from(body)).unwrap()
    }

    #[tokio::test]
    async fn non_loopback_clients_get_403_in_the_face_flavour() {
        let (s, v) = call([192, 168, 1, 20], Face::Ollama, post("/api/chat", "{}")).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert!(v["error"].as_str().unwrap().contains("this machine"));
        let (s, v) = call([10, 0, 0, 2], Face::OpenAi, post("/v1/models", "")).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        assert_eq!(v["error"]["type"], "permission_error");
        // Loopback passes the gate (and here finds no node for the model).
        let (s, _) = call(
            [127, 0, 0, 1],
            Face::Ollama,
            post("/api/chat", r#"{"model":"m"}"#),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_GATEWAY);
    }

    #[test]
    fn loopback_includes_ipv4_mapped_ipv6() {
        assert!(is_local("[::1]:1".parse().unwrap()));
        assert!(is_local("[::ffff:127.0.0.1]:1".parse().unwrap()));
        assert!(is_local("127.0.0.2:1".parse().unwrap()));
        assert!(!is_local("[::ffff:10.0.0.1]:1".parse().unwrap()));
        assert!(!is_local("192.168.1.20:1".parse().unwrap()));
    }

    #[tokio::test]
    async fn oversized_and_malformed_bodies_are_refused_clearly() {
        let big: &'static str = Box::leak("x".repeat(2048).into_boxed_str());
        let (s, v) = call([127, 0, 0, 1], Face::Ollama, post("/api/chat", big)).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(v["error"].as_str().unwrap().contains("limit"));
        let (s, v) = call(
            [127, 0, 0, 1],
            Face::OpenAi,
            post("/v1/chat/completions", "{"),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        let (s, v) = call(
            [127, 0, 0, 1],
            Face::Ollama,
            post("/api/generate", r#"{"prompt":"x"}"#),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(v["error"].as_str().unwrap().contains("model"));
    }

    #[tokio::test]
    async fn passthrough_without_an_engine_says_so() {
        let (s, v) = call([127, 0, 0, 1], Face::Ollama, post("/api/pull", "{}")).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY);
        assert!(v["error"].as_str().unwrap().contains("/api/pull"));
    }
}
