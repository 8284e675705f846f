//! What coding agents send, over plain HTTP: Claude Code's Messages
//! requests (system messages mid-conversation, betas, fields that steer
//! Anthropic's service), `count_tokens`, model aliases held cluster-wide,
//! the Responses API, Ollama's legacy `name`, and every error in the
//! client's own shape. The real tools and SDKs are in `agent_tools.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use pair_emulator::Flavor;
use pair_testkit::cluster::{cluster, http};
use serde_json::{Value, json};

/// A first request as Claude Code sends it (abridged: its tools and
/// system prompt are long).
fn claude_code_request(model: &str, stream: bool) -> Value {
    json!({
        "model": model,
        "max_tokens": 32000,
        "stream": stream,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "a greeting", "signature": "c2ln"},
                                              {"type": "text", "text": "Hi."}]},
            {"role": "system", "content": "<system-reminder>cwd is /tmp</system-reminder>"},
            {"role": "user", "content": "go on"}
        ],
        "tools": [{"name": "Bash", "description": "runs a command",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "thinking": {"type": "adaptive"},
        "metadata": {"user_id": "user_1"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "temperature": 1
    })
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_requests_reach_a_local_model_through_an_alias_set_on_another_node() {
    // The alias is configured on node 1 only; the request enters at node 2,
    // whose engine is OpenAI-compatible, and node 1 (Ollama) holds qwen.
    let c = cluster(2, |s| {
        s.nodes[0].aliases = vec!["claude-*=qwen2.5:7b".parse().unwrap()];
        s.nodes[1].flavor = Flavor::OpenAi;
    })
    .await
    .unwrap();
    for stream in [false, true] {
        let resp = http()
            .post(format!("{}/v1/messages?beta=true", c.nodes[1].openai_url()))
            .header("anthropic-version", "2023-06-01")
            .header(
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
            )
            .header("x-api-key", "sk-local")
            // Claude Code asks for up to 32,000 tokens; a model stops long
            // before, and so does the emulated one when told its length.
            .header("x-emulator-answer-tokens", "12")
            .json(&claude_code_request("claude-sonnet-4-5-20250929", stream))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "stream {stream}");
        assert_eq!(header(&resp, "x-pair-model").as_deref(), Some("qwen2.5:7b"));
        let dropped = header(&resp, "x-pair-dropped").unwrap();
        assert_eq!(
            dropped,
            "cache_control,context_management,messages[].content[].thinking,metadata,output_config.effort",
            "stream {stream}"
        );
        let text = resp.text().await.unwrap();
        if stream {
            assert!(text.starts_with("event: message_start"), "{text}");
            assert!(
                text.trim_end()
                    .ends_with(r#"data: {"type":"message_stop"}"#),
                "{text}"
            );
        } else {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["type"], "message", "{v}");
            assert_eq!(v["model"], "qwen2.5:7b");
            assert!(v["usage"]["output_tokens"].as_u64().unwrap() > 0);
        }
    }
    // The emulated model calls the tool the user's text asks for; the
    // call comes back as a tool_use block Claude Code runs.
    let mut req = claude_code_request("claude-haiku-4-5", false);
    req["messages"] =
        json!([{"role": "user", "content": r#"Bash({"command": "echo pair-tool-ok"})"#}]);
    let v: Value = http()
        .post(format!("{}/v1/messages", c.nodes[1].openai_url()))
        .header("x-emulator-answer-tokens", "12")
        .json(&req)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let call = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap();
    assert_eq!(call["input"], json!({"command": "echo pair-tool-ok"}));

    // count_tokens: the engine that holds the model counts.
    let resp = http()
        .post(format!(
            "{}/v1/messages/count_tokens?beta=true",
            c.nodes[1].openai_url()
        ))
        .json(&json!({"model": "claude-sonnet-4-5", "system": "be brief",
                      "messages": [{"role": "user", "content": "hello there, how are you today?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 5, "{v}");
    assert!(v.get("estimated").is_none(), "the engine counted: {v}");

    // The node's status lists the alias on every node.
    let status: Value = http()
        .get(format!("{}/_pair/status", c.nodes[1].openai_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status["aliases"][0]["alias"], "claude-*=qwen2.5:7b",
        "{status}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_agent_input_is_the_clients_400_or_404_in_its_own_shape_and_reaches_no_engine() {
    let c = cluster(1, |_| {}).await.unwrap();
    let openai = c.nodes[0].openai_url();
    // Requests for the model (health and inventory polls name none).
    let hits = |c: &pair_testkit::cluster::LocalCluster| c.engines[0].hits_for_model("llama3.2:3b");
    let before = hits(&c);
    for (path, body, status, field) in [
        // A field that changes the text and cannot be had.
        (
            "/v1/messages",
            json!({"model": "llama3.2:3b", "max_tokens": 5, "messages": [],
                   "mcp_servers": [{"type": "url", "url": "https://example.invalid", "name": "x"}]}),
            400,
            "mcp_servers",
        ),
        // A malformed Messages body.
        (
            "/v1/messages",
            json!({"model": "llama3.2:3b", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]}),
            400,
            "messages[0].role",
        ),
        // Responses: no store to continue from.
        (
            "/v1/responses",
            json!({"model": "llama3.2:3b", "input": "hi", "previous_response_id": "resp_1"}),
            400,
            "previous_response_id",
        ),
        (
            "/v1/responses",
            json!({"model": "llama3.2:3b", "input": [{"type": "frobnicate"}]}),
            400,
            "input[0].type",
        ),
    ] {
        let resp = http()
            .post(format!("{openai}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path} {body}");
        let v: Value = resp.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{path}: {message}");
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error");
            assert_eq!(v["error"]["type"], "invalid_request_error");
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error");
        }
    }
    let resp = http()
        .post(format!("{openai}/v1/responses"))
        .header("content-type", "application/json")
        .body("{\"model\": \"llama3.2:3b\", \"input\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(resp.json::<Value>().await.unwrap()["error"]["message"].is_string());
    assert_eq!(hits(&c), before, "nothing reached the engine");

    // Anthropic paths pair does not serve: a 404 in Anthropic's shape.
    let resp = http()
        .post(format!("{openai}/v1/messages/batches"))
        .json(&json!({"requests": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("not_found_error"))
    );
    // A stored response: OpenAI's shape.
    let resp = http()
        .get(format!("{openai}/v1/responses/resp_123"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(resp.json::<Value>().await.unwrap()["error"]["message"].is_string());
    // An unknown path the engine answers in plain text: JSON, OpenAI's shape.
    let resp = http()
        .post(format!("{openai}/v1/frobnicate"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollamas_legacy_name_field_is_taken_on_every_engine() {
    let c = cluster(2, |s| {
        s.nodes[1].flavor = Flavor::OpenAi;
        s.nodes[1].models = vec!["only-here:1b".into()];
    })
    .await
    .unwrap();
    // Held by the Ollama engine (passed through) and by the OpenAI one
    // (translated).
    for model in ["llama3.2:3b", "only-here:1b"] {
        let resp = http()
            .post(format!("{}/api/show", c.nodes[0].ollama_url()))
            .json(&json!({"name": model}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{model}");
        let v: Value = resp.json().await.unwrap();
        assert!(v["details"].is_object(), "{model}: {v}");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_streams_its_event_sequence_on_an_ollama_engine() {
    let c = cluster(1, |_| {}).await.unwrap();
    let resp = http()
        .post(format!("{}/v1/responses", c.nodes[0].openai_url()))
        .json(&json!({"model": "llama3.2:3b", "instructions": "be brief", "stream": true,
                      "input": [{"role": "user", "content": [{"type": "input_text", "text": r#"shell({"command": ["ls"]})"#}]}],
                      "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
                      "store": false, "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"},
                      "prompt_cache_key": "k1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "x-pair-dropped").as_deref(),
        Some("include,prompt_cache_key,reasoning.effort")
    );
    let text = resp.text().await.unwrap();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"response.created"), "{text}");
    assert_eq!(names.last(), Some(&"response.completed"), "{text}");
    for want in [
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.output_item.done",
    ] {
        assert!(names.contains(&want), "{want}: {names:?}");
    }
    c.stop().await;
}

/// A coding agent's second request re-sends its long system prompt: the
/// engine (llama.cpp's server, emulated) finds it in its cache, and the
/// agent is told so in Anthropic's terms (`cache_read_input_tokens`, with
/// `input_tokens` only what was not cached), streamed and whole; the job
/// record keeps the cached part, which corrects the scheduler's index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_told_what_the_engine_read_from_its_prompt_cache() {
    let c = cluster(1, |s| s.nodes[0].flavor = Flavor::OpenAi)
        .await
        .unwrap();
    let system = "You are a coding agent. Read the files before editing them. ".repeat(300);
    let ask = |task: &'static str, stream: bool| {
        let url = format!("{}/v1/messages", c.nodes[0].openai_url());
        let body = json!({
            "model": "llama3.2:3b", "max_tokens": 32000, "stream": stream,
            "system": system, "messages": [{"role": "user", "content": task}],
        });
        async move {
            let r = http()
                .post(url)
                .header("anthropic-version", "2023-06-01")
                .header("x-emulator-answer-tokens", "3")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let job = r.headers()["x-pair-job"].to_str().unwrap().to_owned();
            let text = r.text().await.unwrap();
            let usage = if stream {
                let delta = text
                    .split("\n\n")
                    .find(|e| e.starts_with("event: message_delta"))
                    .unwrap_or_else(|| panic!("no message_delta in {text}"));
                let data: Value =
                    serde_json::from_str(delta.split_once("data: ").unwrap().1).unwrap();
                data["usage"].clone()
            } else {
                serde_json::from_str::<Value>(&text).unwrap()["usage"].clone()
            };
            (usage, job)
        }
    };
    let system_tokens = (system.len() / 4) as u64;
    let (cold, _) = ask("task one", false).await;
    assert_eq!(cold["cache_read_input_tokens"], 0, "{cold}");
    for (task, stream) in [("task two", false), ("task three", true)] {
        let (usage, job) = ask(task, stream).await;
        let read = usage["cache_read_input_tokens"].as_u64().unwrap();
        let fresh = usage["input_tokens"].as_u64().unwrap();
        assert!(read >= system_tokens * 9 / 10, "stream {stream}: {usage}");
        assert!(fresh < 100, "stream {stream}: {usage}");
        let rec = pair_testkit::cluster::record(&c, 0, &job).await;
        assert_eq!(rec.cached_tokens, Some(read as u32), "stream {stream}");
        assert_eq!(rec.prompt_tokens, Some((read + fresh) as u32));
    }
    c.stop().await;
}

/// An engine that says nothing of its cache (Ollama's OpenAI-compatible
/// API): the job record keeps the share of the prompt the scheduler priced
/// as cached, so speeds are learned from what was prefilled; no client
/// header needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_keeps_the_cached_share_the_scheduler_priced() {
    let c = cluster(1, |_| {}).await.unwrap();
    let system = "You are a coding agent. Read the files before editing them. ".repeat(300);
    let mut records = Vec::new();
    for task in ["task one", "task two"] {
        let r = http()
            .post(format!("{}/v1/messages", c.nodes[0].openai_url()))
            .header("anthropic-version", "2023-06-01")
            .header("x-emulator-answer-tokens", "3")
            .json(&json!({
                "model": "llama3.2:3b", "max_tokens": 32000, "stream": true,
                "system": system, "messages": [{"role": "user", "content": task}],
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let job = r.headers()["x-pair-job"].to_str().unwrap().to_owned();
        let text = r.text().await.unwrap();
        assert!(!text.contains("cache_read"), "{text}");
        records.push(pair_testkit::cluster::record(&c, 0, &job).await);
    }
    assert_eq!(records[0].cached_tokens, None, "nothing was cached before");
    let (prompt, cached) = (
        records[1].prompt_tokens.unwrap(),
        records[1].cached_tokens.unwrap(),
    );
    assert!(
        cached >= prompt * 8 / 10 && cached < prompt,
        "{cached} of {prompt}"
    );
    c.stop().await;
}

/// Claude Code asks for up to 32,000 tokens and answers a few dozen: its
/// turns are planned at the length its kind of request gave before. An
/// agent's turn (tools offered) is ranked by when its whole answer ends
/// even as a stream; after a few answers of 40 tokens, its decode is
/// priced at a fraction of a request of another shape that nothing has
/// taught yet (planned at the default 256), at the same moment and speed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_turns_are_planned_at_the_length_its_answers_had() {
    let c = cluster(1, |s| s.time_scale = 0.2).await.unwrap();
    let url = format!("{}/v1/messages", c.nodes[0].openai_url());
    let send = |body: Value| {
        let url = url.clone();
        async move {
            let r = http()
                .post(url)
                .header("x-pair-explain", "1")
                .header("x-emulator-answer-tokens", "40")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let route = header(&r, "x-pair-route").unwrap();
            r.text().await.unwrap();
            route
        }
    };
    // "... + decode N + ...": N.
    let decode_in = |route: &str| -> u32 {
        route
            .split_once("+ decode ")
            .and_then(|(_, rest)| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no decode priced in {route}"))
    };
    let first = send(claude_code_request("qwen2.5:7b", true)).await;
    assert!(first.contains("predicted total"), "{first}");
    for _ in 0..6 {
        send(claude_code_request("qwen2.5:7b", true)).await;
    }
    let agent = send(claude_code_request("qwen2.5:7b", true)).await;
    let mut untaught = claude_code_request("qwen2.5:7b", false);
    untaught.as_object_mut().unwrap().remove("tools");
    let untaught = send(untaught).await;
    let (learned, default) = (decode_in(&agent), decode_in(&untaught));
    assert!(
        learned * 4 < default,
        "40 tokens priced {learned} ms, 256 tokens {default} ms:\n{agent}\n{untaught}"
    );
    c.stop().await;
}
