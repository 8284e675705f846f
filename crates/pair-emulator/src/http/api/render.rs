//! What a generation sends back: the whole answer, or its streamed chunks
//! (NDJSON for Ollama, SSE for OpenAI) as the model releases tokens.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::JobTiming;
use crate::http::App;
use crate::http::driver::{JobGuard, Progress};
use crate::http::text::{self, rfc3339_now};

/// The API a generation answers in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Api {
    OllamaGenerate,
    OllamaChat,
    OpenAiChat { include_usage: bool },
    OpenAiCompletion { include_usage: bool },
}

/// One generation request, everything needed to render its chunks.
#[derive(Debug)]
pub(super) struct Gen {
    pub(super) api: Api,
    pub(super) model: String,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) seed: u64,
    /// The index of the answer's first token: past 0 when the request
    /// continues an answer this model began (a final assistant message, or
    /// a raw prompt that ends in its own text).
    pub(super) first_token: u32,
    pub(super) prompt_tokens: u32,
    pub(super) output_tokens: u32,
    /// The client set a limit: the answer ends "length", not "stop".
    pub(super) limited: bool,
    /// A tool the answer calls (chat offered tools, see `tool_to_call`).
    pub(super) tool_call: Option<ToolCall>,
    pub(super) load_us: u64,
    /// Wall seconds per modelled second: durations are reported as the
    /// engine's clock shows them, like a real engine's.
    pub(super) time_scale: f64,
    /// Answers as llama.cpp's server does: `timings` (with `cache_n`) and
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub(super) llama_cpp: bool,
}

/// A tool call the emulated model makes.
#[derive(Debug)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    pub(crate) arguments: Value,
}

impl Gen {
    fn finish_reason(&self) -> &'static str {
        match (&self.tool_call, self.api) {
            (Some(_), Api::OpenAiChat { .. }) => "tool_calls",
            _ if self.limited => "length",
            _ => "stop",
        }
    }

    /// The call in OpenAI's shape (arguments as JSON text) or Ollama's.
    fn tool_calls(&self, openai: bool) -> Option<Value> {
        let call = self.tool_call.as_ref()?;
        Some(if openai {
            json!([{ "id": format!("call_{}", self.id), "type": "function",
                     "function": { "name": call.name, "arguments": call.arguments.to_string() } }])
        } else {
            json!([{ "function": { "name": call.name, "arguments": call.arguments } }])
        })
    }

    fn token_chunk(&self, i: u32) -> Bytes {
        let tok = text::token(self.seed, self.first_token + i);
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
        let ns = |us: u64| super::common::wall_ns(us, self.time_scale);
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
        // Ollama counts only the tokens it evaluated: a cached prefix is
        // not in it.
        m.insert(
            "prompt_eval_count".into(),
            (t.prompt_tokens - t.cached_tokens).into(),
        );
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

    fn usage(&self, t: &JobTiming) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.output_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
        });
        if self.llama_cpp {
            usage["prompt_tokens_details"] = json!({ "cached_tokens": t.cached_tokens });
        }
        usage
    }

    /// llama.cpp server's `timings`: what it evaluated and reused, and how
    /// long each stage took on the engine's clock.
    fn timings(&self, t: &JobTiming) -> Value {
        let ms = |us: u64| super::common::wall_ns(us, self.time_scale) as f64 / 1e6;
        let prompt_n = t.prompt_tokens - t.cached_tokens;
        let prompt_ms = ms(t.first_token_us - t.started_us);
        let predicted_ms = ms(t.finished_us - t.first_token_us);
        let per_second = |n: u32, ms: f64| {
            if ms > 0.0 {
                f64::from(n) * 1e3 / ms
            } else {
                0.0
            }
        };
        let per_token = |n: u32, ms: f64| if n > 0 { ms / f64::from(n) } else { 0.0 };
        json!({
            "cache_n": t.cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per_token(prompt_n, prompt_ms),
            "prompt_per_second": per_second(prompt_n, prompt_ms),
            "predicted_n": t.output_tokens,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per_token(t.output_tokens, predicted_ms),
            "predicted_per_second": per_second(t.output_tokens, predicted_ms),
        })
    }

    fn final_chunks(&self, t: &JobTiming) -> Vec<Bytes> {
        match self.api {
            Api::OllamaGenerate | Api::OllamaChat => {
                let mut m = Map::new();
                m.insert("model".into(), self.model.clone().into());
                m.insert("created_at".into(), rfc3339_now().into());
                if self.api == Api::OllamaChat {
                    let mut message = json!({ "role": "assistant", "content": "" });
                    if let Some(calls) = self.tool_calls(false) {
                        message["tool_calls"] = calls;
                    }
                    m.insert("message".into(), message);
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
                let mut out = Vec::new();
                if let Some(calls) = self.tool_calls(true).filter(|_| chat) {
                    let mut calls = calls;
                    calls[0]["index"] = 0.into();
                    out.push(sse(&json!({
                        "id": self.id, "object": object, "created": self.created, "model": self.model,
                        "system_fingerprint": "fp_pair_emulator",
                        "choices": [{ "index": 0, "delta": { "tool_calls": calls }, "logprobs": null, "finish_reason": null }]
                    })));
                }
                let mut last = json!({
                    "id": self.id, "object": object, "created": self.created, "model": self.model,
                    "system_fingerprint": "fp_pair_emulator", "choices": [choice]
                });
                // llama.cpp's server reports its timings on the last choice.
                if self.llama_cpp {
                    last["timings"] = self.timings(t);
                }
                out.push(sse(&last));
                if include_usage {
                    out.push(sse(&json!({
                        "id": self.id, "object": object, "created": self.created, "model": self.model,
                        "system_fingerprint": "fp_pair_emulator", "choices": [], "usage": self.usage(t)
                    })));
                }
                out.push(Bytes::from_static(b"data: [DONE]\n\n"));
                out
            }
        }
    }

    pub(super) fn whole(&self, t: &JobTiming) -> Value {
        let text: String = (self.first_token..self.first_token + self.output_tokens)
            .map(|i| text::token(self.seed, i))
            .collect();
        match self.api {
            Api::OllamaGenerate | Api::OllamaChat => {
                let mut m = Map::new();
                m.insert("model".into(), self.model.clone().into());
                m.insert("created_at".into(), rfc3339_now().into());
                if self.api == Api::OllamaChat {
                    let mut message = json!({ "role": "assistant", "content": text });
                    if let Some(calls) = self.tool_calls(false) {
                        message["tool_calls"] = calls;
                    }
                    m.insert("message".into(), message);
                } else {
                    m.insert("response".into(), text.into());
                }
                m.extend(self.ollama_stats(t));
                Value::Object(m)
            }
            Api::OpenAiChat { .. } => {
                let mut message = json!({ "role": "assistant", "content": text });
                if let Some(calls) = self.tool_calls(true) {
                    message["tool_calls"] = calls;
                }
                self.with_timings(
                    json!({
                        "id": self.id, "object": "chat.completion", "created": self.created,
                        "model": self.model, "system_fingerprint": "fp_pair_emulator",
                        "choices": [{
                            "index": 0, "message": message,
                            "logprobs": null, "finish_reason": self.finish_reason()
                        }],
                        "usage": self.usage(t),
                    }),
                    t,
                )
            }
            Api::OpenAiCompletion { .. } => self.with_timings(
                json!({
                    "id": self.id, "object": "text_completion", "created": self.created,
                    "model": self.model, "system_fingerprint": "fp_pair_emulator",
                    "choices": [{ "text": text, "index": 0, "logprobs": null, "finish_reason": self.finish_reason() }],
                    "usage": self.usage(t),
                }),
                t,
            ),
        }
    }

    fn with_timings(&self, mut v: Value, t: &JobTiming) -> Value {
        if self.llama_cpp {
            v["timings"] = self.timings(t);
        }
        v
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

/// The body of a streamed answer.
pub(super) fn stream_body(app: App, guard: JobGuard, gen_: Arc<Gen>) -> Body {
    let state = StreamState {
        guard,
        gen_,
        sent: 0,
        queue: VecDeque::new(),
        finished: false,
        app,
    };
    Body::from_stream(futures_util::stream::unfold(state, next_chunk))
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
