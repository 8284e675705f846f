//! What `pair-node` refuses, as a user meets it: an engine at one of the
//! node's own addresses or off loopback (refused at start, exit 64, one
//! line), a listing when no engine answers (503, not an empty list), and
//! IPv6 zones wherever an address is taken (`pair join`, `--peer`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use pair_testkit::process::{KillOnDrop, wait_for_output};
use serde_json::Value;

use pair_testkit::node::{
    Running, cli, closed_port, engine, start, start_with, strip_ansi, wait_ready,
};
const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

/// Runs `pair-node run` with `args` in a fresh state dir and expects a
/// configuration refusal: exit code 64 and one line on stderr, which it
/// returns. The state dir stays empty: nothing was started.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--mdns", "off"])
        .args(args)
        .arg("--state-dir")
        .arg(dir.path())
        .env("PAIR_LOG", "error")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "{args:?} wrote to its state dir before refusing"
    );
    err
}

/// Starts `pair-node run` with `args` (faces, cluster and engines are the
/// caller's) and waits for its "running" line, not for its engines.
fn launch(name: &str, args: &[&str], env: &[(&str, &str)]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["run", "--name", name, "--mdns", "off"])
        .args(args)
        .arg("--state-dir")
        .arg(dir.path())
        .env("PAIR_LOG", "info")
        .env("PAIR_THREADS", "1")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let proc = KillOnDrop(child);
    let mut line = String::new();
    wait_for_output(stderr, Duration::from_secs(30), |l| {
        if l.contains("pair-node running") {
            line = strip_ansi(l);
        }
        !line.is_empty()
    })
    .unwrap();
    let field = |key: &str| {
        let start = line.find(&format!("{key}=")).unwrap() + key.len() + 1;
        line[start..].split_whitespace().next().unwrap().to_owned()
    };
    Running {
        face: format!("http://{}", field("ollama")),
        openai: format!("http://{}", field("openai")),
        cluster: field("cluster"),
        lan: None,
        proc,
        dir,
    }
}

const LOOPBACK_FACES: [&str; 6] = [
    "--ollama-face",
    "127.0.0.1:0",
    "--openai-face",
    "127.0.0.1:0",
    "--cluster",
    "127.0.0.1:0",
];

/// `GET path` on `addr` (`HOST:PORT`): the status and the body as JSON.
fn get(addr: &str, path: &str) -> (u16, Value) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut got = String::new();
    tcp.read_to_string(&mut got).unwrap();
    let status = got
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {got}"));
    let body = got.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {got}"));
    (status, body)
}

fn host_port(url: &str) -> &str {
    url.trim_start_matches("http://")
}

/// An emulated Ollama engine holding `models`, on a free port.
fn engine_holding(models: &'static [&'static str]) -> u16 {
    pair_testkit::node::emulated(pair_emulator::Flavor::Ollama, models)
}

#[test]
fn an_engine_at_the_nodes_own_address_is_refused_before_anything_binds() {
    // The port is held here all along: had the node tried to bind it, it
    // would have failed with another message and another exit code.
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let on = |host: &str| format!("{host}:{port}");
    let cases: [(Vec<String>, &str, &str); 4] = [
        (
            vec![
                "--ollama-face".into(),
                on("127.0.0.1"),
                "--engine".into(),
                format!("ollama=http://{}", on("127.0.0.1")),
            ],
            "--ollama-face",
            "OLLAMA_HOST=",
        ),
        (
            // A face on every address is also on loopback.
            vec![
                "--ollama-face".into(),
                on("0.0.0.0"),
                "--engine".into(),
                format!("ollama=http://{}", on("localhost")),
            ],
            "--ollama-face",
            "OLLAMA_HOST=",
        ),
        (
            vec![
                "--openai-face".into(),
                on("127.0.0.1"),
                "--engine".into(),
                format!("lm-studio=http://{}", on("127.0.0.1")),
            ],
            "--openai-face",
            "lms server start --port",
        ),
        (
            vec![
                "--cluster".into(),
                on("[::]"),
                "--engine".into(),
                format!("openai-compat=http://{}", on("127.0.0.1")),
            ],
            "--cluster",
            "--port",
        ),
    ];
    for (args, flag, how) in cases {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        for (i, default) in [
            ("--ollama-face", "127.0.0.1:0"),
            ("--openai-face", "127.0.0.1:0"),
            ("--cluster", "127.0.0.1:0"),
        ] {
            if !all.contains(&i) {
                all.extend([i, default]);
            }
        }
        let err = refused(&all, &[]);
        assert!(err.contains("this node's own"), "{err}");
        assert!(err.contains(flag), "names the flag that moves it: {err}");
        assert!(err.contains(how), "says how to move the engine: {err}");
    }
    drop(held);
}

#[test]
fn an_engine_off_loopback_is_refused_unless_allowed() {
    // TEST-NET-1 and a LAN name: never dialled, refused on sight.
    for remote in [
        "ollama=http://192.0.2.7:11434",
        "ollama=http://gpu-box.lan:11434",
    ] {
        let mut args = LOOPBACK_FACES.to_vec();
        args.extend(["--engine", remote]);
        let err = refused(&args, &[]);
        assert!(
            err.contains("--allow-remote-engine"),
            "names the flag: {err}"
        );
        assert!(err.contains("unencrypted"), "says why: {err}");
        let err = refused(&args, &[("PAIR_ALLOW_REMOTE_ENGINE", "0")]);
        assert!(err.contains("--allow-remote-engine"), "{err}");
    }
    // Allowed, by flag or by environment, the node starts.
    let local = engine();
    let local = format!("ollama=http://127.0.0.1:{local}");
    let remote = "ollama=http://192.0.2.7:11434";
    let mut args = LOOPBACK_FACES.to_vec();
    args.extend(["--engine", &local, "--engine", remote]);
    let by_env = launch("remote-env", &args, &[("PAIR_ALLOW_REMOTE_ENGINE", "1")]);
    wait_ready(&by_env);
    args.push("--allow-remote-engine");
    let by_flag = launch("remote-flag", &args, &[]);
    wait_ready(&by_flag);
}

#[test]
fn listings_answer_503_when_no_engine_answers() {
    let engine = format!("ollama=http://127.0.0.1:{}", closed_port());
    let mut args = LOOPBACK_FACES.to_vec();
    args.extend(["--engine", &engine]);
    let node = launch("down", &args, &[]);

    let (status, v) = get(host_port(&node.face), "/api/tags");
    assert_eq!(status, 503, "{v}");
    let msg = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("Ollama's shape: {v}"));
    assert!(msg.contains("no engine could be asked"), "{msg}");

    let (status, v) = get(host_port(&node.openai), "/v1/models");
    assert_eq!(status, 503, "{v}");
    assert_eq!(
        v["error"]["code"], "no_engine_answered",
        "OpenAI's shape: {v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no engine could be asked")),
        "{v}"
    );
}

#[test]
fn an_engine_holding_nothing_lists_an_empty_200() {
    let empty = engine_holding(&[]);
    let engine = format!("ollama=http://127.0.0.1:{empty}");
    let mut args = LOOPBACK_FACES.to_vec();
    args.extend(["--engine", &engine]);
    let node = launch("empty", &args, &[]);
    assert_eq!(
        get(host_port(&node.face), "/api/tags"),
        (200, serde_json::json!({"models": []}))
    );
    assert_eq!(
        get(host_port(&node.openai), "/v1/models"),
        (200, serde_json::json!({"object": "list", "data": []}))
    );
}

#[test]
fn a_model_held_by_two_engines_or_two_nodes_is_listed_once() {
    let (p1, p2) = (engine(), engine());
    let second = format!("ollama=http://127.0.0.1:{p2}");
    // One node, two engines with the same model.
    let a = start_with("twice", p1, 1, &["--engine", &second]);
    // And a second node with it too, paired with the first.
    let b = start("again", engine(), 1);
    let pin = cli(&a, &["pair", "invite"])["pin"]
        .as_str()
        .unwrap()
        .to_owned();
    cli(&b, &["pair", "join", &a.cluster, "--pin", &pin]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cli(&a, &["status"])["routable_nodes"] != 2 {
        assert!(std::time::Instant::now() < deadline, "never converged");
        std::thread::sleep(Duration::from_millis(100));
    }

    let (status, tags) = get(host_port(&a.face), "/api/tags");
    assert_eq!(status, 200, "{tags}");
    let names: Vec<&str> = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["llama3.2:3b"], "{tags}");
    let (status, models) = get(host_port(&a.openai), "/v1/models");
    assert_eq!(status, 200, "{models}");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["llama3.2:3b"], "{models}");
}

#[test]
fn zones_that_name_no_interface_are_refused_where_addresses_are_taken() {
    let mut args = LOOPBACK_FACES.to_vec();
    args.extend(["--peer", "[fe80::1%nosuch0]:14318"]);
    let err = refused(&args, &[]);
    assert!(
        err.contains("no network interface named \"nosuch0\""),
        "{err}"
    );
    let mut args = LOOPBACK_FACES.to_vec();
    args.extend(["--peer", "[fe80::1%eth 0]:14318"]);
    refused(&args, &[]);

    // `pair join` says so before it asks the daemon (none runs here).
    let dir = tempfile::tempdir().unwrap();
    for (addr, says) in [
        ("[fe80::1%nosuch0]:14318", "no network interface named"),
        ("[fe80::1%]:14318", "zone after % is empty"),
        ("10.0.0.1%eth0:14318", "follows only an IPv6 address"),
    ] {
        let out = Command::new(BIN)
            .args(["pair", "join", addr, "--pin", "123456"])
            .args(["--control", "http://127.0.0.1:9", "--state-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{addr}: {err}");
        assert!(err.contains(says), "{addr}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// `pair join [::1%lo]:PORT`: a zoned address reaches the inviter, the
/// zone given by interface name (Linux calls loopback `lo`).
#[cfg(target_os = "linux")]
#[test]
fn pair_join_dials_an_address_with_a_zone() {
    if TcpListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here: skipped");
        return;
    }
    let p1 = engine();
    let engine_a = format!("ollama=http://127.0.0.1:{p1}");
    let a = launch(
        "alpha",
        &[
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
            "--cluster",
            "[::1]:0",
            "--engine",
            &engine_a,
        ],
        &[],
    );
    wait_ready(&a);
    let engine_b = format!("ollama=http://127.0.0.1:{}", engine());
    let b = launch(
        "beta",
        &[
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
            "--cluster",
            "[::1]:0",
            "--engine",
            &engine_b,
        ],
        &[],
    );
    wait_ready(&b);
    assert!(a.cluster.starts_with("[::1]:"), "{}", a.cluster);
    let zoned = a.cluster.replace("]:", "%lo]:");

    let pin = cli(&a, &["pair", "invite"])["pin"]
        .as_str()
        .unwrap()
        .to_owned();
    let joined = cli(&b, &["pair", "join", &zoned, "--pin", &pin]);
    assert_eq!(joined["name"], "alpha", "{joined}");
    let peers = cli(&a, &["peers"]);
    assert!(
        peers
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "beta"),
        "the inviter pinned the joiner: {peers}"
    );
    // The joiner's link to the inviter dials the zoned address (mTLS over
    // it): reports flow both ways and each routes to the other.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (sa, sb) = (cli(&a, &["status"]), cli(&b, &["status"]));
        if sa["routable_nodes"] == 2 && sb["routable_nodes"] == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never linked over the zoned address: {sa} {sb}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
