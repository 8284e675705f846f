//! Anthropic's Messages API (what Claude Code and the `anthropic` SDK
//! speak) on an OpenAI-shaped engine: the system prompt,
//! content blocks (text, images, `tool_use`, `tool_result`), `max_tokens`,
//! `stop_sequences` and tools become a chat completion; the answer comes
//! back as a message with content blocks and usage, a stream as
//! Anthropic's event sequence, errors in its error shape.

use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::chunk::Chunk;
use crate::frame::{Event, Framing, Splitter};
use crate::{Target, TranslateError, Translated, kind_of};

/// Fields that change nothing an OpenAI engine does.
const DROPPED: &[&str] = &[
    "model",
    "stream",
    "metadata",
    "service_tier",
    "container",
    "mcp_servers",
];

pub(crate) fn request(
    mut req: Map<String, Value>,
    created_at: &str,
) -> Result<Translated, TranslateError> {
    let model = match req.remove("model") {
        Some(Value::String(m)) if !m.is_empty() => m,
        _ => return Err(TranslateError::new("model", "a model name is required")),
    };
    let max_tokens = req
        .remove("max_tokens")
        .and_then(|v| v.as_u64())
        .ok_or_else(|| TranslateError::new("max_tokens", "required, a positive integer"))?;
    let streaming = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));
    out.insert("max_tokens".into(), max_tokens.into());
    let mut messages = Vec::new();
    match req.remove("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text = blocks
                .iter()
                .enumerate()
                .map(|(i, b)| match b["type"].as_str() {
                    Some("text") => Ok(b["text"].as_str().unwrap_or_default().to_owned()),
                    _ => Err(TranslateError::new(
                        format!("system[{i}]"),
                        "only text blocks are taken",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?
                .join("\n");
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(other) => {
            return Err(TranslateError::new(
                "system",
                format!("a string or text blocks expected, got {}", kind_of(&other)),
            ));
        }
    }
    let Some(Value::Array(turns)) = req.remove("messages") else {
        return Err(TranslateError::new("messages", "an array is required"));
    };
    for (i, turn) in turns.into_iter().enumerate() {
        messages.extend(turn_messages(i, turn)?);
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(stop) = req.remove("stop_sequences") {
        out.insert("stop".into(), stop);
    }
    for k in ["temperature", "top_p", "top_k"] {
        if let Some(v) = req.remove(k) {
            out.insert(k.into(), v);
        }
    }
    if let Some(Value::Array(tools)) = req.remove("tools") {
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
        out.insert("tools".into(), Value::Array(oa));
    }
    if let Some(choice) = req.remove("tool_choice") {
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
        out.insert("tool_choice".into(), oa);
    }
    if let Some(thinking) = req.remove("thinking")
        && thinking["type"].as_str() == Some("enabled")
    {
        return Err(TranslateError::new(
            "thinking",
            "extended thinking is not available on this engine",
        ));
    }
    for (k, v) in &req {
        if !v.is_null() && !DROPPED.contains(&k.as_str()) {
            return Err(TranslateError::new(
                k.clone(),
                "has no equivalent on an OpenAI-compatible engine",
            ));
        }
    }
    out.insert("stream".into(), Value::Bool(streaming));
    if streaming {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let body = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| TranslateError::new("body", e.to_string()))?;
    Ok(Translated {
        target: Target::Chat,
        body,
        answer: Answer::new(model, streaming, created_at).into(),
        dropped: Vec::new(),
    })
}

/// One Anthropic turn as OpenAI messages: a user turn's `tool_result`
/// blocks become `tool` messages (before its other content), an
/// assistant turn's `tool_use` blocks its `tool_calls`.
fn turn_messages(i: usize, turn: Value) -> Result<Vec<Value>, TranslateError> {
    let role = turn["role"]
        .as_str()
        .filter(|r| *r == "user" || *r == "assistant")
        .ok_or_else(|| {
            TranslateError::new(format!("messages[{i}].role"), "user or assistant expected")
        })?
        .to_owned();
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
            Some("thinking" | "redacted_thinking") => {}
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
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// What the stream has open.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Block {
    Text,
    /// A tool call, by its index in OpenAI's `tool_calls`.
    Tool(u64),
}

/// An OpenAI answer on its way to an Anthropic client.
#[derive(Debug)]
pub struct Answer {
    model: String,
    streaming: bool,
    id: String,
    splitter: Splitter,
    events: Vec<Event>,
    started: bool,
    /// The open content block and its index.
    open: Option<(Block, usize)>,
    blocks: usize,
    finish_reason: Option<String>,
    input_tokens: u64,
    output_tokens: u64,
    deltas: u64,
    done: bool,
}

impl Answer {
    fn new(model: String, streaming: bool, created_at: &str) -> Self {
        // An id that differs per request: the node's timestamp, digits only.
        let id = format!(
            "msg_pair{}",
            created_at
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>()
        );
        Self {
            model,
            streaming,
            id,
            splitter: Splitter::new(Framing::Sse),
            events: Vec::new(),
            started: false,
            open: None,
            blocks: 0,
            finish_reason: None,
            input_tokens: 0,
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
        let choice = &v["choices"][0];
        let mut content = Vec::new();
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
            "usage": {
                "input_tokens": v["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
                "output_tokens": v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            },
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
        if let Some(u) = c.usage {
            self.input_tokens = u.prompt_tokens.unwrap_or(self.input_tokens);
            self.output_tokens = u.completion_tokens.unwrap_or(self.output_tokens);
        }
        let Some(choice) = c.choices.unwrap_or_default().into_iter().next() else {
            return;
        };
        self.start(out);
        let delta = choice.delta.unwrap_or_default();
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
        event(
            out,
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.finish_reason.as_deref()), "stop_sequence": null},
            "usage": {"output_tokens": output_tokens}}),
        );
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
