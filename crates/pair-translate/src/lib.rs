//! API translation, with no I/O: a request in the shape a client speaks
//! (Ollama's native API, Anthropic's Messages API) becomes the OpenAI
//! request every engine kind takes, and the engine's answer (whole, or its
//! server-sent events chunk by chunk) becomes the client's shape again.
//!
//! One module owns each mapping: [`ollama`] (Ollama client, OpenAI engine),
//! [`anthropic`] (Anthropic client, OpenAI engine) and [`responses`]
//! (OpenAI Responses client, any engine's chat completions); [`frame`]
//! is the one reader of streamed answers (server-sent events, JSON lines)
//! that cuts them into events, for translation, continuation ([`resume`])
//! and the proxy's counts alike. [`fields`] holds the one rule for fields
//! the engine lacks: each is mapped, dropped (named in the
//! [`Translated::dropped`] list, `x-pair-dropped`) or refused (a
//! [`TranslateError`] naming the field, a 400 for the client), never a
//! silent drop of something that changes the answer. [`model`] puts
//! another model's name in a request, for a node and the edge SDK alike,
//! found by the one JSON syntax cursor ([`json`](mod@json)) a node's body scan uses.
//! Clocks are arguments: durations and timestamps come from the caller.

pub mod anthropic;
mod chunk;
pub mod fields;
pub mod frame;
pub mod json;
pub mod model;
pub mod ollama;
pub mod responses;
pub mod resume;

use serde_json::{Map, Value, json};

/// A client request that cannot be put in the engine's shape.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct TranslateError {
    /// The request field at fault (`options.mirostat`, `messages[2].content`).
    pub field: String,
    pub reason: String,
}

impl TranslateError {
    /// An empty field name (a request may carry the key `""`) is named as
    /// JSON spells it, so a refusal always says what it refused.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let field = field.into();
        Self {
            field: if field.is_empty() {
                "\"\"".to_owned()
            } else {
                field
            },
            reason: reason.into(),
        }
    }
}

/// Which translation a request takes, from the route the client called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Ollama chat.
    OllamaChat,
    /// Ollama generate.
    OllamaGenerate,
    /// Ollama embed.
    OllamaEmbed,
    /// Ollama's legacy embeddings.
    OllamaEmbeddings,
    /// Ollama show (answered from the engine's model list).
    OllamaShow,
    /// Anthropic messages.
    AnthropicMessages,
    /// Anthropic's token count for a messages request.
    AnthropicCountTokens,
    /// OpenAI's Responses API.
    OpenAiResponses,
}

impl Route {
    /// The receipt's name for it (`x-pair-translated`).
    pub fn label(self) -> &'static str {
        match self {
            Route::AnthropicMessages | Route::AnthropicCountTokens => "anthropic->openai",
            Route::OpenAiResponses => "responses->chat",
            _ => "ollama->openai",
        }
    }
}

/// Which OpenAI endpoint of the engine a translated request goes to (the
/// request path names the routes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Chat completions (POST).
    Chat,
    /// Text completions (POST).
    Completion,
    /// Embeddings (POST).
    Embeddings,
    /// The model list (GET).
    Models,
}

/// A translated request: where it goes on the engine and its body, and how
/// to translate what comes back.
#[derive(Debug)]
pub struct Translated {
    pub target: Target,
    pub body: Vec<u8>,
    pub answer: Answer,
    /// The client's fields left out by rule ([`fields::Rule::Dropped`]),
    /// for `x-pair-dropped`.
    pub dropped: Vec<String>,
}

/// What the engine that runs a translated request takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineTraits {
    /// Its chat templates take a system message anywhere in a
    /// conversation (Ollama's do). Otherwise the text of every system
    /// message after the first turn joins the leading system message,
    /// the one place every chat template takes it.
    pub system_anywhere: bool,
}

/// Translates a client's request body for `route` (see [`Translated`]),
/// for an engine with the default [`EngineTraits`]. `created_at` is the
/// node's clock when the request came (RFC 3339), for the answer's
/// timestamps.
pub fn request(route: Route, body: &[u8], created_at: &str) -> Result<Translated, TranslateError> {
    request_for(route, body, created_at, EngineTraits::default())
}

/// [`request`] for an engine with these traits.
pub fn request_for(
    route: Route,
    body: &[u8],
    created_at: &str,
    traits: EngineTraits,
) -> Result<Translated, TranslateError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| TranslateError::new("body", format!("not JSON: {e}")))?;
    let Value::Object(req) = v else {
        return Err(TranslateError::new("body", "not a JSON object"));
    };
    match route {
        Route::AnthropicMessages => anthropic::request(req, created_at, traits),
        Route::AnthropicCountTokens => anthropic::count_tokens(req, traits),
        Route::OpenAiResponses => responses::request(req, created_at, traits),
        _ => ollama::request(route, req, created_at),
    }
}

/// Puts a chat's system messages where the engine takes them: left at
/// their place where it takes them anywhere; otherwise, when there is more
/// than one, their texts are merged, in order, into one leading system
/// message (some templates take a single one, first, and no other).
pub(crate) fn place_system(out: &mut Map<String, Value>, traits: EngineTraits) {
    if traits.system_anywhere {
        return;
    }
    let Some(Value::Array(messages)) = out.get_mut("messages") else {
        return;
    };
    if messages.iter().filter(|m| m["role"] == "system").count() < 2
        && messages.iter().skip(1).all(|m| m["role"] != "system")
    {
        return;
    }
    let (system, rest): (Vec<Value>, Vec<Value>) = std::mem::take(messages)
        .into_iter()
        .partition(|m| m["role"] == "system");
    let texts: Vec<&str> = system
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect();
    messages.push(json!({"role": "system", "content": texts.join("\n\n")}));
    messages.extend(rest);
}

/// What the node measured of one answer (pure code has no clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// From the request's arrival to the end of the answer.
    pub total_ns: u64,
    /// From the request's arrival to its first token.
    pub first_token_ns: u64,
}

/// Turns the engine's OpenAI answer into the client's shape.
#[derive(Debug)]
pub struct Answer {
    inner: AnswerKind,
}

#[derive(Debug)]
enum AnswerKind {
    Ollama(ollama::Answer),
    Anthropic(anthropic::Answer),
    Responses(responses::Answer),
}

impl Answer {
    /// The client's content type for this answer (streamed or whole).
    pub fn content_type(&self) -> &'static str {
        match &self.inner {
            AnswerKind::Ollama(a) => a.content_type(),
            AnswerKind::Anthropic(a) => a.content_type(),
            AnswerKind::Responses(a) => a.content_type(),
        }
    }

    /// Whether the client asked for a stream.
    pub fn streaming(&self) -> bool {
        match &self.inner {
            AnswerKind::Ollama(a) => a.streaming(),
            AnswerKind::Anthropic(a) => a.streaming(),
            AnswerKind::Responses(a) => a.streaming(),
        }
    }

    /// A whole answer (or any error answer) with its status, in the
    /// client's shape.
    pub fn whole(&self, status: u16, body: &[u8], timing: Timing) -> Vec<u8> {
        match &self.inner {
            AnswerKind::Ollama(a) => a.whole(status, body, timing),
            AnswerKind::Anthropic(a) => a.whole(status, body),
            AnswerKind::Responses(a) => a.whole(status, body),
        }
    }

    /// The next bytes of the engine's event stream; what the client gets
    /// for them is appended to `out`.
    pub fn push(&mut self, bytes: &[u8], timing: Timing, out: &mut Vec<u8>) {
        match &mut self.inner {
            AnswerKind::Ollama(a) => a.push(bytes, timing, out),
            AnswerKind::Anthropic(a) => a.push(bytes, out),
            AnswerKind::Responses(a) => a.push(bytes, out),
        }
    }

    /// The engine's stream ended cleanly: the client's closing events (or,
    /// if the engine stopped before saying it was done, an error event).
    pub fn finish(&mut self, timing: Timing, out: &mut Vec<u8>) {
        match &mut self.inner {
            AnswerKind::Ollama(a) => a.finish(timing, out),
            AnswerKind::Anthropic(a) => a.finish(out),
            AnswerKind::Responses(a) => a.finish(out),
        }
    }

    /// Whether the client's stream is complete (its last event went out).
    pub fn done(&self) -> bool {
        match &self.inner {
            AnswerKind::Ollama(a) => a.done(),
            AnswerKind::Anthropic(a) => a.done(),
            AnswerKind::Responses(a) => a.done(),
        }
    }

    /// The error event that ends the client's stream when the engine's
    /// breaks.
    pub fn error_event(&self, message: &str) -> Vec<u8> {
        match &self.inner {
            AnswerKind::Ollama(_) => ollama::error_line(message),
            AnswerKind::Anthropic(_) => anthropic::error_event(message),
            AnswerKind::Responses(a) => a.error_event(message),
        }
    }
}

impl From<ollama::Answer> for Answer {
    fn from(a: ollama::Answer) -> Self {
        Answer {
            inner: AnswerKind::Ollama(a),
        }
    }
}

impl From<responses::Answer> for Answer {
    fn from(a: responses::Answer) -> Self {
        Answer {
            inner: AnswerKind::Responses(a),
        }
    }
}

impl From<anthropic::Answer> for Answer {
    fn from(a: anthropic::Answer) -> Self {
        Answer {
            inner: AnswerKind::Anthropic(a),
        }
    }
}

/// The message of an OpenAI-shaped error body (`{"error": {"message"}}`,
/// `{"error": "..."}`, `{"message"}`), else the body as text.
pub fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        v.get("error")
            .and_then(|e| {
                e.get("message")
                    .and_then(Value::as_str)
                    .or_else(|| e.as_str())
            })
            .or_else(|| v.get("message").and_then(Value::as_str))
            .map(str::to_owned)
    });
    from_json.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned())
}

/// `{"a": {"b": x}}`'s `x` as a string for messages.
pub(crate) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
