//! Pure parsers for what engines say about themselves: the real JSON shapes
//! of Ollama, LM Studio and OpenAI-compatible servers, and Prometheus queue
//! gauges, turned into [`ModelEntry`] lists and [`QueueDepth`]. No I/O.
//!
//! Parsers are lenient about what they do not need (unknown fields, missing
//! optional ones, single entries with invalid names are skipped) and strict
//! about the envelope: a body without the expected list is an error, so a
//! foreign server on the port is not mistaken for an empty engine.

use pair_core::{EngineKind, ModelEntry, ModelName};
use serde::Deserialize;

use crate::EngineError;

/// Requests an engine is running and holding back, from its `/metrics`
/// (vLLM `vllm:num_requests_running` / `vllm:num_requests_waiting`, llama.cpp
/// `llamacpp:requests_processing` / `llamacpp:requests_deferred`).
///
/// This sees work sent straight to the engine's port, which PAIR cannot.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct QueueDepth {
    pub running: u32,
    pub waiting: u32,
}

/// A model Ollama holds in memory (`/api/ps`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OllamaLoaded {
    pub name: ModelName,
    /// Memory the loaded model takes, bytes.
    pub size: Option<u64>,
    /// Of which in VRAM, bytes (0 on CPU-only machines).
    pub size_vram: Option<u64>,
}

fn bad_body(
    kind: EngineKind,
    endpoint: &'static str,
) -> impl FnOnce(serde_json::Error) -> EngineError {
    move |source| EngineError::BadBody {
        kind,
        endpoint,
        source,
    }
}

fn entry(name: ModelName, size_bytes: Option<u64>, loaded: bool) -> ModelEntry {
    ModelEntry {
        name,
        size_bytes,
        loaded,
        perf: None,
        learned: false,
    }
}

/// Adds `e` unless an entry with the same (engine-aware) name is there; a
/// duplicate can only raise `loaded` and fill a missing size.
fn push_unique(out: &mut Vec<ModelEntry>, e: ModelEntry, kind: EngineKind) {
    match out
        .iter_mut()
        .find(|m| m.name.matches(e.name.as_str(), kind))
    {
        Some(m) => {
            m.loaded |= e.loaded;
            m.size_bytes = m.size_bytes.or(e.size_bytes);
        }
        None => out.push(e),
    }
}

// ---------------------------------------------------------------- Ollama

#[derive(Deserialize)]
struct OllamaVersion {
    version: String,
}

/// `GET /api/version` -> `{"version":"0.12.3"}`.
pub fn parse_ollama_version(body: &[u8]) -> Result<String, EngineError> {
    serde_json::from_slice::<OllamaVersion>(body)
        .map(|v| v.version)
        .map_err(bad_body(EngineKind::Ollama, "/api/version"))
}

#[derive(Deserialize)]
struct OllamaList {
    models: Vec<OllamaModel>,
}

#[derive(Deserialize)]
struct OllamaModel {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    size_vram: Option<u64>,
}

impl OllamaModel {
    fn model_name(&self) -> Option<ModelName> {
        let raw = self.name.as_deref().or(self.model.as_deref())?;
        ModelName::new(raw).ok()
    }
}

/// `GET /api/tags`: installed models with their size on disk; none loaded
/// (see [`merge_ollama`]).
pub fn parse_ollama_tags(body: &[u8]) -> Result<Vec<ModelEntry>, EngineError> {
    let list: OllamaList =
        serde_json::from_slice(body).map_err(bad_body(EngineKind::Ollama, "/api/tags"))?;
    let mut out = Vec::with_capacity(list.models.len());
    for m in list.models {
        if let Some(name) = m.model_name() {
            push_unique(&mut out, entry(name, m.size, false), EngineKind::Ollama);
        }
    }
    Ok(out)
}

/// `GET /api/ps`: models loaded in memory right now.
pub fn parse_ollama_ps(body: &[u8]) -> Result<Vec<OllamaLoaded>, EngineError> {
    let list: OllamaList =
        serde_json::from_slice(body).map_err(bad_body(EngineKind::Ollama, "/api/ps"))?;
    Ok(list
        .models
        .into_iter()
        .filter_map(|m| {
            Some(OllamaLoaded {
                name: m.model_name()?,
                size: m.size,
                size_vram: m.size_vram,
            })
        })
        .collect())
}

/// Installed models with `loaded` set from `/api/ps`. A loaded model missing
/// from the installed list (deleted while in memory, or the two listings
/// taken a moment apart) is still served, so it is kept.
pub fn merge_ollama(installed: &[ModelEntry], loaded: &[OllamaLoaded]) -> Vec<ModelEntry> {
    let kind = EngineKind::Ollama;
    let mut out: Vec<ModelEntry> = installed
        .iter()
        .map(|m| ModelEntry {
            loaded: loaded.iter().any(|l| m.name.matches(l.name.as_str(), kind)),
            ..m.clone()
        })
        .collect();
    for l in loaded {
        push_unique(&mut out, entry(l.name.clone(), l.size, true), kind);
    }
    out
}

// ------------------------------------------------------------- LM Studio

#[derive(Deserialize)]
struct LmsV1List {
    models: Vec<LmsV1Model>,
}

#[derive(Deserialize)]
struct LmsV1Model {
    key: String,
    #[serde(default)]
    size_bytes: Option<u64>,
    #[serde(default)]
    loaded_instances: Vec<LmsInstance>,
}

#[derive(Deserialize)]
struct LmsInstance {
    id: String,
}

/// LM Studio 0.4+ `GET /api/v1/models`: every downloaded model by `key`,
/// with its size, loaded when it has a loaded instance. Extra instances
/// (`key:2`, custom identifiers) are addressable names of their own, so they
/// are listed too, loaded.
pub fn parse_lmstudio_v1(body: &[u8]) -> Result<Vec<ModelEntry>, EngineError> {
    let kind = EngineKind::LmStudio;
    let list: LmsV1List = serde_json::from_slice(body).map_err(bad_body(kind, "/api/v1/models"))?;
    let mut out = Vec::with_capacity(list.models.len());
    for m in list.models {
        let Ok(name) = ModelName::new(m.key.as_str()) else {
            continue;
        };
        push_unique(
            &mut out,
            entry(name, m.size_bytes, !m.loaded_instances.is_empty()),
            kind,
        );
        for inst in &m.loaded_instances {
            if inst.id != m.key
                && let Ok(name) = ModelName::new(inst.id.as_str())
            {
                push_unique(&mut out, entry(name, m.size_bytes, true), kind);
            }
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct OpenAiList<T> {
    data: Vec<T>,
}

#[derive(Deserialize)]
struct LmsV0Model {
    id: String,
    #[serde(default)]
    state: Option<String>,
}

/// LM Studio 0.3.6+ `GET /api/v0/models`: `state` is `loaded` or
/// `not-loaded`; no sizes.
pub fn parse_lmstudio_v0(body: &[u8]) -> Result<Vec<ModelEntry>, EngineError> {
    let kind = EngineKind::LmStudio;
    let list: OpenAiList<LmsV0Model> =
        serde_json::from_slice(body).map_err(bad_body(kind, "/api/v0/models"))?;
    let mut out = Vec::with_capacity(list.data.len());
    for m in list.data {
        if let Ok(name) = ModelName::new(m.id) {
            let loaded = m.state.as_deref() == Some("loaded");
            push_unique(&mut out, entry(name, None, loaded), kind);
        }
    }
    Ok(out)
}

// ----------------------------------------------------- OpenAI-compatible

#[derive(Deserialize)]
struct OpenAiModel {
    id: String,
    /// llama.cpp server: `meta.size` is the model's size in bytes.
    #[serde(default)]
    meta: Option<LlamaCppMeta>,
}

#[derive(Deserialize)]
struct LlamaCppMeta {
    #[serde(default)]
    size: Option<u64>,
}

/// `GET /v1/models` of an OpenAI-compatible server. llama.cpp, vLLM and
/// llama-cpp-python list only the models they have loaded, so every entry is
/// loaded. `kind` names the engine for error messages and name matching (LM
/// Studio also answers this route).
pub fn parse_openai_models(kind: EngineKind, body: &[u8]) -> Result<Vec<ModelEntry>, EngineError> {
    let list: OpenAiList<OpenAiModel> =
        serde_json::from_slice(body).map_err(bad_body(kind, "/v1/models"))?;
    let mut out = Vec::with_capacity(list.data.len());
    for m in list.data {
        if let Ok(name) = ModelName::new(m.id) {
            let size = m.meta.and_then(|meta| meta.size);
            // LM Studio's /v1/models lists downloaded models (JIT loading),
            // so nothing can be said about loaded state there.
            let loaded = kind == EngineKind::OpenAiCompat;
            push_unique(&mut out, entry(name, size, loaded), kind);
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
struct LlamaCppProps {
    #[serde(default)]
    total_slots: Option<u64>,
}

/// llama.cpp server `GET /props`: `total_slots` is `-np` (4 by default in
/// recent builds). `None` when the field is absent or zero.
pub fn parse_llamacpp_slots(body: &[u8]) -> Result<Option<u16>, EngineError> {
    let props: LlamaCppProps =
        serde_json::from_slice(body).map_err(bad_body(EngineKind::OpenAiCompat, "/props"))?;
    Ok(props
        .total_slots
        .filter(|&n| n > 0)
        .map(|n| u16::try_from(n).unwrap_or(u16::MAX)))
}

// ------------------------------------------------------------ Prometheus

const RUNNING: [&str; 2] = ["vllm:num_requests_running", "llamacpp:requests_processing"];
const WAITING: [&str; 2] = ["vllm:num_requests_waiting", "llamacpp:requests_deferred"];

/// Token counters: what an engine has processed since it started.
const WORK: [&str; 4] = [
    "llamacpp:prompt_tokens_total",
    "llamacpp:tokens_predicted_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
];

/// Each sample of a Prometheus text exposition: its metric name and its
/// value (finite, not negative).
fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let name = &line[..name_end];
        // The value follows the label set (which may contain spaces inside
        // quoted values), then an optional timestamp.
        let after_labels = match line[name_end..].strip_prefix('{') {
            Some(labels) => labels.rfind('}').map(|i| &labels[i + 1..]),
            None => Some(&line[name_end..]),
        };
        let value = after_labels?
            .split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)?;
        Some((name, value))
    })
}

/// Queue gauges from a Prometheus text exposition. Values are summed over
/// label sets (vLLM labels by model and engine). `None` when neither gauge
/// is present: the server exports no queue figures.
pub fn parse_queue_metrics(text: &str) -> Option<QueueDepth> {
    let mut found = false;
    let mut running = 0.0_f64;
    let mut waiting = 0.0_f64;
    for (name, v) in samples(text) {
        if RUNNING.contains(&name) {
            running += v;
        } else if WAITING.contains(&name) {
            waiting += v;
        } else {
            continue;
        }
        found = true;
    }
    found.then(|| QueueDepth {
        running: to_count(running),
        waiting: to_count(waiting),
    })
}

/// The engine's token counters summed (prompt and generated tokens since
/// it started): when the sum moves, the engine is working, whether or not
/// a token reached pair. `None` when it exports none.
pub fn parse_work_tokens(text: &str) -> Option<u64> {
    let mut total: Option<f64> = None;
    for (name, v) in samples(text) {
        if WORK.contains(&name) {
            *total.get_or_insert(0.0) += v;
        }
    }
    total.map(|t| t.min(u64::MAX as f64) as u64)
}

/// llama.cpp server `GET /slots` (on by default, unlike its `/metrics`):
/// the tokens its slots have decoded for the requests they hold, summed.
/// A request's count starts again at 0, so a change of the sum, either
/// way, is work. `None` when the body is not a list of slots.
pub fn parse_llamacpp_slot_work(body: &[u8]) -> Option<u64> {
    let slots: Vec<serde_json::Value> = serde_json::from_slice(body).ok()?;
    Some(
        slots
            .iter()
            .map(|slot| {
                // An object in current servers, a list of one in older ones.
                let next = &slot["next_token"];
                let next = next.as_array().and_then(|a| a.first()).unwrap_or(next);
                next["n_decoded"].as_u64().unwrap_or(0)
            })
            .fold(0_u64, u64::saturating_add),
    )
}

fn to_count(v: f64) -> u32 {
    // Gauges are counts exported as floats ("2.0"); clamp anything absurd.
    if v >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        // In range and non-negative: the cast cannot truncate meaningfully.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = v.round() as u32;
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Shapes copied from real servers (trimmed digests).
    const OLLAMA_TAGS: &str = r#"{"models":[
      {"name":"llama3.2:latest","model":"llama3.2:latest","modified_at":"2025-05-01T10:12:44.143318+02:00",
       "size":2019393189,"digest":"a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
       "details":{"parent_model":"","format":"gguf","family":"llama","families":["llama"],
                  "parameter_size":"3.2B","quantization_level":"Q4_K_M"}},
      {"name":"qwen2.5:0.5b","model":"qwen2.5:0.5b","modified_at":"2025-04-02T09:00:00Z",
       "size":397821319,"digest":"a8b0c5157701","details":{"format":"gguf","family":"qwen2"}},
      {"name":"nomic-embed-text:latest","model":"nomic-embed-text:latest","size":274302450,
       "digest":"0a109f422b47","details":{"family":"nomic-bert"}}
    ]}"#;

    const OLLAMA_PS: &str = r#"{"models":[
      {"name":"llama3.2:latest","model":"llama3.2:latest","size":3309707264,
       "digest":"a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
       "details":{"parent_model":"","format":"gguf","family":"llama","families":["llama"],
                  "parameter_size":"3.2B","quantization_level":"Q4_K_M"},
       "expires_at":"2025-05-01T10:20:01.7213+02:00","size_vram":3309707264,"context_length":4096}
    ]}"#;

    const LMS_V1: &str = r#"{"models":[
      {"type":"llm","publisher":"lmstudio-community","key":"gemma-3-270m-it-qat",
       "display_name":"Gemma 3 270m Instruct Qat","architecture":"gemma3",
       "quantization":{"name":"Q4_0","bits_per_weight":4},"size_bytes":241410208,"params_string":"270M",
       "loaded_instances":[{"id":"gemma-3-270m-it-qat","config":{"context_length":4096}},
                           {"id":"gemma-3-270m-it-qat:2","config":{"context_length":8192}}],
       "max_context_length":32768,"format":"gguf",
       "capabilities":{"vision":false,"trained_for_tool_use":false},"description":null},
      {"type":"embedding","publisher":"gaianet","key":"text-embedding-nomic-embed-text-v1.5-embedding",
       "display_name":"Nomic Embed Text v1.5","quantization":{"name":"F16","bits_per_weight":16},
       "size_bytes":274290560,"params_string":null,"loaded_instances":[],"max_context_length":2048,"format":"gguf"}
    ]}"#;

    const LMS_V0: &str = r#"{"object":"list","data":[
      {"id":"qwen2-vl-7b-instruct","object":"model","type":"vlm","publisher":"mlx-community","arch":"qwen2_vl",
       "compatibility_type":"mlx","quantization":"4bit","state":"not-loaded","max_context_length":32768},
      {"id":"meta-llama-3.1-8b-instruct","object":"model","type":"llm","publisher":"lmstudio-community",
       "arch":"llama","compatibility_type":"gguf","quantization":"Q4_K_M","state":"loaded","max_context_length":131072}
    ]}"#;

    const LLAMA_CPP_PY: &str = r#"{"object":"list","data":[{"id":"smollm2","object":"model","owned_by":"me","permissions":[]}]}"#;

    const LLAMA_SERVER: &str = r#"{"models":[{"name":"smollm2.gguf","model":"smollm2.gguf","modified_at":"",
      "size":"","digest":"","type":"model","description":"","tags":[""],"capabilities":["completion"],
      "parameters":"","details":{"parent_model":"","format":"gguf","family":"","families":[""],
      "parameter_size":"","quantization_level":""}}],
      "object":"list","data":[{"id":"smollm2.gguf","object":"model","created":1764460000,"owned_by":"llamacpp",
      "meta":{"vocab_type":2,"n_vocab":49152,"n_ctx_train":8192,"n_embd":576,"n_params":134515008,"size":98362432}}]}"#;

    const VLLM_MODELS: &str = r#"{"object":"list","data":[{"id":"Qwen/Qwen2.5-1.5B-Instruct","object":"model",
      "created":1764460000,"owned_by":"vllm","root":"Qwen/Qwen2.5-1.5B-Instruct","parent":null,
      "max_model_len":32768,"permission":[{"id":"modelperm-1","object":"model_permission","created":1764460000,
      "allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,
      "allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}"#;

    const VLLM_METRICS: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 7.0
vllm:num_requests_waiting{engine="1",model_name="a b}c"} 1.0 1764460000000
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage.
vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-1.5B-Instruct"} 0.25
"#;

    const LLAMA_METRICS: &str = "# HELP llamacpp:requests_processing Number of requests processing.\n\
# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n\
# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 2\n";

    fn names(v: &[ModelEntry]) -> Vec<&str> {
        v.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn ollama_tags_and_ps_merge_into_loaded_state() {
        assert_eq!(
            parse_ollama_version(br#"{"version":"0.12.3"}"#).unwrap(),
            "0.12.3"
        );
        let installed = parse_ollama_tags(OLLAMA_TAGS.as_bytes()).unwrap();
        assert_eq!(
            names(&installed),
            ["llama3.2:latest", "qwen2.5:0.5b", "nomic-embed-text:latest"]
        );
        assert_eq!(installed[0].size_bytes, Some(2_019_393_189));
        assert!(installed.iter().all(|m| !m.loaded));

        let loaded = parse_ollama_ps(OLLAMA_PS.as_bytes()).unwrap();
        assert_eq!(loaded[0].size_vram, Some(3_309_707_264));
        let merged = merge_ollama(&installed, &loaded);
        assert_eq!(merged.len(), 3);
        assert!(merged[0].loaded);
        assert!(!merged[1].loaded);
        // Installed size (disk) is kept, not the in-memory size.
        assert_eq!(merged[0].size_bytes, Some(2_019_393_189));
    }

    #[test]
    fn ollama_loaded_but_not_listed_is_kept_and_latest_rule_applies() {
        let installed = parse_ollama_tags(br#"{"models":[{"name":"llama3","size":5}]}"#).unwrap();
        let loaded = parse_ollama_ps(
            br#"{"models":[{"name":"llama3:latest","size":9},{"model":"gone:7b","size":11}]}"#,
        )
        .unwrap();
        let merged = merge_ollama(&installed, &loaded);
        assert_eq!(names(&merged), ["llama3", "gone:7b"]);
        assert!(merged.iter().all(|m| m.loaded));
        assert_eq!(merged[1].size_bytes, Some(11));
    }

    #[test]
    fn ollama_empty_lists_and_foreign_bodies() {
        assert!(parse_ollama_tags(br#"{"models":[]}"#).unwrap().is_empty());
        assert!(parse_ollama_ps(br#"{"models":[]}"#).unwrap().is_empty());
        // An OpenAI server on the port is not an empty Ollama.
        let err = parse_ollama_tags(LLAMA_CPP_PY.as_bytes()).unwrap_err();
        assert!(matches!(
            err,
            EngineError::BadBody {
                endpoint: "/api/tags",
                ..
            }
        ));
        assert!(parse_ollama_version(b"<html>").is_err());
        // A bad name is skipped, not fatal.
        let v = parse_ollama_tags(br#"{"models":[{"name":""},{"name":"ok"}]}"#).unwrap();
        assert_eq!(names(&v), ["ok"]);
    }

    #[test]
    fn lmstudio_v1_lists_downloaded_with_loaded_instances() {
        let v = parse_lmstudio_v1(LMS_V1.as_bytes()).unwrap();
        assert_eq!(
            names(&v),
            [
                "gemma-3-270m-it-qat",
                "gemma-3-270m-it-qat:2",
                "text-embedding-nomic-embed-text-v1.5-embedding"
            ]
        );
        assert!(v[0].loaded && v[1].loaded && !v[2].loaded);
        assert_eq!(v[0].size_bytes, Some(241_410_208));
        assert_eq!(v[2].size_bytes, Some(274_290_560));
    }

    #[test]
    fn lmstudio_v0_state_field() {
        let v = parse_lmstudio_v0(LMS_V0.as_bytes()).unwrap();
        assert_eq!(
            names(&v),
            ["qwen2-vl-7b-instruct", "meta-llama-3.1-8b-instruct"]
        );
        assert!(!v[0].loaded && v[1].loaded);
        assert!(v.iter().all(|m| m.size_bytes.is_none()));
        assert!(parse_lmstudio_v0(LMS_V1.as_bytes()).is_err());
    }

    #[test]
    fn openai_models_of_each_server() {
        let k = EngineKind::OpenAiCompat;
        let py = parse_openai_models(k, LLAMA_CPP_PY.as_bytes()).unwrap();
        assert_eq!(names(&py), ["smollm2"]);
        assert!(py[0].loaded && py[0].size_bytes.is_none());

        let server = parse_openai_models(k, LLAMA_SERVER.as_bytes()).unwrap();
        assert_eq!(names(&server), ["smollm2.gguf"]);
        assert_eq!(server[0].size_bytes, Some(98_362_432));

        let vllm = parse_openai_models(k, VLLM_MODELS.as_bytes()).unwrap();
        assert_eq!(names(&vllm), ["Qwen/Qwen2.5-1.5B-Instruct"]);

        // Through LM Studio's OpenAI route, loaded state is unknown.
        let lms = parse_openai_models(EngineKind::LmStudio, LLAMA_CPP_PY.as_bytes()).unwrap();
        assert!(!lms[0].loaded);

        assert!(parse_openai_models(k, OLLAMA_TAGS.as_bytes()).is_err());
    }

    #[test]
    fn llamacpp_slots_show_decoded_tokens() {
        let now = br#"[{"id":0,"is_processing":true,"next_token":{"has_next_token":true,"n_remain":90,"n_decoded":10}},
                        {"id":1,"is_processing":false,"next_token":{"has_next_token":false,"n_remain":-1,"n_decoded":0}}]"#;
        assert_eq!(parse_llamacpp_slot_work(now), Some(10));
        let older =
            br#"[{"id":0,"next_token":[{"n_decoded":3}]},{"id":1,"next_token":[{"n_decoded":4}]}]"#;
        assert_eq!(parse_llamacpp_slot_work(older), Some(7));
        assert_eq!(parse_llamacpp_slot_work(b"[]"), Some(0));
        assert_eq!(parse_llamacpp_slot_work(br#"{"error":"no"}"#), None);
    }

    #[test]
    fn llamacpp_props_slots() {
        let props = br#"{"default_generation_settings":{"n_ctx":8192},"total_slots":4,"model_path":"m.gguf","chat_template":"x"}"#;
        assert_eq!(parse_llamacpp_slots(props).unwrap(), Some(4));
        assert_eq!(parse_llamacpp_slots(br#"{"total_slots":0}"#).unwrap(), None);
        assert_eq!(parse_llamacpp_slots(b"{}").unwrap(), None);
        assert_eq!(
            parse_llamacpp_slots(br#"{"total_slots":100000}"#).unwrap(),
            Some(u16::MAX)
        );
    }

    #[test]
    fn queue_gauges_from_vllm_and_llamacpp() {
        assert_eq!(
            parse_queue_metrics(VLLM_METRICS),
            Some(QueueDepth {
                running: 3,
                waiting: 8
            })
        );
        assert_eq!(
            parse_queue_metrics(LLAMA_METRICS),
            Some(QueueDepth {
                running: 1,
                waiting: 2
            })
        );
        assert_eq!(
            parse_queue_metrics("# nothing\nprocess_cpu_seconds_total 3\n"),
            None
        );
        assert_eq!(parse_queue_metrics("vllm:num_requests_running NaN\n"), None);
        assert_eq!(parse_queue_metrics(""), None);
    }

    #[test]
    fn token_counters_sum_prompt_and_generated_tokens() {
        // As llama.cpp's server exports them (with --metrics).
        let llama = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n\
# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 1200\n\
# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 345\n\
llamacpp:requests_processing 1\n";
        assert_eq!(parse_work_tokens(llama), Some(1545));
        // vLLM labels by model and engine: summed.
        let vllm = "vllm:prompt_tokens_total{model_name=\"q\"} 10.0\n\
vllm:generation_tokens_total{model_name=\"q\"} 5.0\n\
vllm:generation_tokens_total{model_name=\"r\"} 2.0\n";
        assert_eq!(parse_work_tokens(vllm), Some(17));
        assert_eq!(parse_work_tokens(LLAMA_METRICS), None);
        assert_eq!(parse_work_tokens(VLLM_METRICS), None);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_ollama_tags(&body);
            let _ = parse_ollama_ps(&body);
            let _ = parse_lmstudio_v1(&body);
            let _ = parse_lmstudio_v0(&body);
            let _ = parse_openai_models(EngineKind::OpenAiCompat, &body);
            let _ = parse_llamacpp_slots(&body);
            let _ = parse_queue_metrics(&String::from_utf8_lossy(&body));
        }

        #[test]
        fn ollama_merge_keeps_every_installed_model_once(
            installed in proptest::collection::vec("[a-z]{1,6}(:[a-z0-9]{1,3})?", 0..8),
            loaded in proptest::collection::vec("[a-z]{1,6}(:[a-z0-9]{1,3})?", 0..8),
        ) {
            let kind = EngineKind::Ollama;
            let body = |v: &[String]| serde_json::json!({
                "models": v.iter().map(|n| serde_json::json!({"name": n, "size": 1})).collect::<Vec<_>>()
            }).to_string();
            let inst = parse_ollama_tags(body(&installed).as_bytes()).unwrap();
            let ps = parse_ollama_ps(body(&loaded).as_bytes()).unwrap();
            let merged = merge_ollama(&inst, &ps);
            for name in installed.iter().chain(&loaded) {
                let hits = merged.iter().filter(|m| m.name.matches(name, kind)).count();
                prop_assert_eq!(hits, 1, "{} listed {} times", name, hits);
            }
            for m in &merged {
                let is_loaded = loaded.iter().any(|l| m.name.matches(l, kind));
                prop_assert_eq!(m.loaded, is_loaded);
            }
        }

        #[test]
        fn queue_gauges_sum_over_label_sets(r in proptest::collection::vec(0u32..1000, 1..5), w in 0u32..1000) {
            let mut text = String::new();
            for (i, v) in r.iter().enumerate() {
                text.push_str(&format!("vllm:num_requests_running{{engine=\"{i}\"}} {v}.0\n"));
            }
            text.push_str(&format!("vllm:num_requests_waiting {w}\n"));
            let q = parse_queue_metrics(&text).unwrap();
            prop_assert_eq!(q.running, r.iter().sum::<u32>());
            prop_assert_eq!(q.waiting, w);
        }
    }
}
