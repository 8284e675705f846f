//! Every failover rule, on real nodes over loopback (real mTLS between them),
//! each asserting how many times each engine was hit.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::time::Duration;

use pair_emulator::FaultAction;
use pair_testkit::cluster::{attempts, cluster, http, served_by};
use serde_json::{Value, json};

const MODEL: &str = "llama3.2:3b";

fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": stream})
}

/// Requests to the first node's Ollama face, pinned to node `pin` so the
/// faulty engine is tried first.
async fn send(
    c: &pair_testkit::cluster::LocalCluster,
    pin: usize,
    body: &Value,
) -> reqwest::Response {
    http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", c.nodes[pin].id.to_string())
        .json(body)
        .send()
        .await
        .expect("face answers")
}

/// A request to the first node's Ollama face, pinned to the node `pin`.
async fn send_to(
    c: &pair_testkit::cluster::LocalCluster,
    pin: &str,
    body: &Value,
) -> reqwest::Response {
    http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", pin)
        .json(body)
        .send()
        .await
        .expect("face answers")
}

fn hits(c: &pair_testkit::cluster::LocalCluster) -> Vec<u64> {
    c.engines.iter().map(|e| e.hits_for_model(MODEL)).collect()
}

fn reset(c: &pair_testkit::cluster::LocalCluster) {
    for e in &c.engines {
        e.reset_hits();
        e.faults().clear();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_statuses_move_to_the_next_node_once() {
    let c = cluster(3, |_| {}).await.unwrap();
    for status in [404u16, 408, 429, 500, 502, 503] {
        reset(&c);
        // Node 1 is a peer: the failure travels back over mTLS.
        c.engines[1].faults().fail(Some(MODEL), status, None);
        let resp = send(&c, 1, &chat(false)).await;
        assert_eq!(resp.status(), 200, "status {status} must fail over");
        assert_eq!(attempts(&resp), Some(2), "status {status}");
        assert_ne!(served_by(&resp), Some(c.nodes[1].id.to_string()));
        let h = hits(&c);
        assert_eq!(h[1], 1, "faulty engine hit once for {status}: {h:?}");
        assert_eq!(
            h.iter().sum::<u64>(),
            2,
            "exactly one retry for {status}: {h:?}"
        );
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["message"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_errors_are_returned_as_they_are_never_retried() {
    let c = cluster(3, |_| {}).await.unwrap();
    for (pin, status) in [(0usize, 400u16), (1, 400), (2, 422), (1, 401)] {
        reset(&c);
        c.engines[pin].faults().fail(Some(MODEL), status, None);
        let resp = send(&c, pin, &chat(false)).await;
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(served_by(&resp), Some(c.nodes[pin].id.to_string()));
        let h = hits(&c);
        assert_eq!(h[pin], 1, "{h:?}");
        assert_eq!(
            h.iter().sum::<u64>(),
            1,
            "a {status} hits exactly one engine once: {h:?}"
        );
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_is_skipped_after_the_first_byte_deadline() {
    let c = cluster(3, |s| s.first_byte_timeout = Duration::from_millis(800))
        .await
        .unwrap();
    // Engines that hang with the model loaded (one still loading it is
    // waited for as long as its weights may take to read).
    pair_testkit::cluster::warm(&c, MODEL).await;
    c.engines[2].faults().hang(Some(MODEL));
    let resp = send(&c, 2, &chat(true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&resp), Some(2));
    assert_ne!(served_by(&resp), Some(c.nodes[2].id.to_string()));
    let text = resp.text().await.unwrap();
    assert!(
        text.lines().last().unwrap_or("").contains("\"done\":true"),
        "{text}"
    );

    // Every owner hangs: each is left at the bound while another is left
    // to try (node 2, whose engine stalled a moment ago, only once its
    // cooldown, as long as the floor, is over); the last is waited on, here
    // until the client's deadline, and the 504 names what came before.
    reset(&c);
    for e in &c.engines {
        e.faults().hang(Some(MODEL));
    }
    let resp = http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", c.nodes[0].id.to_string())
        .header("x-pair-deadline", "4")
        .json(&chat(false))
        .send()
        .await
        .expect("face answers");
    assert_eq!(resp.status(), 504);
    let body: Value = resp.json().await.unwrap();
    let tried = body["pair"]["attempts"].as_array().map_or(0, Vec::len);
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("x-pair-deadline of 4 s"), "{body}");
    assert!(error.contains("first-byte-timeout"), "{body}");
    let h = hits(&c);
    assert_eq!(&h[..2], &[1, 1], "{h:?}");
    assert!(h[2] <= 1, "{h:?}");
    // The attempts cut for silence, and the one waited on to the end.
    assert_eq!(tried as u64 + 1, h.iter().sum::<u64>(), "{body}");
    c.stop().await;
}

/// An engine that hangs every request (its health checks still
/// answered) is routed around within seconds, long before the no-progress
/// bound cuts the requests it holds: once an attempt is overdue on it and
/// it has sent nothing for 2 s, its node reports it silent and new work
/// goes to the other owner. A request every 250 ms, through the other
/// node's face; the bound is 30 s, so only the silence can explain the
/// move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_engine_is_routed_around_within_seconds() {
    let c = cluster(2, |s| {
        s.first_byte_timeout = Duration::from_secs(30);
        // The hanging engine is the one routing prefers: fast and wide,
        // so the requests it holds do not push the next ones away.
        s.nodes[0].slots = Some(32);
        s.nodes[1].profile = "cpu".into();
    })
    .await
    .unwrap();
    pair_testkit::cluster::warm(&c, MODEL).await;
    let hung = c.nodes[0].id.to_string();
    let other = c.nodes[1].id.to_string();
    // Routing prefers node 0 while its engine works.
    let resp = http()
        .post(format!("{}/api/chat", c.nodes[1].ollama_url()))
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(served_by(&resp), Some(hung.clone()), "node 0 is preferred");
    c.engines[0].faults().hang(Some(MODEL));
    let began = std::time::Instant::now();
    let mut waiting = Vec::new();
    let mut went: Vec<(Duration, bool)> = Vec::new();
    while began.elapsed() < Duration::from_secs(8) {
        let sent = began.elapsed();
        let before = c.engines[0].hits_for_model(MODEL);
        let url = format!("{}/api/chat", c.nodes[1].ollama_url());
        // Each request is kept waiting (a client that gave up would end
        // the attempt, and what is overdue is the attempts still waiting).
        let task = tokio::spawn(async move {
            http()
                .post(url)
                .timeout(Duration::from_secs(60))
                .json(&chat(false))
                .send()
                .await
        });
        tokio::time::sleep(Duration::from_millis(250)).await;
        let to_hung = c.engines[0].hits_for_model(MODEL) > before;
        if !to_hung {
            let resp = task.await.unwrap().unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(served_by(&resp), Some(other.clone()));
        } else {
            waiting.push(task);
        }
        went.push((sent, to_hung));
    }
    // The last request sent to the hung engine, and every one after it
    // went to the other node.
    let last_hung = went
        .iter()
        .filter(|(_, hung)| *hung)
        .map(|(at, _)| *at)
        .max()
        .expect("the hung engine took the first requests");
    eprintln!(
        "a hung engine was routed around {:.2} s after it hung ({} requests held by it; {} sent)",
        last_hung.as_secs_f64(),
        waiting.len(),
        went.len()
    );
    assert!(
        last_hung < Duration::from_secs(5),
        "routed around within seconds, not at the 30 s bound: {went:?}"
    );
    assert!(
        went.iter().filter(|(at, _)| *at > last_hung).count() >= 8,
        "and kept away: {went:?}"
    );
    for task in waiting {
        task.abort();
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_peer_is_a_transport_error_and_the_next_node_answers() {
    let mut c = cluster(3, |_| {}).await.unwrap();
    let dead = c.nodes.remove(2);
    let dead_id = dead.id.to_string();
    dead.kill().await;
    // Straight away: the origin's snapshot still lists the dead node.
    let resp = http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", &dead_id)
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&resp), Some(2), "the dead node was tried first");
    assert_ne!(served_by(&resp), Some(dead_id.clone()));
    // And it leaves the routing set within the gossip deadline.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let snap = c.nodes[0].state.cluster();
    assert!(snap.nodes().iter().all(|n| n.id.to_string() != dead_id));
    c.stop().await;
}

/// Every owner answering 503: the client gets the last engine's own 503
/// (its body, with the route receipt), after at most five attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_failing_gives_the_last_engine_answer_and_at_most_five_attempts() {
    let c = cluster(6, |_| {}).await.unwrap();
    for e in &c.engines {
        e.faults().fail(Some(MODEL), 503, None);
    }
    let resp = send(&c, 0, &chat(false)).await;
    assert_eq!(resp.status(), 503, "the engines' own status");
    assert_eq!(attempts(&resp), Some(5));
    assert!(served_by(&resp).is_some(), "with the route receipt");
    assert!(resp.headers().get("x-pair-made").is_none());
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["pair"].is_null(),
        "the engine's body, not pair's: {body}"
    );
    assert!(body["error"].as_str().is_some(), "{body}");
    assert_eq!(
        hits(&c).iter().sum::<u64>(),
        5,
        "never more than 5 dispatches"
    );
    c.stop().await;
}

/// Every attempt fails without an answer (every peer is gone, the local
/// engine is dead): pair's own 502 names each node and what it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_at_all_gives_pair_s_502_naming_what_each_node_did() {
    let mut c = cluster(2, |_| {}).await.unwrap();
    let dead = c.nodes.remove(1);
    let dead_id = dead.id.to_string();
    dead.kill().await;
    // The live node's engine sends a head and then drops the connection:
    // no node gives an answer the client could use.
    c.engines[0].faults().close_after_chunks(Some(MODEL), 0);
    let resp = send_to(&c, &dead_id, &chat(false)).await;
    assert_eq!(resp.status(), 502);
    let body: Value = resp.json().await.unwrap();
    let tried = body["pair"]["attempts"].as_array().unwrap();
    assert!((2..=5).contains(&tried.len()), "{body}");
    let live_id = c.nodes[0].id.to_string();
    assert!(
        tried
            .iter()
            .any(|a| a["node"] == live_id.as_str() && a["outcome"] == "body"),
        "{body}"
    );
    assert!(
        tried
            .iter()
            .any(|a| a["node"] == dead_id.as_str() && a["outcome"] == "connect"),
        "{body}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_model_is_a_404_naming_it_and_the_models_the_cluster_holds() {
    let c = cluster(2, |_| {}).await.unwrap();
    let resp = http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .json(&json!({"model": "no-such-model", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.unwrap();
    let message = body["error"].as_str().unwrap();
    assert!(message.contains("no-such-model"), "{message}");
    assert!(
        message.contains("llama3.2:3b") && message.contains("qwen2.5:7b"),
        "{message}"
    );
    let model_hits: u64 = c
        .engines
        .iter()
        .map(|e| e.hits_for_model("no-such-model"))
        .sum();
    assert_eq!(model_hits, 0, "no engine is asked for a model none holds");

    // Every other API: a 404 in its own shape.
    let not_found = |path: &'static str, body: Value| {
        let url = format!("{}{path}", c.nodes[0].openai_url());
        async move {
            let resp = http().post(url).json(&body).send().await.unwrap();
            assert_eq!(resp.status(), 404, "{path}");
            resp.json::<Value>().await.unwrap()
        }
    };
    let body = not_found(
        "/v1/chat/completions",
        json!({"model": "no-such-model", "messages": []}),
    )
    .await;
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(
        body["pair"]["models"],
        json!(["llama3.2:3b", "nomic-embed-text:latest", "qwen2.5:7b"])
    );
    let body = not_found(
        "/v1/messages",
        json!({"model": "no-such-model", "max_tokens": 5, "messages": []}),
    )
    .await;
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "not_found_error");
    let body2 = not_found(
        "/v1/responses",
        json!({"model": "no-such-model", "input": "hi"}),
    )
    .await;
    assert_eq!(body2["error"]["code"], "model_not_found");
    for body in [&body, &body2] {
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("no-such-model") && message.contains("qwen2.5:7b"),
            "the models the cluster holds are listed: {message}"
        );
    }
    c.stop().await;
}

/// An engine that answers 404 for a model its node advertises has its
/// inventory re-read at once (not at the next 10 s inventory poll), on the
/// origin's own engine and on a peer that ran a relayed request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_from_an_advertised_owner_rereads_its_inventory_at_once() {
    let c = cluster(3, |_| {}).await.unwrap();
    for faulty in [0usize, 1] {
        reset(&c);
        c.engines[faulty].faults().fail(Some(MODEL), 404, None);
        let before = c.engines[faulty].hits_for("/api/tags");
        let resp = send(&c, faulty, &chat(false)).await;
        assert_eq!(resp.status(), 200, "node {faulty}: the 404 fails over");
        assert_eq!(attempts(&resp), Some(2));
        let reread = async {
            while c.engines[faulty].hits_for("/api/tags") == before {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        assert!(
            // Scheduled inventory reads come every 10 s: a 500 ms window
            // (twice over) all but rules out passing by coincidence.
            tokio::time::timeout(Duration::from_millis(500), reread)
                .await
                .is_ok(),
            "node {faulty}'s engine inventory was not re-read after its 404"
        );
    }
    c.stop().await;
}

/// A 2xx head is not a commitment: an engine that sends its head and dies
/// before the first body byte is retried on the next node, streamed or not,
/// whether it is the origin's own engine or a peer's behind the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_without_a_first_byte_moves_to_the_next_node() {
    let c = cluster(3, |_| {}).await.unwrap();
    for faulty in [0usize, 1] {
        for stream in [true, false] {
            let case = format!("node {faulty}, stream={stream}");
            reset(&c);
            c.engines[faulty]
                .faults()
                .add(pair_emulator::FaultRule::for_model(
                    MODEL,
                    FaultAction::CloseAfterChunks(0),
                ));
            let resp = send(&c, faulty, &chat(stream)).await;
            assert_eq!(resp.status(), 200, "{case}");
            assert_eq!(attempts(&resp), Some(2), "{case}");
            assert_ne!(served_by(&resp), Some(c.nodes[faulty].id.to_string()));
            let text = resp.text().await.unwrap();
            assert!(
                text.contains("content") && !text.contains("error"),
                "{case}: {text}"
            );
            let h = hits(&c);
            assert_eq!(h[faulty], 1, "{case}: {h:?}");
            assert_eq!(h.iter().sum::<u64>(), 2, "{case}: {h:?}");
        }
    }
    c.stop().await;
}

/// `x-pair-deadline: SECONDS` bounds a request: past it, a 504 that says
/// so (the nodes it was waiting on not blamed: they stay in routing); a
/// malformed one is the client's 400; a request answered within it is
/// served as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_ends_the_wait_with_a_504_that_says_so() {
    let c = cluster(3, |_| {}).await.unwrap();
    for e in &c.engines {
        e.faults()
            .slow_first_byte(Some(MODEL), Duration::from_secs(3));
    }
    let deadline_req = |pin: usize, deadline: &str| {
        http()
            .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", c.nodes[pin].id.to_string())
            .header("x-pair-deadline", deadline)
            .json(&chat(false))
            .send()
    };
    let t = std::time::Instant::now();
    let resp = deadline_req(1, "0.5").await.unwrap();
    let took = t.elapsed();
    assert_eq!(resp.status(), 504);
    let body: Value = resp.json().await.unwrap();
    // Ollama's error shape: the message alone.
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("x-pair-deadline of 0.5 s passed before any node answered"),
        "{body}"
    );
    assert_eq!(body["pair"]["deadline_s"], 0.5, "{body}");
    assert!(
        took < Duration::from_secs(3),
        "ended at the deadline, not the engine: {took:?}"
    );
    // Malformed: the client's 400, naming the header.
    let resp = deadline_req(1, "soon").await.unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("x-pair-deadline"),
        "{body}"
    );
    // The node it waited on is not taken for hung: pinned again, it serves.
    reset(&c);
    let resp = deadline_req(1, "20").await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(served_by(&resp), Some(c.nodes[1].id.to_string()));
    c.stop().await;
}

/// An engine that sends its head and then nothing (its health checks
/// still answering) is left for the next owner after the stall allowance,
/// whether it is the origin's own engine or a peer's behind the relay,
/// streamed or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_then_silence_moves_to_the_next_node_relayed_or_local() {
    let c = cluster(3, |spec| spec.first_byte_timeout = Duration::from_secs(1))
        .await
        .unwrap();
    // Peers 1 and 2 behind the relay, then node 0's own engine twice.
    for (faulty, stream) in [(1usize, false), (2, true), (0, false), (0, true)] {
        let case = format!("node {faulty}, stream={stream}");
        reset(&c);
        if faulty == 0 && stream {
            // Node 0's engine stalled a moment ago and left routing for
            // its cooldown (the first-byte timeout): let every view see
            // it back.
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        c.engines[faulty]
            .faults()
            .add(pair_emulator::FaultRule::for_model(
                MODEL,
                FaultAction::SilentAfterChunks(0),
            ));
        let resp = send(&c, faulty, &chat(stream)).await;
        assert_eq!(resp.status(), 200, "{case}");
        assert_eq!(attempts(&resp), Some(2), "{case}");
        assert_ne!(
            served_by(&resp),
            Some(c.nodes[faulty].id.to_string()),
            "{case}"
        );
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("content") && !text.contains("error"),
            "{case}: {text}"
        );
    }
    c.stop().await;
}

/// Slow is not hung: an engine still loading the model (it answers its
/// polls, and does not list the model loaded yet) is waited for well past
/// the no-progress bound and past the stall allowance of the predicted
/// cold load; a request on it ends with a 200, not a cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_load_longer_than_every_bound_is_waited_for_while_the_engine_reports_loading() {
    let c = cluster(1, |s| {
        s.nodes[0].profile = "cpu".into();
        // The cpu profile loads llama3.2:3b in about 1.6 s: 13 s here.
        s.time_scale = 8.0;
        s.first_byte_timeout = Duration::from_secs(2);
        // Nothing known about the node: the scheduler predicts its
        // fallback 3 s load, so the stall allowance is about 9 s.
        s.seed_perf = false;
    })
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let resp = http()
        .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
        .json(&json!({"model": MODEL, "prompt": "hi", "stream": false, "options": {"num_predict": 2}}))
        .send()
        .await
        .expect("face answers");
    let took = started.elapsed();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    assert_eq!(attempts(&resp), Some(1));
    assert!(
        took > Duration::from_secs(10),
        "the load took {took:?}: not past the allowance, the test proves nothing"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["done"], true, "{body}");
    assert!(
        body["load_duration"].as_u64().unwrap_or(0) > 10_000_000_000,
        "{body}"
    );
    c.stop().await;
}

/// The figure behind "slow is not hung" under the default settings: a
/// 130 s cold load (the case of PAIR's issue #57) ends with a 200 through
/// the default no-progress bound (10 s) and the predicted load's
/// allowance. On demand (130 s of wall time):
/// `cargo test -p pair-tests --test failover -- --ignored --nocapture cold_load_of_130`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure for RELIABILITY.md: 130 s of wall time"]
async fn a_cold_load_of_130_s_ends_200_under_the_default_settings() {
    let c = cluster(1, |s| {
        s.nodes[0].profile = "cpu".into();
        // The cpu profile loads llama3.2:3b in about 1.6 s: 130 s here.
        s.time_scale = 81.0;
        s.first_byte_timeout = pair_http::Timeouts::default().first_byte;
        s.seed_perf = false;
    })
    .await
    .unwrap();
    let started = std::time::Instant::now();
    // The test client's own 30 s timeout would end it first.
    let resp = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
        .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
        .json(&json!({"model": MODEL, "prompt": "hi", "stream": false, "options": {"num_predict": 1}}))
        .send()
        .await
        .expect("face answers");
    let took = started.elapsed();
    let status = resp.status();
    let tries = attempts(&resp);
    let body: Value = resp.json().await.unwrap();
    eprintln!(
        "a cold load under the default settings: {status} after {:.1} s (load_duration {:.1} s), attempts {tries:?}",
        took.as_secs_f64(),
        body["load_duration"].as_u64().unwrap_or(0) as f64 / 1e9,
    );
    assert_eq!(tries, Some(1));
    assert_eq!(status, 200, "{body}");
    assert!(took > Duration::from_secs(125), "the load took {took:?}");
    c.stop().await;
}

/// Slow is an answer; cut, it is none. The only owner of a model, its
/// engine silent (no head, no loading or queue signal) until it answers,
/// is waited for past the stall allowance, locally and behind the relay:
/// the figure of the issue (a head after 130 s under the default 10 s
/// allowance) at a tenth of the scale, 13 s against 1 s, with the default
/// silent bound. Both nodes' records say it waited on a silent engine
/// with no alternative. With a second owner, the request moves there at
/// the allowance instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_owner_s_silent_engine_is_waited_for_and_a_second_owner_takes_over() {
    const LOCAL: &str = "llama3.2:3b";
    const RELAYED: &str = "qwen2.5:7b";
    const SHARED: &str = "nomic-embed-text";
    let c = cluster(3, |s| {
        s.first_byte_timeout = Duration::from_secs(1);
        s.nodes[0].models = vec![LOCAL.into()];
        s.nodes[1].models = vec![RELAYED.into(), SHARED.into()];
        s.nodes[2].models = vec![SHARED.into()];
    })
    .await
    .unwrap();
    // Loaded first: an engine loading a model is waited for anyway.
    for (model, node) in [(LOCAL, 0usize), (RELAYED, 1), (SHARED, 1), (SHARED, 2)] {
        let (path, body) = if model == SHARED {
            ("embed", json!({"model": model, "input": "warm"}))
        } else {
            (
                "generate",
                json!({"model": model, "prompt": "warm", "stream": false, "options": {"num_predict": 1}}),
            )
        };
        let r = http()
            .post(format!("{}/api/{path}", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", c.nodes[node].id.to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "warming {model} on {node}");
        if model != SHARED {
            pair_testkit::cluster::wait_loaded(&c, model, &[c.nodes[node].id]).await;
        }
    }
    let quiet = Duration::from_secs(13);
    c.engines[0].faults().slow_first_byte(Some(LOCAL), quiet);
    c.engines[1].faults().slow_first_byte(Some(RELAYED), quiet);
    let ask = |model: &'static str| {
        let url = format!("{}/api/generate", c.nodes[0].ollama_url());
        async move {
            let t = std::time::Instant::now();
            let resp = reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap()
                .post(url)
                .json(&json!({"model": model, "prompt": "hi", "stream": false, "options": {"num_predict": 4}}))
                .send()
                .await
                .expect("face answers");
            (resp, t.elapsed())
        }
    };
    let ((local, local_took), (relayed, relayed_took)) = tokio::join!(ask(LOCAL), ask(RELAYED));
    for (case, resp, took, ran_on) in [
        ("local", local, local_took, 0usize),
        ("relayed", relayed, relayed_took, 1),
    ] {
        assert_eq!(resp.status(), 200, "{case}");
        assert_eq!(attempts(&resp), Some(1), "{case}: never cut and resent");
        assert_eq!(
            served_by(&resp),
            Some(c.nodes[ran_on].id.to_string()),
            "{case}"
        );
        assert!(
            took >= quiet,
            "{case}: answered in {took:?}, before the engine did"
        );
        let job = pair_testkit::cluster::job_of(&resp);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["done"], true, "{case}: {body}");
        for node in [0, ran_on] {
            let rec = pair_testkit::cluster::record(&c, node, &job).await;
            assert_eq!(
                rec.status,
                pair_core::JobStatus::Completed,
                "{case} on {node}: {rec:?}"
            );
            let waited = rec
                .waited
                .unwrap_or_else(|| panic!("{case} on {node}: {rec:?}"));
            assert_eq!(waited.why, pair_core::WaitReason::SilentOnlyOwner);
            assert!(
                waited.ms >= 8_000,
                "{case} on {node}: waited {} ms of {quiet:?}",
                waited.ms
            );
        }
    }
    // Two owners: the silent one is left at the allowance for the other,
    // whichever is tried first.
    c.engines[1].faults().slow_first_byte(Some(SHARED), quiet);
    let t = std::time::Instant::now();
    let resp = http()
        .post(format!("{}/api/embed", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", c.nodes[1].id.to_string())
        .json(&json!({"model": SHARED, "input": "hi"}))
        .send()
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(resp.status(), 200);
    assert_eq!(served_by(&resp), Some(c.nodes[2].id.to_string()));
    assert_eq!(attempts(&resp), Some(2));
    assert!(took < Duration::from_secs(8), "moved on in {took:?}");
    let job = pair_testkit::cluster::job_of(&resp);
    let rec = pair_testkit::cluster::record(&c, 0, &job).await;
    assert_eq!(rec.waited, None, "{rec:?}");
    c.stop().await;
}

/// A peer that gives up on its engine before the first byte (a head, then
/// silence) says so on the link, and its origin moves on as it does for
/// its own engine: the receipt names the peer's class, not a status to
/// guess from, and the answer is the next owner's own, byte for byte in
/// its content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_s_failure_keeps_its_class_across_the_hop() {
    let c = cluster(3, |spec| {
        spec.first_byte_timeout = Duration::from_secs(1);
        spec.engine_seed = Some(7);
    })
    .await
    .unwrap();
    c.engines[1]
        .faults()
        .add(pair_emulator::FaultRule::for_model(
            MODEL,
            FaultAction::SilentAfterChunks(0),
        ));
    let body = json!({"model": MODEL, "prompt": "the same prompt", "stream": false,
                      "options": {"num_predict": 12, "temperature": 0}});
    let resp = http()
        .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", c.nodes[1].id.to_string())
        .header("x-pair-explain", "1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&resp), Some(2));
    let by = served_by(&resp).unwrap();
    let next = c.nodes.iter().position(|n| n.id.to_string() == by).unwrap();
    assert_ne!(next, 1);
    let job = pair_testkit::cluster::job_of(&resp);
    let got: Value = resp.json().await.unwrap();
    // The engine's own answer to the same request, asked directly.
    let direct: Value = http()
        .post(format!("{}/api/generate", c.engines[next].base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["response"], direct["response"], "{got} vs {direct}");
    assert_eq!(got["eval_count"], direct["eval_count"]);
    // The origin records the answer that came (the peer's own record of
    // its failure is superseded by it as the records converge).
    let origin = pair_testkit::cluster::record(&c, 0, &job).await;
    assert_eq!(origin.status, pair_core::JobStatus::Completed, "{origin:?}");
    assert_eq!(origin.attempts, 2);
    // Without a next owner, the origin's error names the peer's class.
    let only = cluster(2, |spec| {
        spec.first_byte_timeout = Duration::from_secs(1);
        spec.nodes[0].models = vec!["nomic-embed-text".into()];
    })
    .await
    .unwrap();
    only.engines[1]
        .faults()
        .add(pair_emulator::FaultRule::for_model(
            MODEL,
            FaultAction::CloseAfterChunks(0),
        ));
    let resp = http()
        .post(format!("{}/api/generate", only.nodes[0].ollama_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    let err: Value = resp.json().await.unwrap();
    let text = err["error"].as_str().unwrap();
    assert!(text.contains("(body)"), "{err}");
    assert!(!text.contains("(502)") && !text.contains("(504)"), "{err}");
    only.stop().await;
    c.stop().await;
}
