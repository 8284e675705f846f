//! The edge SDK against real nodes on loopback: a client that joined one
//! node reaches the whole cluster, ranks nodes by its own round trips and
//! their load (some nodes behind a small TCP delay proxy), keeps its
//! ranking for the cache TTL, fails over in one retry without probing, and
//! is refused once unpaired.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use pair_core::{NodeId, Role};
use pair_sdk::api::openai;
use pair_sdk::{Client, Config, Error, Request};
use pair_testkit::cluster::LocalCluster;
use pair_testkit::cluster::{cluster, http, wait_loaded};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy to `upstream` that delivers every chunk `delay` after it
/// arrived, both ways: a node `delay` farther away (its round trip grows
/// by twice that).
async fn delay_proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::join!(pump(dr, uw, delay), pump(ur, dw, delay));
            });
        }
    });
    addr
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || tx
                    .send((tokio::time::Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

fn config(dir: &std::path::Path, seeds: &[SocketAddr]) -> Config {
    let mut cfg = Config::new(dir);
    cfg.name = "edge-test".into();
    cfg.seeds = seeds.iter().map(ToString::to_string).collect();
    cfg
}

/// Pairs `client` with node `i` through the real PIN exchange, then waits
/// until every node of `c` lets it in (the others through vouching).
async fn join(c: &LocalCluster, i: usize, client: &Client) {
    let node = &c.nodes[i];
    let pin = node.pairing.open_invite(SystemTime::now()).unwrap();
    let record = client
        .join(&node.cluster_addr.to_string(), pin.reveal())
        .await
        .unwrap();
    assert_eq!(record.id, node.id);
    pair_testkit::cluster::wait_trusted(c, client.id()).await;
}

fn chat(model: &str, tokens: u32) -> openai::ChatRequest {
    let mut r = openai::ChatRequest::new(model, vec![openai::Message::user("hello there")]);
    r.max_tokens = Some(tokens);
    r
}

fn chat_request(model: &str, tokens: u32) -> Request {
    Request::json(
        "/v1/chat/completions",
        serde_json::to_vec(&chat(model, tokens)).unwrap().into(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nearest_node_with_the_model_wins_and_a_busy_one_loses_to_a_farther_idle_one() {
    let c = cluster(3, |s| {
        for n in &mut s.nodes {
            n.profile = "rtx3060".into();
            n.slots = Some(1);
        }
        // Node 2, the nearest, does not hold qwen.
        s.nodes[2].models = vec!["llama3.2:3b".into()];
    })
    .await
    .unwrap();
    let (far, near, nearest) = (c.nodes[0].id, c.nodes[1].id, c.nodes[2].id);
    // Warm qwen on both of its owners, so only distance and load differ.
    for e in &c.engines[..2] {
        let r = http()
            .post(format!("{}/api/generate", e.base_url()))
            .json(&json!({"model": "qwen2.5:7b", "prompt": "hi", "stream": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_loaded(&c, "qwen2.5:7b", &[far, near]).await;

    let seeds = [
        delay_proxy(c.nodes[0].cluster_addr, Duration::from_millis(15)).await,
        delay_proxy(c.nodes[1].cluster_addr, Duration::from_millis(3)).await,
        c.nodes[2].cluster_addr,
    ];
    let dir = tempfile::tempdir().unwrap();
    let client = Client::open(config(dir.path(), &seeds)).await.unwrap();
    join(&c, 2, &client).await;

    let survey = client.survey_for(Some("qwen2.5:7b"), true).await.unwrap();
    let order: Vec<NodeId> = survey.nodes.iter().map(|(n, _)| n.id).collect();
    assert_eq!(
        order,
        vec![near, far],
        "nearest owner first; a node without the model never: {survey:?}"
    );
    let rtt = |id: NodeId| {
        survey
            .nodes
            .iter()
            .find(|(n, _)| n.id == id)
            .unwrap()
            .0
            .rtt_us
    };
    assert!(
        rtt(far) > rtt(near),
        "measured on the client: {} vs {} us",
        rtt(far),
        rtt(near)
    );
    let all = client.survey_for(None, false).await.unwrap();
    assert_eq!(all.nodes.len(), 3, "every node was probed");
    assert_eq!(
        all.nodes[0].0.id, nearest,
        "by round trip, the undelayed node is nearest"
    );

    let resp = client.send(chat_request("qwen2.5:7b", 8)).await.unwrap();
    assert_eq!(resp.node, near);
    assert_eq!(resp.attempts, 1);
    resp.bytes().await.unwrap();

    // Keep the near node busy: one running and two queued on its one slot.
    let pinned = c.nodes[1].id.to_string();
    let face = c.nodes[1].openai_url();
    let busy: Vec<_> = (0..3)
        .map(|_| {
            let (face, pinned) = (face.clone(), pinned.clone());
            tokio::spawn(async move {
                let r = http()
                    .post(format!("{face}/v1/chat/completions"))
                    .header("x-pair-node-pin", pinned)
                    .json(
                        &json!({"model": "qwen2.5:7b", "stream": true, "max_tokens": 4000,
                                  "messages": [{"role": "user", "content": "long"}]}),
                    )
                    .send()
                    .await
                    .unwrap();
                let _ = r.bytes().await;
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.nodes[1].state.load.in_flight() < 3 {
        assert!(Instant::now() < deadline, "the busy requests never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survey = client.survey_for(Some("qwen2.5:7b"), true).await.unwrap();
    assert_eq!(
        survey.nodes.first().map(|(n, _)| n.id),
        Some(far),
        "a busy node loses to a farther idle one: {:?}",
        survey
            .nodes
            .iter()
            .map(|(n, r)| (&n.name, r))
            .collect::<Vec<_>>()
    );
    let resp = client.send(chat_request("qwen2.5:7b", 8)).await.unwrap();
    assert_eq!(resp.node, far);
    resp.bytes().await.unwrap();

    // A model no node holds is a clear error, not a wait.
    let err = client
        .send(chat_request("no-such-model", 8))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoNodeServes { .. }), "{err}");
    assert!(!err.may_retry());

    for b in busy {
        b.abort();
    }
    client.close().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ranking_is_kept_for_its_ttl_across_processes_then_probed_again() {
    let c = cluster(2, |_| {}).await.unwrap();
    let seeds: Vec<SocketAddr> = c.nodes.iter().map(|n| n.cluster_addr).collect();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &seeds);
    {
        let client = Client::open(cfg.clone()).await.unwrap();
        join(&c, 0, &client).await;
        client.close().await;
    }
    // The client's clock is tokio's: run it on a runtime of its own, where
    // time can be moved between requests (the nodes keep real time).
    let cache = cfg.cache_path();
    let rounds = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut rounds = Vec::new();
            let client = Client::open(cfg.clone()).await.unwrap();
            // Rounds after a request, and after a moment for a background
            // round to start.
            let ask = |client: Client| async move {
                client.complete(chat("llama3.2:3b", 4)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                client.stats().rounds
            };
            rounds.push(ask(client.clone()).await);
            for minutes in [4, 2] {
                tokio::time::pause();
                tokio::time::advance(Duration::from_secs(60 * minutes)).await;
                tokio::time::resume();
                rounds.push(ask(client.clone()).await);
            }
            // The stale ranking served that request; the round ran beside it.
            client.close().await;
            // Another process a moment later: the cache file is fresh.
            let again = Client::open(cfg.clone()).await.unwrap();
            rounds.push(ask(again.clone()).await);
            again.close().await;
            // A damaged cache file is dropped and rebuilt.
            std::fs::write(&cache, b"{\"v\":1,\"taken_at_ms\":12,\"nodes\":[{").unwrap();
            let third = Client::open(cfg).await.unwrap();
            rounds.push(ask(third.clone()).await);
            third.close().await;
            assert!(pair_sdk::view::View::load(&cache).is_some(), "rebuilt");
            rounds
        })
    })
    .await
    .unwrap();
    // The join ended with a probe round of the whole cluster, kept in the
    // state dir: the first call, in a new process within the TTL (5 min),
    // uses it; 4 min later it still does; at 6 min a round runs, in the
    // background; a new process within the TTL does not probe; a damaged
    // file does.
    assert_eq!(rounds, vec![0, 0, 1, 0, 1]);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_costs_one_retry_and_no_probe_round_and_a_session_moves_with_it() {
    let mut c = cluster(3, |s| {
        for n in &mut s.nodes {
            n.profile = "rtx3060".into();
        }
    })
    .await
    .unwrap();
    let seeds: Vec<SocketAddr> = c.nodes.iter().map(|n| n.cluster_addr).collect();
    let dir = tempfile::tempdir().unwrap();
    let client = Client::open(config(dir.path(), &seeds)).await.unwrap();
    join(&c, 0, &client).await;
    // The join's own probe rounds (it ends when every node answers); none
    // after it runs on the request path.
    let joined = client.stats().rounds;
    assert!(joined >= 1);

    let send = || client.send(chat_request("llama3.2:3b", 4).in_session("conversation-1"));
    let first = send().await.unwrap();
    let home = first.node;
    first.bytes().await.unwrap();
    for _ in 0..3 {
        let r = send().await.unwrap();
        assert_eq!(
            r.node, home,
            "a session stays on its node while it is healthy"
        );
        r.bytes().await.unwrap();
    }
    assert_eq!(client.stats().rounds, joined);

    let i = c.nodes.iter().position(|n| n.id == home).unwrap();
    c.nodes.remove(i).kill().await;
    let moved = send().await.unwrap();
    assert_ne!(moved.node, home);
    assert_eq!(moved.status, 200);
    assert_eq!(moved.attempts, 2, "one retry");
    let new_home = moved.node;
    moved.bytes().await.unwrap();
    assert_eq!(
        client.stats().rounds,
        joined,
        "no probe round on the request path"
    );
    for _ in 0..3 {
        let r = send().await.unwrap();
        assert_eq!(
            (r.node, r.attempts),
            (new_home, 1),
            "the session moved with it"
        );
        r.bytes().await.unwrap();
    }
    client.close().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaired_client_is_refused_at_the_handshake_and_unpairing_closes_its_streams() {
    let c = cluster(3, |_| {}).await.unwrap();
    let seeds: Vec<SocketAddr> = c.nodes.iter().map(|n| n.cluster_addr).collect();

    // A client the cluster never paired, that pinned node 0 by itself.
    let stranger_dir = tempfile::tempdir().unwrap();
    let stranger = Client::open(config(stranger_dir.path(), &seeds[..1]))
        .await
        .unwrap();
    let n0 = &c.nodes[0];
    pair_identity::TrustStore::open(pair_identity::TrustStore::default_path(stranger_dir.path()))
        .unwrap()
        .insert(pair_identity::PeerRecord {
            id: n0.id,
            name: n0.name.clone(),
            role: Role::Node,
            cert_der: n0.identity.cert_der().to_vec(),
            fingerprint: n0.identity.fingerprint(),
            paired_at: 0,
            vouched_by: None,
        })
        .unwrap();
    let stranger = {
        stranger.close().await;
        Client::open(config(stranger_dir.path(), &seeds[..1]))
            .await
            .unwrap()
    };
    let err = stranger.survey_for(None, true).await.unwrap_err();
    assert!(
        matches!(&err, Error::NoNodes { detail } if detail.contains("TLS")),
        "refused at the handshake: {err}"
    );
    stranger.close().await;

    // A paired client: the node that paired it and its peers list it.
    let dir = tempfile::tempdir().unwrap();
    let client = Client::open(config(dir.path(), &seeds)).await.unwrap();
    join(&c, 0, &client).await;
    let peers: Vec<Value> = http()
        .get(format!("{}/_pair/peers", c.nodes[1].ollama_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = peers
        .iter()
        .find(|p| p["id"] == client.id().to_string())
        .expect("the client is listed on a peer of the node it paired with");
    assert_eq!(row["role"], "client");
    assert_eq!(row["vouched_by"], c.nodes[0].id.to_string());

    let mut stream = client.stream(chat("llama3.2:3b", 20_000)).await.unwrap();
    use futures_util::StreamExt;
    stream.next().await.unwrap().unwrap();

    let unpaired = http()
        .post(format!("{}/_pair/unpair", c.nodes[0].ollama_url()))
        .header("authorization", c.nodes[0].control_token.bearer())
        .json(&json!({"node": client.id().to_string()}))
        .send()
        .await
        .unwrap();
    assert_eq!(unpaired.status(), 200);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = stream.next().await {
            if let Err(e) = item {
                return Some(e);
            }
        }
        None
    })
    .await
    .expect("the stream was closed when the client was unpaired");
    assert!(
        matches!(ended, Some(Error::Interrupted { .. })),
        "an unpaired client's stream ends with an error: {ended:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.nodes.iter().any(|n| n.trust.get(client.id()).is_some()) {
        assert!(Instant::now() < deadline, "unpairing reached every node");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = client
        .send(chat_request("llama3.2:3b", 4))
        .await
        .unwrap_err();
    // Named as a refusal whichever way it shows: the handshake's alert on
    // the request, or the re-probe of a node whose connection just closed.
    assert!(
        matches!(refused, Error::Refused { .. }),
        "every node refuses the handshake: {refused}"
    );
    assert!(!refused.may_retry());
    client.close().await;
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_no_address_finds_the_nodes_by_mdns() {
    let c = cluster(3, |_| {}).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    {
        let client = Client::open(cfg.clone()).await.unwrap();
        join(&c, 0, &client).await;
        client.close().await;
    }
    // Forget every address the join taught it: only multicast is left.
    std::fs::remove_file(cfg.cache_path()).unwrap();
    cfg.mdns = pair_sdk::Mdns::Loopback {
        port: c.spec.mdns_port,
    };
    cfg.browse_wait = Duration::from_secs(10);
    let client = Client::open(cfg).await.unwrap();
    let survey = client.survey_for(None, true).await.unwrap();
    let mut found: Vec<NodeId> = survey.nodes.iter().map(|(n, _)| n.id).collect();
    found.sort();
    let mut all: Vec<NodeId> = c.nodes.iter().map(|n| n.id).collect();
    all.sort();
    assert_eq!(found, all, "{survey:?}");
    let r = client.complete(chat("llama3.2:3b", 4)).await.unwrap();
    assert!(!r.choices.is_empty());
    client.close().await;
    c.stop().await;
}

/// A node that gives up on its engine before the first byte tells the edge
/// client so, as its class on the link: the client moves on as it does
/// for a failure of its own (the next node answers), and when every node
/// fails, its error names each node's class, not a status to guess from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_s_failure_keeps_its_class_for_the_edge_client() {
    let c = cluster(2, |s| {
        for n in &mut s.nodes {
            n.profile = "rtx3060".into();
        }
        s.first_byte_timeout = Duration::from_secs(1);
    })
    .await
    .unwrap();
    let seeds: Vec<SocketAddr> = c.nodes.iter().map(|n| n.cluster_addr).collect();
    let dir = tempfile::tempdir().unwrap();
    let client = Client::open(config(dir.path(), &seeds)).await.unwrap();
    join(&c, 0, &client).await;
    let send = || client.send(chat_request("llama3.2:3b", 4).in_session("conversation-1"));
    let first = send().await.unwrap();
    let home = first.node;
    first.bytes().await.unwrap();
    let i = c.nodes.iter().position(|n| n.id == home).unwrap();
    // The home node's engine sends its head, then closes: the node gives
    // up before any byte, and says why.
    c.engines[i]
        .faults()
        .add(pair_emulator::FaultRule::for_model(
            "llama3.2:3b",
            pair_emulator::FaultAction::CloseAfterChunks(0),
        ));
    let moved = send().await.unwrap();
    assert_eq!(moved.status, 200);
    assert_ne!(moved.node, home);
    assert_eq!(moved.attempts, 2, "one retry");
    moved.bytes().await.unwrap();
    // Every node fails: the error names the class each gave.
    c.engines[1 - i]
        .faults()
        .add(pair_emulator::FaultRule::for_model(
            "llama3.2:3b",
            pair_emulator::FaultAction::CloseAfterChunks(0),
        ));
    match send().await {
        Err(Error::Exhausted { attempts, .. }) => {
            let text = attempts.to_string();
            assert!(text.contains("body"), "{text}");
            assert!(!text.contains("502") && !text.contains("504"), "{text}");
        }
        other => panic!("expected every attempt to fail: {other:?}"),
    }
    client.close().await;
    c.stop().await;
}
