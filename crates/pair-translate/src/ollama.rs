//! Ollama's API on an OpenAI-shaped engine: chat and generate
//! become chat completions (text completions for a raw prompt), embed and
//! the legacy embeddings become embeddings, show is read from the model
//! list; answers and streams come back as Ollama's JSON
//! (lines), with counts from the engine's `usage` and durations from the
//! node's clock.

use serde_json::{Map, Value, json};

use crate::chunk::Chunk;
use crate::fields::{self, Sorted};
use crate::frame::{Event, Framing, Splitter};
use crate::{Route, Target, Timing, TranslateError, Translated, kind_of};

/// `options` that map onto OpenAI fields, and their names there (the
/// rest are sorted by [`fields::OLLAMA_OPTIONS`]).
const OPTIONS: &[(&str, &str)] = &[
    ("num_predict", "max_tokens"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("min_p", "min_p"),
    ("stop", "stop"),
    ("seed", "seed"),
    ("frequency_penalty", "frequency_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("repeat_penalty", "repeat_penalty"),
];

/// Top-level fields every route takes care of itself.
const HANDLED: &[&str] = &["stream", "model", "name", "options"];

pub(crate) fn request(
    route: Route,
    mut req: Map<String, Value>,
    created_at: &str,
) -> Result<Translated, TranslateError> {
    // Ollama still takes its legacy `name` where `model` is missing.
    let model = match req.get("model").or_else(|| req.get("name")) {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(TranslateError::new("model", "a model name is required")),
    };
    let streaming = match route {
        Route::OllamaEmbed | Route::OllamaEmbeddings | Route::OllamaShow => false,
        _ => req.get("stream").and_then(Value::as_bool).unwrap_or(true),
    };
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));
    let mut sorted = Sorted::default();
    let target = match route {
        Route::OllamaShow => {
            return Ok(Translated {
                target: Target::Models,
                body: Vec::new(),
                answer: Answer::new(route, model, false, false, created_at).into(),
                dropped: Vec::new(),
            });
        }
        Route::OllamaEmbed => {
            let input = req
                .remove("input")
                .ok_or_else(|| TranslateError::new("input", "required"))?;
            out.insert("input".into(), input);
            sorted.rest(
                &req,
                "",
                &[fields::OLLAMA_COMMON],
                &[HANDLED, &["dimensions"]].concat(),
            )?;
            if let Some(d) = req.remove("dimensions") {
                out.insert("dimensions".into(), d);
            }
            Target::Embeddings
        }
        Route::OllamaEmbeddings => {
            let prompt = req
                .remove("prompt")
                .ok_or_else(|| TranslateError::new("prompt", "required"))?;
            out.insert("input".into(), prompt);
            sorted.rest(&req, "", &[fields::OLLAMA_COMMON], HANDLED)?;
            Target::Embeddings
        }
        Route::OllamaChat => {
            let messages = match req.remove("messages") {
                Some(Value::Array(m)) => m,
                None => Vec::new(),
                Some(other) => {
                    return Err(TranslateError::new(
                        "messages",
                        format!("an array expected, got {}", kind_of(&other)),
                    ));
                }
            };
            out.insert("messages".into(), Value::Array(chat_messages(messages)?));
            if let Some(tools) = req.remove("tools") {
                out.insert("tools".into(), tools);
            }
            common(&mut req, &mut out, &mut sorted)?;
            sorted.rest(&req, "", &[fields::OLLAMA_COMMON], HANDLED)?;
            Target::Chat
        }
        Route::OllamaGenerate => {
            let prompt = match req.remove("prompt") {
                Some(Value::String(p)) => p,
                None => String::new(),
                Some(other) => {
                    return Err(TranslateError::new(
                        "prompt",
                        format!("a string expected, got {}", kind_of(&other)),
                    ));
                }
            };
            let raw = req.remove("raw").and_then(|r| r.as_bool()).unwrap_or(false);
            if let Some(suffix) = req.remove("suffix") {
                out.insert("suffix".into(), suffix);
            }
            for unsupported in ["context", "template", "images"] {
                if req.get(unsupported).is_some_and(|v| !v.is_null()) {
                    return Err(TranslateError::new(
                        unsupported,
                        "not supported by an OpenAI-compatible engine",
                    ));
                }
                req.remove(unsupported);
            }
            let system = req.remove("system");
            common(&mut req, &mut out, &mut sorted)?;
            sorted.rest(&req, "", &[fields::OLLAMA_COMMON], HANDLED)?;
            if raw {
                if system.is_some() {
                    return Err(TranslateError::new("system", "not taken with raw: true"));
                }
                out.insert("prompt".into(), Value::String(prompt));
                Target::Completion
            } else {
                let mut messages = Vec::new();
                // An empty `system` is the model's own, as on Ollama.
                if let Some(s) = system.filter(|s| !s.is_null() && s != "") {
                    messages.push(json!({"role": "system", "content": s}));
                }
                messages.push(json!({"role": "user", "content": prompt}));
                out.insert("messages".into(), Value::Array(messages));
                Target::Chat
            }
        }
        Route::AnthropicMessages | Route::AnthropicCountTokens | Route::OpenAiResponses => {
            unreachable_route()?
        }
    };
    if streaming {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    } else if target != Target::Embeddings {
        out.insert("stream".into(), Value::Bool(false));
    }
    let body = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| TranslateError::new("body", e.to_string()))?;
    Ok(Translated {
        target,
        body,
        answer: Answer::new(
            route,
            model,
            streaming,
            target == Target::Completion,
            created_at,
        )
        .into(),
        dropped: sorted.dropped,
    })
}

fn unreachable_route() -> Result<Target, TranslateError> {
    Err(TranslateError::new("route", "not an Ollama route"))
}

/// `options`, `format` and the sampling fields chat and generate share.
fn common(
    req: &mut Map<String, Value>,
    out: &mut Map<String, Value>,
    sorted: &mut Sorted,
) -> Result<(), TranslateError> {
    if let Some(options) = req.remove("options") {
        let Value::Object(mut options) = options else {
            return Err(TranslateError::new("options", "an object expected"));
        };
        for (from, to) in OPTIONS {
            if let Some(value) = options.remove(*from) {
                out.insert((*to).into(), value);
            }
        }
        sorted.rest(&options, "options.", &[fields::OLLAMA_OPTIONS], &[])?;
    }
    match req.remove("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(f)) if f == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(Value::String(f)) if f.is_empty() => {}
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema, "strict": true}}),
            );
        }
        Some(other) => {
            return Err(TranslateError::new(
                "format",
                format!("\"json\" or a JSON schema expected, got {other}"),
            ));
        }
    }
    Ok(())
}

/// Ollama chat messages as OpenAI's: images become image parts, tool
/// calls get ids (Ollama has none) that the tool answers after them refer
/// to, arguments become JSON text.
fn chat_messages(messages: Vec<Value>) -> Result<Vec<Value>, TranslateError> {
    let mut out = Vec::with_capacity(messages.len());
    // Ids of the last assistant turn's tool calls, by function name, in order.
    let mut open_calls: Vec<(String, String)> = Vec::new();
    let mut next_id = 0usize;
    for (i, m) in messages.into_iter().enumerate() {
        let field = |f: &str| format!("messages[{i}].{f}");
        let Value::Object(mut m) = m else {
            return Err(TranslateError::new(
                format!("messages[{i}]"),
                "an object expected",
            ));
        };
        let role = match m.remove("role") {
            Some(Value::String(r)) => r,
            _ => return Err(TranslateError::new(field("role"), "required")),
        };
        let content = match m.remove("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(c)) => c,
            Some(other) => {
                return Err(TranslateError::new(
                    field("content"),
                    format!("a string expected, got {}", kind_of(&other)),
                ));
            }
        };
        let mut msg = Map::new();
        msg.insert("role".into(), Value::String(role.clone()));
        match m.remove("images") {
            Some(Value::Array(images)) if !images.is_empty() => {
                let mut parts = vec![json!({"type": "text", "text": content})];
                for (j, img) in images.into_iter().enumerate() {
                    let Value::String(b64) = img else {
                        return Err(TranslateError::new(
                            format!("messages[{i}].images[{j}]"),
                            "base64 text expected",
                        ));
                    };
                    let url = format!("data:{};base64,{b64}", image_mime(&b64));
                    parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                }
                msg.insert("content".into(), Value::Array(parts));
            }
            _ => {
                msg.insert("content".into(), Value::String(content));
            }
        }
        if let Some(Value::Array(calls)) = m.remove("tool_calls") {
            open_calls.clear();
            let mut oa_calls = Vec::with_capacity(calls.len());
            for (j, call) in calls.into_iter().enumerate() {
                let f = call.get("function").cloned().unwrap_or(Value::Null);
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        TranslateError::new(
                            format!("messages[{i}].tool_calls[{j}].function.name"),
                            "required",
                        )
                    })?
                    .to_owned();
                let args = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => "{}".to_owned(),
                };
                let id = format!("call_{next_id}");
                next_id += 1;
                open_calls.push((name.clone(), id.clone()));
                oa_calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}));
            }
            msg.insert("tool_calls".into(), Value::Array(oa_calls));
        }
        if role == "tool" {
            let name = m
                .remove("tool_name")
                .or_else(|| m.remove("name"))
                .and_then(|n| n.as_str().map(str::to_owned));
            // The call it answers: by name, else the first still open.
            let at = name
                .as_ref()
                .and_then(|n| open_calls.iter().position(|(c, _)| c == n))
                .or(if open_calls.is_empty() { None } else { Some(0) });
            let id = match at {
                Some(k) => open_calls.remove(k).1,
                None => {
                    return Err(TranslateError::new(
                        format!("messages[{i}]"),
                        "a tool answer with no tool call before it",
                    ));
                }
            };
            msg.insert("tool_call_id".into(), Value::String(id));
        }
        m.remove("thinking");
        if let Some((k, _)) = m.iter().find(|(_, v)| !v.is_null()) {
            return Err(TranslateError::new(
                field(k),
                "has no equivalent on an OpenAI-compatible engine",
            ));
        }
        out.push(Value::Object(msg));
    }
    Ok(out)
}

/// The image type base64 data starts with (PNG, JPEG, GIF, WebP).
fn image_mime(b64: &str) -> &'static str {
    if b64.starts_with("iVBOR") {
        "image/png"
    } else if b64.starts_with("/9j/") {
        "image/jpeg"
    } else if b64.starts_with("R0lGOD") {
        "image/gif"
    } else if b64.starts_with("UklGR") {
        "image/webp"
    } else {
        "application/octet-stream"
    }
}

/// Ollama's `done_reason` for OpenAI's `finish_reason`.
fn done_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "length",
        _ => "stop",
    }
}

/// Ollama's error body.
pub fn error_line(message: &str) -> Vec<u8> {
    let mut v = serde_json::to_vec(&json!({ "error": message })).unwrap_or_default();
    v.push(b'\n');
    v
}

/// An OpenAI answer on its way to an Ollama client.
#[derive(Debug)]
pub struct Answer {
    route: Route,
    model: String,
    streaming: bool,
    /// `/v1/completions` (raw generate): text in `choices[].text`.
    completion: bool,
    created_at: String,
    splitter: Splitter,
    events: Vec<Event>,
    finish_reason: Option<String>,
    /// pair's receipt from the engine-side stream's final chunk.
    x_pair: Option<Value>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    chunks: u64,
    /// Tool calls streamed in pieces: (name, arguments so far).
    tool_calls: Vec<(String, String)>,
    done: bool,
}

impl Answer {
    fn new(
        route: Route,
        model: String,
        streaming: bool,
        completion: bool,
        created_at: &str,
    ) -> Self {
        Self {
            x_pair: None,
            route,
            model,
            streaming,
            completion,
            created_at: created_at.to_owned(),
            splitter: Splitter::new(Framing::Sse),
            events: Vec::new(),
            finish_reason: None,
            prompt_tokens: None,
            completion_tokens: None,
            chunks: 0,
            tool_calls: Vec::new(),
            done: false,
        }
    }

    pub fn content_type(&self) -> &'static str {
        if self.streaming {
            "application/x-ndjson"
        } else {
            "application/json; charset=utf-8"
        }
    }

    pub fn streaming(&self) -> bool {
        self.streaming
    }

    pub fn done(&self) -> bool {
        self.done
    }

    pub fn whole(&self, status: u16, body: &[u8], timing: Timing) -> Vec<u8> {
        if !(200..300).contains(&status) {
            return error_line(&crate::error_message(body));
        }
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return error_line("the engine's answer is not JSON");
        };
        let usage = |k: &str| v["usage"][k].as_u64();
        let mut out = match self.route {
            Route::OllamaEmbed => json!({
                "model": self.model,
                "embeddings": embeddings(&v),
                "total_duration": timing.total_ns,
                "load_duration": 0,
                "prompt_eval_count": usage("prompt_tokens").unwrap_or(0),
            }),
            Route::OllamaEmbeddings => json!({
                "embedding": embeddings(&v).into_iter().next().unwrap_or_default(),
            }),
            Route::OllamaShow => show(&self.model, &self.created_at),
            _ => {
                let choice = &v["choices"][0];
                let finish = choice["finish_reason"].as_str();
                let mut o = self.head();
                if self.route == Route::OllamaChat {
                    let mut message = json!({
                        "role": "assistant",
                        "content": choice["message"]["content"].as_str().unwrap_or_default(),
                    });
                    if let Some(calls) = choice["message"]["tool_calls"].as_array() {
                        message["tool_calls"] = Value::Array(
                            calls
                                .iter()
                                .map(|c| {
                                    ollama_call(&c["function"]["name"], &c["function"]["arguments"])
                                })
                                .collect(),
                        );
                    }
                    o["message"] = message;
                } else {
                    let text = if self.completion {
                        choice["text"].as_str()
                    } else {
                        choice["message"]["content"].as_str()
                    };
                    o["response"] = Value::String(text.unwrap_or_default().to_owned());
                }
                o["done"] = Value::Bool(true);
                o["done_reason"] = done_reason(finish).into();
                self.counts(
                    &mut o,
                    usage("prompt_tokens"),
                    usage("completion_tokens"),
                    timing,
                );
                o
            }
        };
        if let Value::Object(m) = &mut out {
            m.retain(|_, v| !v.is_null());
        }
        serde_json::to_vec(&out).unwrap_or_default()
    }

    /// `model` and `created_at`, the start of every line.
    fn head(&self) -> Value {
        json!({"model": self.model, "created_at": self.created_at})
    }

    fn counts(&self, o: &mut Value, prompt: Option<u64>, completion: Option<u64>, t: Timing) {
        let eval_ns = t.total_ns.saturating_sub(t.first_token_ns);
        o["total_duration"] = t.total_ns.into();
        o["load_duration"] = 0.into();
        o["prompt_eval_count"] = prompt.unwrap_or(0).into();
        o["prompt_eval_duration"] = t.first_token_ns.into();
        o["eval_count"] = completion.unwrap_or(self.chunks).into();
        o["eval_duration"] = eval_ns.into();
    }

    pub fn push(&mut self, bytes: &[u8], timing: Timing, out: &mut Vec<u8>) {
        self.splitter.push(bytes, &mut self.events);
        self.drain(timing, out);
    }

    pub fn finish(&mut self, timing: Timing, out: &mut Vec<u8>) {
        self.splitter.finish(&mut self.events);
        self.drain(timing, out);
    }

    fn drain(&mut self, timing: Timing, out: &mut Vec<u8>) {
        for event in std::mem::take(&mut self.events) {
            if self.done {
                return;
            }
            match event {
                Event::Json(raw) => self.chunk(&raw, out),
                Event::Done => self.close(timing, out),
                Event::Truncated => {
                    // Ended without [DONE]: complete only if it said why it stopped.
                    if self.finish_reason.is_some() {
                        self.close(timing, out);
                    } else {
                        self.done = true;
                        out.extend(error_line(
                            "the engine's stream ended before it was complete",
                        ));
                    }
                }
                Event::TooLarge => {
                    self.done = true;
                    out.extend(error_line("the engine sent a chunk over 16 MiB"));
                }
            }
        }
    }

    /// One SSE event of the engine's stream: a line of text, if it carries
    /// any. Read into borrowed types, the common case copies nothing.
    fn chunk(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let Ok(c) = serde_json::from_slice::<Chunk<'_>>(raw) else {
            return;
        };
        if c.error.is_some() {
            self.done = true;
            out.extend(error_line(&crate::error_message(raw)));
            return;
        }
        if c.x_pair.is_some() {
            self.x_pair = c.x_pair;
        }
        if let Some(u) = c.usage {
            self.prompt_tokens = u.prompt_tokens.or(self.prompt_tokens);
            self.completion_tokens = u.completion_tokens.or(self.completion_tokens);
        }
        let Some(choice) = c.choices.unwrap_or_default().into_iter().next() else {
            return;
        };
        if let Some(f) = choice.finish_reason {
            self.finish_reason = Some(f.into_owned());
        }
        let delta = choice.delta.unwrap_or_default();
        for call in delta.tool_calls.unwrap_or_default() {
            let idx = usize::try_from(call.index.unwrap_or(0)).unwrap_or(0);
            while self.tool_calls.len() <= idx {
                self.tool_calls.push((String::new(), String::new()));
            }
            let slot = &mut self.tool_calls[idx];
            let f = call.function.unwrap_or_default();
            if let Some(n) = f.name {
                slot.0.push_str(&n);
            }
            if let Some(a) = f.arguments {
                slot.1.push_str(&a);
            }
        }
        let text = if self.completion {
            choice.text
        } else {
            delta.content
        };
        let Some(text) = text.filter(|t| !t.is_empty()) else {
            return;
        };
        self.chunks += 1;
        let chat = self.route == Route::OllamaChat;
        let line = StreamLine {
            model: &self.model,
            created_at: &self.created_at,
            message: chat.then_some(StreamMessage {
                role: "assistant",
                content: &text,
            }),
            response: (!chat).then_some(&*text),
            done: false,
        };
        if serde_json::to_writer(&mut *out, &line).is_ok() {
            out.push(b'\n');
        }
    }

    fn close(&mut self, timing: Timing, out: &mut Vec<u8>) {
        self.done = true;
        let mut line = self.head();
        if self.route == Route::OllamaChat {
            let mut message = json!({"role": "assistant", "content": ""});
            if !self.tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(
                    self.tool_calls
                        .iter()
                        .map(|(n, a)| {
                            ollama_call(&Value::String(n.clone()), &Value::String(a.clone()))
                        })
                        .collect(),
                );
            }
            line["message"] = message;
        } else {
            line["response"] = Value::String(String::new());
        }
        line["done"] = Value::Bool(true);
        line["done_reason"] = done_reason(self.finish_reason.as_deref()).into();
        if let Some(x) = self.x_pair.take() {
            line["x_pair"] = x;
        }
        self.counts(
            &mut line,
            self.prompt_tokens,
            self.completion_tokens,
            timing,
        );
        write_line(&line, out);
    }
}

/// Ollama's `/api/show` for a model an OpenAI-compatible engine holds:
/// what such an engine can say of it (not its Modelfile or template).
fn show(model: &str, at: &str) -> Value {
    json!({
        "modelfile": format!("# {model}: served by an OpenAI-compatible engine (through pair)"),
        "parameters": "",
        "template": "",
        "details": details(),
        "model_info": {},
        "capabilities": ["completion"],
        "modified_at": at,
    })
}

fn details() -> Value {
    json!({"parent_model": "", "format": "gguf", "family": "", "families": null,
           "parameter_size": "", "quantization_level": ""})
}

/// One model in Ollama's `/api/tags` (or, `running`, `/api/ps`) shape, for
/// an engine with no Ollama listing of its own.
pub fn listing_entry(name: &str, size: Option<u64>, running: bool) -> Value {
    let mut e = json!({
        "name": name,
        "model": name,
        "size": size.unwrap_or(0),
        "digest": "",
        "details": details(),
    });
    if running {
        e["size_vram"] = size.unwrap_or(0).into();
    }
    e
}

/// An OpenAI tool call as Ollama's: arguments as a JSON object.
fn ollama_call(name: &Value, arguments: &Value) -> Value {
    let args = match arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        other => other.clone(),
    };
    json!({"function": {"name": name, "arguments": args}})
}

/// One vector per input, in input order. Vectors per token (what
/// llama-cpp-python answers for a model without pooling) are mean-pooled,
/// llama.cpp's usual pooling, since Ollama's clients take one per input.
fn embeddings(v: &Value) -> Vec<Value> {
    let mut data: Vec<&Value> = v["data"]
        .as_array()
        .map(|d| d.iter().collect())
        .unwrap_or_default();
    data.sort_by_key(|e| e["index"].as_u64().unwrap_or(0));
    data.into_iter().map(|e| pooled(&e["embedding"])).collect()
}

fn pooled(e: &Value) -> Value {
    let Some(rows) = e
        .as_array()
        .filter(|r| r.first().is_some_and(Value::is_array))
    else {
        return e.clone();
    };
    let mut sum: Vec<f64> = Vec::new();
    let mut n = 0u32;
    for row in rows.iter().filter_map(Value::as_array) {
        if sum.is_empty() {
            sum = vec![0.0; row.len()];
        }
        if row.len() == sum.len() {
            for (s, x) in sum.iter_mut().zip(row) {
                *s += x.as_f64().unwrap_or(0.0);
            }
            n += 1;
        }
    }
    let n = f64::from(n.max(1));
    Value::Array(sum.into_iter().map(|s| json!(s / n)).collect())
}

/// A line of an Ollama stream before its last.
#[derive(serde::Serialize)]
struct StreamLine<'a> {
    model: &'a str,
    created_at: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<StreamMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a str>,
    done: bool,
}

#[derive(serde::Serialize)]
struct StreamMessage<'a> {
    role: &'static str,
    content: &'a str,
}

fn write_line(v: &Value, out: &mut Vec<u8>) {
    if serde_json::to_writer(&mut *out, v).is_ok() {
        out.push(b'\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request as translate;
    use proptest::prelude::*;

    const AT: &str = "2026-12-03T12:00:00Z";

    fn body(t: &Translated) -> Value {
        serde_json::from_slice(&t.body).unwrap()
    }

    #[test]
    fn chat_options_format_and_tools_map_to_openai() {
        let t = translate(
            Route::OllamaChat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi","images":["iVBORw0KGgo="]}],
                 "options":{"num_predict":5,"temperature":0.2,"top_k":3,"stop":["x"],"seed":7,"num_ctx":4096},
                 "format":"json","keep_alive":"5m","tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#,
            AT,
        )
        .unwrap();
        assert_eq!(t.target, Target::Chat);
        let b = body(&t);
        assert_eq!(b["max_tokens"], 5);
        assert_eq!(b["top_k"], 3);
        assert_eq!(b["seed"], 7);
        assert_eq!(b["stream"], true, "Ollama streams unless told not to");
        assert_eq!(b["response_format"]["type"], "json_object");
        assert!(b.get("num_ctx").is_none() && b.get("keep_alive").is_none());
        assert_eq!(
            b["messages"][0]["content"][1]["image_url"]["url"],
            "data:image/png;base64,iVBORw0KGgo="
        );
        assert_eq!(b["tools"][0]["function"]["name"], "f");
    }

    #[test]
    fn what_cannot_be_mapped_is_an_error_naming_the_field() {
        let e = translate(
            Route::OllamaChat,
            br#"{"model":"m","messages":[],"options":{"mirostat":2}}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "options.mirostat");
        let e = translate(
            Route::OllamaGenerate,
            br#"{"model":"m","prompt":"x","context":[1,2]}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "context");
        let e = translate(
            Route::OllamaChat,
            br#"{"model":"m","messages":[],"format":3}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "format");
        let e = translate(Route::OllamaChat, br#"{"messages":[]}"#, AT).unwrap_err();
        assert_eq!(e.field, "model");
        // A key with no name is named as JSON spells it.
        let e = translate(
            Route::OllamaGenerate,
            br#"{"model":"m","prompt":"x","raw":true,"":true}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "\"\"");
    }

    #[test]
    fn tool_calls_get_ids_their_answers_refer_to() {
        let t = translate(
            Route::OllamaChat,
            br#"{"model":"m","stream":false,"messages":[
                {"role":"user","content":"weather?"},
                {"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Oslo"}}}]},
                {"role":"tool","content":"12C","tool_name":"get_weather"}]}"#,
            AT,
        )
        .unwrap();
        let b = body(&t);
        let call = &b["messages"][1]["tool_calls"][0];
        assert_eq!(call["function"]["arguments"], r#"{"city":"Oslo"}"#);
        assert_eq!(b["messages"][2]["tool_call_id"], call["id"]);
        assert_eq!(b["stream"], false);
    }

    #[test]
    fn a_whole_chat_answer_becomes_ollamas_with_counts() {
        let t = translate(
            Route::OllamaChat,
            br#"{"model":"m","stream":false,"messages":[]}"#,
            AT,
        )
        .unwrap();
        let answer = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Hello",
            "tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
            "finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let timing = Timing {
            total_ns: 2_000,
            first_token_ns: 500,
        };
        let v: Value = serde_json::from_slice(&t.answer.whole(200, answer, timing)).unwrap();
        assert_eq!(v["message"]["content"], "Hello");
        assert_eq!(
            v["message"]["tool_calls"][0]["function"]["arguments"]["a"],
            1
        );
        assert_eq!(v["done_reason"], "length");
        assert_eq!(
            (v["prompt_eval_count"].as_u64(), v["eval_count"].as_u64()),
            (Some(3), Some(4))
        );
        assert_eq!(
            (v["total_duration"].as_u64(), v["eval_duration"].as_u64()),
            (Some(2_000), Some(1_500))
        );
        assert_eq!(v["created_at"], AT);
        let err = t.answer.whole(
            404,
            br#"{"error":{"message":"model 'x' not found"}}"#,
            timing,
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&err).unwrap()["error"],
            "model 'x' not found"
        );
    }

    #[test]
    fn embeddings_come_one_per_input_in_order_and_token_vectors_are_pooled() {
        let t = translate(
            Route::OllamaEmbed,
            br#"{"model":"e","input":["a","b"]}"#,
            AT,
        )
        .unwrap();
        let timing = Timing {
            total_ns: 1,
            first_token_ns: 1,
        };
        // Out of order, one of them per token (llama-cpp-python, no pooling).
        let answer = br#"{"data":[{"index":1,"embedding":[0.5,0.5]},
            {"index":0,"embedding":[[1.0,2.0],[3.0,4.0]]}],"usage":{"prompt_tokens":3}}"#;
        let v: Value = serde_json::from_slice(&t.answer.whole(200, answer, timing)).unwrap();
        assert_eq!(v["embeddings"], json!([[2.0, 3.0], [0.5, 0.5]]));
        let t = translate(
            Route::OllamaEmbeddings,
            br#"{"model":"e","prompt":"a"}"#,
            AT,
        )
        .unwrap();
        let answer = br#"{"data":[{"index":0,"embedding":[[1.0],[0.0]]}]}"#;
        let v: Value = serde_json::from_slice(&t.answer.whole(200, answer, timing)).unwrap();
        assert_eq!(v["embedding"], json!([0.5]));
    }

    const SSE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":2}}\n\n\
data: [DONE]\n\n";

    fn stream(route: Route, pieces: &[&[u8]], end: bool) -> Vec<Value> {
        let req: &[u8] = match route {
            Route::OllamaGenerate => br#"{"model":"m","prompt":"hi"}"#,
            _ => br#"{"model":"m","messages":[]}"#,
        };
        let mut t = translate(route, req, AT).unwrap();
        let mut out = Vec::new();
        for p in pieces {
            t.answer.push(p, Timing::default(), &mut out);
        }
        if end {
            t.answer.finish(Timing::default(), &mut out);
        }
        out.split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[test]
    fn a_stream_becomes_json_lines_ending_done_and_a_cut_one_ends_in_error() {
        let lines = stream(Route::OllamaChat, &[SSE], true);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["message"]["content"], "Hel");
        assert_eq!(lines[2]["done"], true);
        assert_eq!(lines[2]["eval_count"], 2);
        let generated = stream(Route::OllamaGenerate, &[SSE], true);
        assert_eq!(generated[1]["response"], "lo");
        let cut = stream(Route::OllamaChat, &[&SSE[..120]], true);
        assert!(
            cut.last().unwrap()["error"]
                .as_str()
                .unwrap()
                .contains("before it was complete"),
            "{cut:?}"
        );
    }

    proptest! {
        #[test]
        fn a_stream_translated_in_any_pieces_equals_it_translated_whole(cuts in prop::collection::vec(0usize..SSE.len(), 0..10)) {
            let pieces = crate::frame::cut(SSE, &cuts);
            prop_assert_eq!(stream(Route::OllamaChat, &pieces, true), stream(Route::OllamaChat, &[SSE], true));
        }
    }
}
