//! Anthropic's Messages API (what Claude Code and the `anthropic` SDK
//! speak) on an OpenAI-shaped engine: the system prompt,
//! content blocks (text, images, `tool_use`, `tool_result`), `max_tokens`,
//! `stop_sequences` and tools become a chat completion; the answer comes
//! back as a message with content blocks and usage, a stream as
//! Anthropic's event sequence, errors in its error shape.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::chunk::Chunk;
use crate::fields::{self, Sorted};
use crate::frame::{Event, Framing, Splitter};
use crate::{Target, TranslateError, Translated, kind_of};

/// Fields this translation takes care of itself (the table says how).
const HANDLED: &[&str] = &[
    "model",
    "max_tokens",
    "stream",
    "system",
    "messages",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "output_format",
];

pub(crate) fn request(
    req: Map<String, Value>,
    created_at: &str,
    traits: crate::EngineTraits,
) -> Result<Translated, TranslateError> {
    let (out, model, streaming, thinking, dropped) = chat(req, false)?;
    let mut out = out;
    crate::place_system(&mut out, traits);
    let body = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| TranslateError::new("body", e.to_string()))?;
    Ok(Translated {
        target: Target::Chat,
        body,
        answer: Answer::new(model, streaming, thinking, created_at).into(),
        dropped,
    })
}

/// `POST /v1/messages/count_tokens`: the same request, answered by the
/// engine's own tokenizer and chat template (a one-token completion whose
/// `usage.prompt_tokens` is the count). An engine that reports no usage
/// gets an estimate from the request's length, and the answer says so.
pub(crate) fn count_tokens(
    req: Map<String, Value>,
    traits: crate::EngineTraits,
) -> Result<Translated, TranslateError> {
    let (mut out, model, _, _, dropped) = chat(req, true)?;
    crate::place_system(&mut out, traits);
    out.insert("max_tokens".into(), 1.into());
    out.insert("stream".into(), Value::Bool(false));
    out.remove("stream_options");
    let body = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| TranslateError::new("body", e.to_string()))?;
    // About four bytes a token, for text in the languages models see most.
    let estimate = (body.len() as u64).div_ceil(4);
    Ok(Translated {
        target: Target::Chat,
        body,
        answer: Answer::counting(model, estimate).into(),
        dropped,
    })
}

/// A Messages request as a chat completion's fields, with the model,
/// whether it streams, whether it asked for thinking, and what was
/// dropped. `counting`: a `count_tokens` body (no `max_tokens`).
#[allow(clippy::type_complexity)]
fn chat(
    mut req: Map<String, Value>,
    counting: bool,
) -> Result<(Map<String, Value>, String, bool, bool, Vec<String>), TranslateError> {
    let model = match req.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(TranslateError::new("model", "a model name is required")),
    };
    let max_tokens = match req.get("max_tokens") {
        Some(v) => Some(
            v.as_u64()
                .ok_or_else(|| TranslateError::new("max_tokens", "a positive integer expected"))?,
        ),
        None if counting => None,
        None => {
            return Err(TranslateError::new(
                "max_tokens",
                "required, a positive integer",
            ));
        }
    };
    let streaming = !counting && req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));
    if let Some(n) = max_tokens {
        out.insert("max_tokens".into(), n.into());
    }
    let mut sorted = Sorted::default();
    let mut messages = Vec::new();
    match req.remove("system") {
        None | Some(Value::Null) => {}
        Some(system) => {
            cache_hints(system.as_array().map_or(&[], Vec::as_slice), &mut sorted);
            messages.push(json!({"role": "system", "content": system_text("system", &system)?}))
        }
    }
    let turns = match req.remove("messages") {
        Some(Value::Array(turns)) => turns,
        _ => return Err(TranslateError::new("messages", "an array is required")),
    };
    for (i, turn) in turns.into_iter().enumerate() {
        messages.extend(turn_messages(i, turn, &mut sorted)?);
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(stop) = req.remove("stop_sequences").filter(|v| !v.is_null()) {
        out.insert("stop".into(), stop);
    }
    for k in ["temperature", "top_p", "top_k"] {
        if let Some(v) = req.remove(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v);
        }
    }
    match req.remove("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            cache_hints(&tools, &mut sorted);
            out.insert("tools".into(), Value::Array(tools_of(tools)?));
        }
        Some(other) => return Err(expected_array("tools", &other)),
    }
    if let Some(choice) = req.remove("tool_choice").filter(|v| !v.is_null()) {
        let oa = match choice["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
            _ => {
                return Err(TranslateError::new(
                    "tool_choice",
                    "auto, any, none or tool expected",
                ));
            }
        };
        if choice["disable_parallel_tool_use"].as_bool() == Some(true) {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
        out.insert("tool_choice".into(), oa);
    }
    // Any type of thinking is taken: the engine's model reasons as it
    // does, and its reasoning comes back as thinking blocks when asked.
    let thinking = match req.remove("thinking") {
        None | Some(Value::Null) => false,
        Some(Value::Object(t)) => t.get("type").and_then(Value::as_str) != Some("disabled"),
        Some(other) => {
            return Err(TranslateError::new(
                "thinking",
                format!("an object expected, got {}", kind_of(&other)),
            ));
        }
    };
    let format = match req.remove("output_config") {
        Some(Value::Object(mut config)) => {
            let format = config.remove("format");
            req.insert("output_config".into(), Value::Object(config));
            format
        }
        other => {
            if let Some(other) = other {
                req.insert("output_config".into(), other);
            }
            None
        }
    }
    .or_else(|| req.remove("output_format"));
    if let Some(format) = format.filter(|f| !f.is_null()) {
        out.insert("response_format".into(), response_format(&format)?);
    }
    sorted.rest(&req, "", &[fields::ANTHROPIC_MESSAGES], HANDLED)?;
    if streaming {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    } else {
        out.insert("stream".into(), Value::Bool(false));
    }
    Ok((out, model, streaming, thinking, sorted.dropped))
}

/// Notes a prompt-cache hint on any of `blocks` (system text, message
/// content, tools) as the dropped `cache_control`.
fn cache_hints(blocks: &[Value], sorted: &mut Sorted) {
    let hinted = |b: &Value| {
        b.get("cache_control")
            .is_some_and(|c| !c.is_null() && c.as_object().is_none_or(|o| !o.is_empty()))
    };
    if blocks.iter().any(hinted) {
        sorted.drop_field("cache_control");
    }
}

fn expected_array(at: &str, got: &Value) -> TranslateError {
    TranslateError::new(at, format!("an array expected, got {}", kind_of(got)))
}

/// A system prompt (a string or text blocks) as one text.
fn system_text(at: &str, v: &Value) -> Result<String, TranslateError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => Ok(blocks
            .iter()
            .enumerate()
            .map(|(i, b)| match b["type"].as_str() {
                Some("text") => Ok(b["text"].as_str().unwrap_or_default().to_owned()),
                _ => Err(TranslateError::new(
                    format!("{at}[{i}]"),
                    "only text blocks are taken",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?
            .join("\n")),
        other => Err(TranslateError::new(
            at,
            format!("a string or text blocks expected, got {}", kind_of(other)),
        )),
    }
}

/// Client tools as OpenAI function tools; Anthropic's server tools cannot
/// run on a local engine.
fn tools_of(tools: Vec<Value>) -> Result<Vec<Value>, TranslateError> {
    let mut oa = Vec::with_capacity(tools.len());
    for (i, t) in tools.into_iter().enumerate() {
        if t.get("type")
            .and_then(Value::as_str)
            .is_some_and(|ty| ty != "custom")
        {
            return Err(TranslateError::new(
                format!("tools[{i}].type"),
                "server tools cannot run on this engine",
            ));
        }
        let name = t["name"]
            .as_str()
            .ok_or_else(|| TranslateError::new(format!("tools[{i}].name"), "required"))?;
        oa.push(json!({"type": "function", "function": {
            "name": name,
            "description": t.get("description").cloned().unwrap_or(Value::Null),
            "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"})),
        }}));
    }
    Ok(oa)
}

/// Anthropic's structured output (`{"type": "json_schema", "schema"}`) as
/// OpenAI's `response_format`.
fn response_format(f: &Value) -> Result<Value, TranslateError> {
    match f["type"].as_str() {
        Some("json_schema") => Ok(json!({"type": "json_schema", "json_schema": {
            "name": "response", "schema": f["schema"], "strict": true}})),
        _ => Err(TranslateError::new(
            "output_config.format",
            "a json_schema format expected",
        )),
    }
}

/// One Anthropic turn as OpenAI messages: a user turn's `tool_result`
/// blocks become `tool` messages (before its other content), an
/// assistant turn's `tool_use` blocks its `tool_calls`.
fn turn_messages(i: usize, turn: Value, sorted: &mut Sorted) -> Result<Vec<Value>, TranslateError> {
    let role = turn["role"]
        .as_str()
        .filter(|r| matches!(*r, "user" | "assistant" | "system"))
        .ok_or_else(|| {
            TranslateError::new(
                format!("messages[{i}].role"),
                "user, assistant or system expected",
            )
        })?
        .to_owned();
    cache_hints(
        turn["content"].as_array().map_or(&[], Vec::as_slice),
        sorted,
    );
    if role == "system" {
        // A system message in the conversation (Claude Code sends them):
        // kept at its place; `place_system` merges it into the leading
        // one for an engine whose template takes only that.
        let text = system_text(&format!("messages[{i}].content"), &turn["content"])?;
        return Ok(vec![json!({"role": "system", "content": text})]);
    }
    let blocks = match &turn["content"] {
        Value::String(s) => return Ok(vec![json!({"role": role, "content": s})]),
        Value::Array(b) => b.clone(),
        other => {
            return Err(TranslateError::new(
                format!("messages[{i}].content"),
                format!("a string or blocks expected, got {}", kind_of(other)),
            ));
        }
    };
    let mut out = Vec::new();
    let mut parts: Vec<Value> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let at = || format!("messages[{i}].content[{j}]");
        match b["type"].as_str() {
            Some("text") => parts.push(json!({"type": "text", "text": b["text"]})),
            Some("image") => {
                let src = &b["source"];
                let url = match src["type"].as_str() {
                    Some("base64") => format!(
                        "data:{};base64,{}",
                        src["media_type"].as_str().unwrap_or("image/png"),
                        src["data"].as_str().unwrap_or_default()
                    ),
                    Some("url") => src["url"].as_str().unwrap_or_default().to_owned(),
                    _ => {
                        return Err(TranslateError::new(
                            at() + ".source",
                            "base64 or url expected",
                        ));
                    }
                };
                parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
            }
            Some("tool_use") if role == "assistant" => calls.push(json!({
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": b["input"].to_string()},
            })),
            Some("tool_result") if role == "user" => {
                let content = match &b["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(inner) => inner
                        .iter()
                        .filter_map(|x| x["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": content}),
                );
            }
            Some("thinking" | "redacted_thinking") => {
                sorted.drop_field("messages[].content[].thinking");
            }
            other => {
                return Err(TranslateError::new(
                    at() + ".type",
                    format!(
                        "{} blocks cannot be sent to this engine",
                        other.unwrap_or("untyped")
                    ),
                ));
            }
        }
    }
    if !parts.is_empty() || !calls.is_empty() {
        let only_text = parts.iter().all(|p| p["type"] == "text");
        let content = if only_text {
            Value::String(
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
            )
        } else {
            Value::Array(parts)
        };
        let mut m = json!({"role": role, "content": content});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    }
    Ok(out)
}

/// A whole answer's reasoning (`reasoning_content`, or `reasoning`).
fn reasoning_of(message: &Value) -> Option<&str> {
    message["reasoning_content"]
        .as_str()
        .or_else(|| message["reasoning"].as_str())
        .filter(|t| !t.is_empty())
}

/// Anthropic's `stop_reason` for OpenAI's `finish_reason`.
fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic's error type for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error body in Anthropic's shape.
pub fn error_body(status: u16, message: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"type": "error", "error": {"type": error_type(status), "message": message}}),
    )
    .unwrap_or_default()
}

/// The `error` event that ends a broken stream.
pub fn error_event(message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    event(
        &mut out,
        "error",
        &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
    );
    out
}

fn event(out: &mut Vec<u8>, name: &str, data: &impl serde::Serialize) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

/// A `content_block_delta` event's data.
#[derive(serde::Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: DeltaBody<'a>,
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum DeltaBody<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// What the stream has open.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// A tool call, by its index in OpenAI's `tool_calls`.
    Tool(u64),
}

/// An OpenAI answer on its way to an Anthropic client.
#[derive(Debug)]
pub struct Answer {
    model: String,
    streaming: bool,
    /// The client asked for thinking: the engine's reasoning comes back
    /// as thinking blocks (else it is left out).
    thinking: bool,
    /// A `count_tokens` answer, with the estimate for an engine that
    /// reports no usage.
    counting: Option<u64>,
    id: String,
    splitter: Splitter,
    events: Vec<Event>,
    started: bool,
    /// The open content block and its index.
    open: Option<(Block, usize)>,
    blocks: usize,
    finish_reason: Option<String>,
    /// pair's receipt from the engine-side stream's final chunk.
    x_pair: Option<Value>,
    input_tokens: u64,
    /// Of `input_tokens`, those the engine took from its prompt cache,
    /// where it said.
    cached_tokens: Option<u64>,
    output_tokens: u64,
    deltas: u64,
    done: bool,
}

/// Anthropic's usage: `input_tokens` counts only what was not read from a
/// cache, `cache_read_input_tokens` what was, as Anthropic counts a cached
/// prompt (Claude Code shows both).
fn usage(input: u64, cached: Option<u64>, output: u64) -> Value {
    match cached {
        Some(c) => json!({
            "input_tokens": input.saturating_sub(c),
            "cache_read_input_tokens": c.min(input),
            "output_tokens": output,
        }),
        None => json!({"input_tokens": input, "output_tokens": output}),
    }
}

impl Answer {
    fn counting(model: String, estimate: u64) -> Self {
        let mut a = Self::new(model, false, false, "");
        a.counting = Some(estimate);
        a
    }

    fn new(model: String, streaming: bool, thinking: bool, created_at: &str) -> Self {
        // An id that differs per request: the node's timestamp, digits only.
        let id = format!(
            "msg_pair{}",
            created_at
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
        );
        Self {
            x_pair: None,
            model,
            streaming,
            thinking,
            counting: None,
            id,
            splitter: Splitter::new(Framing::Sse),
            events: Vec::new(),
            started: false,
            open: None,
            blocks: 0,
            finish_reason: None,
            input_tokens: 0,
            cached_tokens: None,
            output_tokens: 0,
            deltas: 0,
            done: false,
        }
    }

    pub fn content_type(&self) -> &'static str {
        if self.streaming {
            "text/event-stream"
        } else {
            "application/json"
        }
    }

    pub fn streaming(&self) -> bool {
        self.streaming
    }

    pub fn done(&self) -> bool {
        self.done
    }

    pub fn whole(&self, status: u16, body: &[u8]) -> Vec<u8> {
        if !(200..300).contains(&status) {
            return error_body(status, &crate::error_message(body));
        }
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return error_body(502, "the engine's answer is not JSON");
        };
        if let Some(estimate) = self.counting {
            let counted = v["usage"]["prompt_tokens"].as_u64();
            let answer = match counted {
                Some(n) => json!({"input_tokens": n}),
                None => json!({"input_tokens": estimate, "estimated": true}),
            };
            return serde_json::to_vec(&answer).unwrap_or_default();
        }
        let choice = &v["choices"][0];
        let mut content = Vec::new();
        let message = &choice["message"];
        if let Some(thinking) = reasoning_of(message).filter(|_| self.thinking) {
            content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
        }
        if let Some(text) = choice["message"]["content"]
            .as_str()
            .filter(|t| !t.is_empty())
        {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in choice["message"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let input = call["function"]["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str::<Value>(a).ok())
                .unwrap_or_else(|| json!({}));
            content.push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
        }
        let answer = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason(choice["finish_reason"].as_str()),
            "stop_sequence": null,
            "usage": usage(
                v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                v["usage"]["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .or_else(|| v["timings"]["cache_n"].as_u64()),
                v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            ),
        });
        serde_json::to_vec(&answer).unwrap_or_default()
    }

    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        self.splitter.push(bytes, &mut self.events);
        self.drain(out);
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.splitter.finish(&mut self.events);
        self.drain(out);
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        for ev in std::mem::take(&mut self.events) {
            if self.done {
                return;
            }
            match ev {
                Event::Json(raw) => self.chunk(&raw, out),
                Event::Done => self.close(out),
                Event::Truncated if self.finish_reason.is_some() => self.close(out),
                Event::Truncated => {
                    self.done = true;
                    out.extend(error_event(
                        "the engine's stream ended before it was complete",
                    ));
                }
                Event::TooLarge => {
                    self.done = true;
                    out.extend(error_event("the engine sent a chunk over 16 MiB"));
                }
            }
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
            }}),
        );
    }

    /// Opens `block` unless it is the one open (closing that first).
    fn open(&mut self, block: Block, start: Value, out: &mut Vec<u8>) -> usize {
        if let Some((b, i)) = &self.open
            && *b == block
        {
            return *i;
        }
        self.close_block(out);
        let index = self.blocks;
        self.blocks += 1;
        event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        );
        self.open = Some((block, index));
        index
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            );
        }
    }

    fn chunk(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let Ok(c) = serde_json::from_slice::<Chunk<'_>>(raw) else {
            return;
        };
        if c.error.is_some() {
            self.done = true;
            out.extend(error_event(&crate::error_message(raw)));
            return;
        }
        if let Some(cached) = c.cached_tokens() {
            self.cached_tokens = Some(cached);
        }
        if c.x_pair.is_some() {
            self.x_pair = c.x_pair;
        }
        if let Some(u) = c.usage {
            self.input_tokens = u.prompt_tokens.unwrap_or(self.input_tokens);
            self.output_tokens = u.completion_tokens.unwrap_or(self.output_tokens);
        }
        let Some(choice) = c.choices.unwrap_or_default().into_iter().next() else {
            return;
        };
        self.start(out);
        let delta = choice.delta.unwrap_or_default();
        if let Some(thinking) = delta
            .reasoning_content
            .filter(|t| self.thinking && !t.is_empty())
        {
            self.deltas += 1;
            let index = self.open(
                Block::Thinking,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                out,
            );
            event(
                out,
                "content_block_delta",
                &BlockDelta {
                    kind: "content_block_delta",
                    index,
                    delta: DeltaBody::Thinking {
                        thinking: &thinking,
                    },
                },
            );
        }
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            self.deltas += 1;
            let index = self.open(Block::Text, json!({"type": "text", "text": ""}), out);
            event(
                out,
                "content_block_delta",
                &BlockDelta {
                    kind: "content_block_delta",
                    index,
                    delta: DeltaBody::Text { text: &text },
                },
            );
        }
        for call in delta.tool_calls.unwrap_or_default() {
            let k = call.index.unwrap_or(0);
            let f = call.function.unwrap_or_default();
            let start = json!({"type": "tool_use", "id": call.id.map_or_else(|| format!("toolu_{k}"), Cow::into_owned),
                "name": f.name, "input": {}});
            let index = self.open(Block::Tool(k), start, out);
            if let Some(args) = f.arguments.filter(|a| !a.is_empty()) {
                event(
                    out,
                    "content_block_delta",
                    &BlockDelta {
                        kind: "content_block_delta",
                        index,
                        delta: DeltaBody::InputJson {
                            partial_json: &args,
                        },
                    },
                );
            }
        }
        if let Some(f) = choice.finish_reason {
            self.finish_reason = Some(f.into_owned());
        }
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        self.close_block(out);
        self.done = true;
        let output_tokens = if self.output_tokens > 0 {
            self.output_tokens
        } else {
            self.deltas
        };
        // The prompt's count where the engine said how much of it was
        // cached; else only the answer's, as before.
        let usage = match self.cached_tokens {
            Some(_) => usage(self.input_tokens, self.cached_tokens, output_tokens),
            None => json!({"output_tokens": output_tokens}),
        };
        let mut delta = json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.finish_reason.as_deref()), "stop_sequence": null},
            "usage": usage});
        if let Some(x) = self.x_pair.take() {
            delta["x_pair"] = x;
        }
        event(out, "message_delta", &delta);
        event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Route, request as translate};
    use proptest::prelude::*;

    const AT: &str = "2026-12-03T12:00:00Z";

    #[test]
    fn system_blocks_tools_and_tool_results_map_to_a_chat() {
        let t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":64,"system":"be brief","stop_sequences":["END"],
                 "tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object"}}],
                 "tool_choice":{"type":"any"},
                 "messages":[{"role":"user","content":"weather in Oslo?"},
                   {"role":"assistant","content":[{"type":"text","text":"Let me look."},
                      {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}]},
                   {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"12C"}]}]}"#,
            AT,
        )
        .unwrap();
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Oslo"}"#
        );
        assert_eq!(
            b["messages"][3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "12C"})
        );
        assert_eq!(b["stop"], json!(["END"]));
        assert_eq!(
            b["tools"][0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(b["tool_choice"], "required");
        assert_eq!(b["max_tokens"], 64);
        let e = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","messages":[]}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "max_tokens");
    }

    #[test]
    fn an_earlier_turns_thinking_is_dropped_and_named() {
        let t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"},
                {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},
                    {"type":"redacted_thinking","data":"x"},{"type":"text","text":"Hi."}]},
                {"role":"user","content":"again"}],
                "tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}]}"#,
            AT,
        )
        .unwrap();
        assert_eq!(
            t.dropped,
            ["cache_control", "messages[].content[].thinking"]
        );
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(
            b["messages"][1],
            json!({"role": "assistant", "content": "Hi."})
        );
        let e = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[],"tools":{"name":"f"}}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "tools");
    }

    /// What Claude Code's first request carries beyond the basics.
    const CLAUDE_CODE: &[u8] = br#"{"model":"qwen2.5:7b","max_tokens":32000,"stream":true,
        "system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],
        "messages":[{"role":"user","content":[{"type":"text","text":"say hi","cache_control":{"type":"ephemeral"}}]},
                    {"role":"system","content":"<system-reminder>cwd is /tmp</system-reminder>"},
                    {"role":"user","content":"go on"}],
        "thinking":{"type":"adaptive"},"metadata":{"user_id":"u1"},
        "context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
        "output_config":{"effort":"high"},"temperature":1}"#;

    #[test]
    fn claude_codes_request_keeps_its_system_messages_and_names_what_it_drops() {
        let t = crate::request_for(
            Route::AnthropicMessages,
            CLAUDE_CODE,
            AT,
            crate::EngineTraits {
                system_anywhere: true,
            },
        )
        .unwrap();
        assert_eq!(
            t.dropped,
            [
                "cache_control",
                "context_management",
                "metadata",
                "output_config.effort"
            ]
        );
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        let roles: Vec<&str> = b["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "system", "user"]);
        // One system message only, where a template takes no other.
        let t = translate(Route::AnthropicMessages, CLAUDE_CODE, AT).unwrap();
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "You are Claude Code.\n\n<system-reminder>cwd is /tmp</system-reminder>"})
        );
        assert_eq!(b["messages"][1]["role"], "user");
        assert_eq!(
            b["messages"][2],
            json!({"role": "user", "content": "go on"})
        );
        assert_eq!(b["messages"].as_array().unwrap().len(), 3);
        // What changes the text and cannot be had is refused, by name.
        let e = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[],"mcp_servers":[{"type":"url","url":"https://x"}]}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "mcp_servers");
        let e = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[{"role":"robot","content":"x"}]}"#,
            AT,
        )
        .unwrap_err();
        assert_eq!(e.field, "messages[0].role");
    }

    #[test]
    fn structured_output_and_parallel_tool_use_map_to_openai() {
        let t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[],"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},
                 "tool_choice":{"type":"auto","disable_parallel_tool_use":true}}"#,
            AT,
        )
        .unwrap();
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(b["response_format"]["type"], "json_schema");
        assert_eq!(
            b["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(b["parallel_tool_calls"], false);
        assert!(t.dropped.is_empty());
    }

    #[test]
    fn reasoning_becomes_thinking_blocks_only_when_thinking_was_asked_for() {
        let answer = br#"{"choices":[{"message":{"content":"hi","reasoning_content":"let me see"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        for (thinking, want) in [
            (r#","thinking":{"type":"enabled","budget_tokens":1024}"#, 2),
            (r#","thinking":{"type":"disabled"}"#, 1),
            ("", 1),
        ] {
            let req = format!(r#"{{"model":"m","max_tokens":5,"messages":[]{thinking}}}"#);
            let t = translate(Route::AnthropicMessages, req.as_bytes(), AT).unwrap();
            let v: Value =
                serde_json::from_slice(&t.answer.whole(200, answer, crate::Timing::default()))
                    .unwrap();
            assert_eq!(v["content"].as_array().unwrap().len(), want, "{thinking}");
            if want == 2 {
                assert_eq!(
                    v["content"][0],
                    json!({"type": "thinking", "thinking": "let me see", "signature": ""})
                );
            }
        }
        let mut t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"stream":true,"messages":[],"thinking":{"type":"adaptive"}}"#,
            AT,
        )
        .unwrap();
        let mut out = Vec::new();
        t.answer.push(b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", crate::Timing::default(), &mut out);
        let text = String::from_utf8(out).unwrap();
        let thinking = text
            .find(r#""type":"thinking_delta","thinking":"hmm""#)
            .unwrap();
        let said = text.find(r#""type":"text_delta","text":"Hi""#).unwrap();
        assert!(thinking < said, "{text}");
        assert!(
            text.contains(r#""content_block":{"signature":"","thinking":"","type":"thinking"}"#),
            "{text}"
        );
    }

    #[test]
    fn count_tokens_asks_the_engine_for_one_token_and_reads_its_usage() {
        let t = translate(
            Route::AnthropicCountTokens,
            br#"{"model":"m","system":"be brief","messages":[{"role":"user","content":"hello there"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}"#,
            AT,
        )
        .unwrap();
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(b["max_tokens"], 1);
        assert_eq!(b["stream"], false);
        assert_eq!(b["tools"][0]["function"]["name"], "f");
        let counted: Value = serde_json::from_slice(&t.answer.whole(
            200,
            br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":42,"completion_tokens":1}}"#,
            crate::Timing::default(),
        ))
        .unwrap();
        assert_eq!(counted, json!({"input_tokens": 42}));
        let estimated: Value = serde_json::from_slice(&t.answer.whole(
            200,
            br#"{"choices":[{"message":{"content":"x"}}]}"#,
            crate::Timing::default(),
        ))
        .unwrap();
        assert_eq!(estimated["estimated"], true);
        assert!(estimated["input_tokens"].as_u64().unwrap() > 10);
    }

    #[test]
    fn a_whole_answer_and_an_error_in_anthropics_shape() {
        let t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[]}"#,
            AT,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&t.answer.whole(200, br#"{"choices":[{"message":{"content":"hi",
            "tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"x\":1}"}}]},"finish_reason":"tool_calls"}],
            "usage":{"prompt_tokens":3,"completion_tokens":2}}"#, crate::Timing::default())).unwrap();
        assert_eq!(v["content"][0], json!({"type": "text", "text": "hi"}));
        assert_eq!(v["content"][1]["input"]["x"], 1);
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(v["usage"], json!({"input_tokens": 3, "output_tokens": 2}));
        let e: Value = serde_json::from_slice(&t.answer.whole(
            404,
            br#"{"error":{"message":"no model"}}"#,
            crate::Timing::default(),
        ))
        .unwrap();
        assert_eq!(e["error"]["type"], "not_found_error");
    }

    const SSE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: [DONE]\n\n";

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"stream":true,"messages":[]}"#,
            AT,
        )
        .unwrap();
        let mut out = Vec::new();
        for p in pieces {
            t.answer.push(p, crate::Timing::default(), &mut out);
        }
        t.answer.finish(crate::Timing::default(), &mut out);
        String::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// What the engine took from its prompt cache reaches the client as
    /// Anthropic counts it: `cache_read_input_tokens`, and `input_tokens`
    /// only what was not cached; whole and streamed.
    #[test]
    fn the_engine_s_cached_tokens_are_anthropic_s_cache_reads() {
        let t = translate(
            Route::AnthropicMessages,
            br#"{"model":"m","max_tokens":5,"messages":[]}"#,
            AT,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&t.answer.whole(
            200,
            br#"{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":2000,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":1900}}}"#,
            crate::Timing::default(),
        ))
        .unwrap();
        assert_eq!(
            v["usage"],
            json!({"input_tokens": 100, "cache_read_input_tokens": 1900, "output_tokens": 2})
        );
        // llama.cpp's timings on the last chunk, usage after it.
        let sse = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"timings\":{\"cache_n\":1500,\"prompt_n\":20}}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1520,\"completion_tokens\":1}}\n\n\
data: [DONE]\n\n";
        let delta = events(&[sse])
            .into_iter()
            .find(|e| e.starts_with("event: message_delta"))
            .unwrap();
        let data: Value = serde_json::from_str(delta.split_once("data: ").unwrap().1).unwrap();
        assert_eq!(
            data["usage"],
            json!({"input_tokens": 20, "cache_read_input_tokens": 1500, "output_tokens": 1})
        );
        // An engine that says nothing of a cache: the answer's count only.
        let plain = events(&[SSE])
            .into_iter()
            .find(|e| e.starts_with("event: message_delta"))
            .unwrap();
        assert!(!plain.contains("cache_read"), "{plain}");
    }

    #[test]
    fn a_stream_is_anthropics_event_sequence() {
        let names: Vec<String> = events(&[SSE])
            .iter()
            .map(|e| {
                e.lines()
                    .next()
                    .unwrap()
                    .trim_start_matches("event: ")
                    .to_owned()
            })
            .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let all = events(&[SSE]).join("\n");
        assert!(all.contains(r#""stop_reason":"tool_use""#), "{all}");
        let cut = events(&[&SSE[..100]]);
        assert!(cut.last().unwrap().starts_with("event: error"), "{cut:?}");
    }

    proptest! {
        #[test]
        fn a_stream_translated_in_any_pieces_equals_it_translated_whole(cuts in prop::collection::vec(0usize..SSE.len(), 0..10)) {
            let pieces = crate::frame::cut(SSE, &cuts);
            prop_assert_eq!(events(&pieces), events(&[SSE]));
        }
    }
}
