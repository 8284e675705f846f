//! OpenAI's Responses API (`POST /v1/responses`, what Codex and
//! `client.responses.create` speak) on any engine's chat completions:
//! `instructions` and the `input` items (messages, function, custom and
//! local-shell calls and their outputs) become chat messages, function,
//! custom and local-shell tools become functions, `text.format` the
//! `response_format`; the answer comes back as a response object with
//! output items (reasoning, message, calls), a stream as the Responses
//! event sequence, errors in OpenAI's error shape. pair keeps no
//! responses, so every request carries its whole conversation.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::chunk::Chunk;
use crate::fields::{self, Sorted};
use crate::frame::{Event, Framing, Splitter};
use crate::{Target, TranslateError, Translated, kind_of};

/// What a tool the client declared is on the way back. The engine knows
/// only functions: a custom (freeform) tool is a function taking
/// `{"input": string}` and a local-shell tool a function taking the
/// command, and their calls are turned back into the client's item kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToolKind {
    Function,
    Custom,
    LocalShell,
}

/// A tool OpenAI's servers run: the Responses table drops it as
/// `tools.TYPE` (see [`fields::OPENAI_RESPONSES`]).
fn hosted(ty: &str) -> bool {
    fields::OPENAI_RESPONSES.iter().any(|f| {
        matches!(f.rule, fields::Rule::Dropped(_)) && f.name.strip_prefix("tools.") == Some(ty)
    })
}

/// The function a `local_shell` tool is on the engine.
const LOCAL_SHELL: &str = "local_shell";

pub(crate) fn request(
    mut req: Map<String, Value>,
    created_at: &str,
    traits: crate::EngineTraits,
) -> Result<Translated, TranslateError> {
    let model = match req.remove("model") {
        Some(Value::String(m)) if !m.is_empty() => m,
        _ => return Err(TranslateError::new("model", "a model name is required")),
    };
    let streaming = match req.remove("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(other) => return Err(expected("stream", "a boolean", &other)),
    };
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model.clone()));
    let mut sorted = Sorted::default();
    let mut messages = Vec::new();
    match req.remove("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(other) => return Err(expected("instructions", "a string", &other)),
    }
    match req.remove("input") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.into_iter().enumerate() {
                input_item(i, item, &mut messages, &mut sorted)?;
            }
        }
        Some(other) => {
            return Err(expected("input", "a string or an array of items", &other));
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    crate::place_system(&mut out, traits);

    // What a response object repeats of the request.
    let mut echo = Map::new();
    let mut kinds = Vec::new();
    match req.remove("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut oa = Vec::with_capacity(tools.len());
            // A namespace's tools are the client's own functions; tools
            // OpenAI's servers run are dropped: the engine cannot run them.
            let mut offered = Vec::with_capacity(tools.len());
            for (i, t) in tools.iter().enumerate() {
                match t["type"].as_str() {
                    Some("namespace") => match t.get("tools") {
                        Some(Value::Array(inner)) => offered.extend(
                            inner
                                .iter()
                                .enumerate()
                                .map(|(j, f)| (format!("tools[{i}].tools[{j}]"), f)),
                        ),
                        _ => {
                            return Err(TranslateError::new(
                                format!("tools[{i}].tools"),
                                "a namespace's tools are an array",
                            ));
                        }
                    },
                    Some(ty) if hosted(ty) => sorted.drop_field(format!("tools.{ty}")),
                    _ => offered.push((format!("tools[{i}]"), t)),
                }
            }
            for (at, t) in offered {
                let (function, name, kind) = tool(&at, t, &mut sorted)?;
                if kinds.iter().any(|(n, _)| *n == name) {
                    return Err(TranslateError::new(
                        format!("{at}.name"),
                        format!("`{name}` is named by two tools"),
                    ));
                }
                oa.push(function);
                kinds.push((name, kind));
            }
            if !oa.is_empty() {
                out.insert("tools".into(), Value::Array(oa));
            }
            echo.insert("tools".into(), Value::Array(tools));
        }
        Some(other) => return Err(expected("tools", "an array", &other)),
    }
    match req.remove("tool_choice") {
        Some(choice) if !asks_nothing(&choice) => {
            out.insert("tool_choice".into(), tool_choice(&choice)?);
            echo.insert("tool_choice".into(), choice);
        }
        _ => {}
    }
    match req.remove("parallel_tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => {
            out.insert("parallel_tool_calls".into(), Value::Bool(b));
            echo.insert("parallel_tool_calls".into(), Value::Bool(b));
        }
        Some(other) => return Err(expected("parallel_tool_calls", "a boolean", &other)),
    }
    match req.remove("max_output_tokens") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64().is_some() => {
            out.insert("max_tokens".into(), n.clone());
            echo.insert("max_output_tokens".into(), n);
        }
        Some(other) => {
            return Err(expected("max_output_tokens", "a positive integer", &other));
        }
    }
    for k in ["temperature", "top_p"] {
        match req.remove(k) {
            None | Some(Value::Null) => {}
            Some(n) if n.is_number() => {
                out.insert(k.into(), n.clone());
                echo.insert(k.into(), n);
            }
            Some(other) => return Err(expected(k, "a number", &other)),
        }
    }
    match req.remove("text") {
        None | Some(Value::Null) => {}
        Some(Value::Object(mut text)) => {
            if let Some(format) = text.remove("format").filter(|f| !asks_nothing(f)) {
                if let Some(rf) = response_format(&format)? {
                    out.insert("response_format".into(), rf);
                }
                echo.insert("text".into(), json!({"format": format}));
            }
            sorted.rest(&text, "text.", &[fields::OPENAI_RESPONSES], &[])?;
        }
        Some(other) => return Err(expected("text", "an object", &other)),
    }
    sorted.rest(&req, "", &[fields::OPENAI_RESPONSES], &[])?;

    out.insert("stream".into(), Value::Bool(streaming));
    if streaming {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let body = serde_json::to_vec(&Value::Object(out))
        .map_err(|e| TranslateError::new("body", e.to_string()))?;
    Ok(Translated {
        target: Target::Chat,
        body,
        answer: Answer::new(model, streaming, created_at, echo, kinds).into(),
        dropped: sorted.dropped,
    })
}

/// A value that asks for nothing (as [`fields`] reads one): no choice to map.
fn asks_nothing(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn expected(field: &str, what: &str, got: &Value) -> TranslateError {
    TranslateError::new(field, format!("{what} expected, got {}", kind_of(got)))
}

/// One `input` item as chat messages, appended to `messages`.
fn input_item(
    i: usize,
    item: Value,
    messages: &mut Vec<Value>,
    sorted: &mut Sorted,
) -> Result<(), TranslateError> {
    let at = |f: &str| format!("input[{i}].{f}");
    let Value::Object(mut item) = item else {
        return Err(expected(&format!("input[{i}]"), "an object", &item));
    };
    let ty = match item.get("type") {
        Some(Value::String(t)) => t.clone(),
        // An "easy" message: a role and content, no type.
        None | Some(Value::Null) if item.contains_key("role") => "message".to_owned(),
        Some(other) => return Err(expected(&at("type"), "a string", other)),
        None => return Err(TranslateError::new(at("type"), "required")),
    };
    let text = |item: &Map<String, Value>, f: &str| -> Result<String, TranslateError> {
        match item.get(f) {
            Some(Value::String(s)) => Ok(s.clone()),
            None | Some(Value::Null) => Err(TranslateError::new(at(f), "required")),
            Some(other) => Err(expected(&at(f), "a string", other)),
        }
    };
    match ty.as_str() {
        "message" => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some("system" | "developer") => "system",
                _ => {
                    return Err(TranslateError::new(
                        at("role"),
                        "user, assistant, system or developer expected",
                    ));
                }
            };
            let content = message_content(&at("content"), item.remove("content"))?;
            // An assistant message right after calls is their message: chat
            // wants the calls' results right after the message that made them.
            if role == "assistant"
                && let Some(last) = messages.last_mut().and_then(Value::as_object_mut)
                && last.get("role").and_then(Value::as_str) == Some("assistant")
                && last.contains_key("tool_calls")
                && last.get("content").and_then(Value::as_str) == Some("")
            {
                last.insert("content".into(), content);
                return Ok(());
            }
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" | "custom_tool_call" | "local_shell_call" => {
            let call_id = text(&item, "call_id")?;
            let (name, arguments) = match ty.as_str() {
                "function_call" => (text(&item, "name")?, text(&item, "arguments")?),
                "custom_tool_call" => (
                    text(&item, "name")?,
                    json!({"input": text(&item, "input")?}).to_string(),
                ),
                _ => {
                    let action = &item["action"];
                    let mut args = Map::new();
                    for k in ["command", "working_directory", "timeout_ms", "env"] {
                        if let Some(v) = action.get(k).filter(|v| !v.is_null()) {
                            args.insert(k.into(), v.clone());
                        }
                    }
                    (LOCAL_SHELL.to_owned(), Value::Object(args).to_string())
                }
            };
            let call = json!({"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}});
            // Consecutive calls, and the assistant message before them, are
            // one chat message.
            match messages.last_mut().and_then(Value::as_object_mut) {
                Some(last) if last.get("role").and_then(Value::as_str) == Some("assistant") => {
                    match last.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => {
                            last.insert("tool_calls".into(), json!([call]));
                        }
                    }
                }
                _ => {
                    messages.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                }
            }
        }
        "function_call_output" | "custom_tool_call_output" | "local_shell_call_output" => {
            // A local-shell output names its call by `id` in OpenAI's spec.
            let call_id = match (ty.as_str(), item.get("call_id")) {
                ("local_shell_call_output", None | Some(Value::Null)) => text(&item, "id")?,
                _ => text(&item, "call_id")?,
            };
            let content = tool_output(&at("output"), item.get("output"))?;
            messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
        }
        // Reasoning from an earlier turn is left out: OpenAI's is encrypted
        // or summarised, and chat takes no reasoning back from the client.
        "reasoning" => sorted.drop_field("input[].reasoning"),
        "item_reference" => {
            return Err(TranslateError::new(
                at("type"),
                "pair keeps no items (it has no store): send the item itself",
            ));
        }
        other => {
            return Err(TranslateError::new(
                at("type"),
                format!("{other} items cannot be sent to this engine"),
            ));
        }
    }
    Ok(())
}

/// A message's content as chat content: a string where it is all text.
fn message_content(at: &str, content: Option<Value>) -> Result<Value, TranslateError> {
    let parts = match content {
        Some(Value::String(s)) => return Ok(Value::String(s)),
        Some(Value::Array(parts)) => parts,
        None | Some(Value::Null) => return Err(TranslateError::new(at, "required")),
        Some(other) => return Err(expected(at, "a string or an array of parts", &other)),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let at = format!("{at}[{j}]");
        let text = |key: &str| match p.get(key) {
            Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
            _ => Err(TranslateError::new(
                format!("{at}.{key}"),
                "a string is required",
            )),
        };
        out.push(match p["type"].as_str() {
            Some("input_text" | "output_text") => text("text")?,
            Some("refusal") => text("refusal")?,
            Some("input_image") => {
                let url = match (p.get("image_url"), p.get("file_id")) {
                    (Some(Value::String(u)), _) => u,
                    (_, Some(Value::String(_))) => {
                        return Err(TranslateError::new(
                            format!("{at}.file_id"),
                            "files are kept on OpenAI's servers: send the image as image_url (a URL or a data URL)",
                        ));
                    }
                    _ => {
                        return Err(TranslateError::new(
                            format!("{at}.image_url"),
                            "a URL or a data URL is required",
                        ));
                    }
                };
                let mut image = json!({"url": url});
                if let (Some(detail), Some(m)) = (p.get("detail"), image.as_object_mut())
                    && !detail.is_null()
                {
                    m.insert("detail".into(), detail.clone());
                }
                json!({"type": "image_url", "image_url": image})
            }
            other => {
                return Err(TranslateError::new(
                    format!("{at}.type"),
                    format!(
                        "{} parts cannot be sent to this engine",
                        other.unwrap_or("untyped")
                    ),
                ));
            }
        });
    }
    if out.iter().all(|p| p["type"] == "text") {
        let texts: Vec<&str> = out.iter().filter_map(|p| p["text"].as_str()).collect();
        Ok(Value::String(texts.join("\n")))
    } else {
        Ok(Value::Array(out))
    }
}

/// A call's output as a tool message's text (chat's tool messages take text).
fn tool_output(at: &str, output: Option<&Value>) -> Result<String, TranslateError> {
    match output {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| match (p["type"].as_str(), p.get("text")) {
                (Some("input_text" | "output_text"), Some(Value::String(t))) => Ok(t.as_str()),
                (Some("input_text" | "output_text"), _) => Err(TranslateError::new(
                    format!("{at}[{j}].text"),
                    "a string is required",
                )),
                _ => Err(TranslateError::new(
                    format!("{at}[{j}].type"),
                    "only text reaches a tool message on this engine",
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.join("\n")),
        None | Some(Value::Null) => Err(TranslateError::new(at, "required")),
        Some(other) => Err(expected(at, "a string or an array of parts", other)),
    }
}

/// One of the client's tools as the engine's function, its name and kind.
fn tool(
    at: &str,
    t: &Value,
    sorted: &mut Sorted,
) -> Result<(Value, String, ToolKind), TranslateError> {
    let name = || match t.get("name") {
        Some(Value::String(n)) if !n.is_empty() => Ok(n.clone()),
        _ => Err(TranslateError::new(
            format!("{at}.name"),
            "a name is required",
        )),
    };
    let mut description = t
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (name, parameters, kind) = match t["type"].as_str() {
        Some("function") => {
            let parameters = t.get("parameters").filter(|p| !p.is_null()).cloned();
            (
                name()?,
                parameters.unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                ToolKind::Function,
            )
        }
        Some("custom") => {
            // The engine cannot hold the model to a grammar: the model is
            // told the grammar instead, and the client that it was dropped.
            let format = &t["format"];
            if format["type"] == "grammar" {
                sorted.drop_field(format!("{at}.format"));
                description.push_str(&format!(
                    "\n\nThe input must follow this {} grammar:\n{}",
                    format["syntax"].as_str().unwrap_or("lark"),
                    format["definition"].as_str().unwrap_or_default()
                ));
            }
            let parameters = json!({"type": "object", "properties": {"input": {"type": "string",
                "description": "the tool's whole input, as free text"}},
                "required": ["input"], "additionalProperties": false});
            (name()?, parameters, ToolKind::Custom)
        }
        Some(LOCAL_SHELL) => {
            description = "Runs a command on the user's machine and returns its output.".into();
            let parameters = json!({"type": "object", "properties": {
                "command": {"type": "array", "items": {"type": "string"},
                    "description": "the program and its arguments"},
                "working_directory": {"type": "string"},
                "timeout_ms": {"type": "integer"},
            }, "required": ["command"]});
            (LOCAL_SHELL.to_owned(), parameters, ToolKind::LocalShell)
        }
        Some(other) => {
            return Err(TranslateError::new(
                format!("{at}.type"),
                format!(
                    "{other} tools have no translation; function, custom, local_shell \
                     and namespace tools reach the engine"
                ),
            ));
        }
        None => {
            return Err(TranslateError::new(format!("{at}.type"), "required"));
        }
    };
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name.clone()));
    let description = description.trim_start();
    if !description.is_empty() {
        function.insert("description".into(), Value::String(description.to_owned()));
    }
    function.insert("parameters".into(), parameters);
    if let Some(strict) = t.get("strict").filter(|s| s.is_boolean()) {
        function.insert("strict".into(), strict.clone());
    }
    Ok((
        json!({"type": "function", "function": function}),
        name,
        kind,
    ))
}

/// `tool_choice` in chat's form.
fn tool_choice(choice: &Value) -> Result<Value, TranslateError> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok(choice.clone())
        }
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name")) {
            (Some("function" | "custom"), Some(Value::String(name))) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            (Some(LOCAL_SHELL), _) => {
                Ok(json!({"type": "function", "function": {"name": LOCAL_SHELL}}))
            }
            _ => Err(TranslateError::new(
                "tool_choice",
                "a function or custom tool by name expected",
            )),
        },
        _ => Err(TranslateError::new(
            "tool_choice",
            "auto, none, required or a tool by name expected",
        )),
    }
}

/// `text.format` as chat's `response_format` (plain text is none).
fn response_format(format: &Value) -> Result<Option<Value>, TranslateError> {
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let Some(schema) = format.get("schema").filter(|s| s.is_object()) else {
                return Err(TranslateError::new(
                    "text.format.schema",
                    "a JSON schema is required",
                ));
            };
            let mut js = json!({
                "name": format["name"].as_str().unwrap_or("response"),
                "schema": schema,
            });
            if let Some(m) = js.as_object_mut() {
                for k in ["strict", "description"] {
                    if let Some(v) = format.get(k).filter(|v| !v.is_null()) {
                        m.insert(k.into(), v.clone());
                    }
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(TranslateError::new(
            "text.format.type",
            "text, json_object or json_schema expected",
        )),
    }
}

/// OpenAI's error type for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

/// An error body in OpenAI's shape.
pub fn error_body(status: u16, message: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"error": {
        "message": message, "type": error_type(status), "param": null, "code": null,
    }}))
    .unwrap_or_default()
}

/// Seconds since the Unix epoch of an RFC 3339 time
/// (`2026-12-03T12:00:00.123+01:00`), `None` if it is not one.
fn unix_seconds(t: &str) -> Option<i64> {
    let num = |a: usize, b: usize| t.get(a..b)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, s) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let zone = t
        .get(19..)?
        .trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    let offset = match zone.as_bytes().first()? {
        b'Z' | b'z' => 0,
        sign @ (b'+' | b'-') => {
            let (oh, om) = (
                zone.get(1..3)?.parse::<i64>().ok()?,
                zone.get(4..6)?.parse::<i64>().ok()?,
            );
            let off = oh * 3600 + om * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's days_from_civil).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (mo + if mo > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + s - offset)
}

/// One output item of the answer, as it grows.
#[derive(Debug)]
enum Item {
    /// The model's reasoning, whole (a local engine's is not a summary).
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        kind: ToolKind,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    /// The item as the client's output item: whole, or (`added`) as it
    /// opens, its text still empty.
    fn json(&self, status: &str, added: bool) -> Value {
        match self {
            Item::Reasoning { id, text: t } => json!({
                "id": id, "type": "reasoning", "summary": [], "status": status,
                "content": if added { json!([]) } else { json!([{"type": "reasoning_text", "text": t}]) },
            }),
            Item::Message { id, text: t } => json!({
                "id": id, "type": "message", "role": "assistant", "status": status,
                "content": if added { json!([]) } else { json!([output_text(t)]) },
            }),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
                kind: ToolKind::Function,
            } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id,
                "name": name, "arguments": if added { "" } else { arguments },
            }),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
                kind: ToolKind::Custom,
            } => json!({
                "id": id, "type": "custom_tool_call", "call_id": call_id, "name": name,
                "input": if added { String::new() } else { custom_input(arguments) },
            }),
            Item::Call {
                id,
                call_id,
                arguments,
                kind: ToolKind::LocalShell,
                ..
            } => json!({
                "id": id, "type": "local_shell_call", "status": status, "call_id": call_id,
                "action": shell_action(if added { "{}" } else { arguments }),
            }),
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

/// A custom tool's input from its function's arguments (`{"input": ...}`),
/// or the arguments as they are when the model did not wrap them.
fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(mut o)) => match o.remove("input") {
            Some(Value::String(s)) => s,
            _ => arguments.to_owned(),
        },
        _ => arguments.to_owned(),
    }
}

/// A `local_shell_call`'s action from the function's arguments.
fn shell_action(arguments: &str) -> Value {
    let args = serde_json::from_str::<Value>(arguments).unwrap_or(Value::Null);
    let command = match &args["command"] {
        Value::Array(a) => a.iter().filter(|c| c.is_string()).cloned().collect(),
        // A model that wrote the command as one line meant a shell to read it.
        Value::String(s) => vec![json!("sh"), json!("-c"), json!(s)],
        _ => Vec::new(),
    };
    let env = match &args["env"] {
        Value::Object(e) => Value::Object(
            e.iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        _ => json!({}),
    };
    json!({
        "type": "exec", "command": command, "env": env,
        "working_directory": args["working_directory"].as_str(),
        "timeout_ms": args["timeout_ms"].as_u64(),
    })
}

/// How a response ended (or that it has not).
#[derive(Clone, Copy, Debug)]
enum Status<'a> {
    InProgress,
    Completed,
    /// Cut short, for this reason (`max_output_tokens`).
    Incomplete(&'static str),
    /// The engine failed, with this message.
    Failed(&'a str),
}

impl Status<'_> {
    fn from_finish(finish: Option<&str>) -> Self {
        match finish {
            Some("length") => Status::Incomplete("max_output_tokens"),
            Some("content_filter") => Status::Incomplete("content_filter"),
            _ => Status::Completed,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete(_) => "incomplete",
            Status::Failed(_) => "failed",
        }
    }
}

/// A delta event's data, written without building a JSON tree (the
/// stream's hot path).
#[derive(Serialize)]
struct Delta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<u32>,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

fn write_event(out: &mut Vec<u8>, name: &str, data: &impl Serialize) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let _ = serde_json::to_writer(&mut *out, data);
    out.extend_from_slice(b"\n\n");
}

/// Writes event `name` with `data`'s fields, its `type` and the next
/// sequence number.
fn emit(out: &mut Vec<u8>, seq: &mut u64, name: &str, mut data: Value) {
    if let Some(m) = data.as_object_mut() {
        m.insert("type".into(), Value::String(name.to_owned()));
        m.insert("sequence_number".into(), (*seq).into());
    }
    *seq += 1;
    write_event(out, name, &data);
}

/// What feeds the open item: a stream's deltas go to the item open for
/// their kind, and a delta of another kind closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Feed {
    Reasoning,
    Text,
    /// A tool call, by its index in chat's `tool_calls`.
    Tool(u64),
}

/// A chat completion on its way to a Responses client.
#[derive(Debug)]
pub struct Answer {
    model: String,
    streaming: bool,
    /// `resp_pair<created_at digits>`.
    id: String,
    created_at: i64,
    /// The request's settings a response object repeats.
    echo: Map<String, Value>,
    /// The client's tools by name, and what their calls come back as.
    kinds: Vec<(String, ToolKind)>,
    splitter: Splitter,
    events: Vec<Event>,
    seq: u64,
    started: bool,
    items: Vec<Item>,
    /// What feeds the last item, while it is open.
    open: Option<Feed>,
    finish_reason: Option<String>,
    /// pair's receipt from the engine-side stream's final chunk.
    x_pair: Option<Value>,
    input_tokens: u64,
    output_tokens: u64,
    deltas: u64,
    done: bool,
}

impl Answer {
    fn new(
        model: String,
        streaming: bool,
        created_at: &str,
        mut echo: Map<String, Value>,
        kinds: Vec<(String, ToolKind)>,
    ) -> Self {
        // Ids that differ per request: the node's timestamp, digits only.
        let digits: String = created_at.chars().filter(char::is_ascii_digit).collect();
        for (k, default) in [
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("text", json!({"format": {"type": "text"}})),
            ("temperature", Value::Null),
            ("top_p", Value::Null),
            ("max_output_tokens", Value::Null),
        ] {
            echo.entry(k).or_insert(default);
        }
        Self {
            x_pair: None,
            model,
            streaming,
            id: format!("resp_pair{digits}"),
            created_at: unix_seconds(created_at).unwrap_or(0),
            echo,
            kinds,
            splitter: Splitter::new(Framing::Sse),
            events: Vec::new(),
            seq: 0,
            started: false,
            items: Vec::new(),
            open: None,
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

    /// The id of output item `n`, `prefix` naming its kind as OpenAI's do.
    fn item_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{}_{n}", self.id.trim_start_matches("resp_"))
    }

    fn kind(&self, name: &str) -> ToolKind {
        self.kinds
            .iter()
            .find(|(n, _)| n == name)
            .map_or(ToolKind::Function, |(_, k)| *k)
    }

    /// Output item `n`, a call the engine made. A local-shell call's item id
    /// is its call id, so an output naming the call by `id` finds it.
    fn call(&self, n: usize, call_id: Option<&str>, name: String, arguments: String) -> Item {
        let kind = self.kind(&name);
        let call_id = call_id
            .filter(|c| !c.is_empty())
            .map_or_else(|| self.item_id("call", n), str::to_owned);
        let id = match kind {
            ToolKind::Function => self.item_id("fc", n),
            ToolKind::Custom => self.item_id("ctc", n),
            ToolKind::LocalShell => call_id.clone(),
        };
        Item::Call {
            id,
            call_id,
            name,
            arguments,
            kind,
        }
    }

    /// The response object, with `items` as its output and `tokens` (in,
    /// out) as its usage.
    fn response(&self, status: Status<'_>, items: &[Item], tokens: (u64, u64)) -> Value {
        let last = items.len().saturating_sub(1);
        let output: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let s = match status {
                    // Only the last item was cut short (or left open).
                    Status::Incomplete(_) | Status::Failed(_) if i == last => "incomplete",
                    _ => "completed",
                };
                item.json(s, false)
            })
            .collect();
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status.name(), "model": self.model, "output": output,
            "error": match status {
                Status::Failed(message) => json!({"code": "server_error", "message": message}),
                _ => Value::Null,
            },
            "incomplete_details": match status {
                Status::Incomplete(reason) => json!({"reason": reason}),
                _ => Value::Null,
            },
            "usage": match status {
                Status::Completed | Status::Incomplete(_) => json!({
                    "input_tokens": tokens.0,
                    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                    "output_tokens": tokens.1,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": tokens.0 + tokens.1,
                }),
                _ => Value::Null,
            },
            "instructions": null, "metadata": {}, "previous_response_id": null,
        });
        if let Some(m) = r.as_object_mut() {
            m.extend(self.echo.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        r
    }

    pub fn whole(&self, status: u16, body: &[u8]) -> Vec<u8> {
        if !(200..300).contains(&status) {
            return error_body(status, &crate::error_message(body));
        }
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return error_body(502, "the engine's answer is not JSON");
        };
        let choice = &v["choices"][0];
        let message = &choice["message"];
        let mut items = Vec::new();
        let reasoning = message["reasoning_content"]
            .as_str()
            .or_else(|| message["reasoning"].as_str());
        if let Some(text) = reasoning.filter(|t| !t.is_empty()) {
            items.push(Item::Reasoning {
                id: self.item_id("rs", items.len()),
                text: text.to_owned(),
            });
        }
        if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
            items.push(Item::Message {
                id: self.item_id("msg", items.len()),
                text: text.to_owned(),
            });
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let f = &call["function"];
            let item = self.call(
                items.len(),
                call["id"].as_str(),
                f["name"].as_str().unwrap_or_default().to_owned(),
                f["arguments"].as_str().unwrap_or_default().to_owned(),
            );
            items.push(item);
        }
        let usage = &v["usage"];
        let tokens = (
            usage["prompt_tokens"].as_u64().unwrap_or(0),
            usage["completion_tokens"].as_u64().unwrap_or(0),
        );
        let status = Status::from_finish(choice["finish_reason"].as_str());
        serde_json::to_vec(&self.response(status, &items, tokens)).unwrap_or_default()
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
            self.start(out);
            match ev {
                Event::Json(raw) => self.chunk(&raw, out),
                Event::Done => self.close(out),
                Event::Truncated if self.finish_reason.is_some() => self.close(out),
                Event::Truncated => {
                    self.fail("the engine's stream ended before it was complete", out);
                }
                Event::TooLarge => self.fail("the engine sent a chunk over 16 MiB", out),
            }
        }
    }

    /// The events that open the stream: the response, in progress.
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut seq = self.seq;
        self.opening(&mut seq, out);
        self.seq = seq;
    }

    fn opening(&self, seq: &mut u64, out: &mut Vec<u8>) {
        let r = self.response(Status::InProgress, &[], (0, 0));
        emit(out, seq, "response.created", json!({"response": r}));
        emit(out, seq, "response.in_progress", json!({"response": r}));
    }

    /// The `response.failed` event that ends a broken stream (after the
    /// opening events, if none went out: a client's stream reader wants
    /// the response created first). The response holds the items so far.
    pub fn error_event(&self, message: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut seq = self.seq;
        if !self.started {
            self.opening(&mut seq, &mut out);
        }
        let r = self.response(Status::Failed(message), &self.items, (0, 0));
        emit(
            &mut out,
            &mut seq,
            "response.failed",
            json!({"response": r}),
        );
        out
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        out.extend(self.error_event(message));
        self.done = true;
    }

    fn chunk(&mut self, raw: &[u8], out: &mut Vec<u8>) {
        let Ok(c) = serde_json::from_slice::<Chunk<'_>>(raw) else {
            return;
        };
        if c.error.is_some() {
            self.fail(&crate::error_message(raw), out);
            return;
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
        let delta = choice.delta.unwrap_or_default();
        if let Some(text) = delta.reasoning_content.filter(|t| !t.is_empty()) {
            self.deltas += 1;
            if self.open != Some(Feed::Reasoning) {
                let id = self.item_id("rs", self.items.len());
                self.open_item(
                    Feed::Reasoning,
                    Item::Reasoning {
                        id,
                        text: String::new(),
                    },
                    out,
                );
            }
            self.delta(&text, out);
        }
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            self.deltas += 1;
            if self.open != Some(Feed::Text) {
                let id = self.item_id("msg", self.items.len());
                self.open_item(
                    Feed::Text,
                    Item::Message {
                        id,
                        text: String::new(),
                    },
                    out,
                );
            }
            self.delta(&text, out);
        }
        for call in delta.tool_calls.unwrap_or_default() {
            let k = call.index.unwrap_or(0);
            let f = call.function.unwrap_or_default();
            if self.open != Some(Feed::Tool(k)) {
                let name = f.name.map(Cow::into_owned).unwrap_or_default();
                let item = self.call(self.items.len(), call.id.as_deref(), name, String::new());
                self.open_item(Feed::Tool(k), item, out);
            }
            if let Some(args) = f.arguments.filter(|a| !a.is_empty()) {
                self.delta(&args, out);
            }
        }
        if let Some(f) = choice.finish_reason {
            self.finish_reason = Some(f.into_owned());
        }
    }

    /// Closes the open item and opens `item`, fed by `feed`.
    fn open_item(&mut self, feed: Feed, item: Item, out: &mut Vec<u8>) {
        self.close_item(out);
        let output_index = self.items.len();
        emit(
            out,
            &mut self.seq,
            "response.output_item.added",
            json!({"output_index": output_index, "item": item.json("in_progress", true)}),
        );
        let part = match &item {
            Item::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": ""})),
            Item::Message { .. } => Some(output_text("")),
            Item::Call { .. } => None,
        };
        if let Some(part) = part {
            emit(
                out,
                &mut self.seq,
                "response.content_part.added",
                json!({"item_id": item.id(), "output_index": output_index, "content_index": 0, "part": part}),
            );
        }
        self.items.push(item);
        self.open = Some(feed);
    }

    /// Appends `text` to the open item, and sends it on (a custom or
    /// local-shell call's arguments are sent whole as the call closes:
    /// they are JSON around what the client wants).
    fn delta(&mut self, text: &str, out: &mut Vec<u8>) {
        let output_index = self.items.len().saturating_sub(1);
        let Some(item) = self.items.last_mut() else {
            return;
        };
        let (kind, content_index, logprobs) = match item {
            Item::Reasoning { text: t, .. } => {
                t.push_str(text);
                ("response.reasoning_text.delta", Some(0), None)
            }
            Item::Message { text: t, .. } => {
                t.push_str(text);
                ("response.output_text.delta", Some(0), Some([]))
            }
            Item::Call {
                arguments, kind, ..
            } => {
                arguments.push_str(text);
                if *kind != ToolKind::Function {
                    return;
                }
                ("response.function_call_arguments.delta", None, None)
            }
        };
        let data = Delta {
            kind,
            sequence_number: self.seq,
            item_id: item.id(),
            output_index,
            content_index,
            delta: text,
            logprobs,
        };
        write_event(out, kind, &data);
        self.seq += 1;
    }

    /// Closes the open item: its text whole, then the item whole.
    fn close_item(&mut self, out: &mut Vec<u8>) {
        if self.open.take().is_none() {
            return;
        }
        let output_index = self.items.len().saturating_sub(1);
        let Some(item) = self.items.last() else {
            return;
        };
        let status = match Status::from_finish(self.finish_reason.as_deref()) {
            Status::Incomplete(_) => "incomplete",
            _ => "completed",
        };
        // Each event names the item.
        let on_item = |mut data: Value| {
            if let Some(m) = data.as_object_mut() {
                m.insert("item_id".into(), json!(item.id()));
                m.insert("output_index".into(), json!(output_index));
            }
            data
        };
        let mut events = match item {
            Item::Reasoning { text, .. } => vec![
                (
                    "response.reasoning_text.done",
                    on_item(json!({"content_index": 0, "text": text})),
                ),
                (
                    "response.content_part.done",
                    on_item(json!({"content_index": 0,
                        "part": {"type": "reasoning_text", "text": text}})),
                ),
            ],
            Item::Message { text, .. } => vec![
                (
                    "response.output_text.done",
                    on_item(json!({"content_index": 0, "text": text, "logprobs": []})),
                ),
                (
                    "response.content_part.done",
                    on_item(json!({"content_index": 0, "part": output_text(text)})),
                ),
            ],
            Item::Call {
                arguments, kind, ..
            } => match kind {
                ToolKind::Function => vec![(
                    "response.function_call_arguments.done",
                    on_item(json!({"arguments": arguments})),
                )],
                ToolKind::Custom => {
                    let input = custom_input(arguments);
                    vec![
                        (
                            "response.custom_tool_call_input.delta",
                            on_item(json!({"delta": input})),
                        ),
                        (
                            "response.custom_tool_call_input.done",
                            on_item(json!({"input": input})),
                        ),
                    ]
                }
                ToolKind::LocalShell => Vec::new(),
            },
        };
        events.push((
            "response.output_item.done",
            json!({"output_index": output_index, "item": item.json(status, false)}),
        ));
        for (name, data) in events {
            emit(out, &mut self.seq, name, data);
        }
    }

    /// The engine said it was done: the last item closes and the response
    /// completes (or is incomplete, cut at the token limit).
    fn close(&mut self, out: &mut Vec<u8>) {
        self.close_item(out);
        self.done = true;
        if self.output_tokens == 0 {
            self.output_tokens = self.deltas;
        }
        let status = Status::from_finish(self.finish_reason.as_deref());
        let name = match status {
            Status::Incomplete(_) => "response.incomplete",
            _ => "response.completed",
        };
        let mut r = self.response(status, &self.items, (self.input_tokens, self.output_tokens));
        if let Some(x) = self.x_pair.take() {
            r["x_pair"] = x;
        }
        emit(out, &mut self.seq, name, json!({"response": r}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Route, Timing, request as translate};
    use proptest::prelude::*;

    const AT: &str = "2026-12-03T12:00:00.25Z";

    fn body(req: &str) -> Value {
        let t = translate(Route::OpenAiResponses, req.as_bytes(), AT).unwrap();
        serde_json::from_slice(&t.body).unwrap()
    }

    fn refused(req: &str) -> String {
        translate(Route::OpenAiResponses, req.as_bytes(), AT)
            .unwrap_err()
            .field
    }

    #[test]
    fn a_string_input_and_instructions_become_a_chat() {
        let b = body(
            r#"{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":64,
                "temperature":0.2,"top_p":0.9,"stream":true,"parallel_tool_calls":false}"#,
        );
        assert_eq!(
            b["messages"],
            json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["temperature"], 0.2);
        assert_eq!(b["top_p"], 0.9);
        assert_eq!(b["parallel_tool_calls"], false);
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn items_calls_and_their_outputs_become_chat_messages() {
        let b = body(
            r#"{"model":"m","input":[
                {"role":"developer","content":"use tools"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"look"},
                    {"type":"input_image","image_url":"data:image/png;base64,AA","detail":"low"}]},
                {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"xyz"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Looking.","annotations":[]}]},
                {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
                {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"c1","output":"one"},
                {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"two"}]},
                {"type":"custom_tool_call","call_id":"c3","name":"apply_patch","input":"*** Begin Patch"},
                {"type":"custom_tool_call_output","call_id":"c3","output":"done"},
                {"type":"local_shell_call","id":"c4","call_id":"c4","status":"completed",
                    "action":{"type":"exec","command":["ls"],"env":{},"timeout_ms":null}},
                {"type":"local_shell_call_output","id":"c4","output":"a.txt"}],
              "tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true},
                {"type":"custom","name":"apply_patch","description":"Patch files.",
                    "format":{"type":"grammar","syntax":"lark","definition":"start: patch"}},
                {"type":"local_shell"}],
              "tool_choice":{"type":"function","name":"f"},
              "text":{"format":{"type":"json_schema","name":"out","schema":{"type":"object"},"strict":true}}}"#,
        );
        let m = b["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "use tools"}));
        assert_eq!(m[1]["content"][0], json!({"type": "text", "text": "look"}));
        assert_eq!(
            m[1]["content"][1],
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}})
        );
        // The reasoning item is gone; the assistant message carries both calls.
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["content"], "Looking.");
        let calls = m[2]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["id"], "c1");
        assert_eq!(calls[0]["function"]["arguments"], r#"{"a":1}"#);
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "one"})
        );
        assert_eq!(m[4]["tool_call_id"], calls[1]["id"]);
        assert_eq!(m[4]["content"], "two");
        assert_eq!(
            m[5]["tool_calls"][0]["function"],
            json!({"name": "apply_patch", "arguments": r#"{"input":"*** Begin Patch"}"#})
        );
        assert_eq!(m[6]["tool_call_id"], "c3");
        assert_eq!(
            m[7]["tool_calls"][0]["function"],
            json!({"name": "local_shell", "arguments": r#"{"command":["ls"],"env":{}}"#})
        );
        assert_eq!(
            m[8],
            json!({"role": "tool", "tool_call_id": "c4", "content": "a.txt"})
        );
        assert_eq!(m.len(), 9);
        let tools = b["tools"].as_array().unwrap();
        assert_eq!(
            tools[0],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}})
        );
        let patch = &tools[1]["function"];
        assert_eq!(patch["parameters"]["required"], json!(["input"]));
        assert!(
            patch["description"]
                .as_str()
                .unwrap()
                .contains("start: patch")
        );
        assert_eq!(tools[2]["function"]["name"], "local_shell");
        assert_eq!(
            b["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(
            b["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": true}})
        );
    }

    #[test]
    fn what_cannot_be_had_is_refused_naming_the_field() {
        assert_eq!(
            refused(r#"{"model":"m","input":"hi","previous_response_id":"resp_1"}"#),
            "previous_response_id"
        );
        assert_eq!(
            refused(
                r#"{"model":"m","input":[{"role":"user","content":"a"},{"type":"web_search_call","id":"w"}]}"#
            ),
            "input[1].type"
        );
        assert_eq!(
            refused(r#"{"model":"m","input":[{"type":"item_reference","id":"msg_1"}]}"#),
            "input[0].type"
        );
        assert_eq!(refused(r#"{"model":"m","input":3}"#), "input");
        assert_eq!(
            refused(r#"{"model":"m","input":[{"role":"user"}]}"#),
            "input[0].content"
        );
        assert_eq!(
            refused(
                r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_image","file_id":"file_1"}]}]}"#
            ),
            "input[0].content[0].file_id"
        );
        assert_eq!(
            refused(
                r#"{"model":"m","input":[{"type":"function_call","name":"f","arguments":"{}"}]}"#
            ),
            "input[0].call_id"
        );
        assert_eq!(
            refused(
                r#"{"model":"m","input":"hi","tools":[{"type":"function","name":"f"},{"type":"shell_2099"}]}"#
            ),
            "tools[1].type"
        );
        assert_eq!(refused(r#"{"input":"hi"}"#), "model");
        assert_eq!(
            refused(r#"{"model":"m","input":"hi","frobnicate":1}"#),
            "frobnicate"
        );
        assert_eq!(refused(r#"[1]"#), "body");
    }

    #[test]
    fn codexs_tools_namespaces_flattened_and_hosted_ones_dropped() {
        let t = translate(
            Route::OpenAiResponses,
            br#"{"model":"m","input":"hi","client_metadata":{"thread_id":"t"},"tools":[
                {"type":"function","name":"exec_command","strict":false,"parameters":{"type":"object"}},
                {"type":"namespace","name":"multi_agent_v1","description":"agents","tools":[
                    {"type":"function","name":"spawn_agent","parameters":{"type":"object"}}]},
                {"type":"web_search","external_web_access":false}]}"#,
            AT,
        )
        .unwrap();
        assert_eq!(t.dropped, ["client_metadata", "tools.web_search"]);
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        let names: Vec<&str> = b["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["exec_command", "spawn_agent"]);
    }

    #[test]
    fn dropped_fields_are_listed() {
        let t = translate(
            Route::OpenAiResponses,
            br#"{"model":"m","input":"hi","store":false,"include":["reasoning.encrypted_content"],
                 "prompt_cache_key":"k","reasoning":{"effort":"high"},"text":{"verbosity":"low"},
                 "tools":[{"type":"custom","name":"p","format":{"type":"grammar","syntax":"lark","definition":"x"}}]}"#,
            AT,
        )
        .unwrap();
        assert_eq!(
            t.dropped,
            [
                "include",
                "prompt_cache_key",
                "reasoning.effort",
                "text.verbosity",
                "tools[0].format"
            ]
        );
    }

    #[test]
    fn an_earlier_turns_reasoning_is_dropped_and_named() {
        let t = translate(
            Route::OpenAiResponses,
            br#"{"model":"m","input":[{"role":"user","content":"hi"},
                {"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"xyz"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi."}]}]}"#,
            AT,
        )
        .unwrap();
        assert_eq!(t.dropped, ["input[].reasoning"]);
        let b: Value = serde_json::from_slice(&t.body).unwrap();
        assert_eq!(b["messages"].as_array().unwrap().len(), 2);
    }

    fn answer(req: &str) -> Answer {
        let t = translate(Route::OpenAiResponses, req.as_bytes(), AT).unwrap();
        let crate::AnswerKind::Responses(a) = t.answer.inner else {
            panic!("not a Responses answer")
        };
        a
    }

    const TOOLS: &str = r#""tools":[{"type":"function","name":"f"},{"type":"custom","name":"apply_patch"},{"type":"local_shell"}]"#;

    #[test]
    fn a_whole_answer_is_a_response_object() {
        let a = answer(&format!(r#"{{"model":"m","input":"hi",{TOOLS}}}"#));
        assert_eq!(a.content_type(), "application/json");
        let v: Value = serde_json::from_slice(&a.whole(
            200,
            br#"{"choices":[{"message":{"content":"Hi","reasoning_content":"think",
                "tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},
                  {"id":"c2","type":"function","function":{"name":"apply_patch","arguments":"{\"input\":\"*** Begin\"}"}},
                  {"id":"c3","type":"function","function":{"name":"local_shell","arguments":"{\"command\":[\"ls\",\"-l\"]}"}}]},
                "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        ))
        .unwrap();
        assert_eq!(v["object"], "response");
        assert_eq!(v["id"], "resp_pair2026120312000025");
        assert_eq!(v["created_at"], 1_796_299_200);
        assert_eq!(v["status"], "completed");
        assert_eq!(v["incomplete_details"], Value::Null);
        let out = v["output"].as_array().unwrap();
        assert_eq!(out[0]["type"], "reasoning");
        assert_eq!(out[0]["content"][0]["text"], "think");
        assert_eq!(out[1]["type"], "message");
        assert_eq!(out[1]["content"][0]["text"], "Hi");
        assert_eq!(out[2]["type"], "function_call");
        assert_eq!(out[2]["call_id"], "c1");
        assert_eq!(out[2]["arguments"], r#"{"x":1}"#);
        assert_eq!(out[3]["type"], "custom_tool_call");
        assert_eq!(out[3]["input"], "*** Begin");
        assert_eq!(out[4]["type"], "local_shell_call");
        assert_eq!(out[4]["action"]["command"], json!(["ls", "-l"]));
        let ids: Vec<&str> = out.iter().map(|o| o["id"].as_str().unwrap()).collect();
        assert!(
            (1..ids.len()).all(|i| !ids[..i].contains(&ids[i])),
            "{ids:?}"
        );
        assert_eq!(v["usage"]["input_tokens"], 3);
        assert_eq!(v["usage"]["output_tokens"], 2);
        assert_eq!(v["usage"]["total_tokens"], 5);
        assert_eq!(v["tools"][0]["name"], "f");

        let cut: Value = serde_json::from_slice(&a.whole(
            200,
            br#"{"choices":[{"message":{"content":"Hi"},"finish_reason":"length"}]}"#,
        ))
        .unwrap();
        assert_eq!(cut["status"], "incomplete");
        assert_eq!(
            cut["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(cut["output"][0]["status"], "incomplete");

        let e: Value =
            serde_json::from_slice(&a.whole(404, br#"{"error":{"message":"no model m"}}"#))
                .unwrap();
        assert_eq!(
            e,
            json!({"error": {"message": "no model m", "type": "not_found_error", "param": null, "code": null}})
        );
        let e: Value = serde_json::from_slice(&error_body(503, "busy")).unwrap();
        assert_eq!(e["error"]["type"], "server_error");
    }

    #[test]
    fn rfc3339_times_are_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(
            unix_seconds("2026-12-03T13:00:00.5+01:00"),
            Some(1_796_299_200)
        );
        assert_eq!(unix_seconds("2026-12-03"), None);
        assert_eq!(unix_seconds("é"), None);
    }

    const SSE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"reasoning_content\":\"Hm\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\"\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"apply_patch\",\"arguments\":\"{\\\"input\\\":\\\"*** Be\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":\"gin\\\"}\"}}]}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\n\n\
data: [DONE]\n\n";

    /// The client's events (name, data) for `pieces` of the engine's stream.
    fn events(pieces: &[&[u8]]) -> Vec<(String, Value)> {
        let mut t = translate(
            Route::OpenAiResponses,
            format!(r#"{{"model":"m","input":"hi","stream":true,{TOOLS}}}"#).as_bytes(),
            AT,
        )
        .unwrap();
        assert_eq!(t.answer.content_type(), "text/event-stream");
        let mut out = Vec::new();
        for p in pieces {
            t.answer.push(p, Timing::default(), &mut out);
        }
        t.answer.finish(Timing::default(), &mut out);
        assert!(t.answer.done());
        parse(&out)
    }

    fn parse(out: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8(out.to_vec())
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_owned();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], name.as_str());
                (name, data)
            })
            .collect()
    }

    fn numbered_from_zero(evs: &[(String, Value)]) {
        for (i, (_, d)) in evs.iter().enumerate() {
            assert_eq!(d["sequence_number"], i, "{evs:?}");
        }
    }

    #[test]
    fn a_stream_is_the_responses_event_sequence() {
        let evs = events(&[SSE]);
        let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        numbered_from_zero(&evs);
        let done = &evs.last().unwrap().1["response"];
        assert_eq!(done["status"], "completed");
        let out = done["output"].as_array().unwrap();
        assert_eq!(out.len(), 4);
        assert_eq!(out[0]["content"][0]["text"], "Hm");
        assert_eq!(out[1]["content"][0]["text"], "Hi there");
        assert_eq!(out[2]["arguments"], r#"{"x":1}"#);
        assert_eq!(out[2]["call_id"], "c1");
        assert_eq!(out[3]["type"], "custom_tool_call");
        assert_eq!(out[3]["input"], "*** Begin");
        assert_eq!(done["usage"]["input_tokens"], 7);
        assert_eq!(done["usage"]["output_tokens"], 5);
        // Every event about an item names the item its `added` opened.
        for (name, d) in &evs {
            if let Some(id) = d["item_id"].as_str() {
                let index = d["output_index"].as_u64().unwrap() as usize;
                assert_eq!(out[index]["id"], id, "{name}");
            }
        }
    }

    #[test]
    fn a_stream_cut_short_or_failing_ends_in_response_failed() {
        let cut = events(&[&SSE[..200]]);
        numbered_from_zero(&cut);
        let (name, last) = cut.last().unwrap();
        assert_eq!(name, "response.failed");
        assert_eq!(last["response"]["status"], "failed");
        assert_eq!(last["response"]["error"]["code"], "server_error");
        assert_eq!(last["response"]["output"][0]["type"], "reasoning");

        let failed = events(&[b"data: {\"error\":{\"message\":\"out of memory\"}}\n\n"]);
        let names: Vec<&str> = failed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.failed"
            ]
        );
        assert_eq!(failed[2].1["response"]["error"]["message"], "out of memory");

        // The proxy's own error event goes on from where the stream is.
        let mut a = answer(r#"{"model":"m","input":"hi","stream":true}"#);
        let fresh = parse(&a.error_event("engine gone"));
        assert_eq!(fresh[0].0, "response.created");
        numbered_from_zero(&fresh);
        let mut out = Vec::new();
        a.push(&SSE[..150], &mut out);
        out.extend(a.error_event("engine gone"));
        let evs = parse(&out);
        numbered_from_zero(&evs);
        assert_eq!(evs.last().unwrap().0, "response.failed");
    }

    #[test]
    fn a_stream_cut_at_the_token_limit_is_incomplete() {
        let evs = events(&[b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"]);
        let (name, last) = evs.last().unwrap();
        assert_eq!(name, "response.incomplete");
        assert_eq!(
            last["response"]["incomplete_details"],
            json!({"reason": "max_output_tokens"})
        );
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    }

    proptest! {
        #[test]
        fn a_stream_translated_in_any_pieces_equals_it_translated_whole(cuts in prop::collection::vec(0usize..SSE.len(), 0..10)) {
            let pieces = crate::frame::cut(SSE, &cuts);
            prop_assert_eq!(events(&pieces), events(&[SSE]));
        }
    }
}
