//! Route handlers: the Ollama, OpenAI and LM Studio request and response
//! shapes, driven by the engine model through [`Core`](super::driver::Core).

// Early returns carry the finished error response; it is built once per
// failed request, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::driver::{JobGuard, Progress};
use super::text::{self, count_tokens, embedding, request_seed, rfc3339_now, unix_now};
use super::{App, Flavor, json_response, residency_loaded};
use crate::{JobTiming, ModelStatus};

/// Which error body shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `{"error":"..."}`
    Ollama,
    /// `{"error":{"message","type","param","code"}}`
    OpenAi,
}

fn shape_for(app: &App, path: &str) -> Shape {
    if app.cfg.flavor == Flavor::Ollama && path.starts_with("/api/") {
        Shape::Ollama
    } else {
        Shape::OpenAi
    }
}

fn error(
    shape: Shape,
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = match shape {
        Shape::Ollama => json!({ "error": message }),
        Shape::OpenAi => json!({
            "error": { "message": message, "type": kind, "param": param, "code": code }
        }),
    };
    json_response(status, &body)
}

pub(super) fn bad_request(app: &App, path: &str, message: &str) -> Response {
    error(
        shape_for(app, path),
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        None,
        None,
    )
}

fn unknown_model(app: &App, path: &str, model: &str) -> Response {
    match (shape_for(app, path), app.cfg.flavor) {
        (Shape::Ollama, _) => error(
            Shape::Ollama,
            StatusCode::NOT_FOUND,
            &format!("model '{model}' not found"),
            "",
            None,
            None,
        ),
        // Ollama's OpenAI layer wraps its own message in the OpenAI shape.
        (Shape::OpenAi, Flavor::Ollama) => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("model \"{model}\" not found, try pulling it first"),
            "api_error",
            None,
            None,
        ),
        (Shape::OpenAi, _) => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` does not exist or you do not have access to it."),
            "invalid_request_error",
            Some("model"),
            Some("model_not_found"),
        ),
    }
}

/// The response to an injected status fault.
pub(super) fn fault_status(app: &App, path: &str, code: u16, model: Option<&str>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::NOT_FOUND
        && let Some(m) = model
    {
        return unknown_model(app, path, m);
    }
    let kind = match code {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let mut resp = error(
        shape_for(app, path),
        status,
        &format!("emulated fault: HTTP {code}"),
        kind,
        None,
        None,
    );
    if code == 429 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// The engine would not take the job (its queue is full).
fn refused(app: &App, path: &str, e: &crate::EmulatorError) -> Response {
    let message = match e {
        // Ollama's own words (server/sched.go ErrMaxQueue).
        crate::EmulatorError::QueueFull { .. } => {
            "server busy, please try again.  maximum pending requests exceeded".to_owned()
        }
        other => other.to_string(),
    };
    error(
        shape_for(app, path),
        StatusCode::SERVICE_UNAVAILABLE,
        &message,
        "server_error",
        None,
        None,
    )
}

pub(super) async fn not_found(State(app): State<App>, uri: Uri) -> Response {
    match app.cfg.flavor {
        // Go's net/http default.
        Flavor::Ollama => (StatusCode::NOT_FOUND, "404 page not found").into_response(),
        _ => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("Unexpected endpoint or method. ({})", uri.path()),
            "invalid_request_error",
            None,
            None,
        ),
    }
}

/// A parsed JSON object body, or the engine's 400.
fn parse(app: &App, path: &str, body: &[u8]) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad_request(app, path, "request body must be a JSON object")),
        Err(e) => Err(bad_request(app, path, &format!("invalid JSON: {e}"))),
    }
}

/// The model a request names, resolved, or the engine's 400/404.
fn model_of(app: &App, path: &str, req: &Map<String, Value>) -> Result<(usize, String), Response> {
    let name = req
        .get("model")
        .or_else(|| req.get("name"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let Some(name) = name else {
        let msg = match shape_for(app, path) {
            Shape::Ollama => "model is required",
            Shape::OpenAi => "you must provide a model parameter",
        };
        return Err(bad_request(app, path, msg));
    };
    match app.resolve(name) {
        Some(i) => Ok((i, name.to_owned())),
        None => Err(unknown_model(app, path, name)),
    }
}

/// Text of a message `content`: a string or a list of `{type:text,text}`.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Prompt text and token count of a chat: contents plus ~4 template tokens
/// per message.
fn chat_prompt(req: &Map<String, Value>) -> (String, u32) {
    let mut text = String::new();
    let mut tokens = 0u32;
    for m in req
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = m.get("content").map(content_text).unwrap_or_default();
        tokens = tokens
            .saturating_add(count_tokens(&content))
            .saturating_add(4);
        text.push_str(role);
        text.push(':');
        text.push_str(&content);
        text.push('\n');
    }
    (text, tokens.max(1))
}

fn prompt_of(req: &Map<String, Value>) -> (String, u32) {
    let text = match req.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    let tokens = count_tokens(&text);
    (text, tokens)
}

/// Requested token limit: Ollama `options.num_predict`, OpenAI
/// `max_completion_tokens` / `max_tokens`. Non-positive means none.
fn limit_of(req: &Map<String, Value>) -> Option<u32> {
    let v = req
        .get("options")
        .and_then(|o| o.get("num_predict"))
        .or_else(|| req.get("max_completion_tokens"))
        .or_else(|| req.get("max_tokens"))?;
    let n = v.as_i64()?;
    (n > 0).then(|| u32::try_from(n.min(1_000_000)).unwrap_or(1_000_000))
}

fn seed_of(req: &Map<String, Value>) -> u64 {
    req.get("seed")
        .or_else(|| req.get("options").and_then(|o| o.get("seed")))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

fn stream_of(req: &Map<String, Value>, default: bool) -> bool {
    req.get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(default)
}

/// The API a generation answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    OllamaGenerate,
    OllamaChat,
    OpenAiChat { include_usage: bool },
    OpenAiCompletion { include_usage: bool },
}

/// One generation request, everything needed to render its chunks.
#[derive(Debug)]
struct Gen {
    api: Api,
    model: String,
    id: String,
    created: u64,
    seed: u64,
    prompt_tokens: u32,
    output_tokens: u32,
    /// The client set a limit: the answer ends "length", not "stop".
    limited: bool,
    load_us: u64,
}

fn ns(us: u64) -> u64 {
    us.saturating_mul(1_000)
}

impl Gen {
    fn finish_reason(&self) -> &'static str {
        if self.limited { "length" } else { "stop" }
    }

    fn token_chunk(&self, i: u32) -> Bytes {
        let tok = text::token(self.seed, i);
        match self.api {
            Api::OllamaGenerate => ndjson(&json!({
                "model": self.model, "created_at": rfc3339_now(), "response": tok, "done": false
            })),
            Api::OllamaChat => ndjson(&json!({
                "model": self.model, "created_at": rfc3339_now(),
                "message": { "role": "assistant", "content": tok }, "done": false
            })),
            Api::OpenAiChat { .. } => {
                let delta = if i == 0 {
                    json!({ "role": "assistant", "content": tok })
                } else {
                    json!({ "content": tok })
                };
                sse(&json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model, "system_fingerprint": "fp_pair_emulator",
                    "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": null }]
                }))
            }
            Api::OpenAiCompletion { .. } => sse(&json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_pair_emulator",
                "choices": [{ "text": tok, "index": 0, "logprobs": null, "finish_reason": null }]
            })),
        }
    }

    fn ollama_stats(&self, t: &JobTiming) -> Map<String, Value> {
        let load = if t.cold {
            self.load_us.min(t.first_token_us - t.started_us)
        } else {
            0
        };
        let mut m = Map::new();
        m.insert("done_reason".into(), self.finish_reason().into());
        m.insert("done".into(), true.into());
        m.insert(
            "total_duration".into(),
            ns(t.finished_us - t.submitted_us).into(),
        );
        m.insert("load_duration".into(), ns(load).into());
        m.insert("prompt_eval_count".into(), t.prompt_tokens.into());
        m.insert(
            "prompt_eval_duration".into(),
            ns(t.first_token_us - t.started_us - load).into(),
        );
        m.insert("eval_count".into(), t.output_tokens.into());
        m.insert(
            "eval_duration".into(),
            ns(t.finished_us - t.first_token_us).into(),
        );
        m
    }

    fn usage(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
        })
    }

    fn final_chunks(&self, t: &JobTiming) -> Vec<Bytes> {
        match self.api {
            Api::OllamaGenerate | Api::OllamaChat => {
                let mut m = Map::new();
                m.insert("model".into(), self.model.clone().into());
                m.insert("created_at".into(), rfc3339_now().into());
                if self.api == Api::OllamaChat {
                    m.insert(
                        "message".into(),
                        json!({ "role": "assistant", "content": "" }),
                    );
                } else {
                    m.insert("response".into(), "".into());
                }
                m.extend(self.ollama_stats(t));
                vec![ndjson(&Value::Object(m))]
            }
            Api::OpenAiChat { include_usage } | Api::OpenAiCompletion { include_usage } => {
                let chat = matches!(self.api, Api::OpenAiChat { .. });
                let object = if chat {
                    "chat.completion.chunk"
                } else {
                    "text_completion"
                };
                let choice = if chat {
                    json!({ "index": 0, "delta": {}, "logprobs": null, "finish_reason": self.finish_reason() })
                } else {
                    json!({ "text": "", "index": 0, "logprobs": null, "finish_reason": self.finish_reason() })
                };
                let mut out = vec![sse(&json!({
                    "id": self.id, "object": object, "created": self.created, "model": self.model,
                    "system_fingerprint": "fp_pair_emulator", "choices": [choice]
                }))];
                if include_usage {
                    out.push(sse(&json!({
                        "id": self.id, "object": object, "created": self.created, "model": self.model,
                        "system_fingerprint": "fp_pair_emulator", "choices": [], "usage": self.usage()
                    })));
                }
                out.push(Bytes::from_static(b"data: [DONE]\n\n"));
                out
            }
        }
    }

    fn whole(&self, t: &JobTiming) -> Value {
        let text = text::generated_text(self.seed, self.output_tokens);
        match self.api {
            Api::OllamaGenerate | Api::OllamaChat => {
                let mut m = Map::new();
                m.insert("model".into(), self.model.clone().into());
                m.insert("created_at".into(), rfc3339_now().into());
                if self.api == Api::OllamaChat {
                    m.insert(
                        "message".into(),
                        json!({ "role": "assistant", "content": text }),
                    );
                } else {
                    m.insert("response".into(), text.into());
                }
                m.extend(self.ollama_stats(t));
                Value::Object(m)
            }
            Api::OpenAiChat { .. } => json!({
                "id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_pair_emulator",
                "choices": [{
                    "index": 0, "message": { "role": "assistant", "content": text },
                    "logprobs": null, "finish_reason": self.finish_reason()
                }],
                "usage": self.usage(),
            }),
            Api::OpenAiCompletion { .. } => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "system_fingerprint": "fp_pair_emulator",
                "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": self.finish_reason() }],
                "usage": self.usage(),
            }),
        }
    }
}

fn ndjson(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

/// Waits until a job is done; `None` if the engine shut down first.
async fn wait_done(app: &App, guard: &mut JobGuard) -> Option<JobTiming> {
    loop {
        if let Some(t) = guard.progress.borrow_and_update().done {
            return Some(t);
        }
        tokio::select! {
            r = guard.progress.changed() => {
                if r.is_err() {
                    return guard.progress.borrow().done;
                }
            }
            () = app.shutdown.cancelled() => return None,
        }
    }
}

fn shutting_down() -> Response {
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

/// Common path of every text generation route.
async fn generate(
    app: App,
    path: &str,
    body: Bytes,
    api: Api,
    chat: bool,
    stream_default: bool,
) -> Response {
    let req = match parse(&app, path, &body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let (model_ix, requested) = match model_of(&app, path, &req) {
        Ok(m) => m,
        Err(e) => return e,
    };
    if matches!(api, Api::OllamaGenerate | Api::OllamaChat) && is_load_only(&req, chat) {
        return load_only(&app, path, model_ix, chat).await;
    }
    let (prompt, prompt_tokens) = if chat {
        chat_prompt(&req)
    } else {
        prompt_of(&req)
    };
    let limit = limit_of(&req);
    let output_tokens = limit.unwrap_or(app.cfg.default_max_tokens).max(1);
    let include_usage = req
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let api = match api {
        Api::OpenAiChat { .. } => Api::OpenAiChat { include_usage },
        Api::OpenAiCompletion { .. } => Api::OpenAiCompletion { include_usage },
        other => other,
    };
    let canonical = app.listed_name(model_ix);
    let seed = request_seed(app.cfg.seed ^ seed_of(&req), &canonical, &prompt);
    let load_us = app.core.with_model(|m, _| {
        m.models()
            .nth(model_ix)
            .map_or(0, |s: ModelStatus<'_>| s.rates.load_us)
    });
    let prefix = if chat { "chatcmpl" } else { "cmpl" };
    let gen_ = Arc::new(Gen {
        api,
        // Engines echo the model as requested (Ollama: as resolved).
        model: if app.cfg.flavor == Flavor::Ollama {
            canonical
        } else {
            requested
        },
        id: format!("{prefix}-{:016x}", seed),
        created: unix_now(),
        seed,
        prompt_tokens,
        output_tokens,
        limited: limit.is_some(),
        load_us,
    });
    let mut guard = match app.core.submit(model_ix, prompt_tokens, output_tokens) {
        Ok(g) => g,
        Err(e) => return refused(&app, path, &e),
    };
    if !stream_of(&req, stream_default) {
        return match wait_done(&app, &mut guard).await {
            Some(t) => json_response(StatusCode::OK, &gen_.whole(&t)),
            None => shutting_down(),
        };
    }
    let content_type = match api {
        Api::OllamaGenerate | Api::OllamaChat => "application/x-ndjson",
        _ => "text/event-stream",
    };
    let state = StreamState {
        guard,
        gen_,
        sent: 0,
        queue: VecDeque::new(),
        finished: false,
        app: app.clone(),
    };
    let stream = futures_util::stream::unfold(state, next_chunk);
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// Ollama treats a generate without a prompt, or a chat without messages,
/// as "load this model" and answers once with `done_reason: "load"`.
fn is_load_only(req: &Map<String, Value>, chat: bool) -> bool {
    if chat {
        req.get("messages")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    } else {
        req.get("prompt")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    }
}

async fn load_only(app: &App, path: &str, model_ix: usize, chat: bool) -> Response {
    let mut guard = match app.core.submit(model_ix, 0, 0) {
        Ok(g) => g,
        Err(e) => return refused(app, path, &e),
    };
    if wait_done(app, &mut guard).await.is_none() {
        return shutting_down();
    }
    let mut m = Map::new();
    m.insert("model".into(), app.listed_name(model_ix).into());
    m.insert("created_at".into(), rfc3339_now().into());
    if chat {
        m.insert(
            "message".into(),
            json!({ "role": "assistant", "content": "" }),
        );
    } else {
        m.insert("response".into(), "".into());
    }
    m.insert("done_reason".into(), "load".into());
    m.insert("done".into(), true.into());
    json_response(StatusCode::OK, &Value::Object(m))
}

struct StreamState {
    guard: JobGuard,
    gen_: Arc<Gen>,
    sent: u32,
    queue: VecDeque<Bytes>,
    finished: bool,
    app: App,
}

/// Next body chunk of a streamed answer: tokens as the model releases them,
/// then the closing chunk(s).
async fn next_chunk(mut s: StreamState) -> Option<(Result<Bytes, io::Error>, StreamState)> {
    loop {
        if let Some(b) = s.queue.pop_front() {
            return Some((Ok(b), s));
        }
        if s.finished {
            return None;
        }
        let p: Progress = *s.guard.progress.borrow_and_update();
        if s.sent < p.tokens {
            s.queue.push_back(s.gen_.token_chunk(s.sent));
            s.sent += 1;
            continue;
        }
        if let Some(t) = p.done {
            s.queue.extend(s.gen_.final_chunks(&t));
            s.finished = true;
            continue;
        }
        tokio::select! {
            r = s.guard.progress.changed() => {
                if r.is_err() && s.guard.progress.borrow().done.is_none() {
                    return None;
                }
            }
            () = s.app.shutdown.cancelled() => {
                // An engine going away mid-answer resets the connection; it
                // never ends the stream cleanly.
                s.finished = true;
                s.queue.clear();
                return Some((Err(io::Error::other("emulated engine shut down")), s));
            }
        }
    }
}

pub(super) async fn ollama_generate(State(app): State<App>, body: Bytes) -> Response {
    generate(app, "/api/generate", body, Api::OllamaGenerate, false, true).await
}

pub(super) async fn ollama_chat(State(app): State<App>, body: Bytes) -> Response {
    generate(app, "/api/chat", body, Api::OllamaChat, true, true).await
}

pub(super) async fn openai_chat(State(app): State<App>, body: Bytes) -> Response {
    let api = Api::OpenAiChat {
        include_usage: false,
    };
    generate(app, "/v1/chat/completions", body, api, true, false).await
}

pub(super) async fn openai_completions(State(app): State<App>, body: Bytes) -> Response {
    let api = Api::OpenAiCompletion {
        include_usage: false,
    };
    generate(app, "/v1/completions", body, api, false, false).await
}

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
        .submit(model_ix, tokens, 0)
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

pub(super) async fn ollama_embed(State(app): State<App>, body: Bytes) -> Response {
    match embed(&app, "/api/embed", &body, "input").await {
        Ok(e) => json_response(
            StatusCode::OK,
            &json!({
                "model": e.model, "embeddings": e.vectors,
                "total_duration": ns(e.timing.finished_us - e.timing.submitted_us),
                "load_duration": 0, "prompt_eval_count": e.tokens,
            }),
        ),
        Err(e) => e,
    }
}

/// The legacy single-prompt route.
pub(super) async fn ollama_embeddings(State(app): State<App>, body: Bytes) -> Response {
    match embed(&app, "/api/embeddings", &body, "prompt").await {
        Ok(e) => json_response(
            StatusCode::OK,
            &json!({ "embedding": e.vectors.into_iter().next().unwrap_or_default() }),
        ),
        Err(e) => e,
    }
}

pub(super) async fn openai_embeddings(State(app): State<App>, body: Bytes) -> Response {
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

pub(super) async fn ollama_root() -> &'static str {
    "Ollama is running"
}

pub(super) async fn health() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

pub(super) async fn ollama_version() -> Response {
    json_response(StatusCode::OK, &json!({ "version": "0.12.6" }))
}

pub(super) async fn ollama_tags(State(app): State<App>) -> Response {
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

pub(super) async fn ollama_ps(State(app): State<App>) -> Response {
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

pub(super) async fn ollama_show(State(app): State<App>, body: Bytes) -> Response {
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

pub(super) async fn openai_models(State(app): State<App>) -> Response {
    let data: Vec<Value> = (0..app.cfg.models.len())
        .map(|i| openai_model_entry(&app, i))
        .collect();
    json_response(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

pub(super) async fn openai_model(State(app): State<App>, Path(model): Path<String>) -> Response {
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

pub(super) async fn lmstudio_v0_models(State(app): State<App>) -> Response {
    let loaded = loaded_set(&app);
    let data: Vec<Value> = loaded
        .iter()
        .enumerate()
        .map(|(i, l)| lmstudio_v0_entry(&app, i, *l))
        .collect();
    json_response(StatusCode::OK, &json!({ "object": "list", "data": data }))
}

pub(super) async fn lmstudio_v0_model(
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

pub(super) async fn lmstudio_v1_models(State(app): State<App>) -> Response {
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

    #[test]
    fn limits_prefer_the_engines_own_field() {
        let req = |v: Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(
            limit_of(&req(json!({ "options": { "num_predict": 7 } }))),
            Some(7)
        );
        assert_eq!(
            limit_of(&req(json!({ "max_completion_tokens": 3, "max_tokens": 9 }))),
            Some(3)
        );
        assert_eq!(limit_of(&req(json!({ "max_tokens": -1 }))), None);
        assert_eq!(limit_of(&req(json!({}))), None);
    }

    #[test]
    fn chat_prompts_count_template_tokens() {
        let req = json!({ "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": [{ "type": "text", "text": "hello there" }] },
        ] });
        let (text, tokens) = chat_prompt(req.as_object().unwrap_or(&Map::new()));
        assert_eq!(tokens, 2 + 4 + 3 + 4);
        assert!(text.contains("user:hello there"));
    }
}
