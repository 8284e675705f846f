//! The chaos test: three `pair-node run` processes on loopback (real mTLS,
//! static peers, paired through the control API with PINs), each over an
//! emulated engine, take a stream of mixed requests (Ollama and OpenAI
//! faces, streamed and whole, chat, completion and embedding, three
//! models) while a driver kills and restarts nodes and engines, pauses
//! nodes (SIGSTOP/SIGCONT), makes engines hang, refuse (503), fail (500)
//! and cut their streams.
//!
//! Checked from the client's side: every request ends in exactly one
//! terminal outcome, a complete answer or an explicit error in its API's
//! format (or a broken connection when the node it talked to was killed
//! or paused under it); none runs past its deadline; no stream carries
//! more than one answer (nothing resent after its first byte). From the
//! engines' hit counts (each request is tagged): no request reached the
//! engines more than five times; every complete answer came from one.
//! After the faults, every node's job history holds the same terminal
//! record of every job, and new requests succeeded within seconds of each
//! fault. A summary table is printed.
//!
//! CI runs the default (a few hundred requests in about 40 s);
//! `cargo xtask chaos --requests N --seconds S` runs a larger one through
//! `CHAOS_REQUESTS` / `CHAOS_SECONDS`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pair_daemon::cli::ControlClient;
use pair_emulator::{EmulatedEngine, EmulatorConfig, FaultAction, FaultRule, Flavor, RequestHits};
use pair_identity::ControlToken;
use serde_json::{Value, json};
const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

const CHAT: &str = "llama3.2:3b";
const BIG: &str = "qwen2.5:7b";
const EMBED: &str = "nomic-embed-text";
/// A client gives up on a request after this long: none may take longer.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long a fault lasts, and the calm after it.
const FAULT_FOR: Duration = Duration::from_secs(3);
const CALM: Duration = Duration::from_millis(1500);
/// The nodes' stall floor (`--first-byte-timeout`): a hung engine is
/// routed around after it.
const STALL_FLOOR: &str = "3s";

struct Config {
    requests: usize,
    seconds: u64,
    seed: u64,
}

impl Config {
    fn from_env() -> Self {
        let num = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Self {
            requests: usize::try_from(num("CHAOS_REQUESTS", 500)).unwrap(),
            seconds: num("CHAOS_SECONDS", 40),
            seed: num("CHAOS_SEED", 0x5eed),
        }
    }
}

/// A small deterministic generator (xorshift64*): a run is reproducible
/// from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }
}

// ---------------------------------------------------------------- engines

/// One node's emulated engine, restartable on its port; the hit counts of
/// its past lives are kept.
struct Engine {
    addr: SocketAddr,
    cfg: EmulatorConfig,
    live: Option<EmulatedEngine>,
    past: BTreeMap<String, RequestHits>,
}

impl Engine {
    async fn start(i: usize, models: &[&str]) -> Self {
        let profile = ["rtx4090", "rtx3060", "laptop"][i % 3];
        let cfg = EmulatorConfig::new(Flavor::Ollama, models.iter().copied())
            .with_profile(pair_emulator::HardwareProfile::by_name(profile).unwrap())
            .with_time_scale(0.02)
            .with_seed(i as u64);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let live = EmulatedEngine::spawn(cfg.clone(), listener).unwrap();
        Self {
            addr,
            cfg,
            live: Some(live),
            past: BTreeMap::new(),
        }
    }

    async fn kill(&mut self) {
        if let Some(e) = self.live.take() {
            for (tag, h) in e.hit_counts().by_request {
                let p = self.past.entry(tag).or_default();
                p.hits += h.hits;
                p.completed += h.completed;
            }
            e.shutdown().await;
        }
    }

    async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr).await.unwrap();
        self.live = Some(EmulatedEngine::spawn(self.cfg.clone(), listener).unwrap());
    }

    fn faults(&self) -> Option<pair_emulator::Faults> {
        self.live.as_ref().map(EmulatedEngine::faults)
    }

    /// Every tagged request's counts, past lives included.
    fn counts(&self) -> BTreeMap<String, RequestHits> {
        let mut all = self.past.clone();
        if let Some(e) = &self.live {
            for (tag, h) in e.hit_counts().by_request {
                let p = all.entry(tag).or_default();
                p.hits += h.hits;
                p.completed += h.completed;
            }
        }
        all
    }
}

// ------------------------------------------------------------------ nodes

/// A `pair-node run` process on fixed ports, restartable in its state dir.
struct Node {
    name: String,
    dir: tempfile::TempDir,
    ollama: SocketAddr,
    openai: SocketAddr,
    cluster: SocketAddr,
    engine: SocketAddr,
    peers: Vec<SocketAddr>,
    child: Option<Child>,
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

impl Node {
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("node.log"))
            .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--name", &self.name, "--mdns", "off"])
            .args(["--ollama-face", &self.ollama.to_string()])
            .args(["--openai-face", &self.openai.to_string()])
            .args(["--cluster", &self.cluster.to_string()])
            .args(["--engine", &format!("ollama=http://{}", self.engine)])
            .args(["--first-byte-timeout", STALL_FLOOR])
            .arg("--state-dir")
            .arg(self.dir.path());
        for p in &self.peers {
            cmd.args(["--peer", &p.to_string()]);
        }
        let child = cmd
            .env("PAIR_LOG", "warn")
            .env("PAIR_THREADS", "1")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn pid(&self) -> String {
        self.child.as_ref().unwrap().id().to_string()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {sig} {}", self.name);
    }

    fn face(&self, openai: bool) -> String {
        format!("http://{}", if openai { self.openai } else { self.ollama })
    }

    /// The control client, with the owner's token once the node wrote it.
    fn control(&self) -> ControlClient {
        let c = ControlClient::new(&self.face(false)).unwrap();
        match ControlToken::read(self.dir.path()) {
            Ok(token) => c.with_token(token),
            Err(_) => c,
        }
    }

    /// Waits until the node answers and routes to `routable` nodes.
    async fn ready(&self, routable: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = self.control().status().await
                && s.routable_nodes >= routable
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} never routed to {routable} nodes; log:\n{}",
                self.name,
                std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused process must be resumed to die cleanly.
            let _ = Command::new("kill").args(["-CONT", &self.pid()]).status();
        }
        self.kill();
    }
}

// --------------------------------------------------------------- requests

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Face {
    OllamaChat,
    OllamaGenerate,
    OllamaEmbed,
    OpenAiChat,
    OpenAiCompletions,
    OpenAiEmbeddings,
}

impl Face {
    const ALL: [Face; 6] = [
        Face::OllamaChat,
        Face::OllamaGenerate,
        Face::OllamaEmbed,
        Face::OpenAiChat,
        Face::OpenAiCompletions,
        Face::OpenAiEmbeddings,
    ];
    fn openai(self) -> bool {
        matches!(
            self,
            Face::OpenAiChat | Face::OpenAiCompletions | Face::OpenAiEmbeddings
        )
    }
    fn embed(self) -> bool {
        matches!(self, Face::OllamaEmbed | Face::OpenAiEmbeddings)
    }
    fn path(self) -> &'static str {
        match self {
            Face::OllamaChat => "/api/chat",
            Face::OllamaGenerate => "/api/generate",
            Face::OllamaEmbed => "/api/embed",
            Face::OpenAiChat => "/v1/chat/completions",
            Face::OpenAiCompletions => "/v1/completions",
            Face::OpenAiEmbeddings => "/v1/embeddings",
        }
    }
}

#[derive(Clone, Debug)]
struct Spec {
    tag: String,
    node: usize,
    face: Face,
    stream: bool,
    model: &'static str,
    tokens: u32,
    /// When it is sent, from the start of the run.
    at: Duration,
}

impl Spec {
    fn random(k: usize, rng: &mut Rng, at: Duration) -> Self {
        let face = Face::ALL[rng.below(Face::ALL.len())];
        let model = if face.embed() {
            EMBED
        } else if rng.below(10) < 3 {
            BIG
        } else {
            CHAT
        };
        Self {
            tag: format!("chaos-{k}"),
            node: rng.below(3),
            face,
            stream: !face.embed() && rng.below(2) == 0,
            model,
            tokens: 8 + u32::try_from(rng.below(32)).unwrap(),
            at,
        }
    }

    fn body(&self) -> Value {
        let msgs = json!([{"role": "user", "content": "tell me about chaos"}]);
        match self.face {
            Face::OllamaChat => json!({"model": self.model, "messages": msgs,
                "stream": self.stream, "options": {"num_predict": self.tokens}}),
            Face::OllamaGenerate => json!({"model": self.model, "prompt": "chaos",
                "stream": self.stream, "options": {"num_predict": self.tokens}}),
            Face::OllamaEmbed => json!({"model": self.model, "input": "chaos"}),
            Face::OpenAiChat => json!({"model": self.model, "messages": msgs,
                "stream": self.stream, "max_tokens": self.tokens}),
            Face::OpenAiCompletions => json!({"model": self.model, "prompt": "chaos",
                "stream": self.stream, "max_tokens": self.tokens}),
            Face::OpenAiEmbeddings => json!({"model": self.model, "input": "chaos"}),
        }
    }
}

/// How a request ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// A whole answer, or a stream that ended with its end marker.
    Complete,
    /// A non-2xx answer in the API's error format.
    ApiError(u16),
    /// A stream that ended with an error event in the API's format.
    ErrorEvent,
    /// The connection broke (before or during the answer) while the node
    /// the client talked to was killed or paused: allowed.
    FaceDown,
    // Violations:
    /// The connection broke although its node stayed up.
    Broken(String),
    /// No end within the deadline.
    Hung,
    /// An answer that is not a complete answer nor an explicit error
    /// (a 2xx cut short silently, an error body in no API's format).
    Malformed(String),
    /// More than one answer in one stream (a resend after the first byte).
    Duplicated(String),
}

impl Outcome {
    fn violation(&self) -> bool {
        matches!(
            self,
            Outcome::Broken(_) | Outcome::Hung | Outcome::Malformed(_) | Outcome::Duplicated(_)
        )
    }
    fn kind(&self) -> String {
        match self {
            Outcome::Complete => "complete".into(),
            Outcome::ApiError(s) => format!("error {s}"),
            Outcome::ErrorEvent => "error in stream".into(),
            Outcome::FaceDown => "its node down".into(),
            Outcome::Broken(_) => "VIOLATION broken".into(),
            Outcome::Hung => "VIOLATION hung".into(),
            Outcome::Malformed(_) => "VIOLATION malformed".into(),
            Outcome::Duplicated(_) => "VIOLATION duplicated".into(),
        }
    }
}

#[derive(Debug)]
struct Done {
    spec: Spec,
    outcome: Outcome,
    /// What an error said (its message, shortened).
    detail: String,
    job: Option<String>,
    /// The node that served it (`x-pair-node`), as its UUID.
    served: Option<String>,
    started: Instant,
    ended: Instant,
}

/// Classifies a 2xx body: complete, an error event, cut short, or more
/// than one answer.
fn judge_ok(spec: &Spec, body: &[u8]) -> Outcome {
    let text = String::from_utf8_lossy(body);
    if !spec.stream {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return Outcome::Malformed(format!("whole answer does not parse: {text:.200}"));
        };
        let complete = if spec.face.openai() {
            v["choices"].is_array() || v["data"].is_array()
        } else {
            v["done"] == true || v["embeddings"].is_array()
        };
        return if complete {
            Outcome::Complete
        } else {
            Outcome::Malformed(format!("incomplete whole answer: {text:.200}"))
        };
    }
    let events: Vec<&str> = if spec.face.openai() {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect()
    } else {
        text.lines().filter(|l| !l.trim().is_empty()).collect()
    };
    let mut tokens = 0u32;
    for (i, ev) in events.iter().enumerate() {
        let last = i + 1 == events.len();
        if *ev == "[DONE]" {
            return if last {
                Outcome::Complete
            } else {
                Outcome::Duplicated(format!("events after [DONE]: {text:.300}"))
            };
        }
        let Ok(v) = serde_json::from_str::<Value>(ev) else {
            return Outcome::Malformed(format!("event does not parse: {ev:.200}"));
        };
        if v.get("error").is_some() {
            return if last {
                Outcome::ErrorEvent
            } else {
                Outcome::Duplicated(format!("events after an error: {text:.300}"))
            };
        }
        if !spec.face.openai() && v["done"] == true {
            return if last {
                Outcome::Complete
            } else {
                Outcome::Duplicated(format!("events after done: {text:.300}"))
            };
        }
        let has_text = if spec.face.openai() {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .or(v["choices"][0]["text"].as_str())
                .is_some_and(|s| !s.is_empty())
        } else {
            v["response"]
                .as_str()
                .or(v["message"]["content"].as_str())
                .is_some_and(|s| !s.is_empty())
        };
        tokens += u32::from(has_text);
        if tokens > spec.tokens {
            return Outcome::Duplicated(format!("{tokens} tokens for a limit of {}", spec.tokens));
        }
    }
    Outcome::Malformed(format!("stream ended without its end marker: {text:.300}"))
}

fn judge_error(spec: &Spec, status: u16, body: &[u8]) -> Outcome {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let shaped = if spec.face.openai() {
        v["error"]["message"].is_string()
    } else {
        v["error"].is_string()
    };
    if shaped {
        Outcome::ApiError(status)
    } else {
        Outcome::Malformed(format!(
            "{status} body in no API's error format: {:.200}",
            String::from_utf8_lossy(body)
        ))
    }
}

/// When each node was down (killed or paused): the spans a broken
/// connection is allowed in.
#[derive(Default)]
struct Downtime(
    Mutex<Vec<(usize, Instant, Option<Instant>)>>,
    Mutex<Vec<(usize, Instant)>>,
);

impl Downtime {
    fn killed(&self, node: usize) {
        self.1.lock().unwrap().push((node, Instant::now()));
    }
    /// Whether `node` was killed within `[from, to]`.
    fn killed_within(&self, node: usize, from: Instant, to: Instant) -> bool {
        self.1
            .lock()
            .unwrap()
            .iter()
            .any(|&(n, at)| n == node && at >= from && at <= to)
    }
    fn begin(&self, node: usize) {
        self.0.lock().unwrap().push((node, Instant::now(), None));
    }
    fn end(&self, node: usize) {
        let mut spans = self.0.lock().unwrap();
        if let Some(s) = spans
            .iter_mut()
            .rev()
            .find(|s| s.0 == node && s.2.is_none())
        {
            s.2 = Some(Instant::now());
        }
    }
    /// Whether `node` was down at any time in `[from, to]`.
    fn overlaps(&self, node: usize, from: Instant, to: Instant) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|&(n, a, b)| n == node && a <= to && b.is_none_or(|b| b >= from))
    }
    fn is_down(&self, node: usize) -> bool {
        let now = Instant::now();
        self.overlaps(node, now, now)
    }
}

async fn send(client: &reqwest::Client, nodes: &[String; 6], spec: Spec, down: &Downtime) -> Done {
    let base = &nodes[spec.node * 2 + usize::from(spec.face.openai())];
    let started = Instant::now();
    let req = client
        .post(format!("{base}{}", spec.face.path()))
        .header(pair_emulator::REQUEST_ID, &spec.tag)
        .json(&spec.body())
        .send();
    let run = async {
        let resp = match req.await {
            Ok(r) => r,
            Err(e) => return (Err(format!("before the answer: {e}")), None),
        };
        let status = resp.status().as_u16();
        let header = |name| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let job = header("x-pair-job").map(|j| (j, header("x-pair-node")));
        let mut body = Vec::new();
        let mut s = resp.bytes_stream();
        while let Some(chunk) = s.next().await {
            match chunk {
                Ok(b) => body.extend_from_slice(&b),
                Err(e) => return (Err(format!("during the answer ({status}): {e}")), job),
            }
        }
        (Ok((status, body)), job)
    };
    let (result, job) = match tokio::time::timeout(DEADLINE, run).await {
        Ok(r) => r,
        Err(_) => {
            return Done {
                spec,
                outcome: Outcome::Hung,
                detail: String::new(),
                job: None,
                served: None,
                started,
                ended: Instant::now(),
            };
        }
    };
    let ended = Instant::now();
    let (job, served) = match job {
        Some((j, node)) => (
            Some(j),
            node.and_then(|n| Some(n.rsplit_once('(')?.1.trim_end_matches(')').to_owned())),
        ),
        None => (None, None),
    };
    let detail = match &result {
        Ok((status, body)) if !(200..300).contains(status) || spec.stream => {
            let text = String::from_utf8_lossy(body);
            let tail = text.trim_end().rsplit('\n').next().unwrap_or_default();
            format!(
                "{status} {:.160}",
                if (200..300).contains(status) {
                    tail
                } else {
                    &text
                }
            )
        }
        Ok(_) => String::new(),
        Err(e) => format!("{e:.160}"),
    };
    let outcome = match result {
        Ok((status, body)) if (200..300).contains(&status) => judge_ok(&spec, &body),
        Ok((status, body)) => judge_error(&spec, status, &body),
        Err(_) if down.overlaps(spec.node, started, ended) => Outcome::FaceDown,
        Err(e) => Outcome::Broken(e),
    };
    Done {
        spec,
        outcome,
        detail,
        job,
        served,
        started,
        ended,
    }
}

// ----------------------------------------------------------------- faults

#[derive(Clone, Copy, Debug)]
enum Fault {
    KillNode,
    PauseNode,
    KillEngine,
    HangEngine,
    Refuse503,
    Fail500,
    CutStreams,
}

const FAULTS: [Fault; 7] = [
    Fault::CutStreams,
    Fault::KillNode,
    Fault::Refuse503,
    Fault::HangEngine,
    Fault::PauseNode,
    Fault::Fail500,
    Fault::KillEngine,
];

struct Injected {
    fault: Fault,
    target: usize,
    at: Instant,
    /// Time from the fault to the first new request that succeeded.
    recovered: Option<Duration>,
    /// Requests of the probe that failed while it lasted.
    probe_failures: u32,
}

struct Cluster {
    nodes: Vec<Node>,
    engines: Vec<Engine>,
    down: Arc<Downtime>,
}

impl Cluster {
    async fn inject(&mut self, fault: Fault, t: usize) {
        let models: Vec<String> = self.engines[t]
            .cfg
            .models
            .iter()
            .map(|m| m.name.clone())
            .collect();
        match fault {
            Fault::KillNode => {
                self.down.begin(t);
                self.down.killed(t);
                self.nodes[t].kill();
            }
            Fault::PauseNode => {
                self.down.begin(t);
                self.nodes[t].signal("-STOP");
            }
            Fault::KillEngine => self.engines[t].kill().await,
            Fault::HangEngine | Fault::Refuse503 | Fault::Fail500 | Fault::CutStreams => {
                let action = match fault {
                    Fault::HangEngine => FaultAction::Hang,
                    Fault::Refuse503 => FaultAction::Status(503),
                    Fault::Fail500 => FaultAction::Status(500),
                    _ => FaultAction::CloseAfterChunks(2),
                };
                // Inference only: the engine's health and listings still
                // answer (the nastiest hang).
                let f = self.engines[t].faults().unwrap();
                for m in models {
                    f.add(FaultRule::for_model(m, action));
                }
            }
        }
    }

    async fn restore(&mut self, fault: Fault, t: usize) {
        match fault {
            Fault::KillNode => {
                self.nodes[t].spawn();
                self.nodes[t].ready(1).await;
                self.down.end(t);
            }
            Fault::PauseNode => {
                self.nodes[t].signal("-CONT");
                self.down.end(t);
            }
            Fault::KillEngine => self.engines[t].restart().await,
            _ => {
                if let Some(f) = self.engines[t].faults() {
                    f.clear();
                }
            }
        }
    }
}

/// Sends a small request every 100 ms to a node that is up, and notes
/// when each ended and whether it succeeded.
async fn probe(
    client: reqwest::Client,
    faces: [String; 6],
    down: Arc<Downtime>,
    log: Arc<Mutex<Vec<(Instant, Instant, bool)>>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut k = 0usize;
    while !stop.is_cancelled() {
        k += 1;
        let node = (0..3).map(|i| (k + i) % 3).find(|n| !down.is_down(*n));
        if let Some(node) = node {
            let t = Instant::now();
            let ok = client
                .post(format!("{}/api/generate", faces[node * 2]))
                .json(&json!({"model": CHAT, "prompt": "probe", "stream": false,
                    "options": {"num_predict": 2}}))
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            log.lock().unwrap().push((t, Instant::now(), ok));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ------------------------------------------------------------------- run

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    pair_identity::install_crypto_provider();
    let cfg = Config::from_env();
    let mut rng = Rng(cfg.seed | 1);

    // Node 0 holds every model, node 1 the chat models, node 2 chat and
    // embedding: each model has at least two owners.
    let holdings: [&[&str]; 3] = [&[CHAT, BIG, EMBED], &[CHAT, BIG], &[CHAT, EMBED]];
    let mut engines = Vec::new();
    for (i, m) in holdings.iter().enumerate() {
        engines.push(Engine::start(i, m).await);
    }
    let ports: Vec<[SocketAddr; 3]> = (0..3)
        .map(|_| [free_port(), free_port(), free_port()])
        .collect();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| Node {
            name: format!("chaos-{i}"),
            dir: tempfile::tempdir().unwrap(),
            ollama: ports[i][0],
            openai: ports[i][1],
            cluster: ports[i][2],
            engine: engines[i].addr,
            peers: (0..3).filter(|j| *j != i).map(|j| ports[j][2]).collect(),
            child: None,
        })
        .collect();
    for n in &mut nodes {
        n.spawn();
    }
    for n in &nodes {
        n.ready(1).await;
    }
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        let invite = nodes[a].control().invite().await.unwrap();
        nodes[b]
            .control()
            .join(&nodes[a].cluster.to_string(), &invite.pin)
            .await
            .unwrap();
    }
    for n in &nodes {
        n.ready(3).await;
    }
    let faces: [String; 6] = std::array::from_fn(|i| nodes[i / 2].face(i % 2 == 1));
    let mut ids = Vec::new();
    for n in &nodes {
        ids.push(n.control().status().await.unwrap().id.to_string());
    }
    let mut cluster = Cluster {
        nodes,
        engines,
        down: Arc::new(Downtime::default()),
    };

    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let run_for = Duration::from_secs(cfg.seconds);
    let gap = run_for / u32::try_from(cfg.requests.max(1)).unwrap();
    let specs: Vec<Spec> = (0..cfg.requests)
        .map(|k| Spec::random(k, &mut rng, gap * u32::try_from(k).unwrap()))
        .collect();

    // The clients: each request is sent at its time, concurrently.
    let load = {
        let client = client.clone();
        let down = Arc::clone(&cluster.down);
        let faces = faces.clone();
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for spec in specs {
                tokio::time::sleep_until((t0 + spec.at).into()).await;
                let (client, down, faces) = (client.clone(), Arc::clone(&down), faces.clone());
                tasks.spawn(async move { send(&client, &faces, spec, &down).await });
            }
            let mut done = Vec::new();
            while let Some(d) = tasks.join_next().await {
                done.push(d.unwrap());
            }
            done
        })
    };
    let probes = Arc::new(Mutex::new(Vec::new()));
    let stop_probe = tokio_util::sync::CancellationToken::new();
    let prober = tokio::spawn(probe(
        client.clone(),
        faces.clone(),
        Arc::clone(&cluster.down),
        Arc::clone(&probes),
        stop_probe.clone(),
    ));

    // The faults, one at a time, each on the next node in turn.
    let mut injected: Vec<Injected> = Vec::new();
    tokio::time::sleep(CALM).await;
    let mut k = 0usize;
    while t0.elapsed() + FAULT_FOR + CALM < run_for {
        let fault = FAULTS[k % FAULTS.len()];
        let target = (k + k / FAULTS.len()) % 3;
        k += 1;
        cluster.inject(fault, target).await;
        injected.push(Injected {
            fault,
            target,
            at: Instant::now(),
            recovered: None,
            probe_failures: 0,
        });
        tokio::time::sleep(FAULT_FOR).await;
        cluster.restore(fault, target).await;
        tokio::time::sleep(CALM).await;
    }
    let done = load.await.unwrap();
    stop_probe.cancel();
    prober.await.unwrap();
    let faults_end = Instant::now();

    // Recovery: from each fault to the end of the first probe sent after
    // it that succeeded.
    let probes = probes.lock().unwrap().clone();
    for f in &mut injected {
        let until = f.at + FAULT_FOR + CALM;
        f.recovered = probes
            .iter()
            .find(|(sent, _, ok)| *sent >= f.at && *ok)
            .map(|(_, end, _)| *end - f.at);
        f.probe_failures = u32::try_from(
            probes
                .iter()
                .filter(|(sent, _, ok)| *sent >= f.at && *sent < until && !ok)
                .count(),
        )
        .unwrap();
    }

    // Every node routes to all three again, and the histories converge.
    for n in &cluster.nodes {
        n.ready(3).await;
    }
    let (histories, converged_in) = converge(&cluster.nodes, &done).await;

    let counts: Vec<BTreeMap<String, RequestHits>> =
        cluster.engines.iter().map(Engine::counts).collect();
    let report = summarise(
        &cfg,
        &done,
        &injected,
        &counts,
        &histories,
        converged_in,
        t0,
        faults_end,
    );
    println!("{report}");
    let path = std::env::var("CHAOS_REPORT").ok();
    if let Some(p) = path {
        std::fs::write(p, &report).unwrap();
    }
    check(&done, &injected, &counts, &histories, &ids, &cluster.down);
}

/// What each node's job history says of each job: status, HTTP status,
/// where it ran, its origin and which node's record it is.
/// A job's status, HTTP status, runner, origin, recorder and moves (a
/// stream continued elsewhere after a cut).
type History = BTreeMap<
    String,
    (
        String,
        Option<u16>,
        Option<String>,
        String,
        Option<String>,
        usize,
    ),
>;

async fn history(node: &Node) -> Option<History> {
    let jobs = node.control().jobs(10_000).await.ok()?;
    Some(
        jobs.into_iter()
            .map(|r| {
                (
                    r.id.to_string(),
                    (
                        format!("{:?}", r.status),
                        r.http_status,
                        r.ran_on.map(|n| n.short()),
                        r.origin.short(),
                        r.recorded_by.map(|n| n.short()),
                        r.resumed.len(),
                    ),
                )
            })
            .collect(),
    )
}

/// Waits (up to 60 s) until every node's history holds the same terminal
/// record of every job, and either every job a client was told of is in
/// it or the histories have not changed for 3 s (a job lost with its node
/// never comes).
async fn converge(nodes: &[Node], done: &[Done]) -> (Vec<History>, Option<Duration>) {
    let t = Instant::now();
    let told: Vec<&str> = done.iter().filter_map(|d| d.job.as_deref()).collect();
    let mut agreed: Option<(Vec<History>, Duration)> = None;
    loop {
        let mut hs = Vec::new();
        for n in nodes {
            hs.push(history(n).await.unwrap_or_default());
        }
        let same = hs.windows(2).all(|w| w[0] == w[1]);
        let terminal = hs[0].values().all(|r| r.0 != "Running");
        let all_told = told.iter().all(|j| hs[0].contains_key(*j));
        if same && terminal && all_told {
            return (hs, Some(t.elapsed()));
        }
        match &agreed {
            Some((before, since)) if same && terminal && *before == hs => {
                if t.elapsed() - *since > Duration::from_secs(3) {
                    return (hs, Some(*since));
                }
            }
            _ if same && terminal => agreed = Some((hs.clone(), t.elapsed())),
            _ => agreed = None,
        }
        if t.elapsed() > Duration::from_secs(60) {
            return (hs, None);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[allow(clippy::too_many_arguments)]
fn summarise(
    cfg: &Config,
    done: &[Done],
    injected: &[Injected],
    counts: &[BTreeMap<String, RequestHits>],
    histories: &[History],
    converged_in: Option<Duration>,
    t0: Instant,
    faults_end: Instant,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "chaos: {} requests over {:.0} s (seed {:#x}), {} faults",
        done.len(),
        (faults_end - t0).as_secs_f64(),
        cfg.seed,
        injected.len()
    );
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for d in done {
        *by_kind.entry(d.outcome.kind()).or_default() += 1;
    }
    let _ = writeln!(out, "\n| outcome | requests |\n|---|---:|");
    for (k, n) in &by_kind {
        let _ = writeln!(out, "| {k} | {n} |");
    }
    let mut faces: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for d in done {
        let e = faces
            .entry(format!(
                "{} {}",
                d.spec.face.path(),
                if d.spec.stream { "stream" } else { "whole" }
            ))
            .or_default();
        e.0 += 1;
        e.1 += usize::from(d.outcome == Outcome::Complete);
    }
    let errors: Vec<&Done> = done
        .iter()
        .filter(|d| matches!(d.outcome, Outcome::ApiError(_) | Outcome::ErrorEvent))
        .collect();
    if !errors.is_empty() {
        // Grouped by what they said (numbers and names aside).
        let mut groups: BTreeMap<String, Vec<&Done>> = BTreeMap::new();
        for d in &errors {
            let key: String = d
                .detail
                .chars()
                .take(90)
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .collect();
            groups.entry(key).or_default().push(d);
        }
        let _ = writeln!(out, "\nerrors clients got, by kind:");
        for (key, ds) in &groups {
            let first = ds[0];
            let _ = writeln!(
                out,
                "  {:>4} x {key}\n         e.g. {} {} node {} at {:.1} s: {}",
                ds.len(),
                first.spec.tag,
                first.spec.face.path(),
                first.spec.node,
                (first.started - t0).as_secs_f64(),
                first.detail
            );
        }
    }
    let _ = writeln!(out, "\n| route | requests | complete |\n|---|---:|---:|");
    for (k, (n, c)) in &faces {
        let _ = writeln!(out, "| {k} | {n} | {c} |");
    }
    let _ = writeln!(
        out,
        "\n| fault | node | at (s) | first success after (s) | probe failures |\n|---|---:|---:|---:|---:|"
    );
    for f in injected {
        let _ = writeln!(
            out,
            "| {:?} | {} | {:.1} | {} | {} |",
            f.fault,
            f.target,
            (f.at - t0).as_secs_f64(),
            f.recovered
                .map_or_else(|| "never".into(), |d| format!("{:.2}", d.as_secs_f64())),
            f.probe_failures
        );
    }
    let mut merged: HashMap<&str, RequestHits> = HashMap::new();
    for c in counts {
        for (tag, h) in c {
            let m = merged.entry(tag.as_str()).or_default();
            m.hits += h.hits;
            m.completed += h.completed;
        }
    }
    let max_hits = merged.values().map(|h| h.hits).max().unwrap_or(0);
    let retried = merged.values().filter(|h| h.hits > 1).count();
    let latencies: Vec<f64> = done
        .iter()
        .map(|d| (d.ended - d.started).as_secs_f64())
        .collect();
    let slowest = latencies.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "\nengine hits: {} tagged requests reached an engine, {retried} more than once, at most {max_hits} times",
        merged.len()
    );
    let moved = histories
        .first()
        .map_or(0, |h| h.values().filter(|r| r.5 > 0).count());
    let error_events = done
        .iter()
        .filter(|d| d.outcome == Outcome::ErrorEvent)
        .count();
    let _ = writeln!(
        out,
        "streams cut after their first byte: {moved} moved to another node, {error_events} ended with an error event"
    );
    let _ = writeln!(
        out,
        "slowest request: {slowest:.2} s (deadline {} s)",
        DEADLINE.as_secs()
    );
    let _ = writeln!(
        out,
        "job histories: {} jobs on each of {} nodes, {}",
        histories.first().map_or(0, BTreeMap::len),
        histories.len(),
        converged_in.map_or_else(
            || "NOT converged within 60 s".into(),
            |d| format!("converged {:.1} s after the faults", d.as_secs_f64())
        )
    );
    out
}

fn check(
    done: &[Done],
    injected: &[Injected],
    counts: &[BTreeMap<String, RequestHits>],
    histories: &[History],
    ids: &[String],
    down: &Downtime,
) {
    let violations: Vec<String> = done
        .iter()
        .filter(|d| d.outcome.violation())
        .map(|d| {
            format!(
                "{} {:?} {:?}: {:?}",
                d.spec.tag, d.spec.face, d.spec.stream, d.outcome
            )
        })
        .collect();
    assert!(
        violations.is_empty(),
        "{} requests without a proper end:\n{}",
        violations.len(),
        violations.join("\n")
    );
    // One outcome each, and job ids never shared.
    let mut jobs: HashMap<&str, &str> = HashMap::new();
    for d in done {
        if let Some(j) = &d.job
            && let Some(other) = jobs.insert(j, &d.spec.tag)
        {
            panic!("job {j} answered both {other} and {}", d.spec.tag);
        }
    }
    let mut merged: HashMap<&str, RequestHits> = HashMap::new();
    for c in counts {
        for (tag, h) in c {
            let m = merged.entry(tag.as_str()).or_default();
            m.hits += h.hits;
            m.completed += h.completed;
        }
    }
    for d in done {
        let h = merged.get(d.spec.tag.as_str()).copied().unwrap_or_default();
        assert!(
            h.hits <= 5,
            "{} reached the engines {} times",
            d.spec.tag,
            h.hits
        );
        if d.outcome == Outcome::Complete {
            assert!(h.hits >= 1, "{} complete but no engine saw it", d.spec.tag);
        }
    }
    for f in injected {
        let r = f.recovered.unwrap_or_else(|| {
            panic!(
                "no request succeeded after {:?} on node {}",
                f.fault, f.target
            )
        });
        assert!(
            r < Duration::from_secs(10),
            "{:?} on node {}: first success after {r:?}",
            f.fault,
            f.target
        );
    }
    let differ: Vec<String> = histories[0]
        .keys()
        .chain(histories[1].keys())
        .chain(histories[2].keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|j| !histories.windows(2).all(|w| w[0].get(*j) == w[1].get(*j)))
        .map(|j| {
            let on: Vec<String> = histories
                .iter()
                .map(|h| format!("{:?}", h.get(j)))
                .collect();
            format!("{j}: {}", on.join(" | "))
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the nodes' job histories differ on {} jobs:\n{}",
        differ.len(),
        differ
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Every answer a client got is recorded as it ended. The one loss
    // allowed: a job that ran on the node its client talked to, which was
    // killed before the record left it (within a replication tick and a
    // log write of the job's end).
    let h = &histories[0];
    let mut lost = 0usize;
    for d in done {
        let Some(job) = &d.job else { continue };
        let Some(rec) = h.get(job) else {
            lost += 1;
            let face = d.spec.node;
            let lost_with_its_node = d.served.as_deref() == Some(ids[face].as_str())
                && down.killed_within(face, d.started, d.ended + Duration::from_millis(1500));
            assert!(
                lost_with_its_node,
                "{} (job {job}, {:?}, face node {face}, served by {:?}) is in no history",
                d.spec.tag, d.outcome, d.served
            );
            continue;
        };
        match &d.outcome {
            Outcome::Complete if rec.0 == "Cancelled" => {
                // The runner's record, when the node the client talked to
                // was killed just after passing the whole answer on: its
                // own record went with it, and the runner saw the link
                // reset before it could tell its last piece was written.
                let face = d.spec.node;
                let runners = rec.2.as_deref() != Some(rec.3.as_str()) && rec.4 == rec.2;
                assert!(
                    runners
                        && down.killed_within(
                            face,
                            d.started,
                            d.ended + Duration::from_millis(1500)
                        ),
                    "{} {job}: complete, recorded {rec:?}",
                    d.spec.tag
                );
                lost += 1;
            }
            Outcome::Complete => assert_eq!(rec.0, "Completed", "{} {job}: {rec:?}", d.spec.tag),
            Outcome::ApiError(s) => {
                assert_eq!(rec.0, "Failed", "{} {job}: {rec:?}", d.spec.tag);
                assert_eq!(rec.1, Some(*s), "{} {job}: {rec:?}", d.spec.tag);
            }
            Outcome::ErrorEvent => assert_eq!(rec.0, "Failed", "{} {job}: {rec:?}", d.spec.tag),
            _ => {}
        }
    }
    println!(
        "jobs lost with the node that took them (killed within 1.5 s of their end; the runner's record kept, if any): {lost}"
    );
}
