//! Emulated engines: the performance model in real time behind the real
//! Ollama, OpenAI and LM Studio HTTP routes, with fault injection.
//!
//! `serve(config, listener, shutdown)` is the whole server; [`EmulatedEngine`]
//! wraps it for tests (spawned, with handles to faults and hit counters).
//! Reported durations (Ollama's `eval_duration` and friends) are the model's
//! virtual times, i.e. what the emulated hardware would report, whatever
//! `time_scale` the wall clock runs at.

mod api;
mod driver;
pub mod faults;
pub mod text;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use futures_util::StreamExt;
use pair_core::{EngineKind, ModelName, Workload};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{CacheKind, EmulatorError, EngineModel, HardwareProfile, ModelSpec, Residency};
pub use api::ANSWER_TOKENS;
use driver::Core;
use faults::Hits;
pub use faults::{FaultAction, FaultRule, Faults, HitCounts, RequestHits};
pub use text::AnswerLength;

/// Which real server the engine imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavor {
    /// Ollama: native /api routes plus its OpenAI-compatible /v1 routes.
    Ollama,
    /// An OpenAI-compatible server (llama.cpp server, vLLM): /v1 routes.
    OpenAi,
    /// LM Studio: /v1 routes plus its native /api/v0 and /api/v1 listings.
    LmStudio,
}

impl Flavor {
    pub const ALL: [Flavor; 3] = [Flavor::Ollama, Flavor::OpenAi, Flavor::LmStudio];

    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Ollama => "ollama",
            Flavor::OpenAi => "openai",
            Flavor::LmStudio => "lmstudio",
        }
    }

    /// The engine kind pair-core calls this server.
    pub fn engine_kind(self) -> EngineKind {
        match self {
            Flavor::Ollama => EngineKind::Ollama,
            Flavor::OpenAi => EngineKind::OpenAiCompat,
            Flavor::LmStudio => EngineKind::LmStudio,
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Flavor {
    type Err = EmulatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ollama" => Ok(Flavor::Ollama),
            "openai" | "openai-compat" | "llama.cpp" | "vllm" => Ok(Flavor::OpenAi),
            "lmstudio" | "lm-studio" => Ok(Flavor::LmStudio),
            _ => Err(EmulatorError::BadConfig {
                reason: format!("unknown flavor {s:?} (expected ollama, openai or lmstudio)"),
            }),
        }
    }
}

/// Everything an emulated engine needs.
#[derive(Clone, Debug, PartialEq)]
pub struct EmulatorConfig {
    pub flavor: Flavor,
    pub models: Vec<ModelSpec>,
    pub profile: HardwareProfile,
    /// Seeds the generated text and embeddings (with the request contents).
    pub seed: u64,
    /// Wall seconds per modelled second: 1.0 is real time, 0.01 runs a
    /// hundred times faster (tests).
    pub time_scale: f64,
    /// Overrides the profile's slot count.
    pub slots: Option<u32>,
    /// Start with the models loaded (in order, while they fit). Default:
    /// true for `OpenAi` (a llama.cpp server has its model loaded), false
    /// for Ollama and LM Studio (they load on first use).
    pub preload: bool,
    /// Tokens generated when a request sets no limit (answer ends "stop");
    /// a request's own limit is generated in full (answer ends "length"),
    /// unless `answer_length` is natural.
    pub default_max_tokens: u32,
    /// Where an answer ends without `x-emulator-answer-tokens`. Default
    /// [`AnswerLength::Limit`], which the token-counting tests rely on;
    /// load generators and the demo want [`AnswerLength::NATURAL`].
    pub answer_length: AnswerLength,
    /// The engine's prompt cache. Default: what the flavor's engine keeps
    /// ([`CacheKind::for_engine`]: a context per slot).
    pub cache: CacheKind,
    pub embedding_dims: usize,
    /// Unload a model after this much idle *modelled* time (Ollama's
    /// keep_alive, 5 minutes by default there). Default `None`: models stay
    /// loaded until evicted, so fast tests do not see them vanish.
    pub keep_alive: Option<std::time::Duration>,
    /// Requests allowed to wait for a slot; more get 503. Default: 512 for
    /// Ollama (OLLAMA_MAX_QUEUE), unbounded for the others.
    pub max_queue: Option<u32>,
}

impl EmulatorConfig {
    /// Defaults: rtx4090 profile, seed 0, real time, 32 tokens, 64 dims.
    pub fn new<M: Into<ModelSpec>>(flavor: Flavor, models: impl IntoIterator<Item = M>) -> Self {
        Self {
            flavor,
            models: models.into_iter().map(Into::into).collect(),
            profile: HardwareProfile::rtx4090(),
            seed: 0,
            time_scale: 1.0,
            slots: None,
            preload: flavor == Flavor::OpenAi,
            default_max_tokens: 32,
            answer_length: AnswerLength::Limit,
            cache: CacheKind::for_engine(flavor.engine_kind()),
            embedding_dims: 64,
            keep_alive: None,
            max_queue: (flavor == Flavor::Ollama).then_some(512),
        }
    }
    pub fn with_profile(mut self, profile: HardwareProfile) -> Self {
        self.profile = profile;
        self
    }
    pub fn with_time_scale(mut self, time_scale: f64) -> Self {
        self.time_scale = time_scale;
        self
    }
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    pub fn with_slots(mut self, slots: u32) -> Self {
        self.slots = Some(slots);
        self
    }
    pub fn with_preload(mut self, preload: bool) -> Self {
        self.preload = preload;
        self
    }
    pub fn with_keep_alive(mut self, keep_alive: Option<std::time::Duration>) -> Self {
        self.keep_alive = keep_alive;
        self
    }
    pub fn with_max_queue(mut self, max_queue: Option<u32>) -> Self {
        self.max_queue = max_queue;
        self
    }
    pub fn with_default_max_tokens(mut self, tokens: u32) -> Self {
        self.default_max_tokens = tokens;
        self
    }
    pub fn with_answer_length(mut self, answer_length: AnswerLength) -> Self {
        self.answer_length = answer_length;
        self
    }
    pub fn with_cache(mut self, cache: CacheKind) -> Self {
        self.cache = cache;
        self
    }

    fn check(&self) -> Result<(), EmulatorError> {
        let bad = |reason: &str| {
            Err(EmulatorError::BadConfig {
                reason: reason.to_owned(),
            })
        };
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return bad("time_scale must be a positive number");
        }
        if self.embedding_dims == 0 {
            return bad("embedding_dims must be at least 1");
        }
        if self
            .models
            .iter()
            .any(|m| ModelName::new(m.name.as_str()).is_err())
        {
            return bad("model names must be non-empty, without control characters");
        }
        Ok(())
    }
}

/// Shared by every handler.
#[derive(Clone, Debug)]
pub(crate) struct App {
    cfg: Arc<EmulatorConfig>,
    core: Core,
    faults: Faults,
    hits: Hits,
    shutdown: CancellationToken,
}

impl App {
    fn new(cfg: EmulatorConfig, shutdown: CancellationToken) -> Result<Self, EmulatorError> {
        cfg.check()?;
        let keep_alive_us = cfg
            .keep_alive
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let mut model = EngineModel::new(&cfg.profile, &cfg.models, cfg.slots)
            .with_keep_alive(keep_alive_us)
            .with_max_queue(cfg.max_queue)
            .with_cache(cfg.cache);
        if cfg.preload {
            for i in 0..cfg.models.len() {
                // Models that do not fit next to the earlier ones stay cold.
                let _ = model.preload(i);
            }
        }
        Ok(Self {
            core: Core::new(model, cfg.time_scale),
            cfg: Arc::new(cfg),
            faults: Faults::default(),
            hits: Hits::default(),
            shutdown,
        })
    }

    fn kind(&self) -> EngineKind {
        self.cfg.flavor.engine_kind()
    }

    /// The model a request names, by the engine's matching rule.
    fn resolve(&self, requested: &str) -> Option<usize> {
        let kind = self.kind();
        self.cfg
            .models
            .iter()
            .position(|m| ModelName::new(m.name.as_str()).is_ok_and(|n| n.matches(requested, kind)))
    }

    /// The name the engine lists a model under (`x` -> `x:latest` on Ollama).
    fn listed_name(&self, i: usize) -> String {
        let name = &self.cfg.models[i].name;
        ModelName::new(name.as_str()).map_or_else(|_| name.clone(), |n| n.canonical(self.kind()))
    }
}

/// A running emulated engine owned by the caller (tests, demo).
#[derive(Debug)]
pub struct EmulatedEngine {
    addr: SocketAddr,
    app: App,
    tracker: TaskTracker,
}

impl EmulatedEngine {
    /// Starts serving on `listener` in a task this value owns.
    pub fn spawn(config: EmulatorConfig, listener: TcpListener) -> Result<Self, EmulatorError> {
        let addr = listener.local_addr()?;
        let app = App::new(config, CancellationToken::new())?;
        let tracker = TaskTracker::new();
        let task_app = app.clone();
        tracker.spawn(async move {
            if let Err(error) = run(task_app, listener).await {
                tracing::warn!(%error, "emulated engine stopped");
            }
        });
        tracker.close();
        Ok(Self { addr, app, tracker })
    }

    /// Binds `127.0.0.1:0` and spawns.
    pub async fn start(config: EmulatorConfig) -> Result<Self, EmulatorError> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Self::spawn(config, listener)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, no trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> &EmulatorConfig {
        &self.app.cfg
    }

    /// Handle to change faults at runtime.
    pub fn faults(&self) -> Faults {
        self.app.faults.clone()
    }

    /// Requests received (every route but `/_emulator/*`), faulted ones too.
    pub fn hits(&self) -> u64 {
        self.app.hits.snapshot().total
    }

    /// Requests received on one route path, e.g. `/api/chat`.
    pub fn hits_for(&self, route: &str) -> u64 {
        self.app
            .hits
            .snapshot()
            .by_route
            .get(route)
            .copied()
            .unwrap_or(0)
    }

    /// Requests whose body named `model`, by the engine's matching rule
    /// (on Ollama `llama3` and `llama3:latest` count together).
    pub fn hits_for_model(&self, model: &str) -> u64 {
        let kind = self.app.kind();
        let Ok(want) = ModelName::new(model) else {
            return 0;
        };
        self.app
            .hits
            .snapshot()
            .by_model
            .iter()
            .filter(|(name, _)| want.matches(name, kind))
            .map(|(_, n)| n)
            .sum()
    }

    /// What the engine did with the request tagged `tag`
    /// ([`REQUEST_ID`]).
    pub fn request_hits(&self, tag: &str) -> RequestHits {
        self.app.hits.counts_of(tag)
    }

    pub fn hit_counts(&self) -> HitCounts {
        self.app.hits.snapshot()
    }

    pub fn reset_hits(&self) {
        self.app.hits.reset();
    }

    /// Jobs and tokens the engine holds now.
    pub fn workload(&self) -> Workload {
        self.app.core.with_model(|m, now| m.workload(now))
    }

    /// Modelled microseconds the engine has spent prefilling or decoding.
    pub fn busy_us(&self) -> u64 {
        self.app.core.with_model(|m, now| m.busy_us(now))
    }

    /// Names (as listed) of the models in memory.
    pub fn loaded_models(&self) -> Vec<String> {
        let loaded: Vec<usize> = self
            .app
            .core
            .with_model(|m, _| m.loaded_models().map(|s| s.index).collect());
        loaded
            .into_iter()
            .map(|i| self.app.listed_name(i))
            .collect()
    }

    /// Stops accepting, ends hanging and streaming requests, and waits.
    pub async fn shutdown(self) {
        self.app.shutdown.cancel();
        self.tracker.wait().await;
    }
}

impl Drop for EmulatedEngine {
    fn drop(&mut self) {
        self.app.shutdown.cancel();
    }
}

/// Serves `config` on `listener` until `shutdown` fires.
pub async fn serve(
    config: EmulatorConfig,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), EmulatorError> {
    run(App::new(config, shutdown)?, listener).await
}

async fn run(app: App, listener: TcpListener) -> Result<(), EmulatorError> {
    let router = router(app.clone());
    let driver_stop = CancellationToken::new();
    let driver = app.core.clone().drive(driver_stop.clone());
    let listener = listener.tap_io(|tcp| {
        // Streamed tokens are small writes; Nagle would batch them.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, "TCP_NODELAY failed");
        }
    });
    let shutdown = app.shutdown.clone();
    let server = async {
        let result = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        driver_stop.cancel();
        result
    };
    let ((), result) = tokio::join!(driver, server);
    result.map_err(EmulatorError::from)
}

fn router(app: App) -> Router {
    let openai = Router::new()
        .route("/v1/chat/completions", post(api::openai_chat))
        .route("/v1/completions", post(api::openai_completions))
        .route("/v1/embeddings", post(api::openai_embeddings))
        .route("/v1/models", get(api::openai_models))
        .route("/v1/models/{*model}", get(api::openai_model));
    let flavored = match app.cfg.flavor {
        Flavor::Ollama => openai
            .route("/", get(api::ollama_root).head(api::ollama_root))
            .route("/api/generate", post(api::ollama_generate))
            .route("/api/chat", post(api::ollama_chat))
            .route("/api/embed", post(api::ollama_embed))
            .route("/api/embeddings", post(api::ollama_embeddings))
            .route("/api/tags", get(api::ollama_tags))
            .route("/api/ps", get(api::ollama_ps))
            .route("/api/show", post(api::ollama_show))
            .route("/api/version", get(api::ollama_version)),
        Flavor::OpenAi => openai
            .route("/health", get(api::health))
            .route("/props", get(api::llamacpp_props)),
        Flavor::LmStudio => openai
            .route("/api/v0/models", get(api::lmstudio_v0_models))
            .route("/api/v0/models/{*model}", get(api::lmstudio_v0_model))
            .route("/api/v1/models", get(api::lmstudio_v1_models)),
    };
    flavored
        .route(
            "/_emulator/faults",
            get(admin_faults_get)
                .post(admin_faults_post)
                .put(admin_faults_put)
                .delete(admin_faults_delete),
        )
        .route(
            "/_emulator/stats",
            get(admin_stats).delete(admin_stats_reset),
        )
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            fault_layer,
        ))
        .with_state(app)
}

/// Largest request body read (prompts are small; this keeps memory bounded).
const MAX_BODY: usize = 32 << 20;

/// Counts hits and applies faults before any handler runs.
async fn fault_layer(State(app): State<App>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    if path.starts_with("/_emulator/") {
        return next.run(req).await;
    }
    app.hits.route(&path);
    let tag = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(t) = &tag {
        app.hits.request(t);
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_BODY).await else {
        return api::bad_request(&app, &path, "request body too large or unreadable");
    };
    let model = top_level_model(&bytes);
    if let Some(m) = &model {
        app.hits.model(m);
    }
    let kind = app.kind();
    let applied = app.faults.apply(model.as_deref(), |want| {
        model
            .as_deref()
            .is_some_and(|requested| ModelName::new(want).is_ok_and(|n| n.matches(requested, kind)))
    });
    if !applied.first_byte_delay.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(applied.first_byte_delay) => {}
            () = app.shutdown.cancelled() => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }
    if applied.hang {
        app.shutdown.cancelled().await;
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if let Some(code) = applied.status {
        return api::fault_status(&app, &path, code, model.as_deref());
    }
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    let resp = match applied.close_after_chunks {
        Some(n) => cut_after(resp, n),
        None => resp,
    };
    let resp = match applied.silent_after_chunks {
        Some(n) => silent_after(resp, n, app.shutdown.clone()),
        None => resp,
    };
    match tag {
        Some(t) => count_completion(resp, app.hits.clone(), t),
        None => resp,
    }
}

/// The header a caller tags a request with ([`HitCounts::by_request`]).
pub const REQUEST_ID: &str = "x-request-id";

/// Counts the answer as completed when its body has been sent to the end.
fn count_completion(resp: Response, hits: Hits, tag: String) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut inner = body.into_data_stream();
    let mut done = Some((hits, tag));
    let stream = futures_util::stream::poll_fn(move |cx| {
        let r = inner.poll_next_unpin(cx);
        if let std::task::Poll::Ready(None) = r
            && let Some((hits, tag)) = done.take()
        {
            hits.completed(&tag);
        }
        r
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// The request's top-level `model` (or Ollama's older `name`), if any.
fn top_level_model(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Probe {
        model: Option<String>,
        name: Option<String>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    probe.model.or(probe.name)
}

/// Sends `n` body chunks, then breaks the connection.
fn cut_after(resp: Response, n: u32) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let stream = body
        .into_data_stream()
        .take(n as usize)
        .map(|r| r.map_err(std::io::Error::other))
        .chain(futures_util::stream::once(async {
            // Let hyper flush the chunks already sent before the reset.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Err::<Bytes, _>(std::io::Error::other("emulated fault: connection closed"))
        }));
    Response::from_parts(parts, Body::from_stream(stream))
}

/// Sends `n` body chunks, then nothing until `shutdown`, the connection
/// held open.
fn silent_after(resp: Response, n: u32, shutdown: CancellationToken) -> Response {
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let stream = body
        .into_data_stream()
        .take(n as usize)
        .map(|r| r.map_err(std::io::Error::other))
        .chain(futures_util::stream::once(async move {
            shutdown.cancelled().await;
            Err::<Bytes, _>(std::io::Error::other(
                "emulated fault: silent until shutdown",
            ))
        }));
    Response::from_parts(parts, Body::from_stream(stream))
}

async fn admin_faults_get(State(app): State<App>) -> Response {
    axum::Json(app.faults.list()).into_response()
}

/// Body: one rule or a list of rules, added to those in force.
async fn admin_faults_post(State(app): State<App>, body: Bytes) -> Response {
    match parse_rules(&body) {
        Ok(rules) => {
            for r in rules {
                app.faults.add(r);
            }
            axum::Json(app.faults.list()).into_response()
        }
        Err(e) => e,
    }
}

/// Body: the complete new list of rules.
async fn admin_faults_put(State(app): State<App>, body: Bytes) -> Response {
    match parse_rules(&body) {
        Ok(rules) => {
            app.faults.set(rules);
            axum::Json(app.faults.list()).into_response()
        }
        Err(e) => e,
    }
}

async fn admin_faults_delete(State(app): State<App>) -> Response {
    app.faults.clear();
    StatusCode::NO_CONTENT.into_response()
}

#[allow(clippy::result_large_err)] // cold path: a bad admin request
fn parse_rules(body: &[u8]) -> Result<Vec<FaultRule>, Response> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(FaultRule),
        Many(Vec<FaultRule>),
    }
    match serde_json::from_slice::<OneOrMany>(body) {
        Ok(OneOrMany::One(r)) => Ok(vec![r]),
        Ok(OneOrMany::Many(v)) => Ok(v),
        Err(e) => Err((
            StatusCode::BAD_REQUEST,
            axum::Json(json!({ "error": format!("bad fault rule: {e}") })),
        )
            .into_response()),
    }
}

/// `GET /_emulator/stats`: what the engine holds now, and the readings an
/// emulated GPU's telemetry is made of.
#[derive(Serialize)]
struct Stats {
    hits: HitCounts,
    workload: Workload,
    loaded: Vec<String>,
    /// Busy right now (prefilling or decoding): 1.0, else 0.0.
    utilisation: f32,
    /// The engine's modelled clock, microseconds since it started.
    clock_us: u64,
    /// Modelled microseconds spent busy up to `clock_us`: two readings give
    /// utilisation over the window between them.
    busy_us: u64,
    /// Bytes of model weights in memory.
    memory_used_bytes: u64,
}

async fn admin_stats(State(app): State<App>) -> Response {
    let (workload, loaded, utilisation, clock_us, busy_us, memory_used_bytes) =
        app.core.with_model(|m, now| {
            (
                m.workload(now),
                m.loaded_models().map(|s| s.index).collect::<Vec<_>>(),
                m.utilisation(),
                now,
                m.busy_us(now),
                m.memory_used_bytes(),
            )
        });
    axum::Json(Stats {
        hits: app.hits.snapshot(),
        workload,
        loaded: loaded.into_iter().map(|i| app.listed_name(i)).collect(),
        utilisation,
        clock_us,
        busy_us,
        memory_used_bytes,
    })
    .into_response()
}

async fn admin_stats_reset(State(app): State<App>) -> Response {
    app.hits.reset();
    StatusCode::NO_CONTENT.into_response()
}

pub(crate) fn residency_loaded(r: Residency) -> bool {
    matches!(r, Residency::Loaded)
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    let mut resp = (status, value.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    resp
}
