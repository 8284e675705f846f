//! The daemon and its CLI as a user drives them: two `pair-node run`
//! processes (no multicast), paired with `pair invite` / `pair join`, then
//! `status`, `peers`, `jobs` and `unpair`, all with `--json`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::process::Command;
use std::time::{Duration, Instant};

use pair_testkit::node::{cli, engine, start};
const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

#[test]
fn pair_status_peers_jobs_unpair_through_the_cli() {
    let p1 = engine();
    let p2 = engine();
    // One daemon on the default current-thread runtime, one on four workers:
    // pairing, relay and the CLI work the same on both.
    let a = start("alpha", p1, 1);
    let b = start("beta", p2, 4);

    let invite = cli(&a, &["pair", "invite"]);
    let pin = invite["pin"].as_str().unwrap().to_owned();
    assert_eq!(pin.len(), 6);
    // A wrong PIN is refused and writes no trust.
    let wrong = if pin == "000000" { "111111" } else { "000000" };
    let out = Command::new(BIN)
        .args([
            "pair",
            "join",
            &a.cluster,
            "--pin",
            wrong,
            "--control",
            &b.face,
            "--state-dir",
        ])
        .arg(b.dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pairing failed"));
    assert_eq!(cli(&b, &["peers"]).as_array().unwrap().len(), 0);

    let joined = cli(&b, &["pair", "join", &a.cluster, "--pin", &pin]);
    assert_eq!(joined["name"], "alpha");

    // Both sides route to each other once reports flow (b knows a's address
    // from the join; a learns b's from b's reports).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sa = cli(&a, &["status"]);
        let sb = cli(&b, &["status"]);
        if sa["routable_nodes"] == 2 && sb["routable_nodes"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "never converged: {sa} {sb}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let peers = cli(&a, &["peers"]);
    assert_eq!(peers[0]["name"], "beta");
    assert_eq!(peers[0]["liveness"], "alive");

    // A request pinned to beta, sent to alpha's face, shows in both jobs views.
    let beta_id = peers[0]["id"].as_str().unwrap().to_owned();
    let out = Command::new("curl")
        .args(["-sf", "-H", &format!("x-pair-node-pin: {beta_id}")])
        .arg(format!("{}/api/generate", a.face))
        .args([
            "-d",
            r#"{"model":"llama3.2:3b","prompt":"hi","stream":false}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "curl through the face failed");
    let jobs = cli(&a, &["jobs"]);
    assert_eq!(jobs[0]["ran_on"], beta_id.as_str());
    assert_eq!(jobs[0]["status"], "completed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(&b, &["jobs"]).as_array().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "job record not replicated to beta"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let removed = cli(&a, &["unpair", "beta"]);
    assert_eq!(removed["name"], "beta");
    assert_eq!(cli(&a, &["peers"]).as_array().unwrap().len(), 0);
}

#[test]
fn an_engine_still_on_the_usual_port_is_refused_with_how_to_move_it() {
    // The emulated Ollama engine holds the port the Ollama face wants.
    let port = engine();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--mdns", "off", "--cluster", "127.0.0.1:0"])
        .args(["--openai-face", "127.0.0.1:0"])
        .arg("--ollama-face")
        .arg(format!("127.0.0.1:{port}"))
        // Only the face's port: never the machine's well-known ones.
        .args([
            "--detect-ports",
            &pair_testkit::node::closed_port().to_string(),
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .env("PAIR_LOG", "error")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "exit code for a config problem"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("OLLAMA_HOST="),
        "says how to move the engine: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
}

/// `pair-node run` on free ports with `extra` flags, in front of an engine
/// port nothing answers on: the node, its stderr and its state dir.
fn started(
    extra: &[&str],
) -> (
    pair_testkit::process::KillOnDrop,
    std::process::ChildStderr,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let (child, stderr) = pair_testkit::node::spawn(dir.path(), "logs", 9, 1, extra, None);
    (pair_testkit::process::KillOnDrop(child), stderr, dir)
}

/// The first log lines of a node started with `extra`, up to "pair-node
/// running".
fn started_logs(extra: &[&str]) -> Vec<String> {
    let (node, stderr, _dir) = started(extra);
    let mut lines = Vec::new();
    pair_testkit::process::wait_for_output(stderr, Duration::from_secs(20), |l| {
        lines.push(l.to_owned());
        l.contains("pair-node running")
    })
    .expect("the node starts");
    drop(node);
    lines
}

#[test]
fn logs_are_plain_text_off_a_terminal_and_json_when_asked() {
    let text = started_logs(&[]);
    assert!(
        text.iter().all(|l| !l.contains('\u{1b}')),
        "no colour codes when stderr is not a terminal: {text:?}"
    );
    let json = started_logs(&["--log-format", "json"]);
    let running: serde_json::Value = serde_json::from_str(json.last().unwrap()).unwrap();
    assert_eq!(
        running["fields"]["message"], "pair-node running",
        "{running}"
    );
    assert_eq!(running["level"], "INFO");
    for line in &json {
        serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|e| panic!("every line is JSON ({e}): {line}"));
    }
}

#[test]
fn metrics_can_be_served_for_a_scraper_on_another_address() {
    let (_node, stderr, _dir) =
        started(&["--log-format", "json", "--metrics-listen", "127.0.0.1:0"]);
    let mut addr = None;
    pair_testkit::process::wait_for_output(stderr, Duration::from_secs(20), |l| {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(l)
            && v["fields"]["message"] == "metrics served for scraping"
        {
            addr = v["fields"]["addr"].as_str().map(str::to_owned);
        }
        addr.is_some()
    })
    .expect("the metrics listener starts");
    let addr = addr.unwrap();
    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/stdout", "-w", "\n%{http_code}"])
            .arg(format!("http://{addr}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let metrics = get("/metrics");
    assert!(metrics.ends_with("\n200"), "{metrics}");
    assert!(
        metrics.contains("# TYPE pair_"),
        "Prometheus text: {metrics}"
    );
    let other = get("/api/tags");
    assert!(
        other.ends_with("\n404"),
        "nothing else is served there: {other}"
    );
}

/// This node's own entry in its `/_pair/cluster` view.
fn own_entry(node: &pair_testkit::node::Running) -> serde_json::Value {
    let v = pair_testkit::node::get_json(node.face_addr(), "/_pair/cluster").unwrap();
    let me = v["self"].clone();
    v["snapshot"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == me)
        .cloned()
        .unwrap()
}

/// `POST /api/generate` with `body` to `node`'s face on a thread, with
/// curl; the thread gives the HTTP status.
fn generate(
    node: &pair_testkit::node::Running,
    body: &'static str,
) -> std::thread::JoinHandle<String> {
    let face = node.face.clone();
    std::thread::spawn(move || {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("{face}/api/generate"))
            .args(["-d", body])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    })
}

#[test]
fn a_node_over_an_emulated_engine_reads_its_gpu_from_the_engine() {
    let port = engine();
    let node = pair_testkit::node::start_with(
        "emu",
        port,
        1,
        &[
            "--emulated-hardware",
            "rtx4090",
            "--telemetry-interval",
            "100ms",
        ],
    );
    // Wait until `check` holds for the node's own entry.
    let until = |what: &str, check: &dyn Fn(&serde_json::Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let me = own_entry(&node);
            if check(&me) {
                return me;
            }
            assert!(Instant::now() < deadline, "never {what}: {me}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Idle: the profile's GPU at 0 %, and pressure known to be low (not
    // PAIR's "unknown", which a node without readings reports).
    let idle = until("idle with a reading", &|me| {
        me["gpus"][0]["utilisation_pct"] == 0 && me["pressure"] == 0
    });
    assert_eq!(idle["gpus"][0]["name"], "rtx4090", "{idle}");

    // A long answer keeps the engine busy: utilisation and pressure rise.
    let busy = generate(
        &node,
        r#"{"model":"llama3.2:3b","prompt":"count","stream":false,"options":{"num_predict":1500}}"#,
    );
    let loaded = until("busy", &|me| {
        me["gpus"][0]["utilisation_pct"].as_u64().unwrap_or(0) >= 90
            && me["pressure"].as_u64().unwrap_or(0) >= 2
    });
    assert!(
        loaded["gpus"][0]["vram_used_bytes"].as_u64().unwrap() > 0,
        "the model's weights are in memory: {loaded}"
    );
    assert_eq!(busy.join().unwrap(), "200");
    // And fall back once it is done.
    until("idle again", &|me| me["gpus"][0]["utilisation_pct"] == 0);
}

/// A node learns how its engine's decoding slows as streams share it: an
/// emulated RTX 4090 (batched decoding, about 3^0.8 times one stream's
/// tokens with three) answered alone and three at a time teaches the node
/// an exponent near 0.8, which it advertises in its own snapshot.
#[test]
fn a_node_learns_how_batching_slows_its_engine_s_decoding() {
    let cfg = pair_emulator::EmulatorConfig::new(pair_emulator::Flavor::Ollama, ["llama3.2:3b"])
        .with_time_scale(0.25);
    let port =
        pair_testkit::node::emulated_with(std::net::TcpListener::bind("127.0.0.1:0").unwrap(), cfg);
    let node = pair_testkit::node::start_with("batching", port, 1, &[]);
    let body =
        r#"{"model":"llama3.2:3b","prompt":"count","stream":true,"options":{"num_predict":200}}"#;
    for round in 0..16 {
        let together = if round % 2 == 0 { 1 } else { 3 };
        let asked: Vec<_> = (0..together).map(|_| generate(&node, body)).collect();
        for a in asked {
            assert_eq!(a.join().unwrap(), "200");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let perf = loop {
        let me = own_entry(&node);
        let perf = me["engines"][0]["models"][0]["perf"].clone();
        if perf["batch_exponent"].is_number() {
            break perf;
        }
        assert!(Instant::now() < deadline, "no batching learned: {me}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let e = perf["batch_exponent"].as_f64().unwrap();
    assert!((0.6..=0.95).contains(&e), "{perf}");
}

#[test]
fn keys_add_list_revoke_and_the_lan_face_through_the_cli() {
    let node = pair_testkit::node::start_with(
        "keys",
        engine(),
        1,
        &[
            "--lan-face",
            "127.0.0.1:0",
            "--alias",
            "claude-*=llama3.2:3b",
            "--allowed-host",
            "box.tailnet.ts.net",
            "--lan-max-per-address",
            "3",
        ],
    );
    let lan = lan_addr(&node);
    let made = cli(
        &node,
        &[
            "keys", "add", "laptop", "--models", "llama*", "--rate", "30/min",
        ],
    );
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("pair-sk-"), "{made}");
    let listed = cli(&node, &["keys", "list"]);
    assert_eq!(listed[0]["name"], "laptop");
    assert_eq!(listed[0]["rate_per_min"], 30);
    assert!(
        !listed.to_string().contains(&secret),
        "the secret is shown once"
    );
    // The secret is kept hashed only.
    let stored = std::fs::read_to_string(node.dir.path().join("keys.json")).unwrap();
    assert!(!stored.contains(&secret));
    // The key works on the LAN face, an alias included; a status shows it.
    let chat = |key: &str| {
        let body = r#"{"model":"claude-haiku-4-5","messages":[{"role":"user","content":"hi"}],"max_tokens":3}"#;
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("authorization: Bearer {key}"))
            .args(["-H", "content-type: application/json", "-d", body])
            .arg(format!("http://{lan}/v1/chat/completions"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(chat(&secret), "200");
    // A name given with --allowed-host is this node's; others are not.
    let named = |host: &str| {
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("authorization: Bearer {secret}"))
            .args(["-H", &format!("host: {host}")])
            .arg(format!("http://{lan}/v1/models"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(named("box.tailnet.ts.net"), "200");
    assert_eq!(named("rebound.example"), "403");
    // One address holds three connections at most: a fourth is refused.
    {
        use std::io::{Read, Write};
        let held: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(&lan).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut fourth = std::net::TcpStream::connect(&lan).unwrap();
        fourth
            .write_all(format!("GET /v1/models HTTP/1.1\r\nhost: {lan}\r\n\r\n").as_bytes())
            .unwrap();
        fourth
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = Vec::new();
        let _ = fourth.read_to_end(&mut got);
        let got = String::from_utf8_lossy(&got);
        assert!(got.starts_with("HTTP/1.1 503"), "{got}");
        drop(held);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(chat(&secret), "200", "the address's connections are freed");
    let status = cli(&node, &["status"]);
    assert_eq!(status["aliases"][0]["alias"], "claude-*=llama3.2:3b");
    let human = Command::new(pair_testkit::node::bin())
        .args(["status", "--control", &node.face, "--state-dir"])
        .arg(node.dir.path())
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human
            .lines()
            .any(|l| l.starts_with("aliases") && l.contains("claude-*=llama3.2:3b (this node)")),
        "{human}"
    );
    // Revoked: refused at once on this node.
    let revoked = cli(&node, &["keys", "revoke", "laptop"]);
    assert_eq!(revoked[0]["name"], "laptop");
    assert_eq!(chat(&secret), "401");
    let listed = cli(&node, &["keys", "list"]);
    assert!(listed[0]["revoked_at_ms"].is_u64(), "{listed}");
    // Revoking what is not there says so.
    let out = pair_testkit::node::cli_output(&node, &["keys", "revoke", "nobody"]);
    assert!(!out.status.success());
}

/// The LAN face's address from the node's "pair-node running" line (its
/// status has no field for it): read from the log the test kept.
fn lan_addr(node: &pair_testkit::node::Running) -> String {
    node.lan.clone().expect("the node logged its LAN face")
}

/// `--windows-service` is the Windows service controller's: elsewhere the
/// node refuses it as a usage error, saying so, and starts nothing.
#[cfg(not(windows))]
#[test]
fn the_windows_service_flag_is_refused_off_windows() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(BIN)
        .args(["--windows-service", "run", "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Windows service controller"), "{err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing started"
    );
}
