//! The edge SDK's costs on loopback, against real in-process nodes with
//! emulated engines (issue 22; figures in docs/benchmarks/pair-sdk.md):
//!
//! 1. added latency per request: `Client::send` of a small non-streaming
//!    `POST /api/generate` to one node's cluster port over mTLS (the relay),
//!    against the same relay request over one kept hyper + tokio-rustls
//!    connection with the same client identity, against pair-cluster's
//!    pooled `PeerLink` alone, against the node's Ollama face (plain HTTP on
//!    loopback), and against the emulated engine itself (the floor), the
//!    paths interleaved round by round; then the client thread's CPU and
//!    sleeps per request, path by path;
//! 2. a probe round over 16 nodes (`Client::refresh`, and the bare
//!    `Prober::round` and `Prober::probe`);
//! 3. the extra time of a request whose first-ranked node is dead (its
//!    cluster port refuses connections, or drops SYNs so the connect times
//!    out), against normal requests to the node that serves it, and what
//!    ~100 ms without requests costs any request.
//!
//! The client is paired with the nodes through the real protocol (an
//! invite on a node, `Client::join` with its PIN; in part 3 the second
//! node learns the client by the first one's vouching).
//!
//! Not a test: nothing is asserted about speed. `cargo bench -p pair-sdk
//! --bench edge` (about a minute; without `--bench`, as `cargo test
//! --all-targets` runs it, a few requests of each kind only); `EDGE_N` (requests per path, 2000),
//! `EDGE_ROUNDS` (probe rounds, 50), `EDGE_CYCLES` (refused-node
//! failovers, 100), `EDGE_TIMEOUTS` (timed-out-node failovers, 20),
//! `EDGE_NODES` (nodes probed in a round, 16; 4 in the smoke run),
//! `EDGE_TIME_SCALE` (emulated engine time, 1e-6) change the sizes;
//! `EDGE_ONLY=13` runs some parts only; `EDGE_DEBUG=1` prints each
//! failover cycle.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use pair_core::{NodeId, Role};
use pair_identity::{Identity, TrustStore};
use pair_sdk::{Client, Config, Request};
use pair_testkit::cluster::Node;
use pair_testkit::cluster::{ClusterSpec, LocalCluster};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::runtime::Runtime;

const MODEL: &str = "llama3.2:3b";
const ROUTE: &str = "/api/generate";
const BODY: &str =
    r#"{"model":"llama3.2:3b","prompt":"hi","stream":false,"options":{"num_predict":1}}"#;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // Under `cargo test` and nextest, the smoke run is one test.
    if !pair_testkit::harness::wanted("smoke") {
        return;
    }
    pair_identity::install_crypto_provider();
    // `cargo test --all-targets` runs this without `--bench`: then a few
    // requests of each kind only, to show the bench still works.
    let bench = std::env::args().any(|a| a == "--bench");
    let size =
        |name: &str, full: usize, smoke: usize| env_or(name, if bench { full } else { smoke });
    let time_scale: f64 = env_or("EDGE_TIME_SCALE", 1e-6);
    let n = size("EDGE_N", 2000, 20);
    let rounds = size("EDGE_ROUNDS", 50, 2);
    let cycles = size("EDGE_CYCLES", 100, 2);
    let timeouts = size("EDGE_TIMEOUTS", 20, 1);
    // Pairing is a PAKE per node: 16 take most of a minute unoptimised.
    let probed = size("EDGE_NODES", 16, 4);
    // The nodes (and their engines and background work) run on their own
    // runtime; each node's faces and cluster port on its own event loops.
    // The client side runs on one current-thread runtime, as in an app.
    let nodes_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("nodes")
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    println!(
        "pair-sdk edge bench: time_scale {time_scale}, {n} requests per path, {rounds} probe rounds, {cycles}+{timeouts} failovers"
    );
    if !bench {
        println!("(without --bench: a smoke run, its figures mean nothing)");
    }
    let only: String = env_or("EDGE_ONLY", "123".to_owned());
    if only.contains('1') {
        latency(&nodes_rt, &client_rt, time_scale, n);
    }
    if only.contains('3') {
        failover(&nodes_rt, &client_rt, time_scale, cycles, timeouts);
    }
    if only.contains('2') {
        probe_rounds(&nodes_rt, &client_rt, time_scale, rounds, probed);
    }
    println!("\nwhole run: {:.1} s", started.elapsed().as_secs_f64());
}

// ---- 1. added latency per request ----------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Engine,
    Direct,
    Link,
    Sdk,
    Face,
}

const PATHS: [Path; 5] = [
    Path::Engine,
    Path::Direct,
    Path::Link,
    Path::Sdk,
    Path::Face,
];

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Engine => "engine itself (plain HTTP, the floor)",
            Path::Direct => "direct mTLS relay (hyper + tokio-rustls)",
            Path::Link => "PeerLink relay (pair-cluster's pool)",
            Path::Sdk => "SDK Client::send (relay)",
            Path::Face => "node's Ollama face (plain HTTP)",
        }
    }
}

struct Paths {
    engine: SendRequest<Full<Bytes>>,
    engine_host: String,
    direct: SendRequest<Full<Bytes>>,
    cluster_host: String,
    link: pair_link::PeerLink,
    sdk: Client,
    sdk_req: Request,
    face: SendRequest<Full<Bytes>>,
    face_host: String,
    body: Bytes,
}

impl Paths {
    /// One request on `path`, whole answer read; its wall time.
    async fn run(&mut self, path: Path) -> Duration {
        let t = Instant::now();
        let body = match path {
            Path::Engine => {
                exchange(&mut self.engine, post(ROUTE, &self.engine_host, &self.body)).await
            }
            Path::Direct => {
                exchange(
                    &mut self.direct,
                    post(
                        &format!("{}{ROUTE}", pair_link::RELAY_PREFIX),
                        &self.cluster_host,
                        &self.body,
                    ),
                )
                .await
            }
            Path::Link => {
                let req = http::Request::post(self.link.relay_uri(ROUTE).unwrap())
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(self.body.clone()))
                    .unwrap();
                let resp = self.link.send(req).await.unwrap();
                assert_eq!(resp.status(), 200, "PeerLink path");
                resp.into_body().collect().await.unwrap().to_bytes()
            }
            Path::Sdk => {
                let resp = self.sdk.send(self.sdk_req.clone()).await.unwrap();
                assert_eq!(resp.status, 200, "SDK path");
                resp.bytes().await.unwrap()
            }
            Path::Face => exchange(&mut self.face, post(ROUTE, &self.face_host, &self.body)).await,
        };
        let took = t.elapsed();
        assert!(
            body.windows(10).any(|w| w == b"\"response\""),
            "{path:?}: {}",
            String::from_utf8_lossy(&body)
        );
        took
    }
}

fn latency(nodes_rt: &Runtime, client_rt: &Runtime, time_scale: f64, n: usize) {
    println!("\n== 1. added latency per request, one node, c=1 ==");
    let mut spec = ClusterSpec::new(1);
    spec.time_scale = time_scale;
    spec.mdns = pair_testkit::cluster::Mdns::Off;
    spec.pair = false;
    let cluster = nodes_rt.block_on(LocalCluster::start(spec)).unwrap();
    nodes_rt
        .block_on(cluster.wait_converged(Duration::from_secs(30)))
        .unwrap();
    let node = &cluster.nodes[0];
    let engine_addr = cluster.engines[0].addr();
    let dir = tempfile::tempdir().unwrap();
    client_rt.block_on(async {
        let sdk = paired_client(dir.path(), vec![node.cluster_addr.to_string()], &[node]).await;
        sdk.refresh().await.unwrap();
        let identity = Identity::load_or_create(dir.path(), Role::Client).unwrap();
        let trust = TrustStore::in_memory();
        for r in sdk.pinned_nodes() {
            trust.insert(r).unwrap();
        }
        let connector = pair_identity::tls::tls_connector(&identity, &trust, node.id).unwrap();
        let tls = TcpStream::connect(node.cluster_addr).await.unwrap();
        tls.set_nodelay(true).unwrap();
        let tls = connector
            .connect(pair_identity::tls::server_name(), tls)
            .await
            .unwrap();
        let link = peer_link(
            &identity,
            &trust,
            node.id,
            node.cluster_addr,
            Duration::from_secs(2),
        );
        let mut paths = Paths {
            engine: h1(plain(engine_addr).await).await,
            engine_host: engine_addr.to_string(),
            direct: h1(tls).await,
            cluster_host: node.cluster_addr.to_string(),
            link,
            sdk_req: Request::json(ROUTE, Bytes::from_static(BODY.as_bytes())).unwrap(),
            sdk,
            face: h1(plain(node.ollama_addr).await).await,
            face_host: node.ollama_addr.to_string(),
            body: Bytes::from_static(BODY.as_bytes()),
        };
        let warm = (n / 10).max(50);
        for i in 0..warm {
            for k in 0..PATHS.len() {
                paths.run(PATHS[(i + k) % PATHS.len()]).await;
            }
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(n); PATHS.len()];
        let t = Instant::now();
        for i in 0..n {
            // Each round runs every path once, starting at another one, so
            // noise from the machine falls on all of them alike.
            for k in 0..PATHS.len() {
                let p = (i + k) % PATHS.len();
                times[p].push(paths.run(PATHS[p]).await);
            }
        }
        let wall = t.elapsed();
        let direct = PATHS.iter().position(|p| *p == Path::Direct).unwrap();
        println!(
            "{} requests in {:.1} s ({warm} rounds of warm-up before)",
            n * PATHS.len(),
            wall.as_secs_f64()
        );
        println!(
            "{:<42} {:>8} {:>8} {:>14} {:>14} {:>16}",
            "path", "p50 µs", "p90 µs", "p50 − direct", "p90 − direct", "paired Δ p50/p90"
        );
        let d50 = pct(&times[direct], 0.5);
        let d90 = pct(&times[direct], 0.9);
        for (p, path) in PATHS.iter().enumerate() {
            let paired: Vec<f64> = times[p]
                .iter()
                .zip(&times[direct])
                .map(|(a, b)| us(*a) - us(*b))
                .collect();
            let (p50, p90) = (pct(&times[p], 0.5), pct(&times[p], 0.9));
            println!(
                "{:<42} {:>8.1} {:>8.1} {:>+14.1} {:>+14.1} {:>+8.1}/{:<+8.1}",
                path.label(),
                p50,
                p90,
                p50 - d50,
                p90 - d90,
                pct_f(&paired, 0.5),
                pct_f(&paired, 0.9),
            );
        }
        // The client side's own CPU per request (this thread runs all of
        // it: the SDK, hyper's connection tasks, TLS; the node and the
        // engine are elsewhere), and how often it sleeps: each path in
        // blocks of its own. On a shared VM the CPU figure moves by some
        // 10-20 µs from run to run; the sleeps show a path's wake-ups.
        let block = (n / 4).max(100);
        let cpu_paths = [Path::Direct, Path::Link, Path::Sdk, Path::Face];
        let mut cpu = [Duration::ZERO; 4];
        let mut sleeps = [0u64; 4];
        for rep in 0..4 {
            for k in 0..cpu_paths.len() {
                let p = (rep + k) % cpu_paths.len();
                let (c0, s0) = (thread_cpu(), thread_sleeps());
                for _ in 0..block {
                    paths.run(cpu_paths[p]).await;
                }
                cpu[p] += thread_cpu() - c0;
                sleeps[p] += thread_sleeps() - s0;
            }
        }
        println!("client thread per request (4 blocks of {block} in a row per path, rotated):");
        for (p, path) in cpu_paths.iter().enumerate() {
            let per = 4.0 * block as f64;
            println!(
                "  {:<42} {:>6.1} µs CPU, {:.2} sleeps",
                path.label(),
                us(cpu[p]) / per,
                sleeps[p] as f64 / per
            );
        }
        paths.sdk.close().await;
    });
    nodes_rt.block_on(cluster.stop());
}

/// An SDK client in `dir` with `seeds`, paired through the real protocol
/// with each node of `join` (an invite opened on it, then `Client::join`).
async fn paired_client(dir: &std::path::Path, seeds: Vec<String>, join: &[&Node]) -> Client {
    let mut cfg = Config::new(dir);
    cfg.name = "edge-bench".into();
    cfg.seeds = seeds;
    paired_with(cfg, join).await
}

async fn paired_with(cfg: Config, join: &[&Node]) -> Client {
    let client = Client::open(cfg).await.unwrap();
    for node in join {
        let pin = node.pairing.open_invite(SystemTime::now()).unwrap();
        client
            .join(&node.cluster_addr.to_string(), pin.reveal())
            .await
            .unwrap();
    }
    client
}

/// A `PeerLink` to `node` at `addr`, pinned by `trust` (what the SDK
/// sends with, used here bare), with `connect` as its connect timeout.
fn peer_link(
    identity: &Identity,
    trust: &TrustStore,
    node: NodeId,
    addr: SocketAddr,
    connect: Duration,
) -> pair_link::PeerLink {
    let tls =
        pair_identity::tls::client_config(identity, trust, pair_identity::tls::Expect::Peer(node))
            .unwrap();
    pair_link::PeerLink::new(
        node,
        addr,
        Arc::new(tls),
        pair_http::Timeouts {
            connect,
            first_byte: Duration::from_secs(20),
        },
    )
    .unwrap()
}

async fn plain(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// One kept HTTP/1.1 connection over `io`.
async fn h1<IO>(io: IO) -> SendRequest<Full<Bytes>>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

fn post(path: &str, host: &str, body: &Bytes) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header(HOST, host)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .unwrap()
}

async fn exchange(send: &mut SendRequest<Full<Bytes>>, req: http::Request<Full<Bytes>>) -> Bytes {
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    body
}

// ---- 2. a probe round over EDGE_NODES nodes ------------------------------

fn probe_rounds(
    nodes_rt: &Runtime,
    client_rt: &Runtime,
    time_scale: f64,
    rounds: usize,
    count: usize,
) {
    println!("\n== 2. a probe round over {count} nodes ==");
    let t = Instant::now();
    let mut spec = ClusterSpec::new(count);
    spec.time_scale = time_scale;
    spec.mdns = pair_testkit::cluster::Mdns::Off;
    // Not paired with each other (no gossip among 16 nodes on two cores);
    // the client pairs with each one itself.
    spec.pair = false;
    spec.event_loops = 1;
    let cluster = nodes_rt.block_on(LocalCluster::start(spec)).unwrap();
    nodes_rt.block_on(wait_ready(&cluster.nodes));
    println!(
        "{count} nodes started and ready in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<&Node> = cluster.nodes.iter().collect();
    client_rt.block_on(async {
        let seeds = nodes.iter().map(|n| n.cluster_addr.to_string()).collect();
        let t = Instant::now();
        let client = paired_client(dir.path(), seeds, &nodes).await;
        println!(
            "client paired with {count} nodes (PIN + SPAKE2 each) in {:.2} s",
            t.elapsed().as_secs_f64()
        );
        let mut refresh = Vec::with_capacity(rounds);
        let mut bare = Vec::with_capacity(rounds);
        let mut single = Vec::with_capacity(rounds);
        let identity = Identity::load_or_create(dir.path(), Role::Client).unwrap();
        let trust = TrustStore::in_memory();
        for r in client.pinned_nodes() {
            trust.insert(r).unwrap();
        }
        let prober = pair_sdk::probe::Prober {
            tls: pair_sdk::probe::connector(&identity, &trust).unwrap(),
            trust,
            connect_timeout: Duration::from_secs(2),
            probe_timeout: Duration::from_millis(1500),
        };
        let targets: Vec<(SocketAddr, Option<NodeId>)> =
            nodes.iter().map(|n| (n.cluster_addr, Some(n.id))).collect();
        for round in 0..rounds + 3 {
            // Past the refresh's 50 ms "a round just ended" shortcut.
            tokio::time::sleep(Duration::from_millis(60)).await;
            let t = Instant::now();
            let survey = client.refresh().await.unwrap();
            let took = t.elapsed();
            assert_eq!(survey.nodes.len(), count, "{:?}", survey.failures);
            assert!(survey.failures.is_empty(), "{:?}", survey.failures);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let t = Instant::now();
            let all = prober.round(targets.clone()).await;
            let took_bare = t.elapsed();
            assert!(all.iter().all(Result::is_ok));
            tokio::time::sleep(Duration::from_millis(20)).await;
            let t = Instant::now();
            prober
                .probe(targets[round % count].0, targets[round % count].1)
                .await
                .unwrap();
            let took_one = t.elapsed();
            if round >= 3 {
                refresh.push(took);
                bare.push(took_bare);
                single.push(took_one);
            }
        }
        println!(
            "{:<48} {:>8} {:>8} {:>8}",
            "probe", "p50 ms", "p90 ms", "max ms"
        );
        for (label, v) in [
            ("Client::refresh(), 16 nodes (seeds)", &refresh),
            ("Prober::round, 16 targets", &bare),
            ("Prober::probe, 1 target", &single),
        ] {
            println!(
                "{label:<48} {:>8.2} {:>8.2} {:>8.2}",
                pct(v, 0.5) / 1e3,
                pct(v, 0.9) / 1e3,
                pct(v, 1.0) / 1e3
            );
        }
        client.close().await;
    });
    nodes_rt.block_on(cluster.stop());
}

/// Every node serves its own engine (nodes not paired with each other).
async fn wait_ready(nodes: &[Node]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = nodes.iter().all(|n| {
            n.state
                .cluster()
                .node(n.id)
                .is_some_and(|s| !s.engines.is_empty() && s.engines.iter().all(|e| e.healthy))
        });
        if ready {
            return;
        }
        assert!(Instant::now() < deadline, "nodes not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- 3. failover before the first byte -----------------------------------

/// A TCP forwarder in front of a node's cluster port, which can refuse
/// connections (closed) or drop them (a full accept queue: SYNs go
/// unanswered, so a connect times out) and open again on the same port.
struct Gate {
    addr: SocketAddr,
    target: SocketAddr,
    rt: tokio::runtime::Handle,
    forwarding: Option<tokio::task::JoinHandle<()>>,
    hole: Option<(TcpListener, std::net::TcpStream)>,
}

impl Gate {
    async fn new(target: SocketAddr, rt: tokio::runtime::Handle) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut g = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            target,
            rt,
            forwarding: None,
            hole: None,
        };
        g.open().await;
        g
    }

    async fn open(&mut self) {
        self.close().await;
        let (addr, target) = (self.addr, self.target);
        let (ready, bound) = tokio::sync::oneshot::channel();
        self.forwarding = Some(self.rt.spawn(async move {
            let l = listener(addr, 1024);
            let _ = ready.send(());
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = l.accept().await else {
                    continue;
                };
                conns.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                while conns.try_join_next().is_some() {}
            }
        }));
        bound.await.unwrap();
    }

    /// Connection refused from now on.
    async fn close(&mut self) {
        self.hole = None;
        if let Some(t) = self.forwarding.take() {
            t.abort();
            let _ = t.await;
        }
    }

    /// Connects hang from now on (until the client's connect timeout).
    async fn blackhole(&mut self) {
        self.close().await;
        let l = listener(self.addr, 0);
        // One connection fills an accept queue of zero; the kernel then
        // drops further SYNs.
        let filler = std::net::TcpStream::connect(self.addr).unwrap();
        let probe = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(50));
        assert!(probe.is_err(), "the accept queue is not full");
        self.hole = Some((l, filler));
    }
}

/// One kind of dead node's failovers.
#[derive(Default)]
struct Failovers {
    label: &'static str,
    failover: Vec<Duration>,
    hot: Vec<Duration>,
    cold: Vec<Duration>,
    extra_hot: Vec<f64>,
    extra_cold: Vec<f64>,
    misses: usize,
    bare: Vec<Duration>,
    fresh_link: Vec<Duration>,
}

fn listener(addr: SocketAddr, backlog: u32) -> TcpListener {
    let s = TcpSocket::new_v4().unwrap();
    s.set_reuseaddr(true).unwrap();
    s.bind(addr).unwrap();
    s.listen(backlog).unwrap()
}

fn failover(nodes_rt: &Runtime, client_rt: &Runtime, time_scale: f64, cycles: usize, hangs: usize) {
    let idle_rounds = (cycles / 4).max(2);
    println!("\n== 3. failover before the first byte: first-ranked node dead ==");
    let mut spec = ClusterSpec::new(2);
    spec.time_scale = time_scale;
    spec.mdns = pair_testkit::cluster::Mdns::Off;
    // Node A (the fast one) is ranked first; B (CPU only) serves when A is
    // dead.
    spec.nodes[0].profile = "rtx4090".into();
    spec.nodes[0].name = "node-a-rtx4090".into();
    spec.nodes[1].profile = "cpu".into();
    spec.nodes[1].name = "node-b-cpu".into();
    let cluster = nodes_rt.block_on(LocalCluster::start(spec)).unwrap();
    nodes_rt
        .block_on(cluster.wait_converged(Duration::from_secs(30)))
        .unwrap();
    let (a, b) = (&cluster.nodes[0], &cluster.nodes[1]);
    let dir = tempfile::tempdir().unwrap();
    let connect_timeout = Duration::from_millis(200);
    client_rt.block_on(async {
        // Load the model on both engines (a cold model ranks last).
        for n in [a, b] {
            let mut face = h1(plain(n.ollama_addr).await).await;
            let mut req = post(
                ROUTE,
                &n.ollama_addr.to_string(),
                &Bytes::from_static(BODY.as_bytes()),
            );
            req.headers_mut().insert(
                "x-pair-node-pin",
                http::HeaderValue::from_str(&n.id.to_string()).unwrap(),
            );
            exchange(&mut face, req).await;
        }
        let mut gate = Gate::new(a.cluster_addr, nodes_rt.handle().clone()).await;
        let mut cfg = Config::new(dir.path());
        cfg.name = "edge-bench".into();
        // A through the gate; B as it is.
        cfg.seeds = vec![gate.addr.to_string(), b.cluster_addr.to_string()];
        cfg.connect_timeout = connect_timeout;
        // Paired with B only: A learns the client from B's vouching.
        let client = paired_with(cfg, &[b]).await;
        let t = Instant::now();
        while a.trust.get(client.id()).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "A never learned the client"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "A trusted the client through B's vouching {:.0} ms after the join",
            t.elapsed().as_secs_f64() * 1e3
        );
        // The engines' loaded models reach the nodes' reports.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let survey = client.survey_for(Some(MODEL), true).await.unwrap();
        let order: Vec<String> = survey
            .nodes
            .iter()
            .map(|(n, why)| format!("{} ({})", n.name, why.as_deref().unwrap_or("-")))
            .collect();
        println!("client's ranking: {}", order.join(" > "));
        let rtt_b = survey
            .nodes
            .iter()
            .find(|(n, _)| n.id == b.id)
            .map(|(n, _)| n.rtt_us)
            .unwrap();
        let identity = Identity::load_or_create(dir.path(), Role::Client).unwrap();
        let trust = TrustStore::in_memory();
        for r in client.pinned_nodes() {
            trust.insert(r).unwrap();
        }
        let req = Request::json(ROUTE, Bytes::from_static(BODY.as_bytes())).unwrap();
        let send = |expect_attempts: usize| {
            let client = client.clone();
            let req = req.clone();
            async move {
                let t = Instant::now();
                let resp = client.send(req).await.unwrap();
                let (node, attempts) = (resp.node, resp.attempts);
                assert_eq!(resp.status, 200);
                resp.bytes().await.unwrap();
                let took = t.elapsed();
                (took, node, attempts == expect_attempts)
            }
        };
        // Each cycle: A's port dies, and one request fails over to B
        // (timed). A is out of the client's ranking then, so the next
        // requests go straight to B: three at once (hot), and one after
        // ~100 ms without requests (idle), as the failover request had
        // been. A's port stays dead until the client's first re-probe of it
        // has failed; the next one brings A back. Two cycles of warm-up.
        let mut results = Vec::new();
        for (label, n, hang) in [
            ("refused (port closed)", cycles, false),
            ("connect timed out (SYN dropped)", hangs, true),
        ] {
            let mut k = Failovers {
                label,
                ..Failovers::default()
            };
            for i in 0..n + 2 {
                let keep = i >= 2;
                if hang {
                    gate.blackhole().await;
                } else {
                    gate.close().await;
                }
                let reprobes = client.stats().reprobes;
                let (took, node, two) = send(2).await;
                let failed_at = Instant::now();
                let mut hot = Vec::new();
                let mut hot_ok = true;
                for _ in 0..3 {
                    let (t, node, one) = send(1).await;
                    hot_ok &= node == b.id && one;
                    hot.push(t);
                }
                if !hang && keep {
                    // Below the SDK, while the port is still closed: a bare
                    // connect, and a new PeerLink's relay request.
                    let t = Instant::now();
                    assert!(TcpStream::connect(gate.addr).await.is_err());
                    k.bare.push(t.elapsed());
                    let t = Instant::now();
                    let link = peer_link(&identity, &trust, a.id, gate.addr, connect_timeout);
                    let req = http::Request::post(link.relay_uri(ROUTE).unwrap())
                        .header(CONTENT_TYPE, "application/json")
                        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                        .unwrap();
                    assert!(link.send(req).await.is_err());
                    k.fresh_link.push(t.elapsed());
                }
                // The first re-probe starts, and fails on the dead port
                // (at once when refused, after the connect timeout when
                // SYNs are dropped).
                while client.stats().reprobes == reprobes {
                    assert!(
                        failed_at.elapsed() < Duration::from_secs(5),
                        "the client never probed A again"
                    );
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let fails = if hang { connect_timeout } else { Duration::ZERO };
                tokio::time::sleep(fails + Duration::from_millis(10)).await;
                gate.open().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                let (cold, cold_node, one) = send(1).await;
                let cold_ok = cold_node == b.id && one;
                if keep {
                    if node == b.id && two && hot_ok && cold_ok {
                        k.failover.push(took);
                        k.extra_hot.push(us(took) - pct(&hot, 0.5));
                        k.extra_cold.push(us(took) - us(cold));
                        k.hot.extend(hot);
                        k.cold.push(cold);
                    } else {
                        k.misses += 1;
                    }
                }
                // Back in the ranking when the next re-probe finds it.
                let t = Instant::now();
                while client
                    .cached_cluster()
                    .is_none_or(|c| c.node(a.id).is_none())
                {
                    assert!(t.elapsed() < Duration::from_secs(5), "A never came back");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                if std::env::var_os("EDGE_DEBUG").is_some() {
                    eprintln!(
                        "cycle {i}: failover {took:?} (B? {} 2 attempts? {two}) hot to B? {hot_ok} idle to B? {cold_ok}; A back {:?} after the failure, reprobes {}",
                        node == b.id,
                        failed_at.elapsed(),
                        client.stats().reprobes
                    );
                }
            }
            if hang {
                // The same timeout on the same timer, bare.
                gate.blackhole().await;
                for _ in 0..n.min(10) {
                    let t = Instant::now();
                    let r = tokio::time::timeout(connect_timeout, TcpStream::connect(gate.addr))
                        .await;
                    assert!(r.is_err(), "the connect did not hang");
                    k.bare.push(t.elapsed());
                }
                gate.open().await;
            }
            results.push(k);
        }
        // How much of that is idleness: requests to B after ~100 ms
        // without any, against back to back, through the SDK and through a
        // bare PeerLink. A's port stays closed (A out of the ranking).
        gate.close().await;
        let _ = send(2).await;
        let link_b = peer_link(&identity, &trust, b.id, b.cluster_addr, connect_timeout);
        let via_link = || {
            let link_b = link_b.clone();
            async move {
                let t = Instant::now();
                let req = http::Request::post(link_b.relay_uri(ROUTE).unwrap())
                    .header(CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                    .unwrap();
                let resp = link_b.send(req).await.unwrap();
                assert_eq!(resp.status(), 200);
                resp.into_body().collect().await.unwrap();
                t.elapsed()
            }
        };
        for _ in 0..3 {
            via_link().await;
        }
        let (mut link_idle, mut link_hot, mut sdk_idle, mut sdk_hot) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..idle_rounds {
            for sdk_first in [i % 2 == 0, i % 2 == 1] {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if sdk_first {
                    let (t, node, _) = send(1).await;
                    assert_eq!(node, b.id);
                    sdk_idle.push(t);
                    let (t, _, _) = send(1).await;
                    sdk_hot.push(t);
                } else {
                    link_idle.push(via_link().await);
                    link_hot.push(via_link().await);
                }
            }
        }
        println!(
            "{:<44} {:>16} {:>16}",
            "to B, p50/p90 µs", "after ~100 ms idle", "back to back"
        );
        for (label, idle, hot) in [
            ("SDK Client::send", &sdk_idle, &sdk_hot),
            ("PeerLink (pair-cluster's pool), no SDK", &link_idle, &link_hot),
        ] {
            println!(
                "{label:<44} {:>16} {:>16}",
                format!("{:.1}/{:.1}", pct(idle, 0.5), pct(idle, 0.9)),
                format!("{:.1}/{:.1}", pct(hot, 0.5), pct(hot, 0.9)),
            );
        }
        println!(
            "connect timeout {} ms; the client's probe RTT to B {rtt_b} µs",
            connect_timeout.as_millis()
        );
        println!(
            "{:<32} {:>6} {:>18} {:>10} {:>10} {:>18} {:>18}",
            "first-ranked node",
            "cycles",
            "failover p50/p90",
            "idle p50",
            "hot p50",
            "extra/idle p50/p90",
            "extra/hot p50/p90"
        );
        for k in &results {
            println!(
                "{:<32} {:>6} {:>18} {:>10.1} {:>10.1} {:>18} {:>18}",
                k.label,
                k.failover.len(),
                format!("{:.1}/{:.1}", pct(&k.failover, 0.5), pct(&k.failover, 0.9)),
                pct(&k.cold, 0.5),
                pct(&k.hot, 0.5),
                format!("{:.1}/{:.1}", pct_f(&k.extra_cold, 0.5), pct_f(&k.extra_cold, 0.9)),
                format!("{:.1}/{:.1}", pct_f(&k.extra_hot, 0.5), pct_f(&k.extra_hot, 0.9)),
            );
            if k.misses > 0 {
                println!(
                    "  ({} cycles left out: A not tried first, or back in the ranking too soon)",
                    k.misses
                );
            }
        }
        println!(
            "(µs. idle: a normal request to B after ~100 ms without requests, as the failover request was; hot: right after another.\n extra: each failover request less the idle one of its cycle / the median of its hot ones)"
        );
        println!("below the SDK, to the dead node (µs, p50 / p90):");
        for k in &results {
            println!(
                "  {:<32} bare tokio connect {:.1} / {:.1}",
                k.label,
                pct(&k.bare, 0.5),
                pct(&k.bare, 0.9)
            );
            if !k.fresh_link.is_empty() {
                println!(
                    "  {:<32} new PeerLink + relay request {:.1} / {:.1}",
                    "",
                    pct(&k.fresh_link, 0.5),
                    pct(&k.fresh_link, 0.9)
                );
            }
        }
        client.close().await;
        gate.close().await;
    });
    nodes_rt.block_on(cluster.stop());
}

// ---- figures ---------------------------------------------------------------

/// Times this thread went to sleep (voluntary context switches; Linux's
/// /proc, 0 elsewhere).
#[cfg(target_os = "linux")]
fn thread_sleeps() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn thread_sleeps() -> u64 {
    0
}

/// CPU time of this thread so far (the scheduler's account, updated at
/// least every tick: good to ~1% over a block of requests; Linux's /proc,
/// zero elsewhere).
#[cfg(target_os = "linux")]
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu() -> Duration {
    Duration::ZERO
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q` quantile of `v`, in µs (nearest rank).
fn pct(v: &[Duration], q: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().map(|d| us(*d)).collect();
    s.sort_by(f64::total_cmp);
    pct_sorted(&s, q)
}

fn pct_f(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    pct_sorted(&s, q)
}

fn pct_sorted(s: &[f64], q: f64) -> f64 {
    if s.is_empty() {
        return f64::NAN;
    }
    let i = ((s.len() - 1) as f64 * q).round() as usize;
    s[i]
}
