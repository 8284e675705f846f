//! Mid-stream continuation, without I/O: what a stream cut after its first
//! byte needs to go on from another node. The [`Stitcher`] sits on the
//! stream the engine speaks (OpenAI's chat or completions events, Ollama's
//! chat or generate lines): it passes only complete events on (so a splice
//! never lands inside one) and keeps them (shared bytes, nothing parsed
//! while the stream flows). At a cut it reads the text back and writes the
//! request that continues the answer: a final assistant message the
//! engine continues, or the text appended to a raw prompt, with the token
//! limits lowered by what was streamed. The continuation's events are then
//! rewritten as the rest of the client's stream: its opening role chunk
//! dropped, its final counts summed, and an `x_pair.resumed` receipt
//! added. A node's pipeline and the edge SDK drive it the same way.
//!
//! An Ollama generate with a templated prompt is continued as the chat its
//! template renders (its `system` text and the prompt as the user's turn,
//! the text so far as the assistant's), and the chat's lines are written
//! back as generate lines.
//!
//! What cannot be continued says so: a tool call or a thought under way,
//! `n > 1`, log probabilities, a fill-in-the-middle suffix, a generate
//! with its own template or an earlier answer's token context.

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value, json};

use crate::frame::{Event, Framing, Kind, Reader, Splitter, Step};

/// The API of a stream below translation (the shells know which route
/// is which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    OpenAiChat,
    OpenAiCompletion,
    OllamaChat,
    OllamaGenerate,
}

impl Api {
    /// How its stream is framed.
    pub fn framing(self) -> Framing {
        match self {
            Api::OpenAiChat | Api::OpenAiCompletion => Framing::Sse,
            Api::OllamaChat | Api::OllamaGenerate => Framing::JsonLines,
        }
    }

    /// An OpenAI API (else Ollama's): the flavour a continuation is sent as.
    pub fn is_openai(self) -> bool {
        matches!(self, Api::OpenAiChat | Api::OpenAiCompletion)
    }

    /// A chat (continued by a final assistant message).
    pub fn is_chat(self) -> bool {
        matches!(self, Api::OpenAiChat | Api::OllamaChat)
    }
}

/// What the client has of an answer, read back from the events it was
/// given.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Transcript {
    /// The answer's text so far.
    pub text: String,
    /// Events that carried text: about one token each.
    pub tokens: u32,
    /// Why it cannot be continued, when it cannot.
    pub unresumable: Option<&'static str>,
    /// Its final event went by: nothing is missing but the stream's end.
    pub finished: bool,
}

impl Transcript {
    /// Reads the complete events of `events` (a stream's pieces, in order).
    pub fn read<'a>(api: Api, events: impl IntoIterator<Item = &'a Bytes>) -> Transcript {
        let mut t = Transcript::default();
        let (mut splitter, mut out) = (Splitter::new(api.framing()), Vec::new());
        for chunk in events {
            splitter.push(chunk, &mut out);
            for event in out.drain(..) {
                let Event::Json(payload) = event else {
                    continue;
                };
                match serde_json::from_slice::<Value>(&payload) {
                    Ok(v) => t.event(api, &v),
                    Err(_) => {
                        t.unresumable.get_or_insert("an event that is not JSON");
                    }
                }
            }
        }
        t
    }

    fn event(&mut self, api: Api, v: &Value) {
        if v.get("error").is_some() {
            self.unresumable.get_or_insert("an error event");
            return;
        }
        let (text, done) = match api {
            Api::OpenAiChat | Api::OpenAiCompletion => {
                let choice = v.pointer("/choices/0");
                if v["choices"].as_array().is_some_and(|c| c.len() > 1)
                    || choice.and_then(|c| c.get("index")).and_then(Value::as_u64) > Some(0)
                {
                    self.unresumable.get_or_insert("n > 1");
                }
                let delta = choice.and_then(|c| c.get("delta"));
                if delta
                    .and_then(|d| d.get("tool_calls"))
                    .is_some_and(|c| !c.is_null())
                {
                    self.unresumable.get_or_insert("a tool call");
                }
                if delta
                    .and_then(|d| d.get("reasoning_content").or_else(|| d.get("reasoning")))
                    .and_then(Value::as_str)
                    .is_some_and(|r| !r.is_empty())
                {
                    self.unresumable.get_or_insert("a thought under way");
                }
                let text = match api {
                    Api::OpenAiChat => delta.and_then(|d| d.get("content")),
                    _ => choice.and_then(|c| c.get("text")),
                };
                let done = choice
                    .and_then(|c| c.get("finish_reason"))
                    .is_some_and(|f| !f.is_null())
                    || v.get("usage").is_some_and(|u| !u.is_null());
                (text.and_then(Value::as_str), done)
            }
            Api::OllamaChat | Api::OllamaGenerate => {
                let message = v.get("message");
                if message
                    .and_then(|m| m.get("tool_calls"))
                    .is_some_and(|c| !c.is_null())
                {
                    self.unresumable.get_or_insert("a tool call");
                }
                if message
                    .and_then(|m| m.get("thinking"))
                    .or_else(|| v.get("thinking"))
                    .and_then(Value::as_str)
                    .is_some_and(|r| !r.is_empty())
                {
                    self.unresumable.get_or_insert("a thought under way");
                }
                let text = match api {
                    Api::OllamaChat => message.and_then(|m| m.get("content")),
                    _ => v.get("response"),
                };
                (
                    text.and_then(Value::as_str),
                    v.get("done").and_then(Value::as_bool) == Some(true),
                )
            }
        };
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            self.text.push_str(text);
            self.tokens = self.tokens.saturating_add(1);
        }
        self.finished |= done;
    }
}

/// The request that continues an answer and the API it is in, or why
/// there is none. `Ok(None)`: its token limit is used up (the answer is
/// whole).
pub fn continuation(
    api: Api,
    request: &[u8],
    t: &Transcript,
) -> Result<Option<(Api, Vec<u8>)>, &'static str> {
    if let Some(why) = t.unresumable {
        return Err(why);
    }
    let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(request) else {
        return Err("a request that is not a JSON object");
    };
    if req.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err("n > 1");
    }
    if req
        .get("logprobs")
        .is_some_and(|l| !matches!(l, Value::Null | Value::Bool(false)))
        || req.get("top_logprobs").is_some_and(|l| !l.is_null())
    {
        return Err("log probabilities");
    }
    if !lower_limit(&mut req, api, t.tokens) {
        return Ok(None);
    }
    let mut sent_as = api;
    match api {
        Api::OllamaGenerate if req.get("raw").and_then(Value::as_bool) != Some(true) => {
            templated_as_chat(&mut req, &t.text)?;
            sent_as = Api::OllamaChat;
        }
        Api::OpenAiChat | Api::OllamaChat => {
            let Some(Value::Array(messages)) = req.get_mut("messages") else {
                return Err("a chat without messages");
            };
            messages.push(json!({ "role": "assistant", "content": t.text }));
            if api == Api::OpenAiChat {
                // vLLM continues a final assistant message only when told
                // to; llama.cpp's server does on its own.
                req.insert("continue_final_message".into(), true.into());
                req.insert("add_generation_prompt".into(), false.into());
            }
        }
        Api::OpenAiCompletion | Api::OllamaGenerate => {
            if req.get("suffix").is_some_and(|s| !s.is_null()) {
                return Err("a fill-in-the-middle suffix");
            }
            let Some(Value::String(prompt)) = req.get_mut("prompt") else {
                return Err("a prompt that is not one string");
            };
            prompt.push_str(&t.text);
        }
    }
    let body =
        serde_json::to_vec(&Value::Object(req)).map_err(|_| "a request that cannot be written")?;
    Ok(Some((sent_as, body)))
}

/// Rewrites a templated Ollama generate as the chat its template renders,
/// ending in the assistant's `text` (Ollama continues a final assistant
/// message): its `system` text, then the prompt (and images) as the
/// user's turn. A generate that brings its own template or an earlier
/// answer's token context has no such chat.
fn templated_as_chat(req: &mut Map<String, Value>, text: &str) -> Result<(), &'static str> {
    let set = |v: Option<&Value>| {
        v.is_some_and(|v| match v {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        })
    };
    if set(req.get("template")) {
        return Err("a generate with its own template");
    }
    if set(req.get("context")) {
        return Err("a generate with an earlier answer's token context");
    }
    if set(req.get("suffix")) {
        return Err("a fill-in-the-middle suffix");
    }
    let Some(Value::String(prompt)) = req.remove("prompt") else {
        return Err("a prompt that is not one string");
    };
    let mut messages = Vec::with_capacity(3);
    if let Some(Value::String(system)) = req.remove("system")
        && !system.is_empty()
    {
        messages.push(json!({ "role": "system", "content": system }));
    }
    let mut user = json!({ "role": "user", "content": prompt });
    if let Some(images) = req.remove("images").filter(|i| set(Some(i))) {
        user["images"] = images;
    }
    messages.push(user);
    messages.push(json!({ "role": "assistant", "content": text }));
    for field in ["raw", "template", "context", "suffix"] {
        req.remove(field);
    }
    req.insert("messages".into(), Value::Array(messages));
    Ok(())
}

/// Lowers every token limit the request sets by `streamed`; false when
/// one is used up.
fn lower_limit(req: &mut Map<String, Value>, api: Api, streamed: u32) -> bool {
    let mut left = true;
    let mut lower = |v: &mut Value| {
        if let Some(n) = v.as_i64().filter(|n| *n > 0) {
            let rest = n - i64::from(streamed);
            left &= rest > 0;
            *v = rest.max(1).into();
        }
    };
    match api {
        Api::OllamaChat | Api::OllamaGenerate => {
            if let Some(v) = req
                .get_mut("options")
                .and_then(|o| o.get_mut("num_predict"))
            {
                lower(v);
            }
        }
        Api::OpenAiChat | Api::OpenAiCompletion => {
            for field in ["max_tokens", "max_completion_tokens"] {
                if let Some(v) = req.get_mut(field) {
                    lower(v);
                }
            }
        }
    }
    left
}

/// The final event of an answer whose token limit ran out at a cut.
fn closing(api: Api, model: &str, splice: Option<&Splice>) -> Bytes {
    let receipt = splice.map_or_else(Vec::new, |s| s.receipt.clone());
    let mut end = match api {
        Api::OpenAiChat => json!({ "object": "chat.completion.chunk", "model": model,
            "choices": [{ "index": 0, "delta": {}, "finish_reason": "length" }] }),
        Api::OpenAiCompletion => json!({ "object": "text_completion", "model": model,
            "choices": [{ "index": 0, "text": "", "finish_reason": "length" }] }),
        Api::OllamaChat => json!({ "model": model, "done": true, "done_reason": "length",
            "message": { "role": "assistant", "content": "" } }),
        Api::OllamaGenerate => json!({ "model": model, "done": true, "done_reason": "length",
            "response": "" }),
    };
    if !receipt.is_empty() {
        end["x_pair"] = json!({ "resumed": receipt });
    }
    Bytes::from(match api.framing() {
        Framing::Sse => format!("data: {end}\n\ndata: [DONE]\n\n"),
        _ => format!("{end}\n"),
    })
}

/// Rewrites a continuation's events as the rest of the client's stream:
/// its opening (a role-only chunk) goes, its events are written in the
/// client's API where it was sent in another (a chat continuing a
/// generate), and its final event counts the tokens streamed before it
/// and says where the answer moved.
#[derive(Debug)]
struct Splice {
    api: Api,
    /// The API the continuation answers in.
    from: Api,
    /// Tokens the client had before this continuation.
    before: u32,
    /// `x_pair.resumed`: one entry per move.
    receipt: Vec<Value>,
}

impl Splice {
    /// Rewrites the events in `events` (complete ones, and a last one that
    /// came without its end); bytes that are no event's pass as they are.
    fn rewrite(&self, framing: Framing, events: &Bytes) -> Bytes {
        let mut out = BytesMut::with_capacity(events.len() + 64);
        let (mut changed, mut from, mut payload) = (false, 0, Vec::new());
        let mut take = |step: Step<'_>, to: usize| {
            let kind = match step {
                Step::Data(d) => {
                    payload.extend_from_slice(d);
                    return;
                }
                Step::End(kind) => kind,
            };
            let event = &events[from..to];
            from = to;
            let parsed = (kind == Kind::Json)
                .then(|| serde_json::from_slice::<Value>(&payload).ok())
                .flatten();
            payload.clear();
            let Some(mut v) = parsed else {
                out.extend_from_slice(event);
                return;
            };
            match self.event(&mut v) {
                Edit::Keep => out.extend_from_slice(event),
                Edit::Drop => changed = true,
                Edit::Changed => {
                    changed = true;
                    match framing {
                        Framing::Sse => out.extend_from_slice(format!("data: {v}\n\n").as_bytes()),
                        _ => out.extend_from_slice(format!("{v}\n").as_bytes()),
                    }
                }
            }
        };
        let mut reader = Reader::new(framing);
        let mut steps = reader.read(events);
        while let Some(step) = steps.next() {
            take(step, steps.at());
        }
        for step in reader.finish() {
            take(step, events.len());
        }
        out.extend_from_slice(&events[from..]);
        if changed {
            out.freeze()
        } else {
            events.clone()
        }
    }

    fn event(&self, v: &mut Value) -> Edit {
        let before = u64::from(self.before);
        let mut last = false;
        let mut changed = false;
        if self.from == Api::OllamaChat
            && self.api == Api::OllamaGenerate
            && let Some(Value::Object(message)) =
                v.as_object_mut().and_then(|e| e.remove("message"))
        {
            v["response"] = message.get("content").cloned().unwrap_or_else(|| "".into());
            if let Some(thinking) = message.get("thinking") {
                v["thinking"] = thinking.clone();
            }
            changed = true;
        }
        match self.api {
            Api::OpenAiChat | Api::OpenAiCompletion => {
                let finish = v
                    .pointer("/choices/0/finish_reason")
                    .is_some_and(|f| !f.is_null());
                if let Some(u) = v.get_mut("usage").filter(|u| u.is_object()) {
                    let prompt = u["prompt_tokens"]
                        .as_u64()
                        .unwrap_or(0)
                        .saturating_sub(before);
                    let completion = u["completion_tokens"].as_u64().unwrap_or(0) + before;
                    u["prompt_tokens"] = prompt.into();
                    u["completion_tokens"] = completion.into();
                    u["total_tokens"] = (prompt + completion).into();
                    last = true;
                }
                if !finish && !last && self.api == Api::OpenAiChat {
                    let delta = v.pointer("/choices/0/delta");
                    let says = |k: &str| {
                        delta
                            .and_then(|d| d.get(k))
                            .is_some_and(|x| !x.is_null() && x != "")
                    };
                    if !says("content")
                        && !says("tool_calls")
                        && !says("reasoning_content")
                        && !says("reasoning")
                    {
                        // The continuation's opening: the role, again.
                        return Edit::Drop;
                    }
                }
                last |= finish;
            }
            Api::OllamaChat | Api::OllamaGenerate => {
                if v.get("done").and_then(Value::as_bool) == Some(true) {
                    if let Some(n) = v.get("eval_count").and_then(Value::as_u64) {
                        v["eval_count"] = (n + before).into();
                    }
                    if let Some(n) = v.get("prompt_eval_count").and_then(Value::as_u64) {
                        v["prompt_eval_count"] = n.saturating_sub(before).into();
                    }
                    last = true;
                }
            }
        }
        if !last {
            return if changed { Edit::Changed } else { Edit::Keep };
        }
        v["x_pair"] = json!({ "resumed": self.receipt });
        Edit::Changed
    }
}

enum Edit {
    Keep,
    Drop,
    Changed,
}

/// Most bytes of given events kept to read a cut answer back; a longer
/// answer is not continued.
pub const KEPT_MAX: usize = 8 << 20;

/// What to do about a cut after the client's first byte.
#[derive(Debug, PartialEq, Eq)]
pub enum Cut {
    /// Send `request` (the continuation, in `api`) to another owner of
    /// the model; the client has `before` tokens of the answer.
    Move {
        request: Bytes,
        api: Api,
        before: u32,
    },
    /// The answer is whole (its final event went by, or its token limit is
    /// used up): give the client these last bytes, if any, and end.
    End(Option<Bytes>),
    /// It cannot be continued, for this reason.
    Stop(&'static str),
}

/// One stream's continuation state, without I/O: feed it the stream's
/// pieces and pass on what it returns; at a cut, do what [`Stitcher::cut`]
/// says, and once a continuation answers, call [`Stitcher::moved`] and
/// feed it the continuation's stream.
#[derive(Debug)]
pub struct Stitcher {
    api: Api,
    /// Reads the stream to find where its events end.
    reader: Reader,
    /// The request as it went to the engine.
    request: Bytes,
    model: String,
    /// Moves allowed.
    limit: usize,
    moves: usize,
    /// Events given to the client, while they are few enough to keep.
    given: Vec<Bytes>,
    /// Bytes given (counted up to just past [`KEPT_MAX`]): above zero once
    /// the client has had its first byte.
    given_len: usize,
    /// The start of an event still arriving.
    partial: BytesMut,
    splice: Option<Splice>,
}

impl Stitcher {
    /// A stream of `api` answering `request` (as sent to the engine) for
    /// `model`, which may move `limit` times.
    pub fn new(api: Api, request: Bytes, model: impl Into<String>, limit: u8) -> Self {
        Self {
            api,
            reader: Reader::new(api.framing()),
            request,
            model: model.into(),
            limit: usize::from(limit),
            moves: 0,
            given: Vec::new(),
            given_len: 0,
            partial: BytesMut::new(),
            splice: None,
        }
    }

    pub fn api(&self) -> Api {
        self.api
    }

    /// Whether the client has had its first byte (before it, a failure is
    /// the failover's: the request is sent again whole).
    pub fn began(&self) -> bool {
        self.given_len > 0
    }

    /// The complete events in `data` (with what was held of the one it
    /// finishes), spliced after a move; `None` while an event is still
    /// incomplete.
    pub fn feed(&mut self, data: Bytes) -> Option<Bytes> {
        let mut end = None;
        let mut steps = self.reader.read(&data);
        while let Some(step) = steps.next() {
            if let Step::End(_) = step {
                end = Some(steps.at());
            }
        }
        let Some(end) = end else {
            self.partial.extend_from_slice(&data);
            return None;
        };
        let whole = if self.partial.is_empty() {
            data.slice(..end)
        } else {
            self.partial.extend_from_slice(&data[..end]);
            self.partial.split().freeze()
        };
        self.partial.extend_from_slice(&data[end..]);
        let out = match &self.splice {
            Some(s) => s.rewrite(self.reader.framing(), &whole),
            None => whole,
        };
        if out.is_empty() {
            return None;
        }
        if self.given_len <= KEPT_MAX {
            self.given_len += out.len();
            self.given.push(out.clone());
        }
        Some(out)
    }

    /// The stream was cut after the client's first byte: what to do.
    pub fn cut(&mut self) -> Cut {
        if self.moves >= self.limit {
            return Cut::Stop("its moves are used up");
        }
        if self.given_len > KEPT_MAX {
            return Cut::Stop("too long to read back");
        }
        let t = Transcript::read(self.api, &self.given);
        if t.finished {
            // Only the stream's end is missing.
            return Cut::End(
                (self.reader.framing() == Framing::Sse)
                    .then(|| Bytes::from_static(b"data: [DONE]\n\n")),
            );
        }
        match continuation(self.api, &self.request, &t) {
            Err(why) => Cut::Stop(why),
            // Its limit is reached: what was given is the whole answer.
            Ok(None) => Cut::End(Some(closing(self.api, &self.model, self.splice.as_ref()))),
            Ok(Some((api, body))) => Cut::Move {
                request: Bytes::from(body),
                api,
                before: t.tokens,
            },
        }
    }

    /// The continuation sent in `from` at `before` tokens answered: its
    /// stream is fed from here, rewritten as the rest of the client's;
    /// `entry` is the move's receipt (`x_pair.resumed`).
    pub fn moved(&mut self, from: Api, before: u32, entry: Value) {
        self.moves += 1;
        let mut receipt = self.splice.take().map(|s| s.receipt).unwrap_or_default();
        receipt.push(entry);
        self.partial.clear();
        self.reader = Reader::new(self.api.framing());
        self.splice = Some(Splice {
            api: self.api,
            from,
            before,
            receipt,
        });
    }

    /// The stream ended: a last event that came without its line end.
    pub fn rest(&mut self) -> Option<Bytes> {
        if self.partial.is_empty() {
            return None;
        }
        let rest = self.partial.split().freeze();
        Some(match &self.splice {
            Some(s) => s.rewrite(self.reader.framing(), &rest),
            None => rest,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sse(events: &[Value]) -> Bytes {
        let mut s = String::new();
        for e in events {
            s.push_str(&format!("data: {e}\n\n"));
        }
        Bytes::from(s)
    }

    fn chunk(content: &str) -> Value {
        json!({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    }

    #[test]
    fn a_chat_stream_is_read_back_as_its_text() {
        let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]});
        let events = [sse(&[role, chunk("Hello")]), sse(&[chunk(" world")])];
        let t = Transcript::read(Api::OpenAiChat, &events);
        assert_eq!(t.text, "Hello world");
        assert_eq!(t.tokens, 2);
        assert_eq!(t.unresumable, None);
        assert!(!t.finished);
        let lines = [Bytes::from(
            "{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n{\"message\":{\"role\":\"assistant\",\"content\":\" there\"},\"done\":false}\n",
        )];
        let t = Transcript::read(Api::OllamaChat, &lines);
        assert_eq!((t.text.as_str(), t.tokens), ("Hi there", 2));
    }

    #[test]
    fn tool_calls_thoughts_and_several_choices_are_not_continued() {
        let tool = json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"ci"}}]}, "finish_reason": null}]});
        let t = Transcript::read(Api::OpenAiChat, &[sse(&[tool])]);
        assert_eq!(t.unresumable, Some("a tool call"));
        let think = json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": null}]});
        let t = Transcript::read(Api::OpenAiChat, &[sse(&[think])]);
        assert_eq!(t.unresumable, Some("a thought under way"));
        let second =
            json!({"choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": null}]});
        let t = Transcript::read(Api::OpenAiChat, &[sse(&[second])]);
        assert_eq!(t.unresumable, Some("n > 1"));
        assert!(continuation(Api::OpenAiChat, b"{}", &t).is_err());
    }

    #[test]
    fn a_continuation_ends_with_the_text_and_asks_for_the_rest() {
        let t = Transcript {
            text: "Hello world".into(),
            tokens: 2,
            ..Transcript::default()
        };
        let req = json!({"model": "m", "max_tokens": 10, "stream": true,
                         "messages": [{"role": "user", "content": "hi"}]});
        let (api, body) = continuation(Api::OpenAiChat, req.to_string().as_bytes(), &t)
            .unwrap()
            .unwrap();
        assert_eq!(api, Api::OpenAiChat);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["max_tokens"], 8);
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "Hello world"})
        );
        assert_eq!(v["continue_final_message"], true);
        // Ollama's limit, and a raw prompt.
        let req =
            json!({"model": "m", "prompt": "Q: ", "raw": true, "options": {"num_predict": 5}});
        let (api, body) = continuation(Api::OllamaGenerate, req.to_string().as_bytes(), &t)
            .unwrap()
            .unwrap();
        assert_eq!(api, Api::OllamaGenerate);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (v["prompt"].as_str(), v["options"]["num_predict"].as_i64()),
            (Some("Q: Hello world"), Some(3))
        );
        // A used-up limit needs no continuation.
        let req = json!({"model": "m", "max_tokens": 2, "prompt": "Q"});
        assert_eq!(
            continuation(Api::OpenAiCompletion, req.to_string().as_bytes(), &t),
            Ok(None)
        );
        let req = json!({"model": "m", "logprobs": true, "messages": []});
        assert!(continuation(Api::OpenAiChat, req.to_string().as_bytes(), &t).is_err());
    }

    #[test]
    fn a_templated_generate_goes_on_as_the_chat_its_template_renders() {
        let t = Transcript {
            text: "Paris is".into(),
            tokens: 2,
            ..Transcript::default()
        };
        let req = json!({"model": "m", "prompt": "Capital of France?", "system": "be brief",
                         "images": ["aGk="], "stream": true, "keep_alive": "5m",
                         "options": {"num_predict": 6, "temperature": 0}});
        let (api, body) = continuation(Api::OllamaGenerate, req.to_string().as_bytes(), &t)
            .unwrap()
            .unwrap();
        assert_eq!(api, Api::OllamaChat);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"model": "m", "stream": true, "keep_alive": "5m",
                   "options": {"num_predict": 4, "temperature": 0},
                   "messages": [
                       {"role": "system", "content": "be brief"},
                       {"role": "user", "content": "Capital of France?", "images": ["aGk="]},
                       {"role": "assistant", "content": "Paris is"}]})
        );
        // With no system text, the model's own applies, as in a chat.
        let req = json!({"model": "m", "prompt": "Q", "system": ""});
        let (_, body) = continuation(Api::OllamaGenerate, req.to_string().as_bytes(), &t)
            .unwrap()
            .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["messages"].as_array().map(Vec::len), Some(2));
        // Its own template, or an earlier answer's context, has no chat.
        for req in [
            json!({"model": "m", "prompt": "Q", "template": "{{ .Prompt }}"}),
            json!({"model": "m", "prompt": "Q", "context": [1, 2, 3]}),
            json!({"model": "m", "prompt": "Q", "suffix": "}"}),
        ] {
            assert!(continuation(Api::OllamaGenerate, req.to_string().as_bytes(), &t).is_err());
        }
        // The chat's lines are written back as generate lines.
        let splice = Splice {
            api: Api::OllamaGenerate,
            from: Api::OllamaChat,
            before: 2,
            receipt: vec![json!({"node": "b", "at_token": 2})],
        };
        let lines = Bytes::from(concat!(
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\" Paris.\"},\"done\":false}\n",
            "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"eval_count\":2}\n",
        ));
        let out = splice.rewrite(Framing::JsonLines, &lines);
        let out: Vec<Value> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect();
        assert_eq!(
            out[0],
            json!({"model": "m", "response": " Paris.", "done": false})
        );
        assert_eq!(
            (out[1]["response"].as_str(), out[1]["eval_count"].as_u64()),
            (Some(""), Some(4))
        );
        assert!(out[1].get("message").is_none());
        assert_eq!(out[1]["x_pair"]["resumed"][0]["at_token"], 2);
        let t = Transcript::read(
            Api::OllamaGenerate,
            &[splice.rewrite(Framing::JsonLines, &lines)],
        );
        assert_eq!((t.text.as_str(), t.finished), (" Paris.", true));
    }

    #[test]
    fn a_splice_drops_the_opening_and_sums_the_final_counts() {
        let splice = Splice {
            api: Api::OpenAiChat,
            from: Api::OpenAiChat,
            before: 4,
            receipt: vec![json!({"node": "b", "at_token": 4})],
        };
        let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]});
        let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let usage = json!({"choices": [], "usage": {"prompt_tokens": 14, "completion_tokens": 3, "total_tokens": 17}});
        let mut events = sse(&[role, chunk(" more"), end, usage]).to_vec();
        events.extend_from_slice(b"data: [DONE]\n\n");
        let out = splice.rewrite(Framing::Sse, &Bytes::from(events));
        let text = String::from_utf8(out.to_vec()).unwrap();
        let datas: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        assert_eq!(datas.len(), 4, "{text}");
        assert!(datas[0].contains(" more"));
        let end: Value = serde_json::from_str(datas[1]).unwrap();
        assert_eq!(end["x_pair"]["resumed"][0]["at_token"], 4);
        let usage: Value = serde_json::from_str(datas[2]).unwrap();
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17})
        );
        assert_eq!(datas[3], "[DONE]");
        // Ollama's last line.
        let splice = Splice {
            api: Api::OllamaChat,
            from: Api::OllamaChat,
            ..splice
        };
        let line = Bytes::from("{\"done\":true,\"eval_count\":3,\"prompt_eval_count\":20}\n");
        let v: Value = serde_json::from_slice(&splice.rewrite(Framing::JsonLines, &line)).unwrap();
        assert_eq!(
            (v["eval_count"].as_u64(), v["prompt_eval_count"].as_u64()),
            (Some(7), Some(16))
        );
        assert!(v["x_pair"]["resumed"].is_array());
        // Events it does not change pass as they came.
        let plain = sse(&[chunk("x")]);
        assert_eq!(splice.rewrite(Framing::Sse, &plain), plain);
    }

    /// What a stitcher passes on of `stream` fed in `pieces`, each piece
    /// it passes, and what it holds at the end.
    fn passed(stream: &[u8], cuts: &[usize]) -> (Vec<Bytes>, Option<Bytes>) {
        let mut st = Stitcher::new(Api::OpenAiChat, Bytes::from_static(b"{}"), "m", 1);
        let out = crate::frame::cut(stream, cuts)
            .into_iter()
            .filter_map(|p| st.feed(Bytes::copy_from_slice(p)))
            .collect();
        (out, st.rest())
    }

    const CRLF: &[u8] =
        b"data: {\"choices\":[{\"index\":0,\r\ndata: \"delta\":{\"content\":\"Hi\"}}]}\r\n\r\n\
: ping\r\rdata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"}}]}\r\n\r\n";

    #[test]
    fn events_pass_whole_whatever_their_line_ends() {
        let (out, rest) = passed(CRLF, &[40, 70]);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].ends_with(b"\r\n\r\n") && out[1].starts_with(b": ping"));
        assert_eq!(rest, None);
        let t = Transcript::read(Api::OpenAiChat, &out);
        assert_eq!((t.text.as_str(), t.tokens, t.unresumable), ("Hi!", 2, None));
        // A continuation's CRLF events are rewritten whole.
        let splice = Splice {
            api: Api::OpenAiChat,
            from: Api::OpenAiChat,
            before: 1,
            receipt: vec![json!({"node": "b", "at_token": 1})],
        };
        let role =
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n";
        let events = Bytes::from([&role[..], CRLF].concat());
        assert_eq!(
            splice.rewrite(Framing::Sse, &events),
            CRLF,
            "its opening is dropped"
        );
    }

    proptest! {
        /// However a stream is cut, what a stitcher passes on is the
        /// stream, in whole events.
        #[test]
        fn a_stream_in_any_pieces_passes_in_whole_events(
            cuts in prop::collection::vec(0usize..200, 0..12),
        ) {
            let (whole, _) = passed(CRLF, &[]);
            let (mut out, rest) = passed(CRLF, &cuts);
            let last = out.last().cloned().unwrap_or_default();
            prop_assert!(last.ends_with(b"\r\n\r\n") || last.ends_with(b"\r\n\r"));
            out.extend(rest);
            prop_assert_eq!(out.concat(), CRLF);
            prop_assert_eq!(
                Transcript::read(Api::OpenAiChat, &out),
                Transcript::read(Api::OpenAiChat, &whole)
            );
        }
    }
}
