//! The local faces: the Ollama face (11434) and the OpenAI / LM Studio face
//! (1234), plain HTTP for apps on this machine only. A face is a door of
//! the pipeline ([`crate::pipeline::handle`]): each loopback connection is
//! served by the hand-framed loop ([`pair_http::server`]), or by hyper for
//! what that loop leaves to it, and every request it reads goes into the
//! pipeline as it is. Connections from other machines get 403.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use http::{HeaderValue, Method, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use pair_http::conns::ClientDeadlines;
use pair_http::h1::Headers;
use pair_http::hyper_conn::{accept, serve_router};
use pair_http::server::{self, Whole};
use pair_http::{HttpStack, Reply};
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::body::{over_budget, read_capped, too_large};
use crate::error::json_error;
use crate::lan::{Admitted, Lan};
use crate::pipeline::{self, Door};
use crate::route;
use crate::state::ProxyState;

pub use crate::route::Face;

/// How long a connection from another machine may take to send its head
/// (its answer is a 403 whatever it sends).
const FORBIDDEN_HEAD_DEADLINE: Duration = Duration::from_secs(10);

/// One face's door.
#[derive(Clone)]
struct FaceDoor {
    st: Arc<ProxyState>,
    face: Face,
    /// The node's own routes (metrics, control API, Jobs view).
    app: Router,
}

/// The node's own routes on a face: `/metrics` and the daemon's (`control`:
/// `/_pair/...`, `/ui`). The pipeline sends them here straight from its
/// route step; a path under them that no route serves is a 404 here, in
/// the face's flavour, never a second trip through the pipeline. Only
/// loopback connections ever reach it: [`serve`] decides once per
/// connection.
pub fn router(st: Arc<ProxyState>, face: Face, control: Router) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(st)
        .merge(control)
        .fallback(move || async move {
            json_error(
                StatusCode::NOT_FOUND,
                face.flavor(),
                "not_found",
                "this route of the node is not served here",
                None,
            )
        })
}

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

impl FaceDoor {
    fn door(&self) -> Door<'_> {
        Door::Face {
            face: self.face,
            app: Some(&self.app),
        }
    }

    /// A request hyper read: its body read whole (capped, with the
    /// client's deadlines), then the pipeline.
    async fn hyper_request(&self, req: http::Request<Body>) -> Response<Body> {
        let face = self.face;
        let req = match read_whole(&self.st, req, |m, p| {
            route::classify(m, p)
                .flavor()
                .unwrap_or_else(|| face.flavor())
        })
        .await
        {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        let deadline = std::pin::pin!(tokio::time::sleep(self.st.timeouts.first_byte));
        pipeline::handle(&self.st, self.door(), req, deadline)
            .await
            .into_response()
    }
}

/// A request hyper read, its body read whole (capped, with the client's
/// deadlines), as the pipeline takes it; or the refusal, in the shape
/// `flavor` gives for its method and path.
async fn read_whole(
    st: &ProxyState,
    req: http::Request<Body>,
    flavor: impl FnOnce(&Method, &str) -> pair_core::ApiFlavor,
) -> Result<pipeline::Request, Response<Body>> {
    let (parts, body) = req.into_parts();
    let received = read_capped(
        body,
        &parts.headers,
        st.body_cap,
        &st.deadlines,
        Some(&st.body_budget),
    )
    .await
    .map_err(|resp| resp(flavor(&parts.method, parts.uri.path())))?;
    Ok(pipeline::Request {
        method: parts.method,
        target: parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
        headers: Headers::Map(parts.headers),
        body: received,
        received: tokio::time::Instant::now(),
    })
}

/// The connections the hand-framed loop hands to hyper (HTTP/1.0, chunked
/// or `Expect` requests, upgrades), and every connection under
/// `--http-stack hyper`.
impl hyper::service::Service<http::Request<hyper::body::Incoming>> for FaceDoor {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let door = self.clone();
        Box::pin(async move { Ok(door.hyper_request(req.map(Body::new)).await) })
    }
}

impl server::Answer for FaceDoor {
    fn body_cap(&self) -> usize {
        self.st.body_cap
    }

    fn deadlines(&self) -> ClientDeadlines {
        self.st.deadlines
    }

    /// The pipeline's own future, with no layer around it: its state (the
    /// whole request path) is built where the connection pins it and never
    /// moved. The fields go in as they came: no header map is built.
    fn answer(&self, req: Whole, deadline: Pin<&mut Sleep>) -> impl Future<Output = Reply> + Send {
        pipeline::handle(&self.st, self.door(), req.into(), deadline)
    }

    fn too_large(&self, method: &Method, path: &str) -> Response<Body> {
        let flavor = route::classify(method, path)
            .flavor()
            .unwrap_or_else(|| self.face.flavor());
        too_large(self.st.body_cap, flavor)
    }

    fn body_budget(&self) -> Option<&Arc<pair_http::conns::BodyBudget>> {
        Some(&self.st.body_budget)
    }

    fn over_budget(&self, method: &Method, path: &str) -> Response<Body> {
        over_budget(
            route::classify(method, path)
                .flavor()
                .unwrap_or_else(|| self.face.flavor()),
        )
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
    let door = FaceDoor { st, face, app };
    let conns = TaskTracker::new();
    let loops = Arc::clone(&door.st.loops);
    let hyper = door.st.http_stack == HttpStack::Hyper;
    while let Some((tcp, peer)) = accept(&listener, &shutdown, "face").await {
        let shutdown = shutdown.clone();
        let Some(slot) = door.st.conns.admit() else {
            tracing::warn!(%peer, cap = door.st.conns.cap(), "connection cap reached with every connection busy: answered 503");
            conns.spawn(server::refuse(tcp, busy(face)));
            continue;
        };
        if is_local(peer) {
            let door = door.clone();
            loops.spawn(&conns, tcp, move |tcp| async move {
                if hyper {
                    log_end(peer, server::serve_hyper(tcp, door, slot, shutdown)).await;
                } else {
                    log_end(peer, server::serve(tcp, door, slot, shutdown)).await;
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

/// The LAN face's door: one connection from `peer`, which holds its
/// address's share of connections while it lasts.
#[derive(Clone)]
struct LanDoor {
    st: Arc<ProxyState>,
    lan: Arc<Lan>,
    peer: std::net::IpAddr,
}

impl LanDoor {
    /// One request whole: the LAN door's rules ([`Lan::admit`]), then the
    /// pipeline with the key, the answer with CORS for an allowed page.
    async fn request(&self, req: pipeline::Request, deadline: Pin<&mut Sleep>) -> Reply {
        match self
            .lan
            .admit(self.peer, &req.method, req.target.path(), &req.headers)
        {
            Admitted::Key(key, cors) => self.admitted(&key, cors, req, deadline).await,
            Admitted::Answered(reply) => *reply,
        }
    }

    /// An admitted request: the pipeline with its key, the answer with
    /// CORS for an allowed page.
    async fn admitted(
        &self,
        key: &pair_identity::keys::KeyRecord,
        cors: Option<HeaderValue>,
        req: pipeline::Request,
        deadline: Pin<&mut Sleep>,
    ) -> Reply {
        let reply = pipeline::handle(&self.st, Door::Lan { key }, req, deadline).await;
        crate::lan::with_cors(reply, cors)
    }
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for LanDoor {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        let door = self.clone();
        Box::pin(async move {
            // The door's rules on the head, once: a request refused on it
            // reads no body.
            let (mut parts, body) = req.into_parts();
            let head = Headers::Map(std::mem::take(&mut parts.headers));
            let admitted = door
                .lan
                .admit(door.peer, &parts.method, parts.uri.path(), &head);
            parts.headers = head.into_map(0);
            let (key, cors) = match admitted {
                Admitted::Key(key, cors) => (key, cors),
                Admitted::Answered(reply) => return Ok(reply.into_response()),
            };
            let req = http::Request::from_parts(parts, Body::new(body));
            let req = match read_whole(&door.st, req, crate::lan::flavor_of).await {
                Ok(r) => r,
                Err(resp) => return Ok(resp),
            };
            let deadline = std::pin::pin!(tokio::time::sleep(door.st.timeouts.first_byte));
            Ok(door
                .admitted(&key, cors, req, deadline)
                .await
                .into_response())
        })
    }
}

impl server::Answer for LanDoor {
    fn body_cap(&self) -> usize {
        self.st.body_cap
    }

    fn deadlines(&self) -> ClientDeadlines {
        self.st.deadlines
    }

    fn answer(&self, req: Whole, deadline: Pin<&mut Sleep>) -> impl Future<Output = Reply> + Send {
        self.request(req.into(), deadline)
    }

    fn too_large(&self, method: &Method, path: &str) -> Response<Body> {
        too_large(self.st.body_cap, crate::lan::flavor_of(method, path))
    }

    fn body_budget(&self) -> Option<&Arc<pair_http::conns::BodyBudget>> {
        Some(&self.st.body_budget)
    }

    fn over_budget(&self, method: &Method, path: &str) -> Response<Body> {
        over_budget(crate::lan::flavor_of(method, path))
    }

    /// A body still to come is read only for a request with a valid key
    /// (and the door's other rules but the rate). The whole request then
    /// meets every rule in [`LanDoor::request`]: a key revoked while its
    /// body arrived is refused, and the rate counts requests, not heads.
    /// A body the first read held is not screened: nothing is at stake.
    fn screen(
        &self,
        method: &Method,
        path: &str,
        headers: &pair_http::h1::Fields,
    ) -> Option<Reply> {
        self.lan
            .screen(self.peer, method, path, &Headers::Raw(headers.clone()))
    }
}

/// Serves the LAN face until `shutdown`: every client address may connect
/// (up to its share), and every request needs an API key ([`Lan`]).
pub async fn serve_lan(
    listener: tokio::net::TcpListener,
    st: Arc<ProxyState>,
    lan: Arc<Lan>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let conns = TaskTracker::new();
    let loops = Arc::clone(&st.loops);
    while let Some((tcp, peer)) = accept(&listener, &shutdown, "lan face").await {
        let shutdown = shutdown.clone();
        let Some(slot) = st.conns.admit() else {
            tracing::warn!(%peer, "connection cap reached with every connection busy: answered 503");
            conns.spawn(server::refuse(tcp, busy(Face::OpenAi)));
            continue;
        };
        let Some(share) = lan.connect(peer) else {
            tracing::info!(%peer, "an address over its share of LAN face connections: answered 503");
            conns.spawn(server::refuse(tcp, crate::lan::too_many_connections()));
            continue;
        };
        let door = LanDoor {
            st: Arc::clone(&st),
            lan: Arc::clone(&lan),
            peer: peer.ip(),
        };
        loops.spawn(&conns, tcp, move |tcp| async move {
            log_end(peer, server::serve(tcp, door, slot, shutdown)).await;
            drop(share);
        });
    }
    drop(listener);
    conns.close();
    conns.wait().await;
    Ok(())
}

async fn metrics(State(st): State<Arc<ProxyState>>) -> impl IntoResponse {
    metrics_text(&st)
}

/// The node's metrics in Prometheus' text format.
fn metrics_text(st: &ProxyState) -> impl IntoResponse + use<> {
    let m = &st.metrics;
    m.pending.set(i64::from(st.load.in_flight()));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

/// What the router does not serve itself goes into the pipeline.
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

/// Serves `GET /metrics` alone on `listener` (`--metrics-listen`), for a
/// Prometheus on another machine: any client may read it, nothing else is
/// there; its connections count against the node's cap and have a head
/// deadline.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    st: Arc<ProxyState>,
    shutdown: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
) {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(st): State<Arc<ProxyState>>| async move { metrics_text(&st) }),
        )
        .with_state(Arc::clone(&st));
    while let Some((tcp, remote)) =
        pair_http::hyper_conn::accept(&listener, &shutdown, "metrics").await
    {
        let Some(slot) = st.conns.admit() else {
            tracing::warn!(%remote, "connection cap reached: metrics connection refused");
            continue;
        };
        let (app, shutdown) = (app.clone(), shutdown.clone());
        tasks.spawn(async move {
            slot.busy();
            let io = hyper_util::rt::TokioIo::new(tcp);
            let deadline = Some(std::time::Duration::from_secs(10));
            if let Err(reason) =
                pair_http::hyper_conn::serve_router(io, app, deadline, shutdown, None).await
            {
                tracing::debug!(%remote, reason, "metrics connection closed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn state() -> Arc<ProxyState> {
        crate::state::tests::state(
            pair_runtime::runtime::EventLoops::single(),
            Arc::new(pair_jobs::JobLog::in_memory()),
        )
    }

    async fn call(
        from: [u8; 4],
        face: Face,
        req: http::Request<Body>,
    ) -> (StatusCode, serde_json::Value) {
        let resp = if is_local(SocketAddr::from((from, 40000))) {
            // As a connection on the face serves it: the pipeline first.
            let st = state();
            let app = router(Arc::clone(&st), face, Router::new());
            FaceDoor { st, face, app }.hyper_request(req).await
        } else {
            forbidden(face).oneshot(req).await.unwrap()
        };
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
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
        assert_eq!(s, StatusCode::NOT_FOUND);
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
    async fn the_node_s_own_routes_are_answered_by_its_router_alone() {
        let get = |p: &str| http::Request::get(p).body(Body::empty()).unwrap();
        let (s, _) = call([127, 0, 0, 1], Face::Ollama, get("/metrics")).await;
        assert_eq!(s, StatusCode::OK);
        // A control path no route serves: the router's 404 in the face's
        // flavour, not a second trip through the pipeline.
        let (s, v) = call([127, 0, 0, 1], Face::OpenAi, get("/_pair/v1/nothing")).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(v["error"]["code"], "not_found", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("route of the node")
        );
    }

    #[tokio::test]
    async fn passthrough_without_an_engine_says_so() {
        let (s, v) = call([127, 0, 0, 1], Face::Ollama, post("/api/pull", "{}")).await;
        assert_eq!(s, StatusCode::BAD_GATEWAY);
        assert!(v["error"].as_str().unwrap().contains("/api/pull"));
    }
}
