//! The scenario's workload against the live cluster's faces: the same
//! demand the simulator generates (same seeds, same draws), sent by real
//! HTTP clients on the wall clock, scaled by the time scale. Closed-loop
//! users wait for their answer and think; open-loop sources arrive on
//! their own schedule; agents fan out. Each client enters at the node the
//! scenario's routing says, as in the simulator's per-node mode.
//!
//! Requests are Ollama chats on the node's Ollama face. A multi-turn
//! conversation re-sends its first user message each turn and carries the
//! earlier turns as an assistant message, as chat apps do, with no session
//! header: the nodes find the conversation from the body. The emulated
//! engine is told the answer's natural length (`x-emulator-answer-tokens`),
//! which the router is not, as with a real model.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pair_core::SessionKey;
use serde_json::{Value, json};

use crate::SimError;
use crate::metrics::{Jobs, Record, Turns};
use crate::scenario::{Entry, Micros, Routing, Scenario, SourceKind};
use crate::sim::Cluster;
use crate::workload::{Demand, SourceState};

/// Scenario time on the wall clock.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    t0: Instant,
    /// Wall seconds per modelled second.
    scale: f64,
}

impl Clock {
    pub(super) fn start(scale: f64) -> Self {
        Self {
            t0: Instant::now(),
            scale,
        }
    }

    /// Modelled microseconds since the start.
    pub(super) fn now(&self) -> Micros {
        self.modelled(self.t0.elapsed())
    }

    /// A wall duration in modelled microseconds.
    pub(super) fn modelled(&self, wall: Duration) -> Micros {
        (wall.as_secs_f64() * 1e6 / self.scale) as Micros
    }

    /// The wall instant of modelled time `at`.
    pub(super) fn instant(&self, at: Micros) -> Instant {
        self.t0 + Duration::from_secs_f64(at as f64 / 1e6 * self.scale)
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) records: Vec<Record>,
    pub(super) jobs: Jobs,
    pub(super) turns: Turns,
    pub(super) generated: u64,
    pub(super) completed: u64,
    /// When the last answer ended (modelled).
    pub(super) last_finish: Micros,
}

/// One answer as its client saw it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Answer {
    /// The node that ran it (`x-pair-node`'s name).
    pub(super) node: Option<String>,
    pub(super) ttft: Duration,
    pub e2e: Duration,
    /// The prompt tokens the engine evaluated (Ollama's
    /// `prompt_eval_count`: what it did not find in its cache).
    pub(super) evaluated: Option<u32>,
}

/// Bytes of a stream's end kept to read its last line.
const TAIL_BYTES: usize = 4096;

/// Ollama's `prompt_eval_count` in the last line of `tail`.
fn evaluated_in(tail: &[u8]) -> Option<u32> {
    let line = tail
        .split(|&b| b == b'\n')
        .rfind(|l| !l.iter().all(u8::is_ascii_whitespace))?;
    let v: Value = serde_json::from_slice(line).ok()?;
    u32::try_from(v["prompt_eval_count"].as_u64()?).ok()
}

/// The body of a request for `d`: an Ollama chat whose prompt is
/// `d.prompt_tokens` tokens as the emulated engine counts them (four
/// characters a token, four more per message). `first` is the
/// conversation's first user message length, in tokens, for a multi-turn
/// chat; `id` makes every other request's text unique, so no two
/// single-turn chats look like one conversation.
pub(super) fn chat_body(
    model: &str,
    d: &Demand,
    first: Option<(SessionKey, u32)>,
    id: u64,
    max_tokens: Option<u32>,
) -> Value {
    const PER_MESSAGE: u32 = 4;
    let text = |tag: String, tokens: u32| {
        let chars = (tokens.saturating_sub(PER_MESSAGE).max(1) as usize) * 4;
        let mut s = tag;
        while s.len() < chars {
            s.push_str(" lorem");
        }
        s.truncate(chars.max(1));
        s
    };
    let messages = if d.prompt.is_empty() {
        None
    } else {
        Some(chain_messages(d, &text))
    };
    let messages = match (messages, first) {
        (Some(messages), _) => messages,
        (None, Some((key, first_tokens))) => {
            let opening = text(format!("conversation {:016x}", key.0), first_tokens);
            let rest = d.prompt_tokens.saturating_sub(first_tokens);
            if rest == 0 {
                json!([{ "role": "user", "content": opening }])
            } else {
                let earlier = rest / 2;
                json!([
                    { "role": "user", "content": opening },
                    { "role": "assistant", "content": text(String::new(), earlier.max(PER_MESSAGE + 1)) },
                    { "role": "user", "content": text(format!("turn {id}"), rest - earlier) },
                ])
            }
        }
        (None, None) => {
            json!([{ "role": "user", "content": text(format!("request {id}"), d.prompt_tokens) }])
        }
    };
    let mut body = json!({ "model": model, "messages": messages, "stream": d.streaming });
    // An agent's turn offers its tools, as a coding agent's does.
    if d.tools {
        body["tools"] = json!([{ "type": "function", "function": { "name": "Bash" } }]);
    }
    if let Some(max) = max_tokens {
        body["options"] = json!({ "num_predict": max });
    }
    body
}

/// The messages of a demand whose prompt is a chain: one message per
/// block up to the prompt's length, its text named by the block's hash, so
/// a conversation's later turn re-sends its earlier turns byte for byte
/// and requests that share a system prompt share its message, as real
/// clients do (and as the simulator's engines and routers see them: their
/// caches hit where the simulator's do). A block past the prompt (the
/// answer a turn leaves in the engine's context) joins the next turn.
fn chain_messages(d: &Demand, text: &dyn Fn(String, u32) -> String) -> Value {
    let mut messages = Vec::new();
    let mut at = 0u32;
    for (i, block) in d.prompt.blocks().iter().enumerate() {
        if block.end > d.prompt_tokens {
            break;
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({
            "role": role,
            "content": text(format!("{:016x}", block.hash), block.end - at),
        }));
        at = block.end;
    }
    if at < d.prompt_tokens || messages.is_empty() {
        let rest = d.prompt_tokens.saturating_sub(at);
        messages.push(json!({ "role": "user", "content": text("turn".into(), rest) }));
    }
    Value::Array(messages)
}

/// The node name in a receipt (`NAME (ID)`).
pub(super) fn receipt_name(v: &str) -> &str {
    v.rsplit_once(" (").map_or(v, |(name, _)| name)
}

/// Sends one request (naming its conversation with `x-pair-session` when
/// `session` is given) and reads its answer to the end. A streamed
/// answer's TTFT is its first body bytes; a whole answer's is its end less
/// the decode time the engine reports (`eval_duration`, on the engine's
/// clock).
pub(super) async fn send(
    http: &reqwest::Client,
    face: &str,
    body: &Value,
    answer_tokens: u32,
    session: Option<SessionKey>,
    priority: pair_scheduler::Priority,
) -> Option<Answer> {
    let began = Instant::now();
    let mut req = http
        .post(format!("{face}/api/chat"))
        .header(pair_emulator::http::ANSWER_TOKENS, answer_tokens)
        .json(body);
    if let Some(key) = session {
        req = req.header("x-pair-session", format!("{:016x}", key.0));
    }
    if priority == pair_scheduler::Priority::Batch {
        req = req.header("x-pair-priority", "batch");
    }
    let mut resp = req.send().await.ok()?;
    if !resp.status().is_success() {
        let _ = resp.bytes().await;
        return None;
    }
    let node = resp
        .headers()
        .get("x-pair-node")
        .and_then(|v| v.to_str().ok())
        .map(|v| receipt_name(v).to_owned());
    let streaming = body["stream"].as_bool().unwrap_or(true);
    if streaming {
        let mut first = None;
        let mut tail = Vec::with_capacity(2 * TAIL_BYTES);
        while let Some(chunk) = resp.chunk().await.ok()? {
            if first.is_none() && !chunk.is_empty() {
                first = Some(began.elapsed());
            }
            tail.extend_from_slice(&chunk);
            if tail.len() > 2 * TAIL_BYTES {
                tail.drain(..tail.len() - TAIL_BYTES);
            }
        }
        let e2e = began.elapsed();
        Some(Answer {
            node,
            ttft: first.unwrap_or(e2e),
            e2e,
            evaluated: evaluated_in(&tail),
        })
    } else {
        let whole: Value = resp.json().await.ok()?;
        let e2e = began.elapsed();
        let decode = Duration::from_nanos(whole["eval_duration"].as_u64().unwrap_or(0));
        Some(Answer {
            node,
            ttft: e2e.saturating_sub(decode),
            e2e,
            evaluated: whole["prompt_eval_count"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok()),
        })
    }
}

/// Shared state of one run's clients.
struct Run {
    scn: Scenario,
    faces: Vec<String>,
    names: Vec<String>,
    http: reqwest::Client,
    clock: Clock,
    sources: Vec<Mutex<SourceState>>,
    out: Mutex<Outcome>,
    /// Open-loop requests enter at the nodes in turn.
    next_entry: Mutex<usize>,
    ids: std::sync::atomic::AtomicU64,
    /// Prices agent jobs.
    plan: Cluster,
    /// Conversations send their key as `x-pair-session`.
    session_header: bool,
}

impl Run {
    fn entry(&self, d: &Demand) -> usize {
        let n = self.faces.len().max(1);
        match self.scn.routing {
            Routing::PerNode(Entry::At(i)) => i.min(n - 1),
            Routing::Single | Routing::PerNode(Entry::Spread) => match d.user {
                Some(u) => u as usize % n,
                None => {
                    let mut e = self.next_entry.lock().unwrap_or_else(|p| p.into_inner());
                    *e = (*e + 1) % n;
                    *e
                }
            },
        }
    }

    /// Sends `d`, records what came back, and returns when it ended
    /// (modelled).
    async fn request(&self, d: Demand, first: Option<(SessionKey, u32)>) -> Micros {
        let arrival = self.clock.now();
        let id = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let src = &self.scn.sources[usize::from(d.source)];
        let model = self.scn.models[usize::from(d.model)].name.as_str();
        let body = chat_body(model, &d, first, id, src.max_tokens);
        let face = &self.faces[self.entry(&d)];
        let session = d.session.filter(|_| self.session_header);
        let answer = send(
            &self.http,
            face,
            &body,
            d.output_tokens.max(1),
            session,
            d.priority,
        )
        .await;
        let end = self.clock.now();
        let record = Record {
            arrival,
            node: answer.as_ref().and_then(|a| {
                let name = a.node.as_deref()?;
                let i = self.names.iter().position(|n| n == name)?;
                u16::try_from(i).ok()
            }),
            source: d.source,
            ttft: answer.as_ref().map_or(0, |a| self.clock.modelled(a.ttft)),
            e2e: answer.as_ref().map_or(0, |a| self.clock.modelled(a.e2e)),
            // The engine's queue is not visible from the client.
            queue: 0,
            output_tokens: d.output_tokens,
            cold: false,
            // What the engine did not evaluate it found in its cache; no
            // oracle is known live.
            prompt_tokens: d.prompt_tokens,
            cached_tokens: answer
                .as_ref()
                .and_then(|a| a.evaluated)
                .map_or(0, |e| d.prompt_tokens.saturating_sub(e)),
            oracle_tokens: 0,
        };
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        out.generated += 1;
        out.completed += u64::from(answer.is_some());
        out.last_finish = out.last_finish.max(end);
        if let (Some(session), Some(node)) = (d.session, record.node) {
            out.turns.ran(session, node, arrival >= self.scn.warmup);
        }
        if arrival >= self.scn.warmup {
            out.records.push(record);
        }
        if let Some(job) = d.burst {
            out.jobs.part_done((d.source, job), end, self.scn.warmup);
        }
        drop(out);
        end
    }

    /// One closed-loop user: wake, ask, wait for the answer, think, again.
    async fn user(self: Arc<Self>, s: usize, u: u32) {
        let src = self.scn.sources[s].clone();
        fn lock(run: &Run, s: usize) -> std::sync::MutexGuard<'_, SourceState> {
            run.sources[s].lock().unwrap_or_else(|p| p.into_inner())
        }
        let mut wake = lock(&self, s).first_wake(&src, u);
        // The conversation this user is in, and its first message's length.
        let mut first: Option<(SessionKey, u32)> = None;
        while wake < self.scn.duration {
            tokio::time::sleep_until(self.clock.instant(wake).into()).await;
            let Some(d) = lock(&self, s).user_request(&src, u) else {
                return;
            };
            first = match (d.session, first) {
                (Some(key), Some((k, len))) if k == key => Some((k, len)),
                (Some(key), _) => Some((key, d.prompt_tokens)),
                (None, _) => None,
            };
            let end = self.request(d, first).await;
            wake = end + lock(&self, s).think(&src, u).max(1);
        }
    }

    /// One open-loop source: arrivals on its own schedule.
    async fn open_loop(self: Arc<Self>, s: usize) {
        let src = self.scn.sources[s].clone();
        let mut tasks = tokio::task::JoinSet::new();
        let mut at = 0;
        let mut batch = Vec::new();
        loop {
            let next = {
                let mut st = self.sources[s].lock().unwrap_or_else(|p| p.into_inner());
                st.next_arrival(&src, at)
            };
            match next {
                Some(t) if t < self.scn.duration => at = t,
                _ => break,
            }
            tokio::time::sleep_until(self.clock.instant(at).into()).await;
            batch.clear();
            self.sources[s]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open_loop_batch(&src, &mut batch);
            if let Some(job) = batch.first().and_then(|d| d.burst) {
                let ideal = self.plan.ideal_makespan(&self.scn, &batch);
                let now = self.clock.now();
                self.out
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .jobs
                    .start((s as u16, job), now, ideal, batch.len());
            }
            for d in batch.drain(..) {
                let run = Arc::clone(&self);
                tasks.spawn(async move {
                    run.request(d, None).await;
                });
            }
            // Reap finished requests as we go.
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Runs the scenario's workload against `faces` (node `i`'s Ollama face)
/// and waits for every answer; `plan` prices agent jobs.
pub(super) async fn drive(
    scn: &Scenario,
    plan: &Cluster,
    faces: Vec<String>,
    names: Vec<String>,
    opts: &super::LiveOptions,
) -> Result<Outcome, SimError> {
    // The twin's clients send chats of a given length; an agent loop's
    // turns (a shared system prompt, growing tool results) are not
    // written out as bodies yet.
    if let Some(i) = scn
        .sources
        .iter()
        .position(|s| matches!(s.kind, SourceKind::AgentLoop { .. }))
    {
        return Err(SimError::invalid(
            format!("workload[{i}].kind"),
            "agent-loop runs in the simulator only, not in the live twin",
        ));
    }
    let run = Arc::new(Run {
        scn: scn.clone(),
        faces,
        names,
        http: super::cluster::client()?,
        clock: Clock::start(opts.time_scale),
        session_header: opts.session_header,
        sources: scn
            .sources
            .iter()
            .enumerate()
            .map(|(i, s)| Mutex::new(SourceState::new(scn.seed, i, s)))
            .collect(),
        out: Mutex::new(Outcome::default()),
        next_entry: Mutex::new(0),
        ids: std::sync::atomic::AtomicU64::new(0),
        plan: plan.clone(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for (s, src) in scn.sources.iter().enumerate() {
        match src.kind {
            SourceKind::ClosedLoop { users, .. } => {
                for u in 0..users {
                    tasks.spawn(Arc::clone(&run).user(s, u));
                }
            }
            _ => {
                tasks.spawn(Arc::clone(&run).open_loop(s));
            }
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| SimError::live("a client task", e))?;
    }
    let mut out = run.out.lock().unwrap_or_else(|p| p.into_inner());
    Ok(std::mem::take(&mut *out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(prompt: u32, session: Option<u64>) -> Demand {
        Demand {
            source: 0,
            model: 0,
            prompt_tokens: prompt,
            output_tokens: 10,
            declared_output: 256,
            streaming: true,
            tools: false,
            priority: pair_scheduler::Priority::Interactive,
            session: session.map(SessionKey),
            user: Some(0),
            burst: None,
            agent: None,
            subagent: None,
            prompt: pair_core::PromptChain::EMPTY,
        }
    }

    /// Tokens as the emulated engine counts a chat (pair-emulator's
    /// `chat_prompt`: four characters a token, four per message).
    fn tokens(body: &Value) -> u32 {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().len().div_ceil(4) as u32 + 4)
            .sum()
    }

    #[test]
    fn a_body_carries_the_prompt_length_the_engine_counts() {
        for prompt in [5, 40, 400, 6000] {
            let b = chat_body("m", &demand(prompt, None), None, 3, None);
            assert_eq!(tokens(&b), prompt, "{b}");
            assert!(b.get("options").is_none());
        }
        let b = chat_body("m", &demand(400, None), None, 3, Some(64));
        assert_eq!(b["options"]["num_predict"], 64);
    }

    #[test]
    fn every_turn_of_a_conversation_names_it_the_same_way() {
        let key = SessionKey(0xabc);
        let first = chat_body("m", &demand(300, Some(0xabc)), Some((key, 300)), 1, None);
        let later = chat_body("m", &demand(900, Some(0xabc)), Some((key, 300)), 2, None);
        assert_eq!(first["messages"][0], later["messages"][0]);
        assert_eq!(first["messages"].as_array().unwrap().len(), 1);
        assert_eq!(later["messages"][1]["role"], "assistant");
        assert_eq!(tokens(&first), 300);
        assert!(tokens(&later).abs_diff(900) <= 2, "{}", tokens(&later));
        // Two single-turn chats never share a first message.
        let a = chat_body("m", &demand(50, None), None, 1, None);
        let b = chat_body("m", &demand(50, None), None, 2, None);
        assert_ne!(a["messages"][0], b["messages"][0]);
    }

    #[test]
    fn a_chain_s_turns_are_re_sent_byte_for_byte() {
        let chain = |segments: &[(u64, u32)]| {
            let mut b = pair_core::ChainBuilder::new();
            for &(id, tokens) in segments {
                b.segment(id, tokens);
            }
            b.finish()
        };
        // Turn 1: a shared system prompt and a message, then the answer
        // the engine keeps; turn 2 re-sends it all and a tool result.
        let mut one = demand(1_500, Some(7));
        one.prompt = chain(&[(1, 1_000), (2, 500), (3, 80)]);
        let mut two = demand(2_080, Some(7));
        two.prompt = chain(&[(1, 1_000), (2, 500), (3, 80), (4, 500)]);
        let (b1, b2) = (
            chat_body("m", &one, None, 1, None),
            chat_body("m", &two, None, 2, None),
        );
        let (m1, m2) = (
            b1["messages"].as_array().unwrap(),
            b2["messages"].as_array().unwrap(),
        );
        assert_eq!(m1.len(), 2, "the answer is not part of its own prompt");
        assert_eq!(m2.len(), 4);
        assert_eq!(m1[..], m2[..2]);
        assert_eq!((tokens(&b1), tokens(&b2)), (1_500, 2_080));
        // Another conversation after the same system prompt shares it.
        let mut other = demand(1_300, Some(8));
        other.prompt = chain(&[(1, 1_000), (9, 300)]);
        let b3 = chat_body("m", &other, None, 3, None);
        assert_eq!(b3["messages"][0], m1[0]);
        assert_ne!(b3["messages"][1], m1[1]);
    }

    #[test]
    fn the_engine_s_evaluated_count_is_read_from_a_stream_s_last_line() {
        let stream = b"{\"message\":{\"content\":\"hi\"},\"done\":false}\n{\"done\":true,\"prompt_eval_count\":37,\"eval_count\":3}\n\n";
        assert_eq!(evaluated_in(stream), Some(37));
        assert_eq!(evaluated_in(b"{\"done\":false}\n"), None);
        assert_eq!(evaluated_in(b"not json"), None);
    }

    #[test]
    fn receipts_name_the_node() {
        assert_eq!(receipt_name("desk-4090 (0f3e-...)"), "desk-4090");
        assert_eq!(receipt_name("laptop"), "laptop");
    }

    #[test]
    fn the_clock_scales_both_ways() {
        let c = Clock::start(0.25);
        assert_eq!(c.modelled(Duration::from_millis(250)), 1_000_000);
        assert_eq!(c.instant(4_000_000) - c.t0, Duration::from_secs(1));
    }

    /// A conversation names itself with `x-pair-session` only when asked
    /// to; otherwise nothing but its messages says which it is.
    #[tokio::test]
    async fn the_session_header_is_sent_only_when_asked() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let face = format!("http://{}", listener.local_addr().unwrap());
        let heads = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..2 {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 64 * 1024];
                let mut n = 0;
                while !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    n += sock.read(&mut buf[n..]).await.unwrap();
                }
                let head = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                sock.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
                )
                .await
                .unwrap();
                seen.push(head);
            }
            seen
        });
        let http = super::super::cluster::client().unwrap();
        let body = chat_body("m", &demand(40, Some(0xabc)), None, 1, None);
        let key = Some(SessionKey(0xabc));
        assert!(
            send(&http, &face, &body, 8, key, Default::default())
                .await
                .is_some()
        );
        assert!(
            send(&http, &face, &body, 8, None, Default::default())
                .await
                .is_some()
        );
        let seen = heads.await.unwrap();
        assert!(
            seen[0].contains("x-pair-session: 0000000000000abc"),
            "{}",
            seen[0]
        );
        assert!(!seen[1].contains("x-pair-session"), "{}", seen[1]);
    }
}
