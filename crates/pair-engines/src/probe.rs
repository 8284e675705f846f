//! The HTTP shell of the adapters: one poll of one engine over plain HTTP,
//! every request under a deadline, answers handed to the pure parsers in
//! [`crate::inventory`] and summed up as an [`Observation`].

use std::sync::Arc;
use std::time::Duration;

use pair_core::{EngineKind, ModelEntry};

use crate::inventory::{
    merge_ollama, parse_llamacpp_slot_work, parse_llamacpp_slots, parse_lmstudio_v0,
    parse_lmstudio_v1, parse_ollama_ps, parse_ollama_tags, parse_ollama_version,
    parse_openai_models, parse_queue_metrics, parse_work_tokens,
};
use crate::{EngineConfig, EngineError, InventoryRead, Observation, PortUse, ProbeFailure};

/// Largest engine answer read; real listings are a few KiB.
const MAX_BODY: usize = 8 << 20;

/// A reqwest client for local engines: plain HTTP, no proxy from the
/// environment, every request bounded by `timeout`.
///
/// The workspace builds reqwest without a default TLS provider; an empty
/// rustls configuration on `ring` satisfies it without a process-wide
/// install, and engine URLs are `http://` only anyway.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, EngineError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map(|b| {
            b.with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth()
        });
    let mut builder = reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(2);
    if let Ok(tls) = tls {
        builder = builder.tls_backend_preconfigured(tls);
    }
    builder.build().map_err(EngineError::Client)
}

/// Which LM Studio listing answered last (newest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LmsApi {
    V1,
    V0,
    OpenAi,
}

/// Polls one engine. Keeps only what it learned about the engine's routes
/// (which optional endpoints exist), forgotten whenever a poll fails, since
/// the engine that comes back may be another build with other flags.
#[derive(Debug)]
pub struct EngineProbe {
    client: reqwest::Client,
    config: EngineConfig,
    ollama_installed: Option<Vec<ModelEntry>>,
    lms_api: Option<LmsApi>,
    has_health_route: Option<bool>,
    has_metrics: Option<bool>,
    has_props: Option<bool>,
    has_slots: Option<bool>,
    has_version: Option<bool>,
}

impl EngineProbe {
    pub fn new(config: EngineConfig, timeout: Duration) -> Result<Self, EngineError> {
        Ok(Self::with_client(config, http_client(timeout)?))
    }

    /// Shares a client (and its connection pool) between probes.
    pub fn with_client(config: EngineConfig, client: reqwest::Client) -> Self {
        Self {
            client,
            config,
            ollama_installed: None,
            lms_api: None,
            has_health_route: None,
            has_metrics: None,
            has_props: None,
            has_slots: None,
            has_version: None,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// One poll: health always; the model list as `inventory` says (Ollama's
    /// `/api/ps` and LM Studio's listing every time, as they carry the
    /// loaded state); queue gauges where the engine exports them.
    pub async fn poll(&mut self, inventory: InventoryRead) -> Observation {
        let obs = match self.config.kind {
            EngineKind::Ollama => self.poll_ollama(inventory).await,
            EngineKind::LmStudio => self.poll_lmstudio().await,
            EngineKind::OpenAiCompat => self.poll_openai(inventory).await,
        };
        if obs.health.is_err() {
            self.forget();
        }
        obs
    }

    /// Whether the configured engine answers its own API at the configured
    /// URL: [`PortUse::Free`] if nothing listens, [`PortUse::Other`] if
    /// something else (or something silent) does.
    pub async fn identify(&self) -> PortUse {
        let kind = self.config.kind;
        let answer = match kind {
            EngineKind::Ollama => self
                .get("/api/version")
                .await
                .map(|b| parse_ollama_version(&b).is_ok()),
            EngineKind::LmStudio => {
                let mut answer = Ok(false);
                for (path, parse) in [
                    ("/api/v1/models", lms_v1 as fn(&[u8]) -> bool),
                    ("/api/v0/models", lms_v0),
                    ("/v1/models", lms_openai),
                ] {
                    answer = self.get(path).await.map(|b| parse(&b));
                    if matches!(answer, Ok(true) | Err(ProbeFailure::Refused)) {
                        break;
                    }
                }
                answer
            }
            EngineKind::OpenAiCompat => self
                .get("/v1/models")
                .await
                .map(|b| parse_openai_models(kind, &b).is_ok()),
        };
        match answer {
            Ok(true) => PortUse::Engine,
            Err(ProbeFailure::Refused) => PortUse::Free,
            Ok(false) | Err(_) => PortUse::Other,
        }
    }

    fn forget(&mut self) {
        self.ollama_installed = None;
        self.lms_api = None;
        self.has_health_route = None;
        self.has_metrics = None;
        self.has_props = None;
        self.has_slots = None;
        self.has_version = None;
    }

    async fn get(&self, path: &str) -> Result<bytes::Bytes, ProbeFailure> {
        get_body(&self.client, self.config.base_url.join(path)).await
    }

    async fn poll_ollama(&mut self, inventory: InventoryRead) -> Observation {
        let version = match self.get("/api/version").await {
            Ok(b) => match parse_ollama_version(&b) {
                Ok(v) => v,
                Err(_) => return Observation::failed(ProbeFailure::BadBody),
            },
            Err(f) => return Observation::failed(f),
        };
        if (inventory.any() || self.ollama_installed.is_none())
            && let Ok(b) = self.get("/api/tags").await
            && let Ok(list) = parse_ollama_tags(&b)
        {
            self.ollama_installed = Some(list);
        }
        let loaded = match self.get("/api/ps").await {
            Ok(b) => parse_ollama_ps(&b).ok(),
            Err(_) => None,
        };
        let models = match (&self.ollama_installed, loaded) {
            (Some(installed), Some(loaded)) => Some(merge_ollama(installed, &loaded)),
            _ => None,
        };
        Observation {
            health: Ok(()),
            models,
            slots: None,
            queue: None,
            version: Some(version),
            work_tokens: None,
            continues_chat: None,
        }
    }

    /// LM Studio has no health route: its model listing is the health
    /// check, and it carries the loaded state, so it is read every poll.
    async fn poll_lmstudio(&mut self) -> Observation {
        let order: &[LmsApi] = match self.lms_api {
            Some(LmsApi::V1) | None => &[LmsApi::V1, LmsApi::V0, LmsApi::OpenAi],
            Some(LmsApi::V0) => &[LmsApi::V0, LmsApi::OpenAi],
            Some(LmsApi::OpenAi) => &[LmsApi::OpenAi],
        };
        let mut last = ProbeFailure::Status(404);
        for &api in order {
            let path = match api {
                LmsApi::V1 => "/api/v1/models",
                LmsApi::V0 => "/api/v0/models",
                LmsApi::OpenAi => "/v1/models",
            };
            match self.get(path).await {
                Ok(b) => {
                    let parsed = match api {
                        LmsApi::V1 => parse_lmstudio_v1(&b),
                        LmsApi::V0 => parse_lmstudio_v0(&b),
                        LmsApi::OpenAi => parse_openai_models(EngineKind::LmStudio, &b),
                    };
                    // Older builds may answer an unknown route with an
                    // error body and 200: try the next listing then too.
                    let Ok(models) = parsed else {
                        last = ProbeFailure::BadBody;
                        continue;
                    };
                    self.lms_api = Some(api);
                    return Observation {
                        health: Ok(()),
                        models: Some(models),
                        slots: None,
                        queue: None,
                        version: None,
                        work_tokens: None,
                        continues_chat: None,
                    };
                }
                // An older LM Studio: try the next listing.
                Err(f @ ProbeFailure::Status(404)) => last = f,
                Err(f) => return Observation::failed(f),
            }
        }
        Observation::failed(last)
    }

    /// OpenAI-compatible servers: `/health` where it exists (llama.cpp,
    /// vLLM). llama-cpp-python has none; its 404 still proves the HTTP
    /// server is up, and unlike `/v1/models` it does not wait for (or, with
    /// default settings, interrupt) a running generation. For the same
    /// reason the model list of such a server is read only when required.
    async fn poll_openai(&mut self, inventory: InventoryRead) -> Observation {
        let kind = self.config.kind;
        match self.get("/health").await {
            Ok(_) => self.has_health_route = Some(true),
            Err(ProbeFailure::Status(404 | 405)) => self.has_health_route = Some(false),
            Err(f) => return Observation::failed(f),
        }
        let mut obs = Observation {
            health: Ok(()),
            models: None,
            slots: None,
            queue: None,
            version: None,
            work_tokens: None,
            continues_chat: None,
        };
        if self.has_metrics != Some(false) {
            match self.get("/metrics").await {
                Ok(b) => {
                    let text = String::from_utf8_lossy(&b);
                    obs.queue = parse_queue_metrics(&text);
                    obs.work_tokens = parse_work_tokens(&text);
                    self.has_metrics = Some(obs.queue.is_some() || obs.work_tokens.is_some());
                }
                Err(ProbeFailure::Status(404 | 405 | 501)) => self.has_metrics = Some(false),
                Err(_) => {}
            }
        }
        // llama.cpp serves `/metrics` only with `--metrics`, `/slots` by
        // default: where there are no counters, its slots show the work.
        if self.has_metrics == Some(false) && self.has_slots != Some(false) {
            match self.get("/slots").await {
                Ok(b) => {
                    obs.work_tokens = parse_llamacpp_slot_work(&b);
                    self.has_slots = Some(obs.work_tokens.is_some());
                }
                Err(ProbeFailure::Status(_)) => self.has_slots = Some(false),
                Err(_) => {}
            }
        }
        let read = match inventory {
            InventoryRead::Skip => false,
            InventoryRead::Periodic => self.has_health_route != Some(false),
            InventoryRead::Required => true,
        };
        if read {
            if self.has_props != Some(false) {
                match self.get("/props").await {
                    Ok(b) => {
                        obs.slots = parse_llamacpp_slots(&b).ok().flatten();
                        self.has_props = Some(true);
                    }
                    Err(ProbeFailure::Status(_)) => self.has_props = Some(false),
                    Err(_) => {}
                }
            }
            if let Ok(b) = self.get("/v1/models").await {
                obs.models = parse_openai_models(kind, &b).ok();
            }
            obs.continues_chat = self.continues_chat().await;
        }
        obs
    }

    /// Whether this OpenAI-compatible server continues a chat's final
    /// assistant message, told by its routes, without generating anything
    /// (a probe completion would load a model, or on llama-cpp-python's
    /// server interrupt a running one): llama.cpp's server (`/props`) and
    /// vLLM (`/version`) do; a server with neither, such as
    /// llama-cpp-python's, is not known to (it closes the message and
    /// starts a new turn). `None`: not told this poll.
    async fn continues_chat(&mut self) -> Option<bool> {
        if self.has_props? {
            return Some(true);
        }
        if self.has_version.is_none() {
            match self.get("/version").await {
                Ok(b) => self.has_version = Some(is_vllm_version(&b)),
                Err(ProbeFailure::Status(_)) => self.has_version = Some(false),
                Err(_) => return None,
            }
        }
        self.has_version
    }
}

/// `GET url` under the client's deadline: the body of a 2xx answer, at
/// most [`MAX_BODY`] bytes, or why there is none.
pub(crate) async fn get_body(
    client: &reqwest::Client,
    url: String,
) -> Result<bytes::Bytes, ProbeFailure> {
    let resp = client.get(url).send().await.map_err(classify)?;
    let status = resp.status();
    if !status.is_success() {
        return Err(ProbeFailure::Status(status.as_u16()));
    }
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(ProbeFailure::BadBody);
    }
    let body = resp.bytes().await.map_err(classify)?;
    if body.len() > MAX_BODY {
        return Err(ProbeFailure::BadBody);
    }
    Ok(body)
}

/// vLLM's `GET /version`: `{"version": "0.8.5"}`.
fn is_vllm_version(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .is_some_and(|v| v.get("version").is_some_and(serde_json::Value::is_string))
}

fn lms_v1(b: &[u8]) -> bool {
    parse_lmstudio_v1(b).is_ok()
}

fn lms_v0(b: &[u8]) -> bool {
    parse_lmstudio_v0(b).is_ok()
}

fn lms_openai(b: &[u8]) -> bool {
    parse_openai_models(EngineKind::LmStudio, b).is_ok()
}

fn classify(e: reqwest::Error) -> ProbeFailure {
    if e.is_timeout() {
        ProbeFailure::Timeout
    } else if e.is_connect() {
        ProbeFailure::Refused
    } else {
        ProbeFailure::Transport
    }
}
