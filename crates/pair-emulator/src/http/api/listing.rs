//! Liveness and listing routes: Ollama's root, version, tags, ps and show,
//! OpenAI's models, LM Studio's v0 and v1 models, llama.cpp's health.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::common::{model_of, parse};
use super::errors::unknown_model;
use crate::http::text::{self, unix_now};
use crate::http::{App, Flavor, json_response, residency_loaded};

/// Family, parameter size and quantisation Ollama reports in `details`.
fn details(app: &App, i: usize) -> Value {
    let spec = &app.cfg.models[i];
    let params = spec.size_bytes as f64 / 0.615;
    let parameter_size = if params >= 1e9 {
        format!("{:.1}B", params / 1e9)
    } else {
        format!("{:.0}M", params / 1e6)
    };
    let family = family(&spec.name);
    json!({
        "parent_model": "", "format": "gguf", "family": family, "families": [family],
        "parameter_size": parameter_size, "quantization_level": "Q4_K_M",
    })
}

fn family(name: &str) -> String {
    // `publisher/llama3.1:8b` -> `llama`
    let base = name.rsplit('/').next().unwrap_or(name);
    let base = base.split(':').next().unwrap_or(base);
    base.chars()
        .take_while(char::is_ascii_alphabetic)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// A fixed modification time, so listings are deterministic.
const MODIFIED_AT: &str = "2026-11-01T12:00:00.000000000Z";
const CREATED: u64 = 1_793_534_400;

pub(crate) async fn ollama_root() -> &'static str {
    "Ollama is running"
}

pub(crate) async fn health() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

/// llama.cpp's server `GET /props`: its slots (`-np`) and chat template.
/// Its routes tell pair it is llama.cpp's server, which continues a chat's
/// final assistant message, as this engine does.
pub(crate) async fn llamacpp_props(State(app): State<App>) -> Response {
    let slots = app.core.with_model(|m, _| m.slots());
    json_response(
        StatusCode::OK,
        &json!({
            "total_slots": slots,
            "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
            "build_info": "pair-emulator",
        }),
    )
}

pub(crate) async fn ollama_version() -> Response {
    json_response(StatusCode::OK, &json!({ "version": "0.12.6" }))
}

pub(crate) async fn ollama_tags(State(app): State<App>) -> Response {
    let models: Vec<Value> = (0..app.cfg.models.len())
        .map(|i| {
            let name = app.listed_name(i);
            json!({
                "name": name, "model": name, "modified_at": MODIFIED_AT,
                "size": app.cfg.models[i].size_bytes, "digest": text::digest(&name),
                "details": details(&app, i),
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

pub(crate) async fn ollama_ps(State(app): State<App>) -> Response {
    let loaded: Vec<(usize, u64)> = app.core.with_model(|m, now| {
        m.loaded_models()
            .map(|s| {
                // Seconds until keep-alive unloads it (Ollama shows the
                // default 5 minutes when none is set; busy models too).
                let left = m
                    .expires_at(s.index)
                    .map_or(300_000_000, |at| at.saturating_sub(now));
                (s.index, left / 1_000_000)
            })
            .collect()
    });
    let models: Vec<Value> = loaded
        .into_iter()
        .map(|(i, left_s)| {
            let expires = text::rfc3339(unix_now() + left_s, 0);
            let name = app.listed_name(i);
            let size = app.cfg.models[i].size_bytes;
            json!({
                "name": name, "model": name, "size": size, "digest": text::digest(&name),
                "details": details(&app, i), "expires_at": expires, "size_vram": size,
                "context_length": 4096,
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

pub(crate) async fn ollama_show(State(app): State<App>, body: Bytes) -> Response {
    let path = "/api/show";
    let req = match parse(&app, path, &body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let (i, _) = match model_of(&app, path, &req) {
        Ok(m) => m,
        Err(e) => return e,
    };
    let name = app.listed_name(i);
    let spec = &app.cfg.models[i];
    let embed = name.contains("embed");
    json_response(
        StatusCode::OK,
        &json!({
            "license": "", "modelfile": format!("FROM {name}\n"),
            "parameters": "stop \"<|im_end|>\"", "template": "{{ .Prompt }}",
            "details": details(&app, i),
            "model_info": {
                "general.architecture": family(&spec.name),
                "general.parameter_count": (spec.size_bytes as f64 / 0.615) as u64,
                "general.file_type": 15,
            },
            "capabilities": if embed { json!(["embedding"]) } else { json!(["completion"]) },
            "modified_at": MODIFIED_AT,
        }),
    )
}

fn openai_model_entry(app: &App, i: usize) -> Value {
    let owned_by = match app.cfg.flavor {
        Flavor::Ollama => "library",
        Flavor::OpenAi => "llamacpp",
        Flavor::LmStudio => "organization_owner",
    };
    json!({ "id": app.listed_name(i), "object": "model", "created": CREATED, "owned_by": owned_by })
}

pub(crate) async fn openai_models(State(app): State<App>) -> Response {
    let data: Vec<Value> = (0..app.cfg.models.len())
        .map(|i| openai_model_entry(&app, i))
        .collect();
    json_response(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

pub(crate) async fn openai_model(State(app): State<App>, Path(model): Path<String>) -> Response {
    match app.resolve(&model) {
        Some(i) => json_response(StatusCode::OK, &openai_model_entry(&app, i)),
        None => unknown_model(&app, "/v1/models", &model),
    }
}

fn loaded_set(app: &App) -> Vec<bool> {
    app.core
        .with_model(|m, _| m.models().map(|s| residency_loaded(s.residency)).collect())
}

fn lmstudio_v0_entry(app: &App, i: usize, loaded: bool) -> Value {
    let name = app.listed_name(i);
    let embed = name.contains("embed");
    json!({
        "id": name, "object": "model",
        "type": if embed { "embeddings" } else { "llm" },
        "publisher": "pair-emulator", "arch": family(&name),
        "compatibility_type": "gguf", "quantization": "Q4_K_M",
        "state": if loaded { "loaded" } else { "not-loaded" },
        "max_context_length": 4096,
    })
}

pub(crate) async fn lmstudio_v0_models(State(app): State<App>) -> Response {
    let loaded = loaded_set(&app);
    let data: Vec<Value> = loaded
        .iter()
        .enumerate()
        .map(|(i, l)| lmstudio_v0_entry(&app, i, *l))
        .collect();
    json_response(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

pub(crate) async fn lmstudio_v0_model(
    State(app): State<App>,
    Path(model): Path<String>,
) -> Response {
    match app.resolve(&model) {
        Some(i) => {
            let loaded = loaded_set(&app).get(i).copied().unwrap_or(false);
            json_response(StatusCode::OK, &lmstudio_v0_entry(&app, i, loaded))
        }
        None => unknown_model(&app, "/api/v0/models", &model),
    }
}

pub(crate) async fn lmstudio_v1_models(State(app): State<App>) -> Response {
    let loaded = loaded_set(&app);
    let models: Vec<Value> = loaded
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let name = app.listed_name(i);
            let instances = if *l {
                json!([{ "id": name, "config": { "context_length": 4096 } }])
            } else {
                json!([])
            };
            json!({
                "type": if name.contains("embed") { "embedding" } else { "llm" },
                "publisher": "pair-emulator", "key": name, "display_name": name,
                "architecture": family(&name), "format": "gguf",
                "quantization": { "name": "Q4_K_M", "bits_per_weight": 4 },
                "size_bytes": app.cfg.models[i].size_bytes,
                "loaded_instances": instances, "max_context_length": 4096,
            })
        })
        .collect();
    json_response(StatusCode::OK, &json!({ "models": models }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_from_the_base_name() {
        assert_eq!(family("llama3.2:3b"), "llama");
        assert_eq!(family("lmstudio-community/Qwen2.5-7B:q4"), "qwen");
        assert_eq!(family("nomic-embed-text"), "nomic");
    }
}
