//! A request's body: read whole and capped ([`read_capped`], for the doors
//! hyper serves; the hand-framed face reads its own), then what routing
//! needs read from it (the top-level `model`,
//! whether it streams, how many tokens it may produce) in one pass over
//! the bytes, without building a tree of the document or decoding what it
//! does not need: the prompt's strings are skipped eight bytes at a time
//! and checked for what JSON forbids in them (control characters, bad
//! escapes) in the same pass, by the JSON cursor the edge SDK's
//! [`pair_translate::model::span`] uses too ([`pair_translate::json`]).
//!
//! What it accepts is what `serde_json` accepts for the same fields (a
//! property test holds the two together): RFC 8259 syntax, UTF-8, no
//! duplicate field among the ones read, each read field of its type or
//! `null`, no trailing characters. Two deliberate differences: `options`
//! must be an object (serde also read an array by position), and nesting
//! deeper than [`MAX_DEPTH`] is refused (as `serde_json` refuses it when it
//! builds a value).

use std::borrow::Cow;

use axum::body::Body;
use bytes::Bytes;
use http::{Response, StatusCode, header};
use pair_core::{ApiFlavor, ChainBuilder, PromptChain, RequestProfile};
use pair_http::conns::{BodyBudget, ClientDeadlines};

use pair_translate::json::{Cursor, Step};
pub use pair_translate::json::{JsonError, MAX_DEPTH};

use crate::error::json_error;
use crate::route::Work;

/// Why a body could not be routed; each is the client's fault (400).
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not valid JSON: {0}")]
    Json(JsonError),
    #[error("request body has no \"model\" field")]
    MissingModel,
    #[error("request body must be a JSON object")]
    NotAnObject,
    #[error("request body is not valid UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("invalid \"model\": {0}")]
    BadModel(#[source] pair_core::CoreError),
}

/// The fields read, as they came (`None`: absent or `null`).
#[derive(Debug, Default, PartialEq, Eq)]
struct RawFields<'a> {
    model: Option<Cow<'a, str>>,
    /// Where `model`'s value (quotes included) is in the body.
    model_at: Option<(usize, usize)>,
    /// Ollama's legacy name for `model` (`/api/show`, LiteLLM sends it).
    name: Option<Cow<'a, str>>,
    name_at: Option<(usize, usize)>,
    stream: Option<bool>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    /// The Responses API's output limit.
    max_output_tokens: Option<u64>,
    num_predict: Option<i64>,
    /// Where each prompt-bearing field's value is, by [`PromptPart`]; the
    /// last one where a client repeats it.
    prompt_at: [Option<(usize, usize)>; PromptPart::COUNT],
}

/// The top-level fields that carry the prompt
/// ([`pair_core::prompt::PROMPT_FIELDS`]), by their index there.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct PromptPart(usize);

impl PromptPart {
    const COUNT: usize = pair_core::prompt::PROMPT_FIELDS.len();
}

/// The fields routing reads: top-level ones, and `num_predict` inside
/// Ollama's `options`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Model,
    Name,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    Options,
    NumPredict,
    Prompt(PromptPart),
    Other,
}

impl Field {
    /// The fields of the top level (`nested`: of `options`).
    fn of(key: &[u8], nested: bool) -> Field {
        match (nested, key) {
            (false, b"model") => Field::Model,
            (false, b"name") => Field::Name,
            (false, b"stream") => Field::Stream,
            (false, b"max_tokens") => Field::MaxTokens,
            (false, b"max_completion_tokens") => Field::MaxCompletionTokens,
            (false, b"max_output_tokens") => Field::MaxOutputTokens,
            (false, b"options") => Field::Options,
            (true, b"num_predict") => Field::NumPredict,
            (false, key) => pair_core::prompt::prompt_part(key)
                .map_or(Field::Other, |i| Field::Prompt(PromptPart(i))),
            _ => Field::Other,
        }
    }

    /// Bit in the set of fields seen (duplicates are refused).
    fn bit(self) -> u16 {
        let index = match self {
            Field::Model => 0,
            Field::Name => 1,
            Field::Stream => 2,
            Field::MaxTokens => 3,
            Field::MaxCompletionTokens => 4,
            Field::MaxOutputTokens => 5,
            Field::Options => 6,
            Field::NumPredict => 7,
            Field::Prompt(_) | Field::Other => 8,
        };
        1 << index
    }

    /// Whether a second occurrence is refused: the fields whose value
    /// routing takes (a prompt field is only hashed, and JSON parsers
    /// differ on which duplicate wins, so it is left as it was).
    fn single(self) -> bool {
        !matches!(self, Field::Prompt(_) | Field::Other)
    }
}

/// The body's reader: the one JSON cursor ([`Cursor`]), and the fields
/// routing reads.
struct Scan<'a>(Cursor<'a>);

impl<'a> std::ops::Deref for Scan<'a> {
    type Target = Cursor<'a>;
    fn deref(&self) -> &Cursor<'a> {
        &self.0
    }
}

impl std::ops::DerefMut for Scan<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<'a> Scan<'a> {
    fn new(text: &'a str) -> Self {
        Self(Cursor::new(text))
    }

    /// The whole document: an object, then nothing but whitespace.
    fn document(&mut self) -> Result<RawFields<'a>, BodyError> {
        self.ws();
        if self.peek() != Some(b'{') {
            // Valid JSON that is not an object, or not JSON at all.
            self.value(0)?;
            self.end()?;
            return Err(BodyError::NotAnObject);
        }
        let mut facts = RawFields::default();
        self.object(false, &mut facts)?;
        self.end()?;
        Ok(facts)
    }

    /// An object at the cursor whose read fields go into `facts`; the
    /// others are skipped.
    fn object(&mut self, nested: bool, facts: &mut RawFields<'a>) -> Step<()> {
        self.eat(b'{', "expected '{'")?;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        let mut seen = 0u16;
        loop {
            self.ws();
            let field = self.key(nested)?;
            if field.single() {
                if seen & field.bit() != 0 {
                    return self.err("duplicate field");
                }
                seen |= field.bit();
            }
            self.ws();
            self.eat(b':', "expected ':'")?;
            self.ws();
            match field {
                Field::Model => {
                    let at = self.i;
                    facts.model = self.nullable(Self::model_string)?;
                    facts.model_at = facts.model.as_ref().map(|_| (at, self.i));
                }
                Field::Name => {
                    let at = self.i;
                    facts.name = self.nullable(Self::model_string)?;
                    facts.name_at = facts.name.as_ref().map(|_| (at, self.i));
                }
                Field::Stream => facts.stream = self.nullable(Self::boolean)?,
                Field::MaxTokens => facts.max_tokens = self.nullable(Self::integer)?,
                Field::MaxCompletionTokens => {
                    facts.max_completion_tokens = self.nullable(Self::integer)?;
                }
                Field::MaxOutputTokens => {
                    facts.max_output_tokens = self.nullable(Self::integer)?;
                }
                Field::NumPredict => facts.num_predict = self.nullable(Self::integer)?,
                Field::Options => {
                    if self.peek() == Some(b'{') {
                        self.object(true, facts)?;
                    } else {
                        self.nullable(|s| s.err::<()>("\"options\" must be an object"))?;
                    }
                }
                Field::Prompt(part) => {
                    let at = self.i;
                    self.value(1)?;
                    if let Some(slot) = facts.prompt_at.get_mut(part.0) {
                        *slot = Some((at, self.i));
                    }
                }
                Field::Other => self.value(if nested { 2 } else { 1 })?,
            }
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(_) => return self.err("expected ',' or '}'"),
                None => return self.err("unexpected end of body"),
            }
        }
    }

    /// A key, and which read field it names.
    fn key(&mut self, nested: bool) -> Step<Field> {
        Ok(Field::of(&self.name()?, nested))
    }

    /// `null` (`None`) or what `read` reads.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Step<T>) -> Step<Option<T>> {
        if self.at_word(b"null") {
            self.i += 4;
            return Ok(None);
        }
        read(self).map(Some)
    }

    /// The model's name: borrowed from the body unless it has escapes.
    fn model_string(&mut self) -> Step<Cow<'a, str>> {
        if self.peek() != Some(b'"') {
            return self.err("\"model\" (or \"name\") must be a string");
        }
        let at = self.i;
        let (_, escaped) = self.string()?;
        let quoted = &self.text()[at..self.i];
        if !escaped {
            return Ok(Cow::Borrowed(&quoted[1..quoted.len() - 1]));
        }
        // Decoded by serde_json, whose rules (surrogate pairs) it follows.
        serde_json::from_str::<String>(quoted)
            .map(Cow::Owned)
            .map_err(|_| JsonError {
                what: "invalid escape in \"model\"",
                at,
            })
    }

    fn boolean(&mut self) -> Step<bool> {
        if self.at_word(b"true") {
            self.i += 4;
            Ok(true)
        } else if self.at_word(b"false") {
            self.i += 5;
            Ok(false)
        } else {
            self.err("\"stream\" must be true or false")
        }
    }

    /// An integer field: a JSON number without fraction or exponent, in
    /// `T`'s range. As serde_json reads numbers: `-0`, a fraction, an
    /// exponent or a magnitude past 64 bits make a float, which no integer
    /// field takes.
    fn integer<T: TryFrom<i128>>(&mut self) -> Step<T> {
        let at = self.i;
        let negative = self.peek() == Some(b'-');
        if !matches!(self.peek(), Some(b'-' | b'0'..=b'9')) {
            return self.err("expected an integer");
        }
        self.number()?;
        let digits = &self.bytes()[at + usize::from(negative)..self.i];
        let magnitude = digits.iter().try_fold(0u64, |n, &d| {
            if d.is_ascii_digit() {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            } else {
                None // a fraction or an exponent
            }
        });
        let value = match magnitude {
            Some(0) if negative => None,
            Some(m) if negative => Some(-i128::from(m)),
            Some(m) => Some(i128::from(m)),
            None => None,
        };
        value.and_then(|v| T::try_from(v).ok()).ok_or(JsonError {
            what: "expected an integer in range",
            at,
        })
    }
}

impl From<JsonError> for BodyError {
    fn from(e: JsonError) -> Self {
        BodyError::Json(e)
    }
}

/// What the proxy learned from a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    pub model: String,
    /// Where the model's name (a JSON string, quotes included) is in the
    /// body, to put another in its place (an alias's target).
    pub model_at: (usize, usize),
    pub streaming: bool,
    pub max_output_tokens: Option<u32>,
    /// The request offers tools (a non-empty `tools` field).
    pub tools: bool,
    /// The prompt's block chain (system, tools, turns; no text kept), what
    /// a node's cache may hold of it.
    pub prefix: PromptChain,
}

/// Bodies above this are scanned off the event loop, so one large request
/// does not stall every stream in flight.
pub const INLINE_SCAN_MAX: usize = 1 << 20;

/// [`extract`] for the request path: bodies over [`INLINE_SCAN_MAX`] are
/// scanned on the blocking pool.
pub async fn extract_off_loop(
    body: &bytes::Bytes,
    flavor: ApiFlavor,
    work: Work,
) -> Result<RequestFacts, BodyError> {
    if body.len() <= INLINE_SCAN_MAX {
        return extract(body, flavor, work);
    }
    let b = body.clone();
    match tokio::task::spawn_blocking(move || extract(&b, flavor, work)).await {
        Ok(r) => r,
        // The blocking pool is gone (shutting down): scan here.
        Err(_) => extract(body, flavor, work),
    }
}

/// Extracts the routing facts. `stream` defaults follow each API: Ollama's
/// generate and chat stream unless told not to; OpenAI and Anthropic don't.
pub fn extract(body: &[u8], flavor: ApiFlavor, work: Work) -> Result<RequestFacts, BodyError> {
    let text = std::str::from_utf8(body).map_err(BodyError::NotUtf8)?;
    let facts = Scan::new(text).document()?;
    // Ollama still takes its legacy `name` where `model` is missing.
    let (model, model_at) = match (facts.model, facts.model_at) {
        (Some(m), Some(at)) => (m, at),
        _ if flavor == ApiFlavor::Ollama => facts
            .name
            .zip(facts.name_at)
            .ok_or(BodyError::MissingModel)?,
        _ => return Err(BodyError::MissingModel),
    };
    let model = pair_core::ModelName::new(model.into_owned()).map_err(BodyError::BadModel)?;
    let default_stream = flavor == ApiFlavor::Ollama && work == Work::Generate;
    let streaming = work == Work::Generate && facts.stream.unwrap_or(default_stream);
    let max_output_tokens = facts
        .max_completion_tokens
        .or(facts.max_output_tokens)
        .or(facts.max_tokens)
        .or_else(|| facts.num_predict.and_then(|n| u64::try_from(n).ok()))
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let tools = pair_core::prompt::prompt_part(b"tools")
        .and_then(|i| facts.prompt_at[i])
        .and_then(|(start, end)| body.get(start..end))
        .is_some_and(offers_tools);
    let prefix = if work == Work::Generate {
        prompt_chain(body, &facts.prompt_at)
    } else {
        PromptChain::EMPTY
    };
    Ok(RequestFacts {
        model: model.into(),
        model_at,
        streaming,
        max_output_tokens,
        tools,
        prefix,
    })
}

/// Whether a `tools` value (its JSON as written) offers any: not `null`,
/// not an empty array.
fn offers_tools(value: &[u8]) -> bool {
    match value.trim_ascii() {
        b"null" => false,
        [b'[' | b'{', inner @ .., _] => !inner.trim_ascii().is_empty(),
        _ => true,
    }
}

/// The chain of the prompt's fields, in engine order, each field's JSON as
/// the client wrote it: a client re-sends earlier turns byte for byte, so
/// a later turn's chain starts with the earlier turn's blocks.
fn prompt_chain(body: &[u8], at: &[Option<(usize, usize)>; PromptPart::COUNT]) -> PromptChain {
    let mut chain = ChainBuilder::new();
    for (start, end) in at.iter().flatten() {
        if let Some(value) = body.get(*start..*end) {
            chain.bytes(value);
        }
    }
    chain.finish()
}

impl RequestFacts {
    /// The scheduler's view of this request (the model's name moves into
    /// it).
    pub fn profile(self, flavor: ApiFlavor, work: Work, body_len: usize) -> RequestProfile {
        let mut p = RequestProfile::new(self.model, flavor);
        p.streaming = self.streaming;
        p.tools = self.tools;
        p.prefix = self.prefix;
        p.prompt_tokens = RequestProfile::estimate_tokens_from_bytes(body_len);
        p.max_output_tokens = match work {
            Work::Generate => self
                .max_output_tokens
                .unwrap_or(RequestProfile::DEFAULT_OUTPUT_TOKENS),
            Work::Embed | Work::Show => 0,
        };
        p
    }
}

/// 413 in the face's flavour.
pub fn too_large(cap: usize, flavor: ApiFlavor) -> Response<Body> {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        flavor,
        "body_too_large",
        &format!("request body exceeds the {} MiB limit", cap / (1024 * 1024)),
        None,
    )
}

/// An error answer, made once the caller knows the flavour to give it in.
pub type ErrorFn = Box<dyn FnOnce(ApiFlavor) -> Response<Body> + Send>;

/// 503 for a body the node's budget has no room for, in the API's shape.
pub fn over_budget(flavor: ApiFlavor) -> Response<Body> {
    let mut resp = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        flavor,
        "bodies_budget_spent",
        "pair-node holds as many request bodies as it may while they arrive (--body-budget-mib); retry shortly",
        None,
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    resp
}

/// Reads the whole body up to `cap` bytes (kept for replay on failover).
/// With a `budget`, the body holds its share while it arrives, as on the
/// hand-framed path: a declared length is taken before any byte is read,
/// a body of unknown length (chunked) takes its bytes as they come; with
/// no room, the answer is [`over_budget`].
pub async fn read_capped<B>(
    body: B,
    headers: &http::HeaderMap,
    cap: usize,
    deadlines: &ClientDeadlines,
    budget: Option<&std::sync::Arc<BodyBudget>>,
) -> Result<Bytes, ErrorFn>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let too_big = move |flavor| too_large(cap, flavor);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap as u64) {
        return Err(Box::new(too_big));
    }
    let declared = declared.and_then(|n| usize::try_from(n).ok());
    let mut permit = match budget {
        None => None,
        Some(b) => match b.take(declared.unwrap_or(0)) {
            Some(p) => Some(p),
            None => return Err(Box::new(over_budget)),
        },
    };
    // As on the hand-framed path: a body must keep arriving, and its
    // buffer grows with what arrived.
    let start = tokio::time::Instant::now();
    let mut last = start;
    let mut body = std::pin::pin!(http_body_util::Limited::new(body, cap));
    let mut got: Vec<u8> = Vec::new();
    loop {
        let by = deadlines.body_deadline(start, got.len() as u64, last);
        let frame =
            match tokio::time::timeout_at(by, http_body_util::BodyExt::frame(&mut body)).await {
                Ok(Some(Ok(frame))) => {
                    last = tokio::time::Instant::now();
                    frame
                }
                Ok(None) => return Ok(Bytes::from(got)),
                Ok(Some(Err(e))) => {
                    if e.is::<http_body_util::LengthLimitError>() {
                        return Err(Box::new(too_big));
                    }
                    return Err(Box::new(move |flavor| {
                        json_error(
                            StatusCode::BAD_REQUEST,
                            flavor,
                            "body_read_failed",
                            &format!("could not read the request body: {e}"),
                            None,
                        )
                    }));
                }
                Err(_) => {
                    return Err(Box::new(|flavor| {
                        json_error(
                            StatusCode::REQUEST_TIMEOUT,
                            flavor,
                            "body_too_slow",
                            "the request body stopped arriving",
                            None,
                        )
                    }));
                }
            };
        if let Ok(data) = frame.into_data() {
            let needed = got.len() + data.len();
            if needed > got.capacity() {
                // The buffer grows by doubling (up to the cap); with a
                // budget, what it holds is its capacity, which the permit
                // covers: the declared length at once, else step by step.
                // While it moves, the old buffer and the new one are both
                // held, and the permit covers both.
                let room = (got.capacity() * 2)
                    .min(cap)
                    .max(needed)
                    .max(declared.unwrap_or(0));
                let old = got.capacity();
                let covered = old.max(declared.unwrap_or(0));
                let moving = room > covered;
                if let Some(p) = permit.as_mut()
                    && moving
                    && !p.grow(room - covered + old)
                {
                    return Err(Box::new(over_budget));
                }
                got.reserve_exact(room - got.len());
                if let Some(p) = permit.as_mut()
                    && moving
                {
                    p.shrink(old);
                }
            }
            got.extend_from_slice(&data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An Anthropic body as Claude Code sends it: system and tools after
    /// the turns, the turns growing each time.
    fn agent_turn(task: &str, turns: usize, max_tokens: u32) -> Vec<u8> {
        let mut messages = vec![serde_json::json!({"role": "user", "content": task})];
        for t in 0..turns {
            messages.push(
                serde_json::json!({"role": "assistant", "content": format!("call tool {t}")}),
            );
            messages.push(
                serde_json::json!({"role": "user", "content": "tool result ".repeat(60 + t)}),
            );
        }
        serde_json::to_vec(&serde_json::json!({
            "model": "claude-sonnet",
            "max_tokens": max_tokens,
            "messages": messages,
            "system": "You are a coding agent. ".repeat(400),
            "tools": [{"name": "Bash", "description": "runs a command ".repeat(200)}],
        }))
        .unwrap()
    }

    #[test]
    fn the_prompt_chain_follows_engine_order_and_grows_with_the_turns() {
        let chain = |body: &[u8]| {
            extract(body, ApiFlavor::Anthropic, Work::Generate)
                .unwrap()
                .prefix
        };
        let first = chain(&agent_turn("fix the bug", 1, 100));
        let later = chain(&agent_turn("fix the bug", 4, 32_000));
        let other = chain(&agent_turn("write the docs", 1, 100));
        // A later turn holds all the earlier turn's whole blocks (its last,
        // partial one ends where the turns went on), whatever max_tokens.
        assert!(first.len() > 40, "{}", first.len());
        assert_eq!(later.common_blocks(first.blocks()), first.len() - 1);
        // Another task shares the system prompt and tools (they come first,
        // as in the engine's context), not the turns.
        let shared = other.common_tokens(first.blocks());
        let system_and_tools = ("You are a coding agent. ".len() * 400 + 3_000) as u32 / 4;
        assert!(
            shared >= system_and_tools * 9 / 10 && shared < first.tokens(),
            "{shared} of {}",
            first.tokens()
        );
        // Only generation has a prompt to cache.
        let body = agent_turn("fix the bug", 1, 100);
        assert!(
            extract(&body, ApiFlavor::Anthropic, Work::Embed)
                .unwrap()
                .prefix
                .is_empty()
        );
        // A prompt field may repeat (as JSON allows); routing fields may not.
        assert!(
            extract(
                br#"{"model":"m","prompt":"a","prompt":"b"}"#,
                ApiFlavor::Ollama,
                Work::Generate
            )
            .is_ok()
        );
    }

    #[test]
    fn tools_are_offered_only_by_a_non_empty_list() {
        let tools = |body: &str| {
            extract(body.as_bytes(), ApiFlavor::OpenAi, Work::Generate)
                .unwrap()
                .tools
        };
        assert!(tools(
            r#"{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"Bash"}}]}"#
        ));
        assert!(!tools(r#"{"model":"m","messages":[]}"#));
        assert!(!tools(r#"{"model":"m","messages":[],"tools":[ ]}"#));
        assert!(!tools(r#"{"model":"m","messages":[],"tools":null}"#));
        assert!(!tools(r#"{"model":"m","tools" : [],"messages":[]}"#));
    }

    #[test]
    fn reads_model_stream_and_limits() {
        let f = extract(
            br#"{"messages":[{"role":"user","content":"hi"}],"model":"llama3","options":{"num_predict":7}}"#,
            ApiFlavor::Ollama,
            Work::Generate,
        )
        .unwrap();
        assert_eq!(f.model, "llama3");
        assert!(f.streaming, "ollama chat streams by default");
        assert_eq!(f.max_output_tokens, Some(7));

        let f = extract(
            br#"{"model":"gpt\u002d4o","max_tokens":12}"#,
            ApiFlavor::OpenAi,
            Work::Generate,
        )
        .unwrap();
        assert_eq!(f.model, "gpt-4o", "escapes are decoded");
        assert!(!f.streaming);
        assert_eq!(f.max_output_tokens, Some(12));

        let f = extract(
            br#"{"model":"e","stream":true}"#,
            ApiFlavor::Ollama,
            Work::Embed,
        )
        .unwrap();
        assert!(!f.streaming, "embeddings never stream");
    }

    #[test]
    fn client_errors_are_clear() {
        assert!(matches!(
            extract(b"{not json", ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::Json(_))
        ));
        assert!(matches!(
            extract(br#"{"messages":[]}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::MissingModel)
        ));
        assert!(matches!(
            extract(br#"{"model":""}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::BadModel(_))
        ));
        assert!(matches!(
            extract(br#"{"model":42}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::Json(_))
        ));
        assert!(matches!(
            extract(br#"[1,2]"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::NotAnObject)
        ));
        // Found by fuzzing: an array read by position, and bad UTF-8 in a
        // skipped key.
        assert!(matches!(
            extract(br#"["llama3", true]"#, ApiFlavor::Ollama, Work::Generate),
            Err(BodyError::NotAnObject)
        ));
        assert!(matches!(
            extract(
                b"{\"model\":\"m\",\"messages\":[{\"\xE3ontent\":\"x\"}]}",
                ApiFlavor::Ollama,
                Work::Generate
            ),
            Err(BodyError::NotUtf8(_))
        ));
    }

    #[test]
    fn edge_cases_follow_json_and_serde() {
        let ok = |b: &str| extract(b.as_bytes(), ApiFlavor::OpenAi, Work::Generate);
        let json_err = |b: &str| matches!(ok(b), Err(BodyError::Json(_)));
        // A name with escapes is the name it decodes to.
        assert_eq!(ok(r#"{"mod\u0065l":"m"}"#).unwrap().model, "m");
        // Whitespace of every kind JSON allows, around everything.
        let f = ok(" \t\r\n{ \"model\" :\t\"m\" ,\n\"max_tokens\"\r: 3 }\n ").unwrap();
        assert_eq!((f.model.as_str(), f.max_output_tokens), ("m", Some(3)));
        // -0 is a float to serde_json (it keeps the sign), so not a count.
        assert!(json_err(r#"{"model":"m","max_tokens":-0}"#));
        assert_eq!(
            ok(r#"{"model":"m","max_tokens":0}"#)
                .unwrap()
                .max_output_tokens,
            Some(0)
        );
        // A lone surrogate escape is fine in a skipped string, not in the model.
        assert!(ok(r#"{"model":"m","prompt":"\ud800"}"#).is_ok());
        assert!(json_err(r#"{"model":"\ud800"}"#));
        // A number past f64's range is valid syntax where it is skipped.
        assert!(ok(r#"{"model":"m","x":-1e999}"#).is_ok());
        // A skipped member's name is still decoded, as serde decodes it.
        assert!(json_err(r#"{"model":"m","x":{"\ud800":1}}"#));
        for bad in [
            r#"{"model":"m","model":"n"}"#,                 // duplicate
            r#"{"model":"m","stream":null,"stream":true}"#, // duplicate, the first null
            r#"{"model":"m",}"#,                            // trailing comma
            r#"{"model":"m","x":[1,]}"#,                    // trailing comma, nested
            r#"{"model":"m","x":01}"#,                      // leading zero
            r#"{"model":"m","x":1.}"#,                      // no fraction digits
            r#"{"model":"m","x":1e}"#,                      // no exponent digits
            r#"{"model":"m","x":-}"#,
            r#"{"model":"m","x":tru}"#,
            r#"{"model":"m","x":"a\qb"}"#,         // unknown escape
            r#"{"model":"m","x":"\u12g4"}"#,       // bad hex
            "{\"model\":\"m\",\"x\":\"a\u{1}b\"}", // control character
            r#"{"model":"m"} x"#,                  // trailing characters
            r#"{"model":"m""#,                     // cut short
            r#"{"model":"m"#,
            r#"{"model""#,
            r#"{"model":"m","max_tokens":1e3}"#, // not an integer
            r#"{"model":"m","max_tokens":1.0}"#,
            r#"{"model":"m","max_tokens":-1}"#, // out of range
            r#"{"model":"m","max_tokens":18446744073709551616}"#,
            r#"{"model":"m","options":{"num_predict":9223372036854775808}}"#,
            r#"{"model":"m","stream":"yes"}"#, // wrong type
            r#"{"model":"m","options":[5]}"#,  // serde read this by position
            r#"{"model":["m"]}"#,
            r#"{model:"m"}"#,
        ] {
            assert!(json_err(bad), "accepted {bad}");
        }
        assert!(ok(r#"{"model":"m","options":{"num_predict":-9223372036854775808}}"#).is_ok());
        assert!(json_err(
            r#"{"model":"m","options":{"num_predict":-9223372036854775809}}"#
        ));
        assert_eq!(
            ok(r#"{"model":"m","max_tokens":18446744073709551615}"#)
                .unwrap()
                .max_output_tokens,
            Some(u32::MAX)
        );
        let f = ok(r#"{"model":"m","options":{"num_predict":-1,"temperature":0.5}}"#).unwrap();
        assert_eq!(
            f.max_output_tokens, None,
            "a negative num_predict means no limit"
        );
        assert_eq!(
            ok(r#"{"model":"m","options":null,"stream":null}"#)
                .unwrap()
                .model,
            "m"
        );
        // Nesting: as deep as serde_json parses a value, and no deeper.
        let nest = |n: usize| format!(r#"{{"model":"m","x":{}{}}}"#, "[".repeat(n), "]".repeat(n));
        let value = |b: &str| serde_json::from_str::<serde_json::Value>(b).is_ok();
        assert!(ok(&nest(MAX_DEPTH - 1)).is_ok() && value(&nest(MAX_DEPTH - 1)));
        assert!(json_err(&nest(MAX_DEPTH)) && !value(&nest(MAX_DEPTH)));
        let deep = format!(
            r#"{{"model":"m","options":{{"x":{}{}}}}}"#,
            "[".repeat(MAX_DEPTH - 2),
            "]".repeat(MAX_DEPTH - 2)
        );
        assert!(ok(&deep).is_ok() && value(&deep));
        let deeper = deep.replacen('[', "[[", 1).replacen(']', "]]", 1);
        assert!(json_err(&deeper) && !value(&deeper));
        let top = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(
            matches!(ok(&top(MAX_DEPTH)), Err(BodyError::NotAnObject)) && value(&top(MAX_DEPTH))
        );
        assert!(json_err(&top(MAX_DEPTH + 1)) && !value(&top(MAX_DEPTH + 1)));
        // Errors say where.
        let Err(BodyError::Json(e)) = ok(r#"{"model":"m" "x":1}"#) else {
            panic!("accepted a missing comma");
        };
        assert_eq!((e.what, e.at), ("expected ',' or '}'", 13));
    }

    #[test]
    fn large_prompts_are_skipped_whole() {
        let content = "a \\\"quoted\\\" line,\\n ünïcödé ".repeat(50_000);
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"{content}"}}],"stream":true,"model":"big"}}"#
        );
        let f = extract(body.as_bytes(), ApiFlavor::OpenAi, Work::Generate).unwrap();
        assert_eq!(f.model, "big");
        assert!(f.streaming);
        let cut = &body.as_bytes()[..body.len() / 2];
        assert!(matches!(
            extract(cut, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::Json(_))
        ));
    }

    /// The serde_json reading this module replaced: the oracle it is held
    /// to (except `options` read by position, refused now).
    mod oracle {
        use std::borrow::Cow;

        use serde::Deserialize;
        use serde::de::{IgnoredAny, MapAccess, Visitor};

        #[derive(Deserialize)]
        struct OracleFields<'a> {
            #[serde(borrow, default)]
            model: Option<Cow<'a, str>>,
            #[serde(borrow, default)]
            name: Option<Cow<'a, str>>,
            #[serde(default)]
            stream: Option<bool>,
            #[serde(default)]
            max_tokens: Option<u64>,
            #[serde(default)]
            max_completion_tokens: Option<u64>,
            #[serde(default)]
            max_output_tokens: Option<u64>,
            #[serde(default)]
            options: Option<Options>,
        }

        struct Options {
            num_predict: Option<i64>,
        }

        impl<'de> Deserialize<'de> for Options {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Options;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("an object")
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Options, A::Error> {
                        let mut num_predict = None;
                        let mut seen = false;
                        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                            if key == "num_predict" {
                                if seen {
                                    return Err(serde::de::Error::duplicate_field("num_predict"));
                                }
                                seen = true;
                                num_predict = map.next_value::<Option<i64>>()?;
                            } else {
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                        Ok(Options { num_predict })
                    }
                }
                d.deserialize_map(V)
            }
        }

        /// (model, name, stream, max_tokens, max_completion_tokens,
        /// max_output_tokens, num_predict), or which error.
        pub(super) type Read = (
            Option<String>,
            Option<String>,
            Option<bool>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<i64>,
        );

        pub(super) fn read(body: &[u8]) -> Result<Read, &'static str> {
            let text = std::str::from_utf8(body).map_err(|_| "utf8")?;
            if !text
                .trim_start_matches([' ', '\t', '\n', '\r'])
                .starts_with('{')
            {
                return Err(match serde_json::from_str::<IgnoredAny>(text) {
                    Err(_) => "json",
                    Ok(_) => "not-object",
                });
            }
            let f: OracleFields<'_> = serde_json::from_str(text).map_err(|_| "json")?;
            Ok((
                f.model.map(Cow::into_owned),
                f.name.map(Cow::into_owned),
                f.stream,
                f.max_tokens,
                f.max_completion_tokens,
                f.max_output_tokens,
                f.options.and_then(|o| o.num_predict),
            ))
        }
    }

    fn read(body: &[u8]) -> Result<oracle::Read, &'static str> {
        let text = std::str::from_utf8(body).map_err(|_| "utf8")?;
        match Scan::new(text).document() {
            Ok(f) => Ok((
                f.model.map(Cow::into_owned),
                f.name.map(Cow::into_owned),
                f.stream,
                f.max_tokens,
                f.max_completion_tokens,
                f.max_output_tokens,
                f.num_predict,
            )),
            Err(BodyError::NotAnObject) => Err("not-object"),
            Err(_) => Err("json"),
        }
    }

    /// JSON values of every kind, a few levels deep, with the names the
    /// scanner reads among the others.
    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e6f64..1e6).prop_map(Value::from),
            "[a-z0-9 \"\\\\/\t\n\u{1}é日😀-]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 24, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::vec((field_name(), inner), 0..5)
                    .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn field_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("model".to_owned()),
            Just("name".to_owned()),
            Just("stream".to_owned()),
            Just("max_tokens".to_owned()),
            Just("max_completion_tokens".to_owned()),
            Just("max_output_tokens".to_owned()),
            Just("options".to_owned()),
            Just("num_predict".to_owned()),
            "[a-z_\"é]{0,8}",
        ]
    }

    /// A member of a body: a read field mostly of its own type (often
    /// enough to be accepted), anything else otherwise.
    fn member() -> impl Strategy<Value = (String, serde_json::Value)> {
        use serde_json::Value;
        let model = prop_oneof![
            3 => "[a-z0-9:./_-]{1,12}".prop_map(Value::String),
            1 => "[a-z\"\\\\é\n ]{0,6}".prop_map(Value::String),
            1 => json_value(),
        ];
        let count = prop_oneof![
            3 => (0u64..100_000).prop_map(Value::from),
            1 => Just(Value::Null),
            1 => json_value(),
        ];
        let options = prop_oneof![
            3 => (any::<i32>(), json_value()).prop_map(|(n, other)| {
                serde_json::json!({"temperature": other, "num_predict": n})
            }),
            1 => json_value(),
        ];
        prop_oneof![
            2 => model.clone().prop_map(|v| ("model".to_owned(), v)),
            1 => model.prop_map(|v| ("name".to_owned(), v)),
            1 => prop_oneof![3 => any::<bool>().prop_map(Value::Bool), 1 => json_value()]
                .prop_map(|v| ("stream".to_owned(), v)),
            1 => count.clone().prop_map(|v| ("max_tokens".to_owned(), v)),
            1 => count.clone().prop_map(|v| ("max_completion_tokens".to_owned(), v)),
            1 => count.prop_map(|v| ("max_output_tokens".to_owned(), v)),
            1 => options.prop_map(|v| ("options".to_owned(), v)),
            3 => (field_name(), json_value()),
        ]
    }

    /// A body: an object of members, written compact or pretty, then
    /// maybe damaged (cut, a byte replaced or inserted, a member repeated).
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let doc = prop_oneof![
            4 => prop::collection::vec(member(), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
            1 => json_value(),
        ];
        let text = (doc, any::<bool>()).prop_map(|(v, pretty)| {
            if pretty {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                serde_json::to_string(&v).unwrap()
            }
        });
        let damage = prop_oneof![
            3 => Just(None),
            1 => (any::<prop::sample::Index>(), 0u8..4, prop::sample::select(
                b"{}[]:,\"\\ -0123456789.eEtrufalsn\x01\xff".to_vec()
            ))
            .prop_map(Some),
        ];
        (text, damage).prop_map(|(text, damage)| {
            let mut b = text.into_bytes();
            if let Some((at, how, byte)) = damage {
                let i = at.index(b.len() + 1);
                match how {
                    0 => b.truncate(i),
                    1 if i < b.len() => b[i] = byte,
                    2 => b.insert(i, byte),
                    _ => {
                        // Repeat the first member after the opening brace.
                        if let Some(end) = b.iter().position(|&c| c == b',') {
                            let member = b[1..=end].to_vec();
                            b.splice(1..1, member);
                        }
                    }
                }
            }
            b
        })
    }

    /// The equivalence property is only as good as its bodies: they must
    /// reach every outcome, with and without the fields read.
    #[test]
    fn the_bodies_reach_every_outcome() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = body();
        let mut counts = std::collections::BTreeMap::<&str, usize>::new();
        for _ in 0..4000 {
            let b = strategy.new_tree(&mut runner).unwrap().current();
            let kind = match oracle::read(&b) {
                Ok((Some(_), ..)) => "model",
                Ok((None, Some(_), ..) | (None, _, Some(_), ..)) => "fields",
                Ok(_) => "object",
                Err(e) => e,
            };
            *counts.entry(kind).or_default() += 1;
        }
        for (kind, least) in [
            ("model", 300),
            ("fields", 150),
            ("object", 400),
            ("json", 400),
            ("not-object", 200),
            ("utf8", 5),
        ] {
            let n = counts.get(kind).copied().unwrap_or(0);
            assert!(n >= least, "{kind}: {n} of 4000 ({counts:?})");
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = extract(&bytes, ApiFlavor::Ollama, Work::Generate);
        }

        #[test]
        fn reads_what_serde_json_reads(body in body()) {
            prop_assert_eq!(read(&body), oracle::read(&body), "{}", String::from_utf8_lossy(&body));
        }

        #[test]
        fn finds_the_model_among_other_fields(model in "[a-zA-Z0-9:/._-]{1,40}", pad in "[a-z]{0,20}") {
            let body = serde_json::json!({"prompt": pad, "model": model, "nested": {"model": "other"}});
            let f = extract(body.to_string().as_bytes(), ApiFlavor::OpenAi, Work::Generate).unwrap();
            prop_assert_eq!(f.model, model);
        }
    }

    /// A chunked body, frame by frame, read with a budget: the budget must
    /// cover the buffer's old and new capacity while it moves.
    async fn read_chunked(
        budget: &std::sync::Arc<BodyBudget>,
        frames: usize,
    ) -> Result<Bytes, u16> {
        let chunks: Vec<Result<http_body::Frame<Bytes>, std::convert::Infallible>> = (0..frames)
            .map(|_| Ok(http_body::Frame::data(Bytes::from(vec![b' '; 16 * 1024]))))
            .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
        read_capped(
            body,
            &http::HeaderMap::new(),
            1024 * 1024,
            &ClientDeadlines::default(),
            Some(budget),
        )
        .await
        .map_err(|answer| answer(ApiFlavor::OpenAi).status().as_u16())
    }

    #[tokio::test]
    async fn a_growing_body_holds_its_old_and_new_buffer_while_it_moves() {
        // 16 KiB frames: the buffer holds 16, then 32, then 64 KiB; the
        // third move holds 32 + 64 KiB at once.
        let budget = BodyBudget::new(90 * 1024);
        assert_eq!(read_chunked(&budget, 3).await, Err(503));
        assert_eq!(budget.held(), 0, "a refused body gives its share back");
        let budget = BodyBudget::new(96 * 1024);
        let body = read_chunked(&budget, 3).await.expect("room for the move");
        assert_eq!(body.len(), 48 * 1024);
        assert_eq!(budget.held(), 0, "a whole body leaves the budget");
    }
}
