//! Late binding on real nodes (`--queue`): on a serial engine (one slot),
//! requests wait at the cluster while the slot is taken and go in the
//! cluster queue's order when it frees; past their bound they get a 503
//! in the client's shape, with `Retry-After`. With preemption, an
//! interactive request cuts a streaming batch answer for its slot, and the
//! batch answer goes on afterwards as one unbroken stream.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::time::{Duration, Instant};

use pair_core::{JobStatus, WaitReason};
use pair_scheduler::Order;
use pair_testkit::cluster::{LocalCluster, cluster, http, job_of, record};
use serde_json::{Value, json};

async fn serial_node(queue: Option<Order>) -> LocalCluster {
    let c = cluster(1, |s| {
        s.time_scale = 0.25;
        s.nodes[0].slots = Some(1);
        s.queue = queue;
    })
    .await
    .unwrap();
    // The model loads, and the node learns its engine's one slot.
    generate(&url(&c), "warm", 4).await;
    c
}

fn url(c: &LocalCluster) -> String {
    format!("{}/api/generate", c.nodes[0].ollama_url())
}

/// An Ollama generation of `tokens` at `url`, non-streamed; the status
/// and body.
async fn generate(url: &str, prompt: &str, tokens: u32) -> (u16, Value) {
    let r = http()
        .post(url)
        .json(
            &json!({"model": "llama3.2:3b", "prompt": prompt, "stream": false,
                      "options": {"num_predict": tokens}}),
        )
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// An Ollama generation of `tokens` through `at`'s face, non-streamed and
/// pinned to `node`, spawned; its status.
fn pinned(
    at: String,
    node: pair_core::NodeId,
    tokens: u32,
) -> tokio::task::JoinHandle<reqwest::Result<u16>> {
    tokio::spawn(async move {
        http()
            .post(format!("{at}/api/generate"))
            .header("x-pair-node-pin", node.to_string())
            .json(
                &json!({"model": "llama3.2:3b", "prompt": "a long one", "stream": false,
                          "options": {"num_predict": tokens}}),
            )
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .map(|r| r.status().as_u16())
    })
}

/// A four-token question through `at`'s face, non-streamed: the answer.
async fn ask(at: &str) -> reqwest::Response {
    http()
        .post(format!("{at}/api/generate"))
        .json(
            &json!({"model": "llama3.2:3b", "prompt": "a quick question", "stream": false,
                      "options": {"num_predict": 4}}),
        )
        .send()
        .await
        .unwrap()
}

/// A streamed Ollama chat's text, checked for no error event: its answer
/// and its last event.
fn chat_stream(text: &str) -> (String, Value) {
    let events: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(
        events.iter().all(|e| e.get("error").is_none()),
        "no error in the stream: {text}"
    );
    let answer: String = events
        .iter()
        .filter_map(|e| e["message"]["content"].as_str())
        .collect();
    (answer, events.last().cloned().unwrap_or_default())
}

/// The order answers ended in.
type Ended = std::sync::Arc<std::sync::Mutex<Vec<&'static str>>>;

/// Reads the batch answer `resp` to its end, spawned: its text, with
/// "batch" added to `ended` when it ends.
fn read_batch(resp: reqwest::Response, ended: &Ended) -> tokio::task::JoinHandle<String> {
    let ended = std::sync::Arc::clone(ended);
    tokio::spawn(async move {
        let text = resp.text().await.unwrap();
        ended.lock().unwrap().push("batch");
        text
    })
}

/// Waits (up to 10 s) until node `node` holds `n` requests, running or
/// waiting at the cluster.
async fn holding(c: &LocalCluster, node: usize, n: usize) {
    let st = &c.nodes[node].state;
    let deadline = Instant::now() + Duration::from_secs(10);
    while st.load.in_flight() as usize + st.waitroom.len() < n {
        assert!(
            Instant::now() < deadline,
            "node {node} never held {n} requests"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A long answer takes the one slot; a second long one and then a short
/// one arrive while it runs, each after the node holds the ones before
/// it (and 150 ms more: committed at once, a request the node holds may
/// not have reached the engine's first-come queue yet). Returns the order
/// the two later ones ended in.
async fn race(c: &LocalCluster) -> Vec<&'static str> {
    let started = Instant::now();
    let at = url(c);
    let first = tokio::spawn({
        let at = at.clone();
        async move { generate(&at, "first long", 2000).await }
    });
    holding(c, 0, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let ended = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let send = |name: &'static str, tokens: u32| {
        let (at, ended) = (at.clone(), std::sync::Arc::clone(&ended));
        tokio::spawn(async move {
            let (status, _) = generate(&at, name, tokens).await;
            assert_eq!(status, 200, "{name}");
            ended.lock().unwrap().push(name);
        })
    };
    let long = send("long", 400);
    holding(c, 0, 2).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let short = send("short", 4);
    long.await.unwrap();
    short.await.unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    assert!(started.elapsed() < Duration::from_secs(60));
    ended.lock().unwrap().clone()
}

/// In one run: committed at once, the short request waits in the engine's
/// queue behind the long one that came before it; with late binding and
/// shortest-first, it passes it, and its record says it waited at the
/// cluster.
/// Node `node`'s failovers of class `reason` so far.
fn failovers(c: &LocalCluster, node: usize, reason: &str) -> u64 {
    c.nodes[node]
        .state
        .metrics
        .failovers
        .get_or_create(&pair_proxy::metrics::FailoverLabels {
            reason: reason.into(),
        })
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_request_passes_a_long_one_waiting_for_a_serial_engine() {
    let off = serial_node(None).await;
    assert_eq!(race(&off).await, ["long", "short"], "the engine's own FIFO");
    off.stop().await;

    let sjf = serial_node(Some(Order::ShortestFirst)).await;
    let order = race(&sjf).await;
    let jobs = sjf.nodes[0].state.jobs.recent(10);
    assert_eq!(order, ["short", "long"], "shortest first {jobs:#?}");
    let waited: Vec<_> = jobs
        .iter()
        .filter_map(|j| j.waited.filter(|w| w.why == WaitReason::ClusterQueue))
        .collect();
    assert!(waited.len() >= 2, "both later requests waited: {jobs:#?}");
    assert!(waited.iter().all(|w| w.ms > 0), "{waited:?}");
    sjf.stop().await;
}

/// A request that waits past its `x-pair-deadline` for a slot gets a 503
/// in its client's shape, with `Retry-After`, and is recorded as failed;
/// one that asks for an unknown priority is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_past_the_bound_is_a_503_with_retry_after() {
    let c = serial_node(Some(Order::Priorities)).await;
    let busy = tokio::spawn({
        let at = url(&c);
        async move { generate(&at, "long", 600).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let t0 = Instant::now();
    let r = http()
        .post(format!("{}/v1/chat/completions", c.nodes[0].openai_url()))
        .header("x-pair-deadline", "0.5")
        .header("x-pair-priority", "batch")
        .json(&json!({"model": "llama3.2:3b", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], "cluster_full",
        "OpenAI's shape: {body}"
    );
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(busy.await.unwrap().0, 200);
    let refused = c.nodes[0]
        .state
        .jobs
        .recent(10)
        .into_iter()
        .find(|j| j.http_status == Some(503))
        .expect("the refused request is recorded");
    assert_eq!(refused.status, JobStatus::Failed);
    assert_eq!(
        refused.waited.map(|w| w.why),
        Some(WaitReason::ClusterQueue)
    );

    let r = http()
        .post(format!("{}/v1/chat/completions", c.nodes[0].openai_url()))
        .header("x-pair-priority", "urgent")
        .json(&json!({"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-pair-priority"),
        "{body}"
    );
    c.stop().await;
}

/// With priorities, batch work leaves interactive work the cluster's last
/// free slot: on a one-slot node where interactive work was just served, a
/// request marked batch by its alias (`farm-*=llama3.2:3b@batch`) waits
/// (here past its deadline), where the same request by the model's own
/// name goes at once; `x-pair-priority` overrides the alias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_marks_its_requests_as_batch_work() {
    let c = cluster(1, |s| {
        s.time_scale = 0.25;
        s.nodes[0].slots = Some(1);
        s.nodes[0].aliases = vec!["farm-*=llama3.2:3b@batch".parse().unwrap()];
        s.queue = Some(Order::Priorities);
    })
    .await
    .unwrap();
    generate(&url(&c), "interactive", 4).await;
    let ask = |model: &'static str, priority: Option<&'static str>| {
        let at = url(&c);
        async move {
            let mut r = http()
                .post(at)
                .header("x-pair-deadline", "1")
                .json(&json!({"model": model, "prompt": "go", "stream": false,
                              "options": {"num_predict": 4}}));
            if let Some(p) = priority {
                r = r.header("x-pair-priority", p);
            }
            r.send().await.unwrap().status().as_u16()
        }
    };
    assert_eq!(
        ask("farm-agent-1", None).await,
        503,
        "batch: the last slot is kept"
    );
    assert_eq!(ask("llama3.2:3b", None).await, 200, "interactive goes");
    assert_eq!(
        ask("farm-agent-1", Some("interactive")).await,
        200,
        "the header wins"
    );
    assert_eq!(
        ask("llama3.2:3b", Some("low")).await,
        503,
        "batch by header"
    );
    c.stop().await;
}

/// A batch request for a streamed Ollama chat of `tokens` about
/// `content` through the face `face`.
fn batch_chat_to(face: &str, content: &str, tokens: u32) -> reqwest::RequestBuilder {
    http()
        .post(format!("{face}/api/chat"))
        .header("x-pair-priority", "batch")
        .json(&json!({"model": "llama3.2:3b", "stream": true,
                      "messages": [{"role": "user", "content": content}],
                      "options": {"temperature": 0, "num_predict": tokens}}))
}

/// A batch request for a streamed Ollama chat of `tokens` at node 0; the
/// answer's head.
async fn batch_chat(c: &LocalCluster, tokens: u32) -> reqwest::Response {
    batch_chat_to(&c.nodes[0].ollama_url(), "tell me about rivers", tokens)
        .send()
        .await
        .unwrap()
}

/// A one-slot node warmed by batch work only (so a batch request takes
/// a free slot at once: no interactive work was seen), that learned how
/// long its batch answers are: `tokens`.
async fn serial_batch_node(preempt: bool, tokens: u32) -> LocalCluster {
    serial_batch_node_on("rtx4090", preempt, tokens).await
}

/// [`serial_batch_node`] on hardware `profile`.
async fn serial_batch_node_on(profile: &str, preempt: bool, tokens: u32) -> LocalCluster {
    let c = cluster(1, |s| {
        s.time_scale = 0.25;
        s.nodes[0].profile = profile.into();
        s.nodes[0].slots = Some(1);
        s.queue = Some(Order::Priorities);
        s.preempt = preempt;
        // The same weights in every run: a greedy answer is the same.
        s.engine_seed = Some(7);
    })
    .await
    .unwrap();
    let warm = batch_chat(&c, tokens).await;
    assert_eq!(warm.status(), 200);
    warm.text().await.unwrap();
    c
}

/// A batch answer of `tokens` streamed as an Ollama chat takes the one
/// slot; `questions` interactive questions arrive one after another, each
/// once it streams again. Returns the order they ended in, the batch
/// answer's text and final event, and its job.
async fn cut_race(
    c: &LocalCluster,
    tokens: u32,
    questions: usize,
) -> (Vec<&'static str>, String, Value, String) {
    let ended = Ended::default();
    let resp = batch_chat(c, tokens).await;
    assert_eq!(resp.status(), 200);
    let job = job_of(&resp);
    let batch = read_batch(resp, &ended);
    for _ in 0..questions {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, _) = generate(&url(c), "a quick question", 4).await;
        assert_eq!(status, 200);
        ended.lock().unwrap().push("chat");
    }
    let (answer, last) = chat_stream(&batch.await.unwrap());
    let order = ended.lock().unwrap().clone();
    (order, answer, last, job)
}

/// With priorities alone, interactive questions wait for the batch
/// answer holding the one slot; with preemption each cuts it, and ends
/// first: three cuts, more than the default `--resume-limit` (2) of moves
/// for failures. The batch client's stream is the unbroken one all the
/// same: every token, its count, its end, and the moves in its receipt
/// and record (back onto the same node: it was cut, not failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_work_cuts_a_streaming_batch_answer_with_preempt() {
    const TOKENS: u32 = 2_000;
    let waits = serial_batch_node(false, TOKENS).await;
    let (order, unbroken, last, job) = cut_race(&waits, TOKENS, 1).await;
    assert_eq!(order, ["batch", "chat"], "priorities: the question waits");
    assert_eq!(unbroken.split_whitespace().count(), TOKENS as usize);
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], TOKENS, "{last}");
    assert!(record(&waits, 0, &job).await.resumed.is_empty());
    waits.stop().await;

    let cuts = serial_batch_node(true, TOKENS).await;
    let (order, answer, last, job) = cut_race(&cuts, TOKENS, 3).await;
    assert_eq!(
        order,
        ["chat", "chat", "chat", "batch"],
        "preempt: each question cuts"
    );
    assert_eq!(answer, unbroken, "token for token");
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], TOKENS, "counts summed: {last}");
    let moved = &last["x_pair"]["resumed"];
    assert_eq!(moved.as_array().map(Vec::len), Some(3), "{last}");
    assert!(moved[0]["at_token"].as_u64().unwrap() > 0, "{last}");
    let rec = record(&cuts, 0, &job).await;
    assert_eq!(rec.status, JobStatus::Completed, "{rec:?}");
    assert_eq!(rec.resumed.len(), 3, "{rec:?}");
    assert!(
        rec.resumed.iter().all(|m| m.node == cuts.nodes[0].id),
        "back on the node it was cut on: {rec:?}"
    );
    cuts.stop().await;
}

/// Two one-slot nodes holding requests at the cluster (`--queue sjf`),
/// each told of the other's load only every 4 s. Node 1's slot is taken
/// by its own client just after it reported, node 0's by another long
/// answer: node 0's view still shows node 1 free. A question at node 0
/// goes there and node 1, reading its engine live, refuses it before the
/// engine sees it (`slots-full`); node 0 holds it at the cluster again,
/// with node 1 full until it reports, and it runs on node 0 when node 0's
/// slot frees, instead of queuing behind node 1's long answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_takes_a_held_request_only_into_a_free_slot() {
    let c = cluster(2, |s| {
        s.time_scale = 0.25;
        for n in &mut s.nodes {
            n.slots = Some(1);
        }
        s.queue = Some(Order::ShortestFirst);
        s.gossip.interval = Duration::from_secs(4);
        s.gossip.suspect_after = Duration::from_secs(15);
        s.gossip.dead_after = Duration::from_secs(20);
    })
    .await
    .unwrap();
    pair_testkit::cluster::warm(&c, "llama3.2:3b").await;
    let (node0, node1) = (c.nodes[0].id, c.nodes[1].id);
    // Just after node 1's report reaches node 0: the next is 4 s away.
    let seen = |c: &LocalCluster| {
        c.nodes[0]
            .state
            .cluster()
            .node(node1)
            .map(|n| n.reported_at_ms)
    };
    let before = seen(&c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen(&c) == before {
        assert!(Instant::now() < deadline, "node 1 never reported");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let long1 = pinned(c.nodes[1].ollama_url(), node1, 4_000);
    let long0 = pinned(c.nodes[0].ollama_url(), node0, 300);
    holding(&c, 0, 1).await;
    holding(&c, 1, 1).await;
    let view = c.nodes[0].state.cluster();
    assert_eq!(
        view.node(node1).map(|n| n.workload.pending()),
        Some(0),
        "node 0's view of node 1 is a report old"
    );
    let r = ask(&c.nodes[0].ollama_url()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        pair_testkit::cluster::served_by(&r),
        Some(node0.to_string()),
        "it ran on node 0 once its slot freed"
    );
    let job = job_of(&r);
    assert_eq!(long0.await.unwrap().unwrap(), 200);
    assert!(!long1.is_finished(), "before node 1's long answer ended");
    let refused = failovers(&c, 0, "slots-full");
    assert!(refused >= 1, "node 1 refused it: {refused}");
    let rec = record(&c, 0, &job).await;
    assert_eq!(rec.ran_on, Some(node0));
    assert_eq!(
        rec.waited.map(|w| w.why),
        Some(WaitReason::ClusterQueue),
        "{rec:#?}"
    );
    long1.abort();
    c.stop().await;
}

/// Three one-slot nodes with preemption. Node 0 and node 2 run long
/// interactive answers; a streamed batch answer from node 0's client runs
/// on node 1. A question at node 2 has nothing of its own to cut: node 0
/// refuses it (no batch work there), node 1 cuts the batch answer it
/// serves for node 0 and takes it. The question ends first; node 0
/// continues the batch answer once a slot frees, and its client's stream
/// is unbroken, every token counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_work_cuts_batch_work_a_peer_serves_for_another_node() {
    const TOKENS: u32 = 1_500;
    let c = cluster(3, |s| {
        s.time_scale = 0.25;
        for n in &mut s.nodes {
            n.slots = Some(1);
        }
        s.queue = Some(Order::Priorities);
        s.preempt = true;
        s.engine_seed = Some(7);
    })
    .await
    .unwrap();
    pair_testkit::cluster::warm(&c, "llama3.2:3b").await;
    // Node 0 learns how long its client's batch answers run.
    let warm = batch_chat(&c, TOKENS).await;
    assert_eq!(warm.status(), 200);
    warm.text().await.unwrap();
    let ids: Vec<pair_core::NodeId> = c.nodes.iter().map(|n| n.id).collect();
    let long = |k: usize| pinned(c.nodes[k].ollama_url(), ids[k], 3 * TOKENS);
    let (long0, long2) = (long(0), long(2));
    holding(&c, 0, 1).await;
    holding(&c, 2, 1).await;
    // Every node's view shows both taken.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let resp = batch_chat(&c, TOKENS).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        pair_testkit::cluster::served_by(&resp),
        Some(ids[1].to_string()),
        "the batch answer took node 1's free slot"
    );
    let job = job_of(&resp);
    let ended = Ended::default();
    let batch = read_batch(resp, &ended);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = ask(&c.nodes[2].ollama_url()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        pair_testkit::cluster::served_by(&r),
        Some(ids[1].to_string()),
        "the question took the slot node 1 cut free (nodes {ids:?})"
    );
    ended.lock().unwrap().push("chat");
    let (answer, last) = chat_stream(&batch.await.unwrap());
    assert_eq!(*ended.lock().unwrap(), ["chat", "batch"]);
    assert_eq!(answer.split_whitespace().count(), TOKENS as usize);
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], TOKENS, "counts summed: {last}");
    let rec = record(&c, 0, &job).await;
    assert_eq!(rec.status, JobStatus::Completed, "{rec:?}");
    assert!(!rec.resumed.is_empty(), "it moved: {rec:?}");
    long0.abort();
    long2.abort();
    c.stop().await;
}

/// With preemption, interactive work cuts batch work still prefilling
/// (before its first byte, where the simulator cuts first: it throws away
/// the least work). A laptop's one slot takes a batch chat with a long
/// prompt; a question arriving while it prefills cuts it. The batch
/// request waits at the cluster again (its first attempt failed as
/// `preempted`), runs once the question is done, and its client gets the
/// whole answer, unbroken: nothing had streamed, so nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_work_cuts_batch_work_before_its_first_byte() {
    const TOKENS: u32 = 40;
    let c = serial_batch_node_on("laptop", true, TOKENS).await;
    // About 3,000 prompt tokens: seconds of prefill on a laptop.
    let long = "the river runs past the mill and on to the sea ".repeat(300);
    let request = batch_chat_to(&c.nodes[0].ollama_url(), &long, TOKENS);
    let ended = Ended::default();
    let batch = {
        let ended = std::sync::Arc::clone(&ended);
        tokio::spawn(async move {
            let resp = request.send().await.unwrap();
            let status = resp.status().as_u16();
            let job = job_of(&resp);
            let text = resp.text().await.unwrap();
            ended.lock().unwrap().push("batch");
            (status, job, text)
        })
    };
    holding(&c, 0, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = generate(&url(&c), "a quick question", 4).await;
    assert_eq!(status, 200);
    ended.lock().unwrap().push("chat");
    let (status, job, text) = batch.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        *ended.lock().unwrap(),
        ["chat", "batch"],
        "the question cut it"
    );
    let (answer, last) = chat_stream(&text);
    assert_eq!(answer.split_whitespace().count(), TOKENS as usize);
    assert_eq!(last["eval_count"], TOKENS, "{last}");
    let rec = record(&c, 0, &job).await;
    assert_eq!(rec.status, JobStatus::Completed, "{rec:?}");
    assert!(rec.resumed.is_empty(), "cut before its first byte: {rec:?}");
    let cut = failovers(&c, 0, "preempted");
    assert_eq!(cut, 1, "its first attempt was cut");
    assert_eq!(
        rec.waited.map(|w| w.why),
        Some(WaitReason::ClusterQueue),
        "{rec:#?}"
    );
    c.stop().await;
}
