//! The daemon and its CLI as a user drives them: two `pair-node run`
//! processes (no multicast), paired with `pair invite` / `pair join`, then
//! `status`, `peers`, `jobs` and `unpair`, all with `--json`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::process::{Command, Stdio};

use pair_node::harness::{KillOnDrop, wait_for_output};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

struct Running {
    _proc: KillOnDrop,
    face: String,
    cluster: String,
    _dir: tempfile::TempDir,
}

/// Starts `pair-node run` on ephemeral ports in a temporary state dir, with
/// an emulated engine and `threads` event loops (`--threads`),
/// and reads the bound addresses from its log line.
fn start(name: &str, engine_port: u16, threads: u16) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--name", name, "--mdns", "off"])
        .args([
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
        ])
        .args(["--cluster", "127.0.0.1:0"])
        .arg("--engine")
        .arg(format!("ollama=http://127.0.0.1:{engine_port}"))
        .arg("--state-dir")
        .arg(dir.path())
        .env("PAIR_LOG", "info")
        .env("PAIR_THREADS", threads.to_string())
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let proc = KillOnDrop(child);
    let mut line = String::new();
    wait_for_output(stderr, Duration::from_secs(30), |l| {
        if l.contains("pair-node running") {
            line = l.to_owned();
        }
        !line.is_empty()
    })
    .unwrap();
    let field = |key: &str| {
        let plain = strip_ansi(&line);
        let start = plain.find(&format!("{key}=")).unwrap() + key.len() + 1;
        plain[start..].split_whitespace().next().unwrap().to_owned()
    };
    Running {
        face: format!("http://{}", field("ollama")),
        cluster: field("cluster"),
        _proc: proc,
        _dir: dir,
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

fn cli(face: &str, args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .args(args)
        .args(["--control", face, "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pair-node {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// An emulated Ollama engine on a free port, served by a small runtime on
/// its own thread for the rest of the test process.
fn engine() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let cfg =
                pair_emulator::EmulatorConfig::new(pair_emulator::Flavor::Ollama, ["llama3.2:3b"]);
            let _engine = pair_emulator::EmulatedEngine::spawn(cfg, listener).unwrap();
            std::future::pending::<()>().await;
        });
    });
    port
}

#[test]
fn pair_status_peers_jobs_unpair_through_the_cli() {
    let p1 = engine();
    let p2 = engine();
    // One daemon on the default current-thread runtime, one on four workers:
    // pairing, relay and the CLI work the same on both.
    let a = start("alpha", p1, 1);
    let b = start("beta", p2, 4);

    let invite = cli(&a.face, &["pair", "invite"]);
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
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pairing failed"));
    assert_eq!(cli(&b.face, &["peers"]).as_array().unwrap().len(), 0);

    let joined = cli(&b.face, &["pair", "join", &a.cluster, "--pin", &pin]);
    assert_eq!(joined["name"], "alpha");

    // Both sides route to each other once reports flow (b knows a's address
    // from the join; a learns b's from b's reports).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sa = cli(&a.face, &["status"]);
        let sb = cli(&b.face, &["status"]);
        if sa["routable_nodes"] == 2 && sb["routable_nodes"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "never converged: {sa} {sb}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let peers = cli(&a.face, &["peers"]);
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
    let jobs = cli(&a.face, &["jobs"]);
    assert_eq!(jobs[0]["ran_on"], beta_id.as_str());
    assert_eq!(jobs[0]["status"], "completed");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cli(&b.face, &["jobs"]).as_array().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "job record not replicated to beta"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let removed = cli(&a.face, &["unpair", "beta"]);
    assert_eq!(removed["name"], "beta");
    assert_eq!(cli(&a.face, &["peers"]).as_array().unwrap().len(), 0);
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
