//! `pair-client` as a user runs it (the real binary) against a loopback
//! cluster of real nodes: `pair join` with a PIN, `probe`, `chat`, and
//! `serve`, driven by the real `openai` and `ollama` Python SDKs (the same
//! checks as against a node's own faces).

// Linux: the client runs in a mount namespace (`unshare`) whose
// /etc/hosts names the test cluster.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use pair_testkit::cluster::{ClusterSpec, LocalCluster};

fn pair_client(state: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pair-client"))
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .env("PAIR_LOG", "warn")
        .output()
        .expect("run pair-client")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn join_probe_chat_and_serve_unmodified_sdks() {
    pair_identity::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let c = rt.block_on(async {
        let mut spec = ClusterSpec::new(3);
        spec.time_scale = 0.05;
        let c = LocalCluster::start(spec).await.unwrap();
        c.wait_converged(Duration::from_secs(20)).await.unwrap();
        c
    });
    let state = tempfile::tempdir().unwrap();

    // Join node 0 with a PIN it invited.
    let pin = c.nodes[0].pairing.open_invite(SystemTime::now()).unwrap();
    let addr = c.nodes[0].cluster_addr.to_string();
    let out = pair_client(
        state.path(),
        &["pair", "join", &addr, "--pin", pin.reveal()],
    );
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("paired with {}", c.nodes[0].name)),
        "{said}"
    );
    assert!(
        said.contains("2 more node(s)"),
        "the rest of the cluster pinned: {said}"
    );
    let client_id: pair_core::NodeId = said
        .split("as client ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("client id");
    // The join ends once every node lets the client in: the first probe
    // after it lists the whole cluster.
    assert!(c.nodes.iter().all(|n| n.trust.get(client_id).is_some()));
    let out = pair_client(state.path(), &["probe", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        first["nodes"].as_array().unwrap().len(),
        c.nodes.len(),
        "the first probe after the join lists every node: {first}"
    );

    // Probe: every node, with models and the order for one.
    let out = pair_client(state.path(), &["probe", "--json", "-m", "qwen2.5:7b"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = probe["nodes"].as_array().unwrap();
    assert_eq!(
        nodes.len(),
        2,
        "the two nodes holding qwen, in order: {probe}"
    );
    assert!(nodes.iter().all(|n| n["rtt_us"].as_u64().unwrap() > 0));
    assert!(
        nodes[0]["reason"].as_str().unwrap().contains("predicted"),
        "{probe}"
    );
    let out = pair_client(state.path(), &["probe"]);
    let table = text(&out.stdout);
    assert!(
        table.contains("cached"),
        "a second call within the TTL uses the cache: {table}"
    );
    for n in &c.nodes {
        assert!(table.contains(&n.name), "{table}");
    }

    // Chat: streamed text, then who served it.
    let out = pair_client(
        state.path(),
        &["chat", "-m", "llama3.2:3b", "--max-tokens", "12", "hello"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).trim().is_empty());
    let err = text(&out.stderr);
    assert!(
        err.contains("served by node-") && err.contains("first token after"),
        "{err}"
    );
    let out = pair_client(
        state.path(),
        &["chat", "--api", "ollama", "-m", "qwen2.5:7b", "hi"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = pair_client(state.path(), &["chat", "-m", "no-such-model", "hi"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("no reachable node serves model 'no-such-model'"));

    // Serve: local faces for unmodified apps.
    let (serve, ollama, openai) = pair_testkit::node::client_serve(
        Path::new(env!("CARGO_BIN_EXE_pair-client")),
        state.path(),
    );
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../pair-node/tests/sdk/clients.py");
    let py = pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(py)
        .arg(script)
        .args([&ollama, &openai])
        .output()
        .expect("run python");
    let said = text(&out.stdout);
    assert!(
        out.status.success(),
        "SDK checks failed:\n{said}\n{}",
        text(&out.stderr)
    );
    assert!(said.trim_end().ends_with("checks"), "{said}");
    drop(serve);

    // A name that resolves to several addresses (a site's "cluster" name):
    // each address is a candidate. The name lives in a hosts file mounted
    // over /etc/hosts for the client alone (a mount namespace); the nodes
    // behind it are reached through forwarders on those addresses.
    let port = rt.block_on(async {
        let probe = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        probe.local_addr().unwrap().port()
    });
    for (ip, node) in [("127.0.0.2", 1), ("127.0.0.3", 2)] {
        let upstream = c.nodes[node].cluster_addr;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind((ip, port)))
            .expect("forwarder address");
        rt.spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
    }
    let hosts = state.path().join("hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n127.0.0.2 cluster.test\n127.0.0.3 cluster.test\n",
    )
    .unwrap();
    std::fs::remove_file(state.path().join("edge-cache.json")).unwrap();
    let seed = format!("cluster.test:{port}");
    let out = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            r#"mount --bind "$0" /etc/hosts && exec "$@""#,
        ])
        .arg(&hosts)
        .arg(env!("CARGO_BIN_EXE_pair-client"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["--seed", &seed, "probe", "--json", "--fresh"])
        .env("PAIR_LOG", "warn")
        .output()
        .expect("unshare (util-linux) runs the client in a mount namespace; needs root");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let probe: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let addrs: Vec<&str> = probe["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["addr"].as_str().unwrap())
        .collect();
    for want in [format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}")] {
        assert!(
            addrs.contains(&want.as_str()),
            "{want} from the name's addresses: {probe}"
        );
    }
    assert_eq!(
        addrs.len(),
        3,
        "the third node through the members: {probe}"
    );
    rt.block_on(c.stop());
}
