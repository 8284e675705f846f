//! Streams that survive their node: a stream cut after its first byte (the
//! serving engine dies mid-answer, on this node or a peer) goes on from
//! another owner of the model. With the same model weights everywhere and
//! greedy decoding, the client's answer is the unbroken one, token for
//! token, in every API; the final event says where it moved and the job
//! record lists both nodes.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use pair_emulator::{FaultAction, FaultRule};
use pair_testkit::cluster::{ClusterSpec, LocalCluster, cluster, http, job_of, record};
use serde_json::{Value, json};

const MODEL: &str = "llama3.2:3b";

/// A client API: where it is sent and how its stream reads.
#[derive(Clone, Copy, Debug)]
enum Api {
    OllamaChat,
    OllamaGenerate,
    /// Ollama's generate with the model's template (no `raw`).
    OllamaTemplated,
    OpenAiChat,
    OpenAiCompletion,
    Anthropic,
}

impl Api {
    const ALL: [Api; 6] = [
        Api::OllamaChat,
        Api::OllamaGenerate,
        Api::OllamaTemplated,
        Api::OpenAiChat,
        Api::OpenAiCompletion,
        Api::Anthropic,
    ];

    fn url(self, c: &LocalCluster) -> String {
        let n = &c.nodes[0];
        match self {
            Api::OllamaChat => format!("{}/api/chat", n.ollama_url()),
            Api::OllamaGenerate | Api::OllamaTemplated => {
                format!("{}/api/generate", n.ollama_url())
            }
            Api::OpenAiChat => format!("{}/v1/chat/completions", n.openai_url()),
            Api::OpenAiCompletion => format!("{}/v1/completions", n.openai_url()),
            Api::Anthropic => format!("{}/v1/messages", n.openai_url()),
        }
    }

    fn body(self, tokens: u32) -> Value {
        let messages = json!([{"role": "user", "content": "tell me about rivers"}]);
        match self {
            Api::OllamaChat => json!({"model": MODEL, "messages": messages, "stream": true,
                                      "options": {"temperature": 0, "num_predict": tokens}}),
            Api::OllamaGenerate => json!({"model": MODEL, "prompt": "Rivers:", "raw": true,
                                          "stream": true,
                                          "options": {"temperature": 0, "num_predict": tokens}}),
            Api::OllamaTemplated => json!({"model": MODEL, "prompt": "tell me about rivers",
                                           "system": "be brief", "stream": true,
                                           "options": {"temperature": 0, "num_predict": tokens}}),
            Api::OpenAiChat => json!({"model": MODEL, "messages": messages, "stream": true,
                                      "temperature": 0, "max_tokens": tokens,
                                      "stream_options": {"include_usage": true}}),
            Api::OpenAiCompletion => json!({"model": MODEL, "prompt": "Rivers:", "stream": true,
                                            "temperature": 0, "max_tokens": tokens,
                                            "stream_options": {"include_usage": true}}),
            Api::Anthropic => json!({"model": MODEL, "messages": messages, "stream": true,
                                     "temperature": 0, "max_tokens": tokens}),
        }
    }

    /// The events of a stream (JSON payloads), in order.
    fn events(self, text: &str) -> Vec<Value> {
        text.lines()
            .filter_map(|l| match self {
                Api::OllamaChat | Api::OllamaGenerate | Api::OllamaTemplated => Some(l),
                _ => l.strip_prefix("data: ").filter(|d| *d != "[DONE]"),
            })
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{self:?}: {e}: {l}")))
            .collect()
    }

    /// The answer's text, its tokens as the client counted them, and the
    /// final event.
    fn answer(self, text: &str) -> (String, Option<u64>, Value) {
        let events = self.events(text);
        for e in &events {
            assert!(
                e.get("error").is_none() && e["type"] != "error",
                "{self:?}: an error in the stream: {text}"
            );
        }
        let piece = |e: &Value| -> Option<String> {
            match self {
                Api::OllamaChat => e["message"]["content"].as_str(),
                Api::OllamaGenerate | Api::OllamaTemplated => e["response"].as_str(),
                Api::OpenAiChat => e["choices"][0]["delta"]["content"].as_str(),
                Api::OpenAiCompletion => e["choices"][0]["text"].as_str(),
                Api::Anthropic => e["delta"]["text"].as_str(),
            }
            .map(str::to_owned)
        };
        let answer: String = events.iter().filter_map(piece).collect();
        // The final event: Anthropic's `message_delta` (its counts and
        // stop reason), every other API's last.
        let last = match self {
            Api::Anthropic => events.iter().find(|e| e["type"] == "message_delta"),
            _ => events.last(),
        }
        .cloned()
        .unwrap_or_default();
        let counted = match self {
            Api::OllamaChat | Api::OllamaGenerate | Api::OllamaTemplated => {
                last["eval_count"].as_u64()
            }
            Api::OpenAiChat | Api::OpenAiCompletion => last["usage"]["completion_tokens"].as_u64(),
            Api::Anthropic => last["usage"]["output_tokens"].as_u64(),
        };
        (answer, counted, last)
    }
}

/// Streams `api`'s request through node 0, pinned to node `pin`.
async fn stream(c: &LocalCluster, api: Api, pin: usize, tokens: u32) -> (String, String) {
    let resp = http()
        .post(api.url(c))
        .header("x-pair-node-pin", c.nodes[pin].id.to_string())
        .json(&api.body(tokens))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{api:?}");
    (job_of(&resp), resp.text().await.unwrap())
}

fn same_weights(n: usize) -> impl FnOnce(&mut ClusterSpec) {
    move |spec| {
        spec.engine_seed = Some(7);
        // Every node Ollama-flavoured but the last, OpenAI-compatible, so
        // continuations cross engine kinds too.
        if let Some(last) = spec.nodes.get_mut(n - 1) {
            last.flavor = pair_emulator::Flavor::OpenAi;
        }
    }
}

/// The engine dies after a few tokens, on a peer (its stream is cut at
/// the relay) and on the origin's own engine: the client's answer is the
/// unbroken one, its counts summed, and the record names both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_way_goes_on_from_another_node_token_for_token() {
    let c = cluster(3, same_weights(3)).await.unwrap();
    for api in Api::ALL {
        let (_, unbroken) = stream(&c, api, 2, 24).await;
        let (want, want_count, _) = api.answer(&unbroken);
        assert_eq!(want.split_whitespace().count(), 24, "{api:?}: {want}");
        assert_eq!(want_count, Some(24), "{api:?}");
        for faulty in [1usize, 0] {
            let case = format!("{api:?}, engine {faulty} dies");
            c.engines[faulty].faults().clear();
            c.engines[faulty]
                .faults()
                .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(6)).times(1));
            let (job, text) = stream(&c, api, faulty, 24).await;
            let (got, count, last) = api.answer(&text);
            assert_eq!(got, want, "{case}: {text}");
            assert_eq!(count, want_count, "{case}: token counts summed");
            let moved = &last["x_pair"]["resumed"][0];
            assert!(moved["at_token"].as_u64().unwrap() > 0, "{case}: {last}");
            assert_ne!(moved["node_id"], json!(c.nodes[faulty].id), "{case}");
            let rec = record(&c, 0, &job).await;
            assert_eq!(rec.status, pair_core::JobStatus::Completed, "{case}");
            assert_eq!(rec.ran_on, Some(c.nodes[faulty].id), "{case}");
            assert_eq!(rec.resumed.len(), 1, "{case}: {rec:?}");
            assert_ne!(rec.resumed[0].node, c.nodes[faulty].id, "{case}");
            assert!(
                rec.resumed[0].at_token > 0 && rec.resumed[0].at_token < 24,
                "{case}"
            );
        }
    }
    c.stop().await;
}

/// With `--resume off`, a cut ends the stream with its error event and
/// nothing is sent again (the behaviour of every other router).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_resume_off_a_cut_ends_with_an_error_and_is_never_resent() {
    let c = cluster(3, |spec| {
        same_weights(3)(spec);
        spec.resume = pair_proxy::resume::ResumePolicy::OFF;
    })
    .await
    .unwrap();
    for api in [Api::OllamaChat, Api::OpenAiChat] {
        for e in &c.engines {
            e.reset_hits();
        }
        c.engines[1]
            .faults()
            .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(3)).times(1));
        let (job, text) = stream(&c, api, 1, 20).await;
        let last = text.trim_end().lines().last().unwrap_or("").to_owned();
        assert!(last.contains("\"error\""), "{api:?}: {text}");
        assert!(!text.contains("[DONE]"), "{api:?}: {text}");
        let hits: u64 = c.engines.iter().map(|e| e.hits_for_model(MODEL)).sum();
        assert_eq!(hits, 1, "{api:?}: never resent after the first byte");
        let rec = record(&c, 0, &job).await;
        assert_eq!(rec.status, pair_core::JobStatus::Failed);
        assert!(rec.resumed.is_empty());
    }
    c.stop().await;
}

/// A cut that cannot be continued keeps the explicit error: a tool call
/// under way, and a cut with no other owner of the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_continued_ends_with_an_error() {
    let c = cluster(2, same_weights(2)).await.unwrap();
    // Both owners' engines cut the stream: it moves once, from node 1 to
    // node 0, and is cut there with no owner left.
    c.engines[1]
        .faults()
        .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(3)).times(1));
    c.engines[0]
        .faults()
        .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(3)).times(1));
    let (job, text) = stream(&c, Api::OllamaChat, 1, 20).await;
    let last = text.trim_end().lines().last().unwrap_or("").to_owned();
    assert!(last.contains("\"error\""), "{text}");
    let rec = record(&c, 0, &job).await;
    assert_eq!(rec.status, pair_core::JobStatus::Failed);
    assert_eq!(
        rec.resumed.len(),
        1,
        "moved once, then cut with nowhere left: {rec:?}"
    );
    // A tool call under way: the emulated model says 3 words, then calls
    // the tool; the cut comes after the call's chunk, before its end.
    for e in &c.engines {
        e.faults().clear();
    }
    c.engines[1]
        .faults()
        .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(4)).times(1));
    let resp = http()
        .post(format!("{}/v1/chat/completions", c.nodes[0].openai_url()))
        .header("x-pair-node-pin", c.nodes[1].id.to_string())
        .json(&json!({"model": MODEL, "stream": true, "max_tokens": 3,
                      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
                      "messages": [{"role": "user", "content": "get_weather({\"city\": \"Oslo\"})"}]}))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"tool_calls\""), "{text}");
    assert!(text.contains("stream_interrupted"), "{text}");
    c.stop().await;
}

/// A chat is continued only on an engine known to continue a final
/// assistant message: with LM Studio's the only other owner, a cut chat
/// ends with its error event and nothing is sent there; a raw completion,
/// which every engine continues, moves to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_is_not_moved_to_an_engine_that_cannot_continue_it() {
    let c = cluster(2, |spec| {
        spec.engine_seed = Some(7);
        spec.nodes[0].flavor = pair_emulator::Flavor::LmStudio;
    })
    .await
    .unwrap();
    for (api, moves) in [(Api::OpenAiChat, false), (Api::OpenAiCompletion, true)] {
        for e in &c.engines {
            e.reset_hits();
        }
        c.engines[1]
            .faults()
            .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(3)).times(1));
        let (job, text) = stream(&c, api, 1, 20).await;
        let rec = record(&c, 0, &job).await;
        if moves {
            let (answer, _, _) = api.answer(&text);
            assert_eq!(answer.split_whitespace().count(), 20, "{api:?}: {text}");
            assert_eq!(rec.resumed.len(), 1, "{api:?}: {rec:?}");
        } else {
            let last = text.trim_end().lines().last().unwrap_or("").to_owned();
            assert!(last.contains("\"error\""), "{api:?}: {text}");
            assert_eq!(c.engines[0].hits_for_model(MODEL), 0, "{api:?}");
            assert_eq!(rec.status, pair_core::JobStatus::Failed);
            assert!(rec.resumed.is_empty(), "{api:?}: {rec:?}");
        }
    }
    c.stop().await;
}

/// An edge client with its state in `dir`, joined through node 0 and let
/// in by every node.
async fn joined_client(c: &LocalCluster, dir: &std::path::Path) -> pair_sdk::Client {
    let mut cfg = pair_sdk::Config::new(dir);
    cfg.seeds = vec![c.nodes[0].cluster_addr.to_string()];
    let client = pair_sdk::Client::open(cfg).await.unwrap();
    let pin = c.nodes[0]
        .pairing
        .open_invite(std::time::SystemTime::now())
        .unwrap();
    client
        .join(&c.nodes[0].cluster_addr.to_string(), pin.reveal())
        .await
        .unwrap();
    pair_testkit::cluster::wait_trusted(c, client.id()).await;
    client
}

/// The figures RELIABILITY.md quotes (not a pass/fail check; run with
/// `cargo test -p pair-tests --test resume -- --ignored --nocapture`):
/// for cut streams at real engine speed, the time from the last token
/// before the cut to the first after it, beside the new node's own time
/// to first token for the same request unbroken; through a node's face
/// (the node continues the stream), through the edge SDK (the client
/// continues it) and through `pair-client serve` (the client's faces for
/// unmodified apps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints figures; run on demand"]
async fn cut_to_first_resumed_token_figures() {
    use futures_util::StreamExt;
    use pair_sdk::Request;
    let c = cluster(3, |spec| {
        same_weights(3)(spec);
        spec.time_scale = 1.0;
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = joined_client(&c, dir.path()).await;
    // `pair-client serve` on the same (joined) state.
    let (_serve, serve_ollama, serve_openai) =
        pair_testkit::node::client_serve(&pair_testkit::node::client_bin(), dir.path());
    // When each token of a stream arrived, and its text.
    async fn tokens<E: std::fmt::Debug>(
        api: Api,
        sent: Instant,
        mut s: impl futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    ) -> (Vec<Duration>, String) {
        let mut at = Vec::new();
        let mut text = String::new();
        while let Some(chunk) = s.next().await {
            let piece = String::from_utf8_lossy(&chunk.unwrap()).into_owned();
            for e in api.events(&piece) {
                let t = match api {
                    Api::OllamaChat => e["message"]["content"].as_str(),
                    _ => e["choices"][0]["delta"]["content"].as_str(),
                };
                if t.is_some_and(|t| !t.is_empty()) {
                    at.push(sent.elapsed());
                }
            }
            text.push_str(&piece);
        }
        (at, text)
    }
    let rounds = 30;
    for via in ["a node's face", "the edge SDK", "pair-client serve"] {
        let sdk = via == "the edge SDK";
        let (mut gaps, mut ttfts) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let api = [Api::OllamaChat, Api::OpenAiChat][round % 2];
            let faulty = 1 + round % 2;
            c.engines[faulty].faults().clear();
            c.engines[faulty]
                .faults()
                .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(8)).times(1));
            let timed = |pin: usize| {
                let node = c.nodes[pin].id.to_string();
                let mut url = api.url(&c);
                if via == "pair-client serve" {
                    let path = url.split_once("//").unwrap().1;
                    let path = path[path.find('/').unwrap()..].to_owned();
                    let face = match api {
                        Api::OllamaChat => &serve_ollama,
                        _ => &serve_openai,
                    };
                    url = format!("{}{path}", face.trim_end_matches('/'));
                }
                let body = api.body(16);
                let client = &client;
                async move {
                    let sent = Instant::now();
                    if sdk {
                        let path = url.split_once("//").unwrap().1;
                        let path = &path[path.find('/').unwrap()..];
                        let mut req = Request::json(path, body.to_string().into()).unwrap();
                        req.headers.insert("x-pair-node-pin", node.parse().unwrap());
                        let resp = client.send(req).await.unwrap();
                        tokens(api, sent, resp.into_stream()).await
                    } else {
                        let resp = http()
                            .post(url)
                            .header("x-pair-node-pin", node)
                            .json(&body)
                            .send()
                            .await
                            .unwrap();
                        tokens(api, sent, resp.bytes_stream()).await
                    }
                }
            };
            let (at, text) = timed(faulty).await;
            let (_, _, last) = api.answer(&text);
            let Some(k) = last["x_pair"]["resumed"][0]["at_token"].as_u64() else {
                panic!("round {round}: not moved: {text}");
            };
            let k = usize::try_from(k).unwrap();
            gaps.push(at[k] - at[k - 1]);
            let moved_to = c
                .nodes
                .iter()
                .position(|n| json!(n.id) == last["x_pair"]["resumed"][0]["node_id"])
                .unwrap();
            let (unbroken, _) = timed(moved_to).await;
            ttfts.push(unbroken[0]);
        }
        let pct = |v: &mut Vec<Duration>, p: f64| {
            v.sort();
            v[((v.len() - 1) as f64 * p).round() as usize]
        };
        println!(
            "through {}: {rounds} cut streams: last token before the cut to the first after: p50 {:?}, p95 {:?}; \
             the new node's own time to first token: p50 {:?}, p95 {:?}",
            via,
            pct(&mut gaps, 0.5),
            pct(&mut gaps, 0.95),
            pct(&mut ttfts, 0.5),
            pct(&mut ttfts, 0.95),
        );
    }
    c.stop().await;
}

/// An engine that goes silent mid-answer (its health checks still
/// answering) is a cut once nothing came for the no-progress bound
/// (`--first-byte-timeout`): the answer goes on from another node, the
/// same as the unbroken one; with `--resume off` the stream ends with its
/// error event instead of leaving the client waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_silent_mid_answer_is_a_cut() {
    for resume in [true, false] {
        let c = cluster(3, |spec| {
            same_weights(3)(spec);
            spec.first_byte_timeout = Duration::from_secs(1);
            if !resume {
                spec.resume = pair_proxy::resume::ResumePolicy::OFF;
            }
        })
        .await
        .unwrap();
        let api = Api::OpenAiChat;
        let (_, unbroken) = stream(&c, api, 2, 24).await;
        let (want, _, _) = api.answer(&unbroken);
        c.engines[1]
            .faults()
            .add(FaultRule::for_model(MODEL, FaultAction::SilentAfterChunks(6)).times(1));
        let t = Instant::now();
        let (job, text) = stream(&c, api, 1, 24).await;
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "resume {resume}: {took:?}");
        let rec = record(&c, 0, &job).await;
        if resume {
            let (got, _, _) = api.answer(&text);
            assert_eq!(got, want, "{text}");
            assert_eq!(rec.resumed.len(), 1, "{rec:?}");
        } else {
            assert!(text.contains("stream_interrupted"), "{text}");
            assert_eq!(rec.status, pair_core::JobStatus::Failed);
            // The peer cut its own silent engine and its relay with it.
            assert!(rec.error.is_some(), "{rec:?}");
        }
        c.stop().await;
    }
}

/// The edge SDK holds its caller's stream itself: a stream it gets from a
/// node whose engine dies mid-answer goes on from another owner, through
/// the same stitcher and driver, and the caller's answer is the unbroken
/// one, token for token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_stream_cut_mid_way_goes_on_from_another_node() {
    use pair_sdk::Request;
    let c = cluster(3, same_weights(3)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = joined_client(&c, dir.path()).await;
    for api in [Api::OllamaChat, Api::OpenAiChat] {
        let path = match api {
            Api::OllamaChat => "/api/chat",
            _ => "/v1/chat/completions",
        };
        let send = |faulty: usize| {
            let mut req = Request::json(path, api.body(24).to_string().into()).unwrap();
            req.headers.insert(
                "x-pair-node-pin",
                c.nodes[faulty].id.to_string().parse().unwrap(),
            );
            client.send(req)
        };
        let unbroken = send(1).await.unwrap().bytes().await.unwrap();
        let (want, want_count, _) = api.answer(std::str::from_utf8(&unbroken).unwrap());
        assert_eq!(want.split_whitespace().count(), 24, "{api:?}: {want}");
        c.engines[1]
            .faults()
            .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(6)).times(1));
        let resp = send(1).await.unwrap();
        assert_eq!(resp.node, c.nodes[1].id, "{api:?}: the pin is honoured");
        let text = resp.bytes().await.unwrap();
        let (got, count, last) = api.answer(std::str::from_utf8(&text).unwrap());
        assert_eq!(got, want, "{api:?}");
        assert_eq!(count, want_count, "{api:?}: token counts summed");
        let moved = &last["x_pair"]["resumed"][0];
        assert!(moved["at_token"].as_u64().unwrap() > 0, "{api:?}: {last}");
        assert_ne!(moved["node_id"], json!(c.nodes[1].id), "{api:?}");
    }
    c.stop().await;
}
