//! Cluster behaviour on real nodes over loopback: merged listings, route
//! spreading under concurrency, and the mTLS gate (unpaired peers refused,
//! unpairing closes open connections), session affinity through a face.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::collections::HashSet;
use std::time::{Duration, Instant};

use pair_core::Role;
use pair_testkit::cluster::{cluster, http, served_by};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn get_json(url: String) -> Value {
    http().get(url).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_are_merged_across_the_cluster_in_each_envelope() {
    let c = cluster(3, |s| s.nodes[2].models.push("phi3:mini".into()))
        .await
        .unwrap();
    let tags = get_json(format!("{}/api/tags", c.nodes[0].ollama_url())).await;
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"phi3:mini"),
        "a peer's model is listed: {names:?}"
    );
    assert!(names.contains(&"qwen2.5:7b"));
    let llama = names.iter().filter(|n| n.starts_with("llama3.2")).count();
    assert_eq!(llama, 1, "held by three nodes, listed once: {names:?}");
    assert!(
        tags["models"][0]["size"].as_u64().is_some(),
        "engine's own entries"
    );

    let models = get_json(format!("{}/v1/models", c.nodes[0].openai_url())).await;
    assert_eq!(models["object"], "list");
    let ids: HashSet<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains("phi3:mini") && ids.contains("llama3.2:3b"),
        "{ids:?}"
    );

    // A model held only by node 3 is served from node 1's face.
    let resp = http()
        .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
        .json(&json!({"model": "phi3:mini", "prompt": "hi", "stream": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(served_by(&resp), Some(c.nodes[2].id.to_string()));
    c.stop().await;
}

/// `n` nodes on the same hardware (rtx3060) with `llama3.2:3b` loaded
/// everywhere and node 0's view settled.
async fn identical_warm_cluster(n: usize, time_scale: f64) -> pair_testkit::cluster::LocalCluster {
    warm_cluster(&vec!["rtx3060"; n], time_scale).await
}

/// A cluster of one node per hardware profile in `profiles`, the model
/// loaded everywhere.
async fn warm_cluster(profiles: &[&str], time_scale: f64) -> pair_testkit::cluster::LocalCluster {
    let c = cluster(profiles.len(), |s| {
        s.time_scale = time_scale;
        for (node, profile) in s.nodes.iter_mut().zip(profiles) {
            node.profile = (*profile).into();
        }
    })
    .await
    .unwrap();
    warm_everywhere(&c, "llama3.2:3b").await;
    c
}

/// Loads `model` on every node (requests pinned to each) and waits until
/// node 0's cluster view (peer reports arrive every gossip interval) shows
/// it loaded and idle everywhere, so cold loads and stale views do not
/// decide what a test measures.
async fn warm_everywhere(c: &pair_testkit::cluster::LocalCluster, model: &str) {
    pair_testkit::cluster::warm(c, model).await;
    wait_settled(c, model).await;
}

/// The id of a node of `c` other than `id`.
fn another_node(c: &pair_testkit::cluster::LocalCluster, id: &str) -> String {
    c.nodes
        .iter()
        .map(|n| n.id.to_string())
        .find(|n| n != id)
        .unwrap()
}

/// Waits until node 0's cluster view shows `model` learned on every node.
async fn wait_learned(c: &pair_testkit::cluster::LocalCluster, model: &str) {
    wait_view(c, model, "every node's speed learned", |_, m| {
        m["learned"] == true
    })
    .await;
}

/// Waits (10 s at most) until node 0's cluster view (peer reports and its
/// own snapshot arrive every gossip interval) shows every node with an
/// entry for `model` that `holds` accepts, given the node and the entry.
async fn wait_view(
    c: &pair_testkit::cluster::LocalCluster,
    model: &str,
    what: &str,
    holds: impl Fn(&Value, &Value) -> bool,
) {
    let view = format!("{}/_pair/cluster", c.nodes[0].ollama_url());
    for _ in 0..100 {
        let v = get_json(view.clone()).await;
        let nodes = v["snapshot"]["nodes"].as_array().unwrap();
        let seen = nodes.len() == c.nodes.len()
            && nodes.iter().all(|n| {
                n["engines"][0]["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == model && holds(n, m))
            });
        if seen {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} never reached node 0's view");
}

/// `n` streamed generate requests sent at once to node 0's face and read
/// to their end; the node each ran on.
async fn burst(c: &pair_testkit::cluster::LocalCluster, n: usize, num_predict: u32) -> Vec<String> {
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let sends = (0..n).map(|i| {
        let url = url.clone();
        async move {
            let r = http()
                .post(url)
                .json(&json!({"model": "llama3.2:3b", "prompt": format!("q{i}"),
                              "stream": true, "options": {"num_predict": num_predict}}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let who = served_by(&r).unwrap();
            assert!(r.text().await.unwrap().contains("\"done\":true"));
            who
        }
    });
    futures_util::future::join_all(sends).await
}

/// Waits until node 0's cluster view shows `model` loaded and nothing
/// running on every node.
async fn wait_settled(c: &pair_testkit::cluster::LocalCluster, model: &str) {
    wait_view(c, model, "the warm, idle state", |n, m| {
        n["workload"]["running"] == 0 && m["loaded"] == true
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_spreads_over_the_nodes() {
    // Real time, identical hardware: reservations must spread the burst.
    let c = identical_warm_cluster(3, 1.0).await;
    let served = burst(&c, 9, 64).await;
    let mut per_node = std::collections::HashMap::new();
    for s in &served {
        *per_node.entry(s.clone()).or_insert(0) += 1;
    }
    assert_eq!(
        per_node.len(),
        3,
        "all three nodes served part of the burst: {per_node:?}"
    );
    assert!(per_node.values().all(|&n| n <= 5), "{per_node:?}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaired_peers_are_refused_and_unpairing_closes_connections() {
    let c = cluster(2, |_| {}).await.unwrap();
    let server = &c.nodes[0];
    let peer = &c.nodes[1];

    // A stranger with its own identity, trusting the server's certificate:
    // the server refuses its certificate during the handshake.
    let stranger = pair_identity::Identity::generate(Role::Node).unwrap();
    let stranger_trust = pair_identity::TrustStore::in_memory();
    stranger_trust
        .insert(peer.trust.get(server.id).unwrap())
        .unwrap();
    let connector =
        pair_identity::tls::tls_connector(&stranger, &stranger_trust, server.id).unwrap();
    let refused = async {
        let tcp = tokio::net::TcpStream::connect(server.cluster_addr).await?;
        let mut tls = connector
            .connect(pair_identity::tls::server_name(), tcp)
            .await?;
        // TLS 1.3: a refused client certificate surfaces on first use.
        tls.write_all(b"GET /pair/v1/report HTTP/1.1\r\nhost: x\r\n\r\n")
            .await?;
        let mut buf = [0u8; 64];
        let n = tls.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "closed without an answer");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    assert!(refused.is_err(), "an unpaired identity must not get in");

    // The paired peer gets in and is answered over mTLS...
    let connector =
        pair_identity::tls::tls_connector(&peer.identity, &peer.trust, server.id).unwrap();
    let tcp = tokio::net::TcpStream::connect(server.cluster_addr)
        .await
        .unwrap();
    let mut tls = connector
        .connect(pair_identity::tls::server_name(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /pair/v1/relay/api/tags HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tls.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    // ...until the server unpairs it: the open connection is closed...
    server.trust.remove(peer.id).unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the unpaired peer's connection was not closed"
    );

    // ...and new handshakes fail.
    let tcp = tokio::net::TcpStream::connect(server.cluster_addr)
        .await
        .unwrap();
    let again = async {
        let mut tls = connector
            .connect(pair_identity::tls::server_name(), tcp)
            .await?;
        tls.write_all(b"GET /pair/v1/relay/api/tags HTTP/1.1\r\nhost: x\r\n\r\n")
            .await?;
        let n = tls.read(&mut buf).await?;
        anyhow::ensure!(n > 0, "closed");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    assert!(again.is_err(), "an unpaired peer must not get back in");

    // And the server stops routing to it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(server.state.cluster().node(peer.id).is_none());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_stream_finish() {
    let mut c = cluster(1, |s| {
        s.time_scale = 1.0;
        s.nodes[0].profile = "laptop".into();
    })
    .await
    .unwrap();
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let mut resp = http()
        .post(url)
        .json(
            &json!({"model": "llama3.2:3b", "prompt": "long", "stream": true,
                      "options": {"num_predict": 60}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    // Stop the node while the answer is still streaming.
    let node = c.nodes.remove(0);
    let stopping = tokio::spawn(node.stop());
    let mut rest = Vec::from(first.as_ref());
    while let Some(chunk) = resp.chunk().await.unwrap() {
        rest.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(rest).unwrap();
    let last: Value = serde_json::from_str(text.trim_end().lines().last().unwrap()).unwrap();
    assert_eq!(last["done"], true, "the stream finished: {text}");
    assert_eq!(text.lines().count(), 61, "60 tokens and the final line");
    stopping.await.unwrap();
    c.stop().await;
}

/// A requester-only identity (role `client`, what the edge SDK will use)
/// pairs through the real PIN protocol, relays inference over mTLS and gets
/// an answer, yet never appears in any node's routing view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paired_client_relays_but_is_never_scheduled() {
    let c = cluster(2, |_| {}).await.unwrap();
    let server = &c.nodes[0];
    let invite: Value = http()
        .post(format!("{}/_pair/invite", server.ollama_url()))
        .header("authorization", server.control_token.bearer())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pin: pair_identity::Pin = invite["pin"].as_str().unwrap().parse().unwrap();
    let client = pair_identity::Identity::generate(Role::Client).unwrap();
    let client_trust = pair_identity::TrustStore::in_memory();
    let record = pair_identity::join(
        &server.cluster_addr.to_string(),
        &pin,
        &client,
        &client_trust,
        "edge-app",
    )
    .await
    .unwrap();
    assert_eq!(record.id, server.id);
    let seen = server.trust.get(client.id()).unwrap();
    assert_eq!(seen.role, Role::Client, "the node recorded the client role");

    // A relayed generate over mTLS with the client's certificate.
    let connector = pair_identity::tls::tls_connector(&client, &client_trust, server.id).unwrap();
    let post = |path: &'static str, body: String| {
        let connector = connector.clone();
        let addr = server.cluster_addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut tls = connector
                .connect(pair_identity::tls::server_name(), tcp)
                .await
                .unwrap();
            let req = format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            tls.write_all(req.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            tokio::time::timeout(Duration::from_secs(20), tls.read_to_end(&mut answer))
                .await
                .unwrap()
                .ok();
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    let answer = post(
        "/pair/v1/relay/api/generate",
        r#"{"model":"llama3.2:3b","prompt":"hi","stream":false}"#.into(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"response\""), "{answer}");
    assert_eq!(
        server
            .state
            .metrics
            .encode()
            .lines()
            .find(|l| l.starts_with("pair_relayed_in_total"))
            .unwrap(),
        "pair_relayed_in_total 1"
    );

    // It cannot make itself a routing target: a workload report in its own
    // name (a real node's snapshot, re-labelled) and job records are refused.
    let mut fake = server.state.cluster().node(c.nodes[1].id).unwrap().clone();
    fake.id = client.id();
    let refused = post(
        "/pair/v1/report?port=1",
        serde_json::to_string(&fake).unwrap(),
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    let refused = post("/pair/v1/jobs", "[]".into()).await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");

    // Never a routing target, on the node it paired with or elsewhere.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for n in &c.nodes {
        assert!(n.state.cluster().node(client.id()).is_none());
        assert!(n.state.peer(client.id()).is_none());
    }
    c.stop().await;
}

/// Requests sent one after another through node 0, each the moment the
/// last answered, all go to the fastest node, here the local one. Its own
/// workload is read live: the cluster view's copy is refreshed once per
/// gossip interval and would still show the request that just finished,
/// which on a one-slot engine looks like a queue and would send the next
/// request to a slower node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_stay_on_the_idle_fastest_node() {
    back_to_back(&["rtx4090", "rtx3060", "rtx3060"], 0).await;
}

/// The same when the fastest node is a peer: its report, made while the
/// last request ran there, counts that request until the next report, so
/// the router credits back the requests it saw finish after a report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_requests_stay_on_the_idle_fastest_peer() {
    back_to_back(&["rtx3060", "rtx4090", "rtx3060"], 1).await;
}

async fn back_to_back(profiles: &[&str], fastest: usize) {
    // Engines report durations on their own clock: at a quarter of real
    // time the nodes' speeds stay far enough apart on the wall clock that
    // milliseconds of scheduling noise cannot reorder them.
    let c = warm_cluster(profiles, 0.25).await;
    // Every node learns its speed first (a node nothing is learned about
    // is tried when idle: exploration, not what this test is about).
    for node in &c.nodes {
        let r = http()
            .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", node.id.to_string())
            .json(
                &json!({"model": "llama3.2:3b", "prompt": "teach me ".repeat(200),
                          "stream": true, "options": {"num_predict": 16}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap();
    }
    wait_learned(&c, "llama3.2:3b").await;
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let fastest = c.nodes[fastest].id.to_string();
    let started = Instant::now();
    let mut served = Vec::new();
    // Long enough to span several gossip intervals.
    while served.len() < 20 || started.elapsed() < Duration::from_secs(2) {
        let r = http()
            .post(&url)
            .json(
                &json!({"model": "llama3.2:3b", "prompt": "next", "stream": false,
                          "options": {"num_predict": 4}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        served.push(served_by(&r).unwrap());
    }
    let elsewhere = served.iter().filter(|n| **n != fastest).count();
    assert_eq!(
        elsewhere,
        0,
        "{elsewhere} of {} requests left the idle fastest node",
        served.len()
    );
    c.stop().await;
}

/// `x-pair-session` through a face: once a conversation has run on a node,
/// its next turns go back there (its KV cache is warm), while requests
/// without the header keep going where the scheduler ranks best. One node
/// is clearly the fastest, so that pick is one node by a wide margin
/// rather than a tie-break among identical ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_to_the_node_it_ran_on() {
    let c = warm_cluster(&["rtx4090", "rtx3060", "rtx3060"], 0.05).await;
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let ask = |session: Option<&'static str>, pin: Option<String>| {
        let url = url.clone();
        async move {
            let mut req = http().post(url).json(
                &json!({"model": "llama3.2:3b", "prompt": "turn", "stream": false,
                        "options": {"num_predict": 4}}),
            );
            if let Some(s) = session {
                req = req.header("x-pair-session", s);
            }
            if let Some(p) = pin {
                req = req.header("x-pair-node-pin", p);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            served_by(&r).unwrap()
        }
    };
    // Where requests go on their own (the scheduler's pick on this idle
    // cluster), then a conversation whose first turn ran elsewhere.
    let usual = ask(None, None).await;
    let elsewhere = another_node(&c, &usual);
    assert_eq!(
        ask(Some("conv-1"), Some(elsewhere.clone())).await,
        elsewhere
    );
    for turn in 0..4 {
        assert_eq!(
            ask(Some("conv-1"), None).await,
            elsewhere,
            "turn {turn} of the session left its node"
        );
        // Peers' reports reach node 0 once per gossip interval (the turn
        // just finished is credited off its node's report meanwhile): wait
        // for a view in which every node reports idle, so the scheduler's
        // pick is compared with like.
        wait_settled(&c, "llama3.2:3b").await;
        assert_eq!(
            ask(None, None).await,
            usual,
            "a request without a session followed the session"
        );
    }
    c.stop().await;
}

/// The same without any header, as an unmodified chat app sends it: every
/// turn re-sends the conversation from its start, and a later turn goes
/// where the first one ran; a new conversation is routed on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_sticks_to_its_node_without_a_header() {
    let c = warm_cluster(&["rtx4090", "rtx3060", "rtx3060"], 0.05).await;
    // Until every node's speed is learned, a request may be sent to learn
    // one: the scheduler's usual pick is only known after.
    wait_learned(&c, "llama3.2:3b").await;
    let urls: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("{}/api/chat", n.ollama_url()))
        .collect();
    let ask_at = |entry: usize, messages: Vec<Value>, pin: Option<String>| {
        let url = urls[entry].clone();
        async move {
            let mut req = http().post(url).json(&json!({"model": "llama3.2:3b",
                "messages": messages, "stream": false, "options": {"num_predict": 4}}));
            if let Some(p) = pin {
                req = req.header("x-pair-node-pin", p);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let node = served_by(&r).unwrap();
            let v: Value = r.json().await.unwrap();
            (node, v["message"].clone())
        }
    };
    let ask = |messages: Vec<Value>, pin: Option<String>| ask_at(0, messages, pin);
    let user = |text: &str| json!({"role": "user", "content": text});
    let (usual, _) = ask(vec![user("where do requests go?")], None).await;
    let elsewhere = another_node(&c, &usual);
    // The first turn of a chat runs elsewhere (pinned there).
    let mut chat = vec![user("plan a trip to Oslo")];
    let (first, answer) = ask(chat.clone(), Some(elsewhere.clone())).await;
    assert_eq!(first, elsewhere);
    chat.push(answer);
    for turn in 0..4 {
        chat.push(user(&format!("and day {turn}?")));
        let (node, answer) = ask(chat.clone(), None).await;
        assert_eq!(node, elsewhere, "turn {turn} left the conversation's node");
        chat.push(answer);
        wait_settled(&c, "llama3.2:3b").await;
        // A new conversation is routed on its own.
        let (node, _) = ask(vec![user(&format!("another chat {turn}"))], None).await;
        assert_eq!(node, usual, "a new conversation followed the old one");
        wait_settled(&c, "llama3.2:3b").await;
    }
    // A later turn that enters at another node follows the conversation
    // too: node 0's report says where it sent it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for entry in [1, 2] {
        chat.push(user(&format!("asked at node {entry}")));
        let (node, answer) = ask_at(entry, chat.clone(), None).await;
        assert_eq!(node, elsewhere, "a turn entering at node {entry} lost it");
        chat.push(answer);
        wait_settled(&c, "llama3.2:3b").await;
    }
    // Even one that opens with the same words: only later turns follow.
    let (node, _) = ask(vec![user("plan a trip to Oslo")], None).await;
    assert_eq!(node, usual, "a first turn followed another chat's binding");
    c.stop().await;
}

/// A client that uploads a body over the 32 MiB cap, and reads only once
/// it has sent it all (as the Python SDKs do), gets the 413 in the face's
/// own error shape, not a reset: with a declared length (the face's own
/// HTTP/1.1 path) and chunked (the path hyper serves). A client that asks
/// first (`Expect: 100-continue`, curl's way over 1 MiB) is refused at
/// once, without being told to send the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_upload_gets_its_413_not_a_reset() {
    let c = cluster(1, |_| {}).await.unwrap();
    let addr = c.nodes[0]
        .ollama_url()
        .trim_start_matches("http://")
        .to_owned();
    let body = vec![b' '; 33 << 20];
    // HTTP/1.0 (no chunked framing, no 100-continue) is served by hyper,
    // like the chunked upload.
    for (version, chunked, expect) in [
        ("1.1", false, false),
        ("1.1", true, false),
        ("1.1", false, true),
        ("1.0", false, false),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let framing = if chunked {
            "transfer-encoding: chunked".to_owned()
        } else {
            format!("content-length: {}", body.len())
        };
        // curl asks before sending a body over 1 MiB.
        let ask = if expect {
            "expect: 100-continue\r\n"
        } else {
            ""
        };
        let head =
            format!("POST /api/chat HTTP/{version}\r\nhost: {addr}\r\n{ask}{framing}\r\n\r\n");
        tcp.write_all(head.as_bytes()).await.unwrap();
        // Asked first, the node refuses at once: no 100, no body sent.
        if !expect {
            if chunked {
                for piece in body.chunks(1 << 20) {
                    let size = format!("{:x}\r\n", piece.len());
                    tcp.write_all(size.as_bytes())
                        .await
                        .expect("chunk size taken");
                    tcp.write_all(piece).await.expect("chunk taken");
                    tcp.write_all(b"\r\n").await.expect("chunk end taken");
                }
                tcp.write_all(b"0\r\n\r\n").await.expect("last chunk taken");
            } else {
                tcp.write_all(&body).await.expect("the whole body is taken");
            }
        }
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got))
            .await
            .expect("the node closes the connection")
            .expect("no reset");
        let got = String::from_utf8_lossy(&got);
        let case = format!("HTTP/{version} chunked={chunked} expect={expect}");
        assert!(
            got.starts_with("HTTP/1.") && got.get(8..12) == Some(" 413"),
            "{case}: {got}"
        );
        let json = got.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert!(json.contains("error"), "{case}: {got}");
    }
    c.stop().await;
}

/// A peer is routed to only while its address answers as that peer: once
/// the address answers with another node's certificate, it leaves routing
/// although reports that look fresh keep coming for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_address_answers_as_another_node_is_not_routed_to() {
    let mut c = cluster(3, |s| s.mdns = pair_daemon::config::Mdns::Off)
        .await
        .unwrap();
    let b = c.nodes.remove(1);
    let b_id = b.id;
    let a = &c.nodes[0];
    let other = c.nodes[1].cluster_addr;
    let mut stale = a.state.cluster().node(b_id).unwrap().clone();
    b.stop().await;
    let started = Instant::now();
    let left = loop {
        // A report for b, as fresh as can be, naming the other node's
        // address as b's.
        stale.reported_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        a.reports.accept(stale.clone(), Some(other));
        let view = a.state.cluster();
        if view.node(b_id).is_none_or(|n| !n.liveness.is_routable()) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "b is still routable: {:?}",
            view.node(b_id).map(|n| n.liveness)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Within the dead-after window of the gossip config (2 s), plus ticks.
    assert!(left < Duration::from_secs(4), "left routing after {left:?}");
    // And requests keep going to the nodes that answer as themselves.
    for _ in 0..4 {
        let resp = http()
            .post(format!("{}/api/generate", a.ollama_url()))
            .json(&json!({"model": "llama3.2:3b", "prompt": "hi", "stream": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_ne!(served_by(&resp), Some(b_id.to_string()));
    }
    c.stop().await;
}

/// An Ollama engine says nothing of its parallelism: the node starts by
/// pricing it as one slot, and advertises more once it has seen its engine
/// stream that many answers at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_an_engine_does_not_report_are_learned_from_overlapping_answers() {
    let c = cluster(1, |s| {
        s.time_scale = 0.2;
        s.nodes[0].profile = "rtx4090".into();
        s.nodes[0].slots = Some(3);
    })
    .await
    .unwrap();
    let slots = || {
        c.nodes[0]
            .state
            .cluster()
            .node(c.nodes[0].id)
            .map(|n| n.engines[0].slots)
    };
    assert_eq!(slots(), Some(1), "nothing seen yet: one slot");
    // Streamed: the first token and the end are seen apart (a whole
    // answer arrives at once and shows no overlap).
    burst(&c, 3, 400).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while slots() != Some(3) {
        assert!(
            Instant::now() < deadline,
            "slots never learned: {:?}",
            slots()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // `pair-node status` says what the cluster is told.
    let status = get_json(format!("{}/_pair/status", c.nodes[0].ollama_url())).await;
    assert_eq!(status["engines"][0]["slots"], 3, "{status}");
    c.stop().await;
}

/// A fresh cluster of a fast and a slow node that know nothing of their
/// speeds (no seed, no GPU telemetry here): whichever node the requests
/// enter at, the fast one is found within two requests and then takes at
/// least 9 of the next 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_fast_node_is_found_within_a_few_requests() {
    for entry in [0, 1] {
        let c = cluster(2, |s| {
            s.seed_perf = false;
            s.time_scale = 0.2;
            s.nodes[0].profile = "rtx3060".into();
            s.nodes[1].profile = "rtx4090".into();
        })
        .await
        .unwrap();
        let fast = c.nodes[1].id.to_string();
        let url = format!("{}/api/generate", c.nodes[entry].ollama_url());
        // A prompt long enough to teach prefill speed, streamed so decode
        // speed is seen apart from it; each one new from its first word,
        // so no engine holds it cached (a cached prompt is no lesson in
        // prefill, and is rightly sent where it is cached).
        let mut ran_on = Vec::new();
        for i in 0..12 {
            let prompt =
                format!("Question {i}. ") + &"Tell me about the history of tea. ".repeat(40);
            let r = http()
                .post(&url)
                .json(
                    &json!({"model": "llama3.2:3b", "prompt": prompt, "stream": true,
                              "options": {"num_predict": 24}}),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let node = served_by(&r).unwrap();
            r.text().await.unwrap();
            ran_on.push(node == fast);
            // Sequential requests with gaps: what was learned reaches every
            // node's view (reports every 200 ms) before the next one.
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        let later = ran_on[2..].iter().filter(|f| **f).count();
        assert!(
            later >= 9,
            "entering at node {entry}: on the fast node {ran_on:?}"
        );
        c.stop().await;
    }
}

/// The engine's own account of a job (Ollama's prompt and eval durations)
/// goes into the job record and is what speeds are learned from: a request
/// that queued behind another on a one-slot engine waited for its first
/// token far longer than the engine spent on its prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_carry_the_engines_own_durations() {
    let c = cluster(1, |s| {
        s.time_scale = 0.2;
        s.nodes[0].slots = Some(1);
    })
    .await
    .unwrap();
    burst(&c, 2, 200).await;
    let jobs = c.nodes[0].state.jobs.recent(2);
    assert_eq!(jobs.len(), 2);
    for j in &jobs {
        let engine = j.engine.expect("the engine's durations are recorded");
        assert!(
            engine.prompt_ms.is_some() && engine.decode_ms.is_some(),
            "{j:?}"
        );
        assert_eq!(j.output_tokens, Some(200), "the engine's count: {j:?}");
    }
    let queued = jobs.iter().max_by_key(|j| j.ttft_ms).unwrap();
    let waited = queued.ttft_ms.unwrap();
    let prompt = queued.engine.unwrap().prompt_ms.unwrap();
    assert!(
        waited > prompt + 100,
        "queued {waited} ms for its first token, the engine spent {prompt} ms on the prompt"
    );
    c.stop().await;
}

/// A whole answer shows its node no first token: its prompt stops counting
/// as prefill work (what peers and the node's own ranking price a new
/// prompt by) once the prediction says its first token is due, long
/// before the answer ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answers_prompt_stops_counting_once_its_first_token_is_due() {
    let c = cluster(1, |s| {
        s.time_scale = 0.5;
        s.nodes[0].profile = "rtx3060".into();
    })
    .await
    .unwrap();
    warm_everywhere(&c, "llama3.2:3b").await;
    let load = &c.nodes[0].state.load;
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    let prompt = "Tell me about the history of tea. ".repeat(200);
    let answer = tokio::spawn(async move {
        let r = http()
            .post(url)
            .json(
                &json!({"model": "llama3.2:3b", "prompt": prompt, "stream": false,
                          "options": {"num_predict": 600}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while load.in_flight() == 0 {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let counted = load.workload(1).prefill_tokens;
    assert!(
        counted > 1000,
        "the prompt counts while it prefills: {counted}"
    );
    while load.workload(1).prefill_tokens > 0 {
        assert_eq!(
            load.in_flight(),
            1,
            "the answer ended with its prompt still counted as prefill work"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        load.in_flight(),
        1,
        "the prompt stopped counting only at the end"
    );
    let body = answer.await.unwrap();
    assert!(body.contains("\"done\":true"), "{body}");
    c.stop().await;
}

/// Requests that arrive at the same instant are ranked one after the
/// other, each seeing those before it, even when the node's event loops
/// take them at once: in a burst of four over two idle nodes, the requests
/// a node got saw 0, 1, 2, ... ahead of them there (`x-pair-route`), never
/// two the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_same_instant_each_see_the_ones_before() {
    let c = identical_warm_cluster(2, 1.0).await;
    let url = format!("{}/api/generate", c.nodes[0].ollama_url());
    for round in 0..10 {
        wait_settled(&c, "llama3.2:3b").await;
        let sends = (0..4).map(|i| {
            let url = url.clone();
            async move {
                let r = http()
                    .post(url)
                    .header("x-pair-explain", "1")
                    .json(&json!({"model": "llama3.2:3b", "prompt": format!("q{i}"),
                                  "stream": true, "options": {"num_predict": 32}}))
                    .send()
                    .await
                    .unwrap();
                let who = served_by(&r).unwrap();
                let why = r.headers()["x-pair-route"].to_str().unwrap().to_owned();
                assert!(r.text().await.unwrap().contains("\"done\":true"));
                // "... [2 ahead on 4 slots; ...]"
                let ahead: u32 = why
                    .split('[')
                    .nth(1)
                    .and_then(|w| w.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("no count ahead in {why}"));
                (who, ahead)
            }
        });
        let seen = futures_util::future::join_all(sends).await;
        let mut per_node: std::collections::HashMap<String, Vec<u32>> = Default::default();
        for (who, ahead) in &seen {
            per_node.entry(who.clone()).or_default().push(*ahead);
        }
        for (node, mut aheads) in per_node {
            aheads.sort_unstable();
            let want: Vec<u32> = (0..u32::try_from(aheads.len()).unwrap()).collect();
            assert_eq!(aheads, want, "round {round}, node {node}: {seen:?}");
        }
    }
    c.stop().await;
}

/// Sub-agents of a coding agent share a long system prompt and tools and
/// differ in their task: each goes where that prefix is cached, not only
/// a conversation's later turns, and its receipt says how much of it was
/// cached. The first is pinned to a node the scheduler would not pick on
/// its own, so the test can tell a cached prefix from the scheduler's
/// usual choice; a prompt that shares nothing is credited with nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_sharing_a_system_prompt_go_where_it_is_cached() {
    let c = identical_warm_cluster(3, 0.05).await;
    wait_learned(&c, "llama3.2:3b").await;
    let urls: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("{}/v1/chat/completions", n.openai_url()))
        .collect();
    // About 12k tokens of system prompt and tools, as an agent sends them.
    let system = "You are a coding agent. Use the tools to read and edit files. ".repeat(750);
    let ask_at = |entry: usize, system: String, task: String, pin: Option<String>| {
        let url = urls[entry].clone();
        async move {
            let mut req = http().post(url).header("x-pair-explain", "1").json(&json!({
                "model": "llama3.2:3b", "max_tokens": 4,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": task}],
            }));
            if let Some(p) = pin {
                req = req.header("x-pair-node-pin", p);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 200);
            let route = r.headers()["x-pair-route"].to_str().unwrap().to_owned();
            (served_by(&r).unwrap(), route)
        }
    };
    let ask = |system, task, pin| ask_at(0, system, task, pin);
    // "prefill N (M cached)": M.
    let cached_in = |route: &str| -> u32 {
        route
            .split_once(" cached)")
            .and_then(|(head, _)| head.rsplit('(').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no cached count in {route}"))
    };
    let (usual, _) = ask("Be brief.".into(), "hello".into(), None).await;
    wait_settled(&c, "llama3.2:3b").await;
    let elsewhere = another_node(&c, &usual);
    let (first, _) = ask(system.clone(), "task 0".into(), Some(elsewhere.clone())).await;
    assert_eq!(first, elsewhere);
    wait_settled(&c, "llama3.2:3b").await;
    let system_tokens = u32::try_from(system.len() / 4).unwrap();
    for task in 1..5 {
        let (node, route) = ask(system.clone(), format!("task {task}"), None).await;
        assert_eq!(
            node, elsewhere,
            "sub-agent {task} went where its prefix is not cached: {route}"
        );
        // The system prompt is priced as cached.
        let cached = cached_in(&route);
        assert!(
            cached >= system_tokens * 9 / 10,
            "{cached} of {system_tokens} cached: {route}"
        );
        wait_settled(&c, "llama3.2:3b").await;
        // A prompt that shares nothing, kept off the agents' node (its one
        // slot would give the agents' prefix way to it, as the engine's
        // does): credited with nothing.
        let other = format!("Another agent {task}.");
        let (_, route) = ask(other, "task".into(), Some(usual.clone())).await;
        assert!(!route.contains("cached"), "credited with a cache: {route}");
        wait_settled(&c, "llama3.2:3b").await;
    }
    // A sub-agent entering at another node: that node learned where the
    // prompt is cached from node 0's reports alone.
    for entry in [1, 2] {
        let (node, route) = ask_at(entry, system.clone(), format!("at {entry}"), None).await;
        assert_eq!(node, elsewhere, "entering at node {entry}: {route}");
        assert!(cached_in(&route) >= system_tokens * 9 / 10, "{route}");
        wait_settled(&c, "llama3.2:3b").await;
    }
    c.stop().await;
}

/// A peer's report is in a node's view as soon as it arrives, not at the
/// node's own next push. Two nodes push every 4 s: were each to publish
/// only on its own push, the lags of node 0 seeing node 1's reports and of
/// node 1 seeing node 0's would add up to the 4 s interval (the two pushes'
/// phases), so one of them would be 2 s or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_report_is_seen_when_it_arrives_not_at_the_next_push() {
    let c = cluster(2, |s| {
        s.gossip.interval = Duration::from_secs(4);
        s.gossip.suspect_after = Duration::from_secs(15);
        s.gossip.dead_after = Duration::from_secs(20);
    })
    .await
    .unwrap();
    // The most each node's view lagged the other's reports, over three
    // reports each way.
    let made = |me: usize| {
        let peer = c.nodes[1 - me].id;
        let view = c.nodes[me].state.cluster();
        let at = view.node(peer).map(|n| n.reported_at_ms);
        (at, view.taken_at_ms)
    };
    let mut last = [made(0).0, made(1).0];
    let mut seen = [0; 2];
    let mut lags = [0u64; 2];
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.iter().any(|&n| n < 3) {
        assert!(Instant::now() < deadline, "reports stopped: {seen:?} seen");
        for me in 0..2 {
            let (at, taken) = made(me);
            if at != last[me]
                && let Some(at) = at
            {
                lags[me] = lags[me].max(taken.saturating_sub(at));
                last[me] = Some(at);
                seen[me] += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        lags.iter().all(|&ms| ms < 1_500),
        "views lagged the reports by {lags:?} ms"
    );
    c.stop().await;
}
