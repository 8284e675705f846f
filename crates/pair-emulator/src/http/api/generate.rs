//! The text generation routes (Ollama generate and chat, OpenAI chat and
//! completions): reading the prompt and limits, submitting the job, and
//! Ollama's load-only requests.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::common::{model_of, parse, wait_done};
use super::errors::{refused, shutting_down};
use super::prefix::{Shape, chain_of};
use super::render::{Api, Gen, ToolCall, stream_body};
use crate::ModelStatus;
use crate::http::text::{answered_tokens, count_tokens, request_seed, rfc3339_now, unix_now};
use crate::http::{App, Flavor, json_response};

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

/// Ollama's generate is raw (the prompt as given) only when asked.
fn is_raw(req: &Map<String, Value>) -> bool {
    req.get("raw").and_then(Value::as_bool) == Some(true)
}

/// What a templated Ollama generate renders: the model's chat template
/// over its `system` text and the prompt as the user's turn, as a chat
/// with those messages would (so a chat that ends in the answer's start
/// continues it).
fn templated(req: &Map<String, Value>) -> Map<String, Value> {
    let mut messages = Vec::new();
    if let Some(system) = req
        .get("system")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        messages.push(json!({ "role": "system", "content": system }));
    }
    let prompt = prompt_of(req).0;
    messages.push(json!({ "role": "user", "content": prompt }));
    let mut chat = req.clone();
    chat.insert("messages".into(), Value::Array(messages));
    chat
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

/// The length of the answer the emulated model "wants" to give: it stops
/// there on its own (answer ends "stop") unless the request's limit cuts it
/// first. Load generators (`pair-sim live`) set it so the engine generates
/// a drawn length the router is not told, as a real model's answer is.
pub const ANSWER_TOKENS: &str = "x-emulator-answer-tokens";

fn answer_tokens(headers: &HeaderMap) -> Option<u32> {
    headers
        .get(ANSWER_TOKENS)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n > 0)
}

/// Tokens generated, and whether the request's own limit ended the answer.
fn output_length(limit: Option<u32>, natural: Option<u32>, default: u32) -> (u32, bool) {
    match (limit, natural) {
        (Some(l), Some(n)) => (l.min(n).max(1), n >= l),
        (None, Some(n)) => (n, false),
        (Some(l), None) => (l.max(1), true),
        (None, None) => (default.max(1), false),
    }
}

/// Common path of every text generation route.
async fn generate(
    app: App,
    path: &str,
    (headers, body): (HeaderMap, Bytes),
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
    let shape = if chat {
        Shape::Chat
    } else if matches!(api, Api::OllamaGenerate) && !is_raw(&req) {
        Shape::Templated
    } else {
        Shape::Raw
    };
    let (prompt, mut prompt_tokens) = match shape {
        Shape::Chat => chat_prompt(&req),
        Shape::Templated => chat_prompt(&templated(&req)),
        Shape::Raw => prompt_of(&req),
    };
    // The engine renders the offered tools into the prompt too.
    if let Some(tools) = req.get("tools").filter(|t| chat && !t.is_null()) {
        prompt_tokens = prompt_tokens.saturating_add(count_tokens(&tools.to_string()));
    }
    // The engine's cache finds what it holds of this chain when the job
    // takes a slot; only the rest is prefilled.
    let chain = chain_of(&req, shape);
    let prompt_tokens = prompt_tokens.max(chain.tokens());
    let canonical = app.listed_name(model_ix);
    let seed_for = |prompt: &str| request_seed(app.cfg.seed ^ seed_of(&req), &canonical, prompt);
    // An answer this model began, to continue: its seed is the prompt's
    // without it, and it goes on from the token after it.
    let (seed, first_token) = match continued(&req, chat, &prompt, seed_for) {
        Some(c) => c,
        None => (seed_for(&prompt), 0),
    };
    let natural = answer_tokens(&headers).or_else(|| app.cfg.answer_length.draw(seed));
    let (output_tokens, limited) = output_length(
        limit_of(&req),
        natural.map(|n| n.saturating_sub(first_token).max(1)),
        app.cfg.default_max_tokens.saturating_sub(first_token),
    );
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
        first_token,
        prompt_tokens,
        output_tokens,
        limited,
        tool_call: if chat { tool_to_call(&req) } else { None },
        load_us,
        time_scale: app.cfg.time_scale,
        llama_cpp: app.cfg.flavor == Flavor::OpenAi,
    });
    let mut guard = match app
        .core
        .submit(model_ix, prompt_tokens, output_tokens, chain)
    {
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
    let mut resp = Response::new(stream_body(app, guard, gen_));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The answer a request continues, as its seed and the index of the
/// token it goes on from: a chat whose last message is the assistant's
/// (llama.cpp, vLLM and Ollama continue it rather than start a new turn),
/// or a raw prompt that ends in this model's answer to what comes before.
/// Greedy decoding makes a continued answer the unbroken one's rest.
fn continued(
    req: &Map<String, Value>,
    chat: bool,
    prompt: &str,
    seed_for: impl Fn(&str) -> u64,
) -> Option<(u64, u32)> {
    if chat {
        let messages = req.get("messages")?.as_array()?;
        let (last, before) = messages.split_last()?;
        if last.get("role").and_then(Value::as_str) != Some("assistant") {
            return None;
        }
        let begun = last.get("content").map(content_text).unwrap_or_default();
        if begun.is_empty() {
            return None;
        }
        let mut earlier = req.clone();
        earlier.insert("messages".into(), Value::Array(before.to_vec()));
        let seed = seed_for(&chat_prompt(&earlier).0);
        // Text it did not write itself is continued after as many words.
        let at = answered_tokens(seed, &begun)
            .unwrap_or_else(|| u32::try_from(begun.split_whitespace().count()).unwrap_or(0));
        return Some((seed, at));
    }
    // The answer's first token is capitalised: only there can it start.
    prompt
        .char_indices()
        .rev()
        .filter(|(_, c)| c.is_ascii_uppercase())
        .take(64)
        .find_map(|(at, _)| {
            let seed = seed_for(&prompt[..at]);
            let n = answered_tokens(seed, &prompt[at..]).filter(|n| *n > 0)?;
            Some((seed, n))
        })
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
    let mut guard = match app
        .core
        .submit(model_ix, 0, 0, pair_core::PromptChain::EMPTY)
    {
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

/// One text generation route: its path, API, whether it is a chat, and
/// whether it streams when the request does not say.
struct Route {
    path: &'static str,
    api: Api,
    chat: bool,
    stream_default: bool,
}

async fn serve(app: App, route: &Route, headers: HeaderMap, body: Bytes) -> Response {
    generate(
        app,
        route.path,
        (headers, body),
        route.api,
        route.chat,
        route.stream_default,
    )
    .await
}

pub(crate) async fn ollama_generate(State(app): State<App>, h: HeaderMap, b: Bytes) -> Response {
    const R: Route = Route {
        path: "/api/generate",
        api: Api::OllamaGenerate,
        chat: false,
        stream_default: true,
    };
    serve(app, &R, h, b).await
}

pub(crate) async fn ollama_chat(State(app): State<App>, h: HeaderMap, b: Bytes) -> Response {
    const R: Route = Route {
        path: "/api/chat",
        api: Api::OllamaChat,
        chat: true,
        stream_default: true,
    };
    serve(app, &R, h, b).await
}

pub(crate) async fn openai_chat(State(app): State<App>, h: HeaderMap, b: Bytes) -> Response {
    const R: Route = Route {
        path: "/v1/chat/completions",
        api: Api::OpenAiChat {
            include_usage: false,
        },
        chat: true,
        stream_default: false,
    };
    serve(app, &R, h, b).await
}

pub(crate) async fn openai_completions(State(app): State<App>, h: HeaderMap, b: Bytes) -> Response {
    const R: Route = Route {
        path: "/v1/completions",
        api: Api::OpenAiCompletion {
            include_usage: false,
        },
        chat: false,
        stream_default: false,
    };
    serve(app, &R, h, b).await
}

/// The tool call an emulated model makes, on demand: a chat offered
/// tools whose last message (system notes aside) is the user's, naming an
/// offered tool as a call in its text (`get_weather({"city": "Oslo"})`,
/// `Bash({"command": "ls"})`, or `name()` for no arguments). A count after
/// the call in the conversation's first user message (`Bash({"command":
/// "ls"}) x5`) makes it an agent's loop: after each tool's answer the model
/// calls the same tool again until it has called it that many times in
/// all, then answers in text. Otherwise, after a tool's answer or with no
/// such call asked for, it answers in text.
fn tool_to_call(req: &Map<String, Value>) -> Option<ToolCall> {
    // An answer being continued (a final assistant message) is still
    // the answer to the turn before it.
    let messages = req.get("messages")?.as_array()?;
    let messages = match messages.split_last() {
        Some((last, before)) if role_of(last) == Some("assistant") => before,
        _ => messages,
    };
    let offered: Vec<&str> = req
        .get("tools")?
        .as_array()?
        .iter()
        .filter_map(|t| t.pointer("/function/name")?.as_str())
        .collect();
    let asked = |m: &Value| {
        let text = content_text(m.get("content")?);
        offered.iter().find_map(|name| asked_call(&text, name))
    };
    // A system note after the user's turn (Claude Code sends its
    // environment so) does not end the turn.
    let last = messages
        .iter()
        .rev()
        .find(|m| role_of(m) != Some("system"))?;
    if role_of(last) == Some("user")
        && let Some((call, _)) = asked(last)
    {
        return Some(call);
    }
    // The agent's loop: the task is the first user message; every
    // assistant turn since has been a tool call (a text answer ends the
    // loop), and the last tool's answer is not yet answered.
    let first = messages.iter().position(|m| role_of(m) == Some("user"))?;
    let (call, turns) = asked(&messages[first])?;
    let mut made = 0u32;
    for m in &messages[first + 1..] {
        if role_of(m) != Some("assistant") {
            continue;
        }
        let calls = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if calls == 0 {
            return None;
        }
        made = made.saturating_add(u32::try_from(calls).unwrap_or(u32::MAX));
    }
    (made > 0 && made < turns).then_some(call)
}

fn role_of(m: &Value) -> Option<&str> {
    m.get("role").and_then(Value::as_str)
}

/// The most turns one asked call may take: enough for any agent's loop,
/// few enough that a typo cannot make a conversation endless.
const MAX_TOOL_TURNS: u32 = 1000;

/// `name(ARGS)` in `text`, ARGS a JSON object or nothing, and how many
/// times in all it is to be called: `xN` (or `×N`) right after the call,
/// else once.
fn asked_call(text: &str, name: &str) -> Option<(ToolCall, u32)> {
    let call = format!("{name}(");
    text.match_indices(&call).find_map(|(at, _)| {
        // A name that ends another word (`my_get_weather(`) is not a call.
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        let rest = text[at + call.len()..].trim_start();
        let (arguments, after) = if let Some(after) = rest.strip_prefix(')') {
            (json!({}), after)
        } else {
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let args = values.next()?.ok().filter(Value::is_object)?;
            let after = rest[values.byte_offset()..]
                .trim_start()
                .strip_prefix(')')?;
            (args, after)
        };
        let call = ToolCall {
            name: name.to_owned(),
            arguments,
        };
        Some((call, turns_after(after)))
    })
}

/// The `xN` count that may follow a call; 1 without one.
fn turns_after(text: &str) -> u32 {
    let text = text.trim_start();
    let Some(rest) = text.strip_prefix('x').or_else(|| text.strip_prefix('×')) else {
        return 1;
    };
    let digits: &str = &rest[..rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len())];
    // `x5` must end there: `xylophone` or `x5b` is text, not a count.
    let ends = rest[digits.len()..]
        .chars()
        .next()
        .is_none_or(|c| !c.is_alphanumeric() && c != '_');
    match digits.parse::<u32>() {
        Ok(n) if ends && n > 0 => n.min(MAX_TOOL_TURNS),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_natural_length_stops_the_answer_before_the_limit() {
        // (limit, natural, default) -> (tokens, ended by the limit)
        assert_eq!(output_length(Some(64), Some(10), 32), (10, false));
        assert_eq!(output_length(Some(8), Some(10), 32), (8, true));
        assert_eq!(output_length(Some(10), Some(10), 32), (10, true));
        assert_eq!(output_length(None, Some(500), 32), (500, false));
        assert_eq!(output_length(Some(7), None, 32), (7, true));
        assert_eq!(output_length(None, None, 32), (32, false));
        let mut h = HeaderMap::new();
        h.insert(ANSWER_TOKENS, HeaderValue::from_static(" 12 "));
        assert_eq!(answer_tokens(&h), Some(12));
        h.insert(ANSWER_TOKENS, HeaderValue::from_static("0"));
        assert_eq!(answer_tokens(&h), None);
        h.insert(ANSWER_TOKENS, HeaderValue::from_static("many"));
        assert_eq!(answer_tokens(&h), None);
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
    fn a_tool_is_called_when_the_user_writes_the_call() {
        let req = |text: &str, last: &str| {
            json!({"tools": [{"type": "function", "function": {"name": "get_weather"}},
                             {"type": "function", "function": {"name": "Bash"}}],
                   "messages": [{"role": last, "content": text}]})
            .as_object()
            .cloned()
            .unwrap_or_default()
        };
        let call =
            tool_to_call(&req(r#"run Bash({"command": "echo hi"}) please"#, "user")).unwrap();
        assert_eq!(call.name, "Bash");
        assert_eq!(call.arguments, json!({"command": "echo hi"}));
        let call = tool_to_call(&req("weather? get_weather()", "user")).unwrap();
        assert_eq!(
            (call.name.as_str(), call.arguments),
            ("get_weather", json!({}))
        );
        assert!(tool_to_call(&req("what is the weather?", "user")).is_none());
        assert!(tool_to_call(&req("my_get_weather()", "user")).is_none());
        assert!(tool_to_call(&req("Bash(not json)", "user")).is_none());
        assert!(tool_to_call(&req("Bash()", "tool")).is_none());
    }

    #[test]
    fn a_counted_call_repeats_after_each_tool_answer_until_made_that_often() {
        let task = r#"fix it: Bash({"command": "make"}) x3"#;
        let call = json!({"id": "c", "type": "function",
                          "function": {"name": "Bash", "arguments": "{\"command\":\"make\"}"}});
        // The conversation after `calls` rounds of call and answer, with
        // Claude Code's system note after each tool's answer.
        let after = |calls: usize| {
            let mut messages = vec![
                json!({"role": "system", "content": "you are an agent"}),
                json!({"role": "user", "content": [{"type": "text", "text": task}]}),
            ];
            for _ in 0..calls {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
                messages.push(json!({"role": "tool", "tool_call_id": "c", "content": "ok"}));
                messages.push(
                    json!({"role": "user", "content": "<system-reminder>x</system-reminder>"}),
                );
            }
            json!({"tools": [{"type": "function", "function": {"name": "Bash"}}],
                   "messages": messages})
            .as_object()
            .cloned()
            .unwrap_or_default()
        };
        for calls in 0..3 {
            let next = tool_to_call(&after(calls)).unwrap();
            assert_eq!(next.name, "Bash");
            assert_eq!(next.arguments, json!({"command": "make"}));
        }
        assert!(tool_to_call(&after(3)).is_none());
        assert!(tool_to_call(&after(4)).is_none());
        // A text answer ends the loop; the same request gives the same call.
        let mut ended = after(1);
        if let Some(Value::Array(m)) = ended.get_mut("messages") {
            m.push(json!({"role": "assistant", "content": "done"}));
            m.push(json!({"role": "user", "content": "thanks"}));
        }
        assert!(tool_to_call(&ended).is_none());
        assert_eq!(
            tool_to_call(&after(2)).map(|c| c.arguments),
            tool_to_call(&after(2)).map(|c| c.arguments)
        );
    }

    #[test]
    fn a_turn_count_is_x_and_digits_right_after_the_call() {
        let turns = |text: &str| asked_call(text, "f").map(|(_, n)| n);
        assert_eq!(turns("f() x5"), Some(5));
        assert_eq!(turns(r#"f({"a": 1})x12."#), Some(12));
        assert_eq!(turns("f() ×2"), Some(2));
        assert_eq!(turns("f()"), Some(1));
        assert_eq!(turns("f() x0"), Some(1));
        assert_eq!(turns("f() xylophone"), Some(1));
        assert_eq!(turns("f() x5b"), Some(1));
        assert_eq!(turns("f() x99999999999"), Some(1));
        assert_eq!(turns("f() x5000"), Some(MAX_TOOL_TURNS));
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
