//! Failover where most home clusters live: one or two nodes, engines that
//! are briefly busy, owners that go away and come back, answers that are
//! slow but alive. Real nodes, real sockets; the emulated engine's hit
//! counts say how often each was asked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use pair_core::JobStatus;
use pair_emulator::{EmulatedEngine, FaultAction, FaultRule};
use pair_testkit::cluster::LocalCluster;
use pair_testkit::cluster::{attempts, cluster, http, job_of, record};
use serde_json::{Value, json};

const MODEL: &str = "llama3.2:3b";

fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "stream": stream})
}

async fn send(c: &LocalCluster, body: &Value) -> reqwest::Response {
    http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .json(body)
        .send()
        .await
        .expect("face answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_owner_s_refusals_are_retried_on_it_with_backoff() {
    let c = cluster(1, |_| {}).await.unwrap();
    let e = &c.engines[0];
    e.faults()
        .add(FaultRule::for_model(MODEL, FaultAction::Status(503)).times(2));
    let resp = send(&c, &chat(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&resp), Some(3));
    assert_eq!(e.hits_for_model(MODEL), 3);

    // A 429 says when to come back (the emulator's says 1 s): the retry
    // waits for it.
    e.reset_hits();
    e.faults()
        .add(FaultRule::for_model(MODEL, FaultAction::Status(429)).times(1));
    let t = Instant::now();
    let resp = send(&c, &chat(true)).await;
    assert_eq!(resp.status(), 200);
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(attempts(&resp), Some(2));
    assert_eq!(e.hits_for_model(MODEL), 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_engine_s_own_answer_reaches_the_client_with_its_retry_after() {
    let c = cluster(1, |_| {}).await.unwrap();
    let e = &c.engines[0];
    e.faults().fail(Some(MODEL), 429, None);
    let resp = send(&c, &chat(false)).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert!(resp.headers().contains_key("x-pair-node"), "the receipt");
    let n = attempts(&resp).unwrap();
    assert!((2..=5).contains(&n), "{n}");
    assert_eq!(e.hits_for_model(MODEL), u64::from(n));
    let job = job_of(&resp);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"].is_string(), "the engine's own body: {body}");
    let r = record(&c, 0, &job).await;
    assert_eq!(
        (r.status, r.http_status, r.attempts),
        (JobStatus::Failed, Some(429), u8::try_from(n).unwrap())
    );
    c.stop().await;
}

/// Kills node 0's engine; returns what restarts it on the same port.
async fn kill_engine(
    c: &mut LocalCluster,
) -> (std::net::SocketAddr, pair_emulator::EmulatorConfig) {
    let e = c.engines.remove(0);
    let (addr, cfg) = (e.addr(), e.config().clone());
    e.shutdown().await;
    (addr, cfg)
}

async fn engine_healthy(c: &LocalCluster, healthy: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.nodes[0]
        .state
        .cluster()
        .node(c.nodes[0].id)
        .is_none_or(|n| n.engines.iter().any(|e| e.healthy != healthy))
    {
        assert!(Instant::now() < deadline, "engine never healthy={healthy}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_only_owner_to_come_back() {
    let mut c = cluster(1, |s| s.first_byte_timeout = Duration::from_secs(20))
        .await
        .unwrap();
    let (addr, cfg) = kill_engine(&mut c).await;
    let url = format!("{}/api/chat", c.nodes[0].ollama_url());
    let pending = tokio::spawn(async move { http().post(url).json(&chat(false)).send().await });
    engine_healthy(&c, false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pending.is_finished(), "the request did not wait");
    let back =
        EmulatedEngine::spawn(cfg, tokio::net::TcpListener::bind(addr).await.unwrap()).unwrap();
    let resp = pending.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    assert!(attempts(&resp).unwrap() >= 2);
    assert_eq!(back.hits_for_model(MODEL), 1);
    back.shutdown().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_never_comes_back_gives_503_saying_so() {
    let mut c = cluster(1, |s| s.first_byte_timeout = Duration::from_secs(3))
        .await
        .unwrap();
    kill_engine(&mut c).await;
    let t = Instant::now();
    let resp = http()
        .post(format!("{}/v1/chat/completions", c.nodes[0].openai_url()))
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    // It waited (most of) its deadline, not failing at once.
    assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "no_owner_up", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(MODEL),
        "{body}"
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_is_not_cut_while_the_engine_works() {
    // One slot, a one-second floor: the second request waits behind the
    // first for longer than the floor, while the engine streams the first.
    let c = cluster(1, |s| {
        s.first_byte_timeout = Duration::from_secs(1);
        s.time_scale = 1.0;
        s.nodes[0].slots = Some(1);
        s.nodes[0].profile = "cpu".into();
    })
    .await
    .unwrap();
    let long = json!({"model": MODEL, "prompt": "a long answer", "stream": true,
        "options": {"num_predict": 60}});
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let first = http().post(&url).json(&long).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let drain = tokio::spawn(async move {
        let mut s = first.bytes_stream();
        while let Some(chunk) = s.next().await {
            chunk.unwrap();
        }
    });
    let t = Instant::now();
    let second = http()
        .post(&url)
        .json(&json!({"model": MODEL, "prompt": "hi", "stream": false,
            "options": {"num_predict": 4}}))
        .send()
        .await
        .unwrap();
    let waited = t.elapsed();
    assert_eq!(second.status(), 200);
    assert_eq!(attempts(&second), Some(1), "never cut and resent");
    assert!(
        waited > Duration::from_secs(1),
        "the test needs a wait past the floor: {waited:?}"
    );
    drain.await.unwrap();
    assert_eq!(c.engines[0].hits_for_model(MODEL), 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_head_leaves_a_cancelled_record() {
    let c = cluster(1, |_| {}).await.unwrap();
    c.engines[0]
        .faults()
        .slow_first_byte(Some(MODEL), Duration::from_secs(3));
    let before = c.nodes[0].state.jobs.len();
    let gone = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .json(&chat(false))
        .send()
        .await;
    assert!(gone.is_err());
    let deadline = Instant::now() + Duration::from_secs(10);
    let rec = loop {
        let recent = c.nodes[0].state.jobs.recent(10);
        if recent.len() > before {
            break recent[0].clone();
        }
        assert!(Instant::now() < deadline, "no record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rec.status, JobStatus::Cancelled, "{rec:?}");
    assert!(rec.error.unwrap().contains("went away"));
    c.stop().await;
}

/// A whole answer whose client resets after its head (it reads a little,
/// then closes with RST while the rest is still being written) is recorded
/// as what the client got: cancelled, not completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_the_client_reset_during_is_recorded_cancelled() {
    let c = cluster(1, |spec| spec.time_scale = 0.0002).await.unwrap();
    let addr = c.nodes[0]
        .ollama_url()
        .trim_start_matches("http://")
        .to_owned();
    // About 6 MB of answer, more than loopback's socket buffers hold for a
    // reader whose window is 4 KiB.
    reset_after_the_head(&addr, "").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let rec = loop {
        if let Some(r) = c.nodes[0].state.jobs.recent(1).first()
            && r.status.is_terminal()
        {
            break r.clone();
        }
        assert!(Instant::now() < deadline, "no record");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rec.http_status, Some(200), "{rec:?}");
    assert_eq!(rec.status, JobStatus::Cancelled, "{rec:?}");
    c.stop().await;
}

/// A relayed stream cut mid-way: the node that ran it records its part
/// failed; the origin moved the answer to its own engine and records it
/// completed, naming both nodes. With `--resume off` both record it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_stream_cut_mid_way_is_recorded_on_both_nodes() {
    for resume in [true, false] {
        let c = cluster(2, |spec| {
            if !resume {
                spec.resume = pair_proxy::resume::ResumePolicy::OFF;
            }
        })
        .await
        .unwrap();
        c.engines[1].faults().close_after_chunks(Some(MODEL), 3);
        let resp = http()
            .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", c.nodes[1].id.to_string())
            .json(&chat(true))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let job = job_of(&resp);
        let text = resp.text().await.unwrap();
        assert_eq!(
            text.contains("\"error\""),
            !resume,
            "resume {resume}: {text}"
        );
        let runner = record(&c, 1, &job).await;
        let origin = record(&c, 0, &job).await;
        for r in [&runner, &origin] {
            assert_eq!(r.ran_on, Some(c.nodes[1].id), "resume {resume}: {r:?}");
        }
        if resume {
            assert_eq!(origin.status, JobStatus::Completed, "{origin:?}");
            assert_eq!(origin.resumed.len(), 1);
            assert_eq!(origin.resumed[0].node, c.nodes[0].id);
        } else {
            assert_eq!(origin.status, JobStatus::Failed, "{origin:?}");
            assert!(origin.resumed.is_empty());
        }
        c.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_cut_mid_body_on_the_node_s_own_engine_is_retried() {
    let c = cluster(2, |_| {}).await.unwrap();
    // The first node's own engine sends a head and one chunk, then drops.
    c.engines[0]
        .faults()
        .add(FaultRule::for_model(MODEL, FaultAction::CloseAfterChunks(1)).times(1));
    let resp = http()
        .post(format!("{}/api/chat", c.nodes[0].ollama_url()))
        .header("x-pair-node-pin", c.nodes[0].id.to_string())
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(attempts(&resp), Some(2));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["done"], true, "a complete answer: {body}");
    c.stop().await;
}

/// Requests that arrive at once on a node's two faces spread evenly over
/// equal idle nodes: 100 rounds of 2 + 2 (Ollama and OpenAI faces) over
/// two nodes come out 2/2, under the default policy and as the nodes
/// learn their speeds from these very jobs (whole answers, which teach no
/// decode speed nor stream overlap). The counting underneath (this node's
/// own load read live, its reservations on the peer, the peer's reports,
/// which cover a reservation only once they say they counted its request)
/// is checked over every interleaving in `pair-scheduler`'s
/// `tests/spread.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_requests_on_both_faces_spread_two_and_two() {
    let c = cluster(2, |s| {
        for n in &mut s.nodes {
            n.profile = "rtx4090".into();
        }
        // Answers of about a quarter second: the four of a round overlap
        // even when a loaded machine spreads their arrival.
        s.time_scale = 0.5;
    })
    .await
    .unwrap();
    pair_testkit::cluster::warm(&c, MODEL).await;
    let me = c.nodes[0].id.to_string();
    let mut uneven = Vec::new();
    for round in 0..100 {
        let ask = |i: usize| {
            let (url, body) = if i.is_multiple_of(2) {
                (
                    format!("{}/api/chat", c.nodes[0].ollama_url()),
                    json!({"model": MODEL, "messages": [{"role": "user", "content": format!("round {round}, {i}")}],
                           "stream": false, "options": {"num_predict": 150}}),
                )
            } else {
                (
                    format!("{}/v1/chat/completions", c.nodes[0].openai_url()),
                    json!({"model": MODEL, "messages": [{"role": "user", "content": format!("round {round}, {i}")}],
                           "max_tokens": 150}),
                )
            };
            async move {
                let resp = http().post(url).json(&body).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                pair_testkit::cluster::served_by(&resp)
            }
        };
        let got = tokio::join!(ask(0), ask(1), ask(2), ask(3));
        let here = [got.0, got.1, got.2, got.3]
            .iter()
            .filter(|n| n.as_deref() == Some(me.as_str()))
            .count();
        if here != 2 {
            uneven.push((round, here));
        }
    }
    assert!(
        uneven.is_empty(),
        "rounds not 2/2 (round, on node 0): {uneven:?}"
    );
    c.stop().await;
}

/// The same reset behind the relay: the origin records what its client
/// got (cancelled), and the node that ran it, which handed the whole
/// answer over, ends with the origin's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_whole_answer_the_client_reset_during_is_cancelled_everywhere() {
    let c = cluster(2, |spec| spec.time_scale = 0.0002).await.unwrap();
    let addr = c.nodes[0]
        .ollama_url()
        .trim_start_matches("http://")
        .to_owned();
    reset_after_the_head(&addr, &format!("x-pair-node-pin: {}\r\n", c.nodes[1].id)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let origin = loop {
        if let Some(r) = c.nodes[0].state.jobs.recent(1).first()
            && r.status.is_terminal()
        {
            break r.clone();
        }
        assert!(Instant::now() < deadline, "no record on the origin");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(origin.ran_on, Some(c.nodes[1].id), "{origin:?}");
    assert_eq!(origin.status, JobStatus::Cancelled, "{origin:?}");
    // The node that ran it takes the origin's record.
    loop {
        if let Some(r) = c.nodes[1].state.jobs.get(origin.id)
            && r.status == JobStatus::Cancelled
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the runner's record: {:?}",
            c.nodes[1].state.jobs.get(origin.id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.stop().await;
}

/// Asks `addr` for about 6 MB of whole answer (more than loopback's socket
/// buffers hold for a reader whose window is 4 KiB), with `extra` header
/// lines, reads the 200 head, then resets the connection.
async fn reset_after_the_head(addr: &str, extra: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "long"}],
                      "stream": false, "options": {"num_predict": 700_000}})
    .to_string();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(addr.parse().unwrap()).await.unwrap();
    tcp.write_all(
        format!(
            "POST /api/chat HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = [0u8; 64];
    let n = tcp.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );
    tcp.set_zero_linger().unwrap();
    drop(tcp);
}
