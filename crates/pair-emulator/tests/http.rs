//! Every route and every fault of the emulated engines, over real sockets.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pair_emulator::{
    AnswerLength, CacheKind, EmulatedEngine, EmulatorConfig, FaultAction, FaultRule, Flavor,
    HardwareProfile,
};
use serde_json::{Value, json};

const CHAT: &str = "llama3.2:3b";
const EMBED: &str = "nomic-embed-text:137m";

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

async fn start(flavor: Flavor) -> EmulatedEngine {
    start_with(EmulatorConfig::new(flavor, [CHAT, EMBED])).await
}

async fn start_with(cfg: EmulatorConfig) -> EmulatedEngine {
    // A thousand times faster than real time keeps tests quick while the
    // model's order of events stays the same.
    EmulatedEngine::start(cfg.with_time_scale(0.001).with_seed(7))
        .await
        .unwrap()
}

async fn post(e: &EmulatedEngine, path: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", e.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn get(e: &EmulatedEngine, path: &str) -> reqwest::Response {
    client()
        .get(format!("{}{path}", e.base_url()))
        .send()
        .await
        .unwrap()
}

async fn lines(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.unwrap();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn ollama_generate_streams_ndjson_then_matches_the_whole_answer() {
    let e = start(Flavor::Ollama).await;
    let body = json!({ "model": "llama3.2:3b", "prompt": "why is the sky blue?", "options": { "num_predict": 5 } });
    let resp = post(&e, "/api/generate", body.clone()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let chunks: Vec<Value> = lines(resp)
        .await
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(chunks.len(), 6);
    let streamed: String = chunks[..5]
        .iter()
        .map(|c| c["response"].as_str().unwrap())
        .collect();
    let last = &chunks[5];
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "length");
    assert_eq!(last["eval_count"], 5);
    assert!(last["total_duration"].as_u64().unwrap() > 0);
    assert!(
        last["load_duration"].as_u64().unwrap() > 0,
        "first use is a cold load"
    );
    assert_eq!(last["model"], "llama3.2:3b");

    let mut whole_req = body;
    whole_req["stream"] = json!(false);
    let whole: Value = post(&e, "/api/generate", whole_req)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(whole["response"], streamed.as_str());
    assert_eq!(whole["load_duration"], 0, "second use is warm");
    assert_eq!(streamed.split(' ').count(), 5);
    e.shutdown().await;
}

#[tokio::test]
async fn ollama_chat_defaults_and_latest_tag() {
    let e = start_with(EmulatorConfig::new(Flavor::Ollama, ["qwen2.5"])).await;
    let body = json!({ "model": "qwen2.5", "stream": false, "messages": [{ "role": "user", "content": "hi" }] });
    let v: Value = post(&e, "/api/chat", body).await.json().await.unwrap();
    assert_eq!(v["model"], "qwen2.5:latest");
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(
        v["message"]["content"].as_str().unwrap().split(' ').count(),
        32
    );
    assert_eq!(v["done_reason"], "stop");
    // The prompt is counted as the cache sees it: the message's JSON,
    // `{"content":"hi","role":"user"}`, at four bytes a token.
    assert_eq!(v["prompt_eval_count"], 8);
    let body =
        json!({ "model": "qwen2.5:latest", "messages": [{ "role": "user", "content": "hi" }] });
    let streamed = lines(post(&e, "/api/chat", body).await).await;
    assert_eq!(streamed.len(), 33);
    // No messages: Ollama only loads the model.
    let load: Value = post(
        &e,
        "/api/chat",
        json!({ "model": "qwen2.5", "messages": [] }),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(load["done_reason"], "load");
    assert_eq!(load["message"]["content"], "");
    assert_eq!(e.hits_for("/api/chat"), 3);
    assert_eq!(e.hits_for_model("qwen2.5"), 3);
    assert_eq!(e.hits_for_model("qwen2.5:latest"), 3);
    assert_eq!(e.hit_counts().by_model["qwen2.5"], 2);
    e.shutdown().await;
}

#[tokio::test]
async fn ollama_listing_routes() {
    let e = start(Flavor::Ollama).await;
    let tags: Value = get(&e, "/api/tags").await.json().await.unwrap();
    let models = tags["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0]["name"], CHAT);
    assert_eq!(models[0]["size"], 1_845_000_000u64);
    assert_eq!(models[0]["digest"].as_str().unwrap().len(), 64);
    assert_eq!(models[0]["details"]["family"], "llama");
    assert_eq!(models[0]["details"]["parameter_size"], "3.0B");

    let ps: Value = get(&e, "/api/ps").await.json().await.unwrap();
    assert!(ps["models"].as_array().unwrap().is_empty());
    let body = json!({ "model": CHAT, "prompt": "x", "stream": false });
    assert_eq!(post(&e, "/api/generate", body).await.status(), 200);
    let ps: Value = get(&e, "/api/ps").await.json().await.unwrap();
    assert_eq!(ps["models"][0]["name"], CHAT);
    assert_eq!(ps["models"][0]["size_vram"], 1_845_000_000u64);
    assert!(
        ps["models"][0]["expires_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
    assert_eq!(e.loaded_models(), [CHAT]);

    let show = post(&e, "/api/show", json!({ "model": CHAT })).await;
    assert_eq!(show.status(), 200);
    let show: Value = show.json().await.unwrap();
    assert_eq!(show["details"]["format"], "gguf");
    assert_eq!(show["capabilities"][0], "completion");
    let v: Value = get(&e, "/api/version").await.json().await.unwrap();
    assert!(v["version"].is_string());
    assert_eq!(
        get(&e, "/").await.text().await.unwrap(),
        "Ollama is running"
    );
    let models: Value = get(&e, "/v1/models").await.json().await.unwrap();
    assert_eq!(models["data"][1]["id"], EMBED);
    e.shutdown().await;
}

#[tokio::test]
async fn ollama_embeddings_are_deterministic() {
    let e = start(Flavor::Ollama).await;
    let v: Value = post(
        &e,
        "/api/embed",
        json!({ "model": EMBED, "input": ["a", "b", "a"] }),
    )
    .await
    .json()
    .await
    .unwrap();
    let embs = v["embeddings"].as_array().unwrap();
    assert_eq!(embs.len(), 3);
    assert_eq!(embs[0].as_array().unwrap().len(), 64);
    assert_eq!(embs[0], embs[2]);
    assert_ne!(embs[0], embs[1]);
    let old: Value = post(
        &e,
        "/api/embeddings",
        json!({ "model": EMBED, "prompt": "a" }),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(old["embedding"], embs[0]);
    let oa: Value = post(
        &e,
        "/v1/embeddings",
        json!({ "model": EMBED, "input": "a" }),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(oa["data"][0]["embedding"], embs[0]);
    assert_eq!(oa["object"], "list");
    e.shutdown().await;
}

#[tokio::test]
async fn unknown_models_answer_like_each_engine() {
    let o = start(Flavor::Ollama).await;
    for path in ["/api/chat", "/api/generate", "/api/embed", "/api/show"] {
        let r = post(&o, path, json!({ "model": "nope", "prompt": "x" })).await;
        assert_eq!(r.status(), 404, "{path}");
        assert_eq!(
            r.json::<Value>().await.unwrap(),
            json!({ "error": "model 'nope' not found" })
        );
    }
    let r = post(
        &o,
        "/v1/chat/completions",
        json!({ "model": "nope", "messages": [] }),
    )
    .await;
    assert_eq!(r.status(), 404);
    assert!(
        r.json::<Value>().await.unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nope")
    );
    o.shutdown().await;

    for flavor in [Flavor::OpenAi, Flavor::LmStudio] {
        let e = start(flavor).await;
        for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] {
            let r = post(
                &e,
                path,
                json!({ "model": "nope", "prompt": "x", "input": "x" }),
            )
            .await;
            assert_eq!(r.status(), 404);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "model_not_found", "{flavor} {path}");
            assert_eq!(v["error"]["type"], "invalid_request_error");
            assert_eq!(v["error"]["param"], "model");
        }
        assert_eq!(get(&e, "/v1/models/nope").await.status(), 404);
        assert_eq!(get(&e, &format!("/v1/models/{CHAT}")).await.status(), 200);
        e.shutdown().await;
    }
}

#[tokio::test]
async fn malformed_json_is_a_400_in_the_engines_shape() {
    let o = start(Flavor::Ollama).await;
    let r = client()
        .post(format!("{}/api/chat", o.base_url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    let r = post(&o, "/api/chat", json!({ "messages": [] })).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "model is required"
    );
    o.shutdown().await;

    let e = start(Flavor::OpenAi).await;
    let r = client()
        .post(format!("{}/v1/chat/completions", e.base_url()))
        .body("[1,")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "invalid_request_error"
    );
    assert_eq!(get(&e, "/api/tags").await.status(), 404);
    e.shutdown().await;
}

#[tokio::test]
async fn openai_chat_streams_sse_with_usage_and_done() {
    let e = start(Flavor::OpenAi).await;
    let body = json!({
        "model": CHAT, "stream": true, "max_tokens": 4,
        "stream_options": { "include_usage": true },
        "messages": [{ "role": "user", "content": [{ "type": "text", "text": "hello" }] }],
    });
    let resp = post(&e, "/v1/chat/completions", body.clone()).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = lines(resp).await;
    assert!(events.iter().all(|l| l.starts_with("data: ")));
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|l| serde_json::from_str(&l[6..]).unwrap())
        .collect();
    assert_eq!(
        chunks.len(),
        6,
        "4 tokens, the finish chunk, the usage chunk"
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 4);
    assert_eq!(chunks[5]["choices"], json!([]));
    let streamed: String = chunks[..4]
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();

    let mut plain = body;
    plain["stream"] = json!(false);
    let v: Value = post(&e, "/v1/chat/completions", plain)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], streamed.as_str());
    assert_eq!(
        v["usage"]["total_tokens"],
        v["usage"]["prompt_tokens"].as_u64().unwrap() + 4
    );
    e.shutdown().await;
}

#[tokio::test]
async fn openai_completions_stream_and_whole() {
    let e = start(Flavor::LmStudio).await;
    let body = json!({ "model": CHAT, "prompt": "Once", "max_tokens": 3, "stream": true });
    let events = lines(post(&e, "/v1/completions", body).await).await;
    assert_eq!(events.len(), 5);
    let first: Value = serde_json::from_str(&events[0][6..]).unwrap();
    assert_eq!(first["object"], "text_completion");
    let v: Value = post(
        &e,
        "/v1/completions",
        json!({ "model": CHAT, "prompt": "Once" }),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 32);
    e.shutdown().await;
}

#[tokio::test]
async fn lmstudio_listings_show_loaded_state() {
    let e = start(Flavor::LmStudio).await;
    let v0: Value = get(&e, "/api/v0/models").await.json().await.unwrap();
    assert_eq!(v0["data"][0]["state"], "not-loaded");
    assert_eq!(v0["data"][1]["type"], "embeddings");
    let body =
        json!({ "model": CHAT, "messages": [{ "role": "user", "content": "x" }], "max_tokens": 1 });
    assert_eq!(post(&e, "/v1/chat/completions", body).await.status(), 200);
    let v0: Value = get(&e, "/api/v0/models").await.json().await.unwrap();
    assert_eq!(v0["data"][0]["state"], "loaded");
    assert_eq!(v0["data"][1]["state"], "not-loaded");
    let one: Value = get(&e, &format!("/api/v0/models/{CHAT}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(one["state"], "loaded");
    let v1: Value = get(&e, "/api/v1/models").await.json().await.unwrap();
    assert_eq!(v1["models"][0]["key"], CHAT);
    assert_eq!(
        v1["models"][0]["loaded_instances"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(
        v1["models"][1]["loaded_instances"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    e.shutdown().await;
}

#[tokio::test]
async fn openai_flavor_starts_warm() {
    let e = start(Flavor::OpenAi).await;
    assert_eq!(e.loaded_models(), [CHAT, EMBED]);
    assert_eq!(get(&e, "/health").await.status(), 200);
    e.shutdown().await;
}

#[tokio::test]
async fn a_full_slot_queues_the_next_request() {
    let cfg = EmulatorConfig::new(Flavor::Ollama, [CHAT])
        .with_slots(1)
        .with_preload(true);
    // Slower than the other tests, so real-time jitter between the two
    // arrivals stays small next to the modelled 0.6 s answers.
    let e = EmulatedEngine::start(cfg.with_time_scale(0.1))
        .await
        .unwrap();
    let body =
        json!({ "model": CHAT, "prompt": "x", "stream": false, "options": { "num_predict": 200 } });
    let began = std::time::Instant::now();
    let (a, b) = tokio::join!(
        post(&e, "/api/generate", body.clone()),
        post(&e, "/api/generate", body)
    );
    let wall_ns = u64::try_from(began.elapsed().as_nanos()).unwrap();
    let a: Value = a.json().await.unwrap();
    let b: Value = b.json().await.unwrap();
    let (first, second) = if a["total_duration"].as_u64() < b["total_duration"].as_u64() {
        (a, b)
    } else {
        (b, a)
    };
    let field = |v: &Value, k: &str| v[k].as_u64().unwrap();
    let waited = field(&second, "total_duration")
        - field(&second, "load_duration")
        - field(&second, "prompt_eval_duration")
        - field(&second, "eval_duration");
    // The second waited for most of the first's answer.
    assert!(
        waited >= field(&first, "eval_duration") / 2,
        "{first} {second}"
    );
    // Each duration is rounded down on its own.
    assert!(
        field(&first, "total_duration")
            .abs_diff(field(&first, "prompt_eval_duration") + field(&first, "eval_duration"))
            <= 2
    );
    // Durations are on the engine's (wall) clock, as a real engine's are:
    // at a tenth of real time, the modelled 1.2 s of both answers took about
    // 120 ms.
    assert!(
        field(&second, "total_duration") <= wall_ns,
        "{second} reported over {wall_ns} ns of wall time"
    );
    assert!(field(&second, "total_duration") >= wall_ns / 4, "{second}");
    assert_eq!(e.workload().pending(), 0);
    e.shutdown().await;
}

#[tokio::test]
async fn status_faults_count_down_and_hits_are_exact() {
    let e = start(Flavor::Ollama).await;
    e.faults().fail(Some(CHAT), 500, Some(2));
    let body =
        json!({ "model": CHAT, "prompt": "x", "stream": false, "options": { "num_predict": 1 } });
    for _ in 0..2 {
        let r = post(&e, "/api/generate", body.clone()).await;
        assert_eq!(r.status(), 500);
        assert!(r.json::<Value>().await.unwrap()["error"].is_string());
    }
    assert_eq!(post(&e, "/api/generate", body.clone()).await.status(), 200);
    assert_eq!(e.hits_for("/api/generate"), 3);
    assert_eq!(e.hits_for_model(CHAT), 3);
    assert!(e.faults().list().is_empty());

    e.faults().fail(None, 429, None);
    let r = get(&e, "/api/tags").await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    e.faults().clear();
    e.faults().fail(Some(CHAT), 404, Some(1));
    let r = post(&e, "/api/generate", body.clone()).await;
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        format!("model '{CHAT}' not found")
    );
    e.faults().fail(Some(CHAT), 400, Some(1));
    assert_eq!(post(&e, "/api/generate", body.clone()).await.status(), 400);
    // A rule for another model leaves this one alone.
    e.faults().fail(Some(EMBED), 500, None);
    assert_eq!(post(&e, "/api/generate", body).await.status(), 200);
    assert_eq!(e.hits(), 7);
    e.shutdown().await;
}

#[tokio::test]
async fn hang_never_answers_until_shutdown() {
    let e = start(Flavor::OpenAi).await;
    e.faults().hang(Some(CHAT));
    let req = client()
        .post(format!("{}/v1/chat/completions", e.base_url()))
        .timeout(Duration::from_millis(300))
        .json(&json!({ "model": CHAT, "messages": [] }))
        .send()
        .await;
    assert!(req.unwrap_err().is_timeout());
    assert_eq!(e.hits_for("/v1/chat/completions"), 1);
    // Other models still answer.
    assert_eq!(get(&e, "/v1/models").await.status(), 200);
    // A hung request does not hold shutdown up.
    let url = format!("{}/v1/chat/completions", e.base_url());
    let pending = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({ "model": CHAT, "messages": [] }))
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::time::timeout(Duration::from_secs(5), e.shutdown())
        .await
        .unwrap();
    let _ = pending.await;
}

#[tokio::test]
async fn close_after_chunks_cuts_the_stream() {
    let e = start(Flavor::Ollama).await;
    e.faults().close_after_chunks(Some(CHAT), 3);
    let body = json!({ "model": CHAT, "prompt": "x", "options": { "num_predict": 20 } });
    let resp = post(&e, "/api/generate", body).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    let mut failed = false;
    while let Some(item) = stream.next().await {
        match item {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the stream must end in an error, not cleanly");
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert!(!text.contains("\"done\":true"));
    // The model's slot was given back.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(e.workload().pending(), 0);
    e.shutdown().await;
}

#[tokio::test]
async fn slow_first_byte_and_extra_delay() {
    let e = start(Flavor::OpenAi).await;
    e.faults()
        .slow_first_byte(Some(CHAT), Duration::from_millis(300));
    let t = Instant::now();
    let r = post(
        &e,
        "/v1/chat/completions",
        json!({ "model": CHAT, "messages": [], "max_tokens": 1 }),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(300));
    e.faults().clear();
    e.faults().extra_delay(None, Duration::from_millis(200));
    let t = Instant::now();
    assert_eq!(get(&e, "/v1/models").await.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(200));
    e.shutdown().await;
}

#[tokio::test]
async fn admin_routes_set_faults_and_report_stats() {
    let e = start(Flavor::LmStudio).await;
    let c = client();
    let url = format!("{}/_emulator/faults", e.base_url());
    let rule = FaultRule::for_model(CHAT, FaultAction::Status(503)).times(1);
    let r = c.post(&url).json(&rule).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(e.faults().list(), [rule]);
    let r = post(
        &e,
        "/v1/chat/completions",
        json!({ "model": CHAT, "messages": [] }),
    )
    .await;
    assert_eq!(r.status(), 503);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"]["type"],
        "server_error"
    );
    let r = c
        .post(&url)
        .body(r#"[{"action":"hang"},{"action":{"extra_delay_ms":5}}]"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap().as_array().unwrap().len(),
        2
    );
    assert_eq!(c.delete(&url).send().await.unwrap().status(), 204);
    assert!(e.faults().list().is_empty());
    assert_eq!(c.post(&url).body("{").send().await.unwrap().status(), 400);

    let stats: Value = get(&e, "/_emulator/stats").await.json().await.unwrap();
    assert_eq!(stats["hits"]["total"], 1);
    assert_eq!(stats["hits"]["by_route"]["/v1/chat/completions"], 1);
    assert_eq!(stats["hits"]["by_model"][CHAT], 1);
    assert_eq!(stats["workload"]["running"], 0);
    // The emulated GPU's readings: busy time on the engine's own clock.
    let (busy, clock) = (
        stats["busy_us"].as_u64().unwrap(),
        stats["clock_us"].as_u64().unwrap(),
    );
    assert!(clock > 0 && busy <= clock, "{stats}");
    assert!(stats["memory_used_bytes"].is_u64(), "{stats}");
    e.shutdown().await;
}

#[tokio::test]
async fn small_memory_evicts_the_idle_model() {
    let mut profile = HardwareProfile::rtx3060();
    profile.memory_bytes = 3_000_000_000;
    let cfg = EmulatorConfig::new(Flavor::Ollama, ["a:3b", "b:3b"]).with_profile(profile);
    let e = start_with(cfg).await;
    for m in ["a:3b", "b:3b"] {
        let body =
            json!({ "model": m, "prompt": "x", "stream": false, "options": { "num_predict": 1 } });
        let v: Value = post(&e, "/api/generate", body).await.json().await.unwrap();
        assert!(v["load_duration"].as_u64().unwrap() > 0);
    }
    assert_eq!(e.loaded_models(), ["b:3b"]);
    e.shutdown().await;
}

#[tokio::test]
async fn a_full_queue_answers_503_and_keep_alive_unloads() {
    let cfg = EmulatorConfig::new(Flavor::Ollama, [CHAT])
        .with_slots(1)
        .with_max_queue(Some(0))
        .with_keep_alive(Some(Duration::from_secs(500)));
    let e = start_with(cfg).await;
    // A streamed answer far longer than the test holds the only slot.
    let long = json!({ "model": CHAT, "prompt": "x", "options": { "num_predict": 1_000_000 } });
    let first = post(&e, "/api/generate", long).await;
    assert_eq!(first.status(), 200);
    let r = post(&e, "/api/generate", json!({ "model": CHAT, "prompt": "y" })).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("server busy"));
    // The client going away frees the slot.
    drop(first);
    while e.workload().running > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(e.loaded_models(), [CHAT]);
    // 500 modelled seconds idle = 0.5 s here.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let ps: Value = get(&e, "/api/ps").await.json().await.unwrap();
    assert_eq!(ps["models"], json!([]));
    e.shutdown().await;
}

#[tokio::test]
async fn serve_stops_on_its_token_and_resets_open_streams() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = EmulatorConfig::new(Flavor::OpenAi, [CHAT]).with_time_scale(1.0);
    let token = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(pair_emulator::serve(cfg, listener, token.clone()));
    let body = json!({ "model": CHAT, "messages": [], "max_tokens": 100_000, "stream": true });
    let resp = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    assert!(stream.next().await.unwrap().is_ok());
    token.cancel();
    let mut ended_in_error = false;
    while let Some(item) = stream.next().await {
        if item.is_err() {
            ended_in_error = true;
        }
    }
    assert!(
        ended_in_error,
        "a stream cut by shutdown must not look complete"
    );
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn tagged_requests_count_arrivals_and_answers_sent_to_their_end() {
    let e = start(Flavor::Ollama).await;
    let send = |tag: &'static str, stream: bool| {
        let url = format!("{}/api/generate", e.base_url());
        async move {
            client()
                .post(url)
                .header(pair_emulator::REQUEST_ID, tag)
                .json(&json!({ "model": CHAT, "prompt": "x", "stream": stream,
                    "options": { "num_predict": 8 } }))
                .send()
                .await
                .unwrap()
        }
    };
    let whole = send("a", false).await;
    assert_eq!(whole.status(), 200);
    let body: Value = whole.json().await.unwrap();
    assert_eq!(body["done"], true, "a whole answer still parses: {body}");
    let streamed = send("b", true).await.text().await.unwrap();
    assert!(streamed.contains("\"done\":true"));
    e.faults().close_after_chunks(Some(CHAT), 2);
    let cut = send("b", true).await;
    let _ = cut.text().await;
    let counts = |t| {
        let h = e.request_hits(t);
        (h.hits, h.completed)
    };
    assert_eq!(counts("a"), (1, 1));
    assert_eq!(counts("b"), (2, 1), "the cut answer did not complete");
    assert_eq!(counts("never"), (0, 0));
    e.shutdown().await;
}

/// Greedy decoding: an answer continued from its own start (a final
/// assistant message, or a raw prompt that ends in it) is the unbroken
/// answer's rest, token for token, in every text API.
#[tokio::test]
async fn a_continued_answer_is_the_unbroken_one_s_rest() {
    let ollama = start(Flavor::Ollama).await;
    let whole = |v: &Value, path: &str| -> String {
        match path {
            "/api/chat" => v["message"]["content"].as_str(),
            "/api/generate" => v["response"].as_str(),
            "/v1/chat/completions" => v["choices"][0]["message"]["content"].as_str(),
            _ => v["choices"][0]["text"].as_str(),
        }
        .unwrap()
        .to_owned()
    };
    for path in [
        "/api/chat",
        "/api/generate",
        "/v1/chat/completions",
        "/v1/completions",
    ] {
        let chat = path.contains("chat");
        let limit = |n: u32| {
            if path.starts_with("/api") {
                json!({ "options": { "num_predict": n } })
            } else {
                json!({ "max_tokens": n })
            }
        };
        let ask = |begun: Option<&str>, n: u32| {
            let mut body = limit(n);
            body["model"] = json!(CHAT);
            body["stream"] = json!(false);
            if chat {
                let mut messages = vec![json!({ "role": "user", "content": "tell me more" })];
                if let Some(b) = begun {
                    messages.push(json!({ "role": "assistant", "content": b }));
                }
                body["messages"] = json!(messages);
            } else {
                body["prompt"] = json!(format!("tell me more\n{}", begun.unwrap_or("")));
                body["raw"] = json!(true);
            }
            body
        };
        let unbroken = whole(
            &post(&ollama, path, ask(None, 12))
                .await
                .json()
                .await
                .unwrap(),
            path,
        );
        let words: Vec<&str> = unbroken.split_inclusive(' ').collect();
        assert_eq!(words.len(), 12, "{path}: {unbroken}");
        // Cut after 5 tokens: the text so far ends before the 6th's space.
        let begun: String = unbroken.split(' ').take(5).collect::<Vec<_>>().join(" ");
        let rest = whole(
            &post(&ollama, path, ask(Some(&begun), 7))
                .await
                .json()
                .await
                .unwrap(),
            path,
        );
        assert_eq!(format!("{begun}{rest}"), unbroken, "{path}");
    }
}

/// A coding agent's turn: a long system prompt, then the conversation.
fn agent_turn(system: &str, turns: &[(&str, &str)]) -> Value {
    let mut messages = vec![json!({ "role": "system", "content": system })];
    messages.extend(
        turns
            .iter()
            .map(|(role, content)| json!({ "role": role, "content": content })),
    );
    json!({ "model": CHAT, "stream": false, "messages": messages })
}

#[tokio::test]
async fn ollama_prefills_only_what_a_slot_does_not_hold() {
    let e = start_with(EmulatorConfig::new(Flavor::Ollama, [CHAT]).with_slots(1)).await;
    let system = "You are a careful coding agent. ".repeat(300);
    let first = agent_turn(&system, &[("user", "list the files")]);
    let v1: Value = post(&e, "/api/chat", first).await.json().await.unwrap();
    let answer = v1["message"]["content"].as_str().unwrap().to_owned();
    let evaluated1 = v1["prompt_eval_count"].as_u64().unwrap();
    assert!(evaluated1 > 2_000, "{v1}");
    // The next turn re-sends everything: only its tail is evaluated, and
    // its prompt evaluation is that much shorter.
    let next = agent_turn(
        &system,
        &[
            ("user", "list the files"),
            ("assistant", &answer),
            ("user", "now run the tests"),
        ],
    );
    let v2: Value = post(&e, "/api/chat", next).await.json().await.unwrap();
    let evaluated2 = v2["prompt_eval_count"].as_u64().unwrap();
    assert!(evaluated2 < 200, "{v2}");
    assert!(
        v2["prompt_eval_duration"].as_u64().unwrap() < v1["prompt_eval_duration"].as_u64().unwrap()
    );
    e.shutdown().await;
}

#[tokio::test]
async fn openai_reports_cached_tokens_like_llama_cpp() {
    let e = start_with(EmulatorConfig::new(Flavor::OpenAi, [CHAT]).with_slots(1)).await;
    let system = "You are a careful coding agent. ".repeat(300);
    let first = agent_turn(&system, &[("user", "fix the bug")]);
    let v1: Value = post(&e, "/v1/chat/completions", first)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v1["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(v1["timings"]["cache_n"], 0);
    // Another task after the same system prompt, streamed with usage: the
    // slot holds the system prompt.
    let mut other = agent_turn(&system, &[("user", "write the docs")]);
    other["stream"] = json!(true);
    other["stream_options"] = json!({ "include_usage": true });
    let text = post(&e, "/v1/chat/completions", other)
        .await
        .text()
        .await
        .unwrap();
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let usage = &events.last().unwrap()["usage"];
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The system message's whole blocks: 9,600 bytes of text in JSON.
    assert!((2_300..=2_420).contains(&cached), "{usage}");
    let timings = events.iter().find_map(|ev| ev.get("timings")).unwrap();
    assert_eq!(timings["cache_n"].as_u64().unwrap(), cached);
    assert_eq!(
        timings["prompt_n"].as_u64().unwrap() + cached,
        usage["prompt_tokens"].as_u64().unwrap()
    );
    e.shutdown().await;
}

#[tokio::test]
async fn a_pool_engine_shares_a_system_prompt_across_slots() {
    let cfg = EmulatorConfig::new(Flavor::OpenAi, [CHAT])
        .with_slots(4)
        .with_cache(CacheKind::Pool {
            capacity_tokens: 100_000,
        });
    let e = start_with(cfg).await;
    let system = "You are a careful coding agent. ".repeat(300);
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };
    let v: Value = post(
        &e,
        "/v1/chat/completions",
        agent_turn(&system, &[("user", "a")]),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(cached(&v), 0);
    // Three tasks at once: each finds the system prompt.
    let tasks = ["b", "c", "d"].map(|task| {
        post(
            &e,
            "/v1/chat/completions",
            agent_turn(&system, &[("user", task)]),
        )
    });
    for resp in futures_util::future::join_all(tasks).await {
        let v: Value = resp.json().await.unwrap();
        assert!(cached(&v) >= 2_300, "{v}");
    }
    e.shutdown().await;
}

#[tokio::test]
async fn natural_answers_end_short_of_an_agent_s_limit() {
    let cfg = EmulatorConfig::new(Flavor::OpenAi, [CHAT]).with_answer_length(AnswerLength::NATURAL);
    let e = start_with(cfg).await;
    let body = json!({
        "model": CHAT, "max_tokens": 32_000,
        "messages": [{ "role": "user", "content": "explain the bug" }],
    });
    let v: Value = post(&e, "/v1/chat/completions", body.clone())
        .await
        .json()
        .await
        .unwrap();
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..=4096).contains(&n), "{n}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The same request, the same length.
    let again: Value = post(&e, "/v1/chat/completions", body.clone())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["usage"]["completion_tokens"].as_u64().unwrap(), n);
    // The header still sets it exactly.
    let v: Value = client()
        .post(format!("{}/v1/chat/completions", e.base_url()))
        .header(pair_emulator::http::ANSWER_TOKENS, "7")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 7);
    e.shutdown().await;
}

#[tokio::test]
async fn a_counted_tool_call_is_an_agent_s_loop_of_that_many_calls() {
    let e = start_with(EmulatorConfig::new(Flavor::OpenAi, [CHAT]).with_slots(1)).await;
    let system = "You are a careful coding agent. ".repeat(300);
    let mut messages = vec![
        json!({ "role": "system", "content": system }),
        json!({ "role": "user", "content": r#"run the tests: Bash({"command": "make test"}) x4"# }),
    ];
    let mut calls = 0;
    let mut cached = Vec::new();
    let answer = loop {
        let body = json!({
            "model": CHAT, "messages": messages,
            "tools": [{ "type": "function", "function": { "name": "Bash", "parameters": {} } }],
        });
        let v: Value = post(&e, "/v1/chat/completions", body)
            .await
            .json()
            .await
            .unwrap();
        cached.push(
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        let choice = &v["choices"][0];
        if choice["finish_reason"] != "tool_calls" {
            break choice["message"]["content"].as_str().unwrap().to_owned();
        }
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "Bash");
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(args, json!({ "command": "make test" }));
        calls += 1;
        assert!(calls <= 4, "the loop did not end: {v}");
        messages.push(choice["message"].clone());
        messages.push(json!({ "role": "tool", "tool_call_id": call["id"], "content": "ok" }));
    };
    assert_eq!(calls, 4);
    assert!(!answer.is_empty());
    // Each turn after the first finds the whole conversation before it in
    // the slot: the agent's growing prompt is what the cache serves.
    assert_eq!(cached[0], 0);
    assert!(
        cached.windows(2).skip(1).all(|w| w[1] > w[0]) && cached[1] >= 2_300,
        "{cached:?}"
    );
    e.shutdown().await;
}
