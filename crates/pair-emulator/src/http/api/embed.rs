//! The embedding routes: Ollama's embed and legacy embeddings, OpenAI's
//! embeddings (floats or base64).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};

use super::common::{model_of, parse, wait_done, wall_ns};
use super::errors::{refused, shutting_down};
use crate::JobTiming;
use crate::http::text::{count_tokens, embedding, request_seed};
use crate::http::{App, Flavor, json_response};

/// Inputs of an embedding request: a string or a list of strings.
fn inputs(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// What an embedding job produced.
struct Embedded {
    model: String,
    vectors: Vec<Vec<f32>>,
    tokens: u32,
    timing: JobTiming,
    /// The request asked for `"encoding_format": "base64"` (OpenAI).
    base64: bool,
}

/// Runs an embedding job (the body is parsed once, here).
async fn embed(app: &App, path: &str, body: &[u8], field: &str) -> Result<Embedded, Response> {
    let req = parse(app, path, body)?;
    let base64 = req.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let (model_ix, requested) = model_of(app, path, &req)?;
    let texts = inputs(req.get(field));
    let tokens = texts
        .iter()
        .map(|t| count_tokens(t))
        .fold(0u32, u32::saturating_add)
        .max(1);
    let canonical = app.listed_name(model_ix);
    let mut guard = app
        .core
        .submit(model_ix, tokens, 0, pair_core::PromptChain::EMPTY)
        .map_err(|e| refused(app, path, &e))?;
    let t = wait_done(app, &mut guard).await.ok_or_else(shutting_down)?;
    let vectors = texts
        .iter()
        .map(|s| {
            embedding(
                request_seed(app.cfg.seed, &canonical, s),
                app.cfg.embedding_dims,
            )
        })
        .collect();
    let name = if app.cfg.flavor == Flavor::Ollama {
        canonical
    } else {
        requested
    };
    Ok(Embedded {
        model: name,
        vectors,
        tokens,
        timing: t,
        base64,
    })
}

pub(crate) async fn ollama_embed(State(app): State<App>, body: Bytes) -> Response {
    match embed(&app, "/api/embed", &body, "input").await {
        Ok(e) => json_response(
            StatusCode::OK,
            &json!({
                "model": e.model, "embeddings": e.vectors,
                "total_duration": wall_ns(e.timing.finished_us - e.timing.submitted_us, app.cfg.time_scale),
                "load_duration": 0, "prompt_eval_count": e.tokens,
            }),
        ),
        Err(e) => e,
    }
}

/// The legacy single-prompt route.
pub(crate) async fn ollama_embeddings(State(app): State<App>, body: Bytes) -> Response {
    match embed(&app, "/api/embeddings", &body, "prompt").await {
        Ok(e) => json_response(
            StatusCode::OK,
            &json!({ "embedding": e.vectors.into_iter().next().unwrap_or_default() }),
        ),
        Err(e) => e,
    }
}

pub(crate) async fn openai_embeddings(State(app): State<App>, body: Bytes) -> Response {
    match embed(&app, "/v1/embeddings", &body, "input").await {
        Ok(Embedded {
            model,
            vectors,
            tokens,
            base64,
            ..
        }) => {
            let data: Vec<Value> = vectors
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    let embedding = if base64 {
                        use base64::Engine as _;
                        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                        Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
                    } else {
                        json!(v)
                    };
                    json!({ "object": "embedding", "index": i, "embedding": embedding })
                })
                .collect();
            json_response(
                StatusCode::OK,
                &json!({
                    "object": "list", "data": data, "model": model,
                    "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
                }),
            )
        }
        Err(e) => e,
    }
}
