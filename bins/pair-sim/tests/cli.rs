//! The real `pair-sim` binary: a scenario run end to end (JSON and SVG
//! files), byte-identical output for a seed, exit code 64 on bad config, and
//! an emulated Ollama engine answering on a real socket.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pair-sim"))
}

fn smoke() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ci-smoke.toml")
}

#[test]
fn run_writes_table_json_and_svgs() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let svg = dir.path().join("plots");
    let out = bin()
        .arg("run")
        .arg(smoke())
        .args(["--policy", "all", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    for policy in [
        "predicted-latency",
        "pair",
        "least-pending",
        "p2c",
        "round-robin",
    ] {
        assert!(table.contains(policy), "table lacks {policy}:\n{table}");
    }
    assert!(table.contains("users@SLO"));

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["scenario"], "ci-smoke");
    let policies = v["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 5);
    for p in policies {
        let run = &p["run"];
        assert!(run["requests"].as_u64().unwrap() > 0);
        assert_eq!(run["generated"], run["completed"]);
        for metric in ["ttft", "e2e", "queue"] {
            for q in ["p50_ms", "p95_ms", "p99_ms"] {
                assert!(run[metric][q].as_f64().is_some(), "{metric}.{q}");
            }
        }
        assert!(run["throughput_rps"].as_f64().unwrap() > 0.0);
        let nodes = run["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 3);
        let share: f64 = nodes
            .iter()
            .map(|n| n["request_share"].as_f64().unwrap())
            .sum();
        assert!((share - 1.0).abs() < 0.01, "shares sum to {share}");
        let search = &p["search"];
        let users = search["users_at_slo"].as_u64().unwrap();
        let probes = search["probes"].as_array().unwrap();
        assert!(!probes.is_empty());
        // The answer agrees with the probes around it.
        for probe in probes {
            let u = probe["users"].as_u64().unwrap();
            if u == users && u > 0 {
                assert_eq!(probe["pass"], true);
            }
            if u == users + 1 {
                assert_eq!(probe["pass"], false);
            }
        }
        assert!(!p["ttft_cdf"].as_array().unwrap().is_empty());
    }

    for name in [
        "ci-smoke-ttft-cdf.svg",
        "ci-smoke-users.svg",
        "ci-smoke-nodes.svg",
    ] {
        let text = std::fs::read_to_string(svg.join(name)).unwrap();
        assert!(text.starts_with("<svg"), "{name}");
        assert!(text.trim_end().ends_with("</svg>"), "{name}");
        assert!(text.contains("<path") || text.contains("<rect"), "{name}");
    }
    let cdf = std::fs::read_to_string(svg.join("ci-smoke-ttft-cdf.svg")).unwrap();
    assert!(cdf.matches("<path").count() >= 5);
}

#[test]
fn same_seed_gives_byte_identical_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for (i, seed) in ["5", "5", "6"].iter().enumerate() {
        let json = dir.path().join(format!("{i}.json"));
        let status = bin()
            .arg("run")
            .arg(smoke())
            .args([
                "--policy",
                "pair,predicted-latency",
                "--seed",
                seed,
                "--json",
            ])
            .arg(&json)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        outputs.push(std::fs::read(&json).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
    assert_ne!(outputs[0], outputs[2]);
}

#[test]
fn bad_configuration_exits_64_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let text = std::fs::read_to_string(smoke())
        .unwrap()
        .replace("profile = \"laptop\"", "profile = \"quantum\"");
    std::fs::write(&bad, text).unwrap();
    let out = bin().arg("run").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("quantum"), "{err}");

    let out = bin()
        .arg("run")
        .arg(smoke())
        .args(["--policy", "fastest"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fastest"));
}

/// `--users` and `--duration` change the run as the live twin's do: the
/// JSON says the users asked for, and more users in the same time make
/// more requests; a scenario with no closed-loop source refuses `--users`.
#[test]
fn run_takes_users_and_duration_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = |users: &str| {
        let json = dir.path().join(format!("{users}.json"));
        let status = bin()
            .arg("run")
            .arg(smoke())
            .args(["--policy", "pair", "--no-search", "--duration", "90"])
            .args(["--users", users, "--json"])
            .arg(&json)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let run = &v["policies"][0]["run"];
        assert_eq!(run["simulated_s"], 90.0, "{run}");
        (v["users"].clone(), run["generated"].as_u64().unwrap())
    };
    let (few_users, few) = run("2");
    let (many_users, many) = run("12");
    assert_eq!((few_users, many_users), (2.into(), 12.into()));
    assert!(
        many > 3 * few,
        "12 users made {many} requests, 2 made {few}"
    );

    let open = dir.path().join("open.toml");
    let text: String = std::fs::read_to_string(smoke())
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("users =") && !l.starts_with("think_ms ="))
        .map(|l| match l {
            "kind = \"closed-loop\"" => "kind = \"poisson\"\nrate_per_s = 1.0\n".to_owned(),
            l => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&open, text).unwrap();
    let out = bin()
        .arg("run")
        .arg(&open)
        .args(["--users", "3", "--no-search"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--users"));
}

/// `--fan-out`, `--only` and `--no-prefix-index` reshape an agent scenario:
/// the JSON has its jobs and cached tokens; a node that is not there, or a
/// fan-out for a scenario with no agents, is bad configuration.
#[test]
fn run_takes_fan_out_nodes_and_the_prefix_index_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let agents =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/agents-claude-code.toml");
    let json = dir.path().join("agents.json");
    let status = bin()
        .arg("run")
        .arg(&agents)
        .args([
            "--policy",
            "predicted-latency",
            "--duration",
            "300",
            "--fan-out",
            "3",
        ])
        .args(["--only", "desk-4090", "--no-prefix-index", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["nodes"].as_array().unwrap().len(), 1, "{}", v["nodes"]);
    let run = &v["policies"][0]["run"];
    assert!(run["fan_out"]["jobs"].as_u64().unwrap() >= 2, "{run}");
    assert!(run["cache"]["cached_tokens"].as_u64().unwrap() > 0, "{run}");
    for args in [vec!["--only", "nowhere"], vec!["--fan-out", "0"]] {
        let out = bin().arg("run").arg(&agents).args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
    }
    let out = bin()
        .arg("run")
        .arg(smoke())
        .args(["--fan-out", "4", "--no-search"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--fan-out"));
}

/// Kills the engine even when an assertion fails.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(addr: &str, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

#[test]
fn engine_serves_ollama_version_on_a_free_port() {
    // A free port: bind :0, read it, release it for the child.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Child(
        bin()
            .args(["engine", "--flavor", "ollama", "--listen", &addr])
            .args([
                "--models",
                "llama3.2:3b,qwen2.5:0.5b",
                "--profile",
                "rtx4090",
                "--seed",
                "1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let reply = loop {
        match get(&addr, "/api/version") {
            Ok(r) if !r.is_empty() => break r,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("engine never answered: {other:?}"),
        }
    };
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("\"version\""), "{reply}");
    let tags = get(&addr, "/api/tags").unwrap();
    assert!(tags.contains("llama3.2:3b"), "{tags}");

    // Ctrl-C (SIGINT) stops it gracefully, with a success status.
    let mut child = child;
    let sent = Command::new("kill")
        .args(["-INT", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "engine ignored SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
