//! Engines found by themselves: `pair-node run` with no `--engine` looks at
//! loopback ports (here the ones the test passes with the hidden
//! `--detect-ports`, never the machine's well-known ones), names what
//! answers, adopts every engine and says so; with nothing there it says
//! what to run and picks the engine up when it starts. `--engine-cmd`
//! starts the engine `--engine` names. `pair-node status` shows each engine.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pair_emulator::Flavor;
use pair_testkit::process::KillOnDrop;
use serde_json::{Value, json};

use pair_testkit::node::{closed_port, emulated, emulated_on, strip_ansi};
const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

/// A `pair-node run` whose log lines the test reads as they come.
struct Node {
    proc: KillOnDrop,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    face: String,
    dir: tempfile::TempDir,
}

impl Node {
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(BIN)
            .args(["run", "--mdns", "off", "--cluster", "127.0.0.1:0"])
            .args(args)
            .arg("--state-dir")
            .arg(dir.path())
            .env("PAIR_LOG", "info")
            .env("PAIR_THREADS", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if tx.send(strip_ansi(&line)).is_err() {
                    return;
                }
            }
        });
        let mut node = Self {
            proc: KillOnDrop(child),
            lines,
            seen: Vec::new(),
            face: String::new(),
            dir,
        };
        let running = node.expect(|l| l.contains("pair-node running"));
        let start = running.find("ollama=").unwrap() + "ollama=".len();
        let addr = running[start..].split_whitespace().next().unwrap();
        node.face = format!("http://{addr}");
        node
    }

    /// Waits (20 s at most) for a log line `want` accepts and returns it.
    fn expect(&mut self, want: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(_) => panic!("line never came; log so far:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn count(&self, needle: &str) -> usize {
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }

    fn status(&self, json: bool) -> std::process::Output {
        let mut cmd = Command::new(BIN);
        cmd.args(["status", "--control", &self.face]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    }

    /// `pair-node status --json` once every engine is up (20 s at most).
    fn status_when_up(&self, engines: usize) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = self.status(true);
            assert!(out.status.success(), "{out:?}");
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            let up = v["engines"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["healthy"] == true)
                .count();
            if up == engines {
                return v;
            }
            assert!(Instant::now() < deadline, "engines never all up: {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn chat(&self, model: &str) -> (u16, String) {
        let out = Command::new("curl")
            .args(["-s", "-o", "-", "-w", "\n%{http_code}"])
            .arg(format!("{}/api/chat", self.face))
            .args([
                "-d",
                &json!({"model": model, "stream": false,
                        "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.parse().unwrap(), body.to_owned())
    }
}

/// A listener that answers every request with an empty 404: something on
/// the port, but no engine.
fn not_an_engine() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                if conn.read(&mut buf).is_ok_and(|n| n > 0) {
                    let _ = conn.write_all(
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                }
            });
        }
    });
    port
}

const FACES: [&str; 4] = [
    "--ollama-face",
    "127.0.0.1:0",
    "--openai-face",
    "127.0.0.1:0",
];

#[test]
fn engines_on_loopback_are_found_named_and_served() {
    let ollama = emulated(Flavor::Ollama, &["llama3.2:3b"]);
    let lms = emulated(Flavor::LmStudio, &["qwen2.5-7b-instruct"]);
    let llama = emulated(Flavor::OpenAi, &["phi3:mini"]);
    let other = not_an_engine();
    let free = closed_port();
    let ports = format!("{ollama},{lms},{llama},{other},{free}");
    let mut args = FACES.to_vec();
    args.extend(["--detect-ports", &ports]);
    let node = Node::start(&args);

    // What was found, by what it answered: the ports are arbitrary.
    for needle in [
        format!("found Ollama on 127.0.0.1:{ollama}"),
        format!("found LM Studio on 127.0.0.1:{lms}"),
        format!("found llama.cpp server on 127.0.0.1:{llama}"),
        format!("something on 127.0.0.1:{other} answers no engine API"),
        "routing to 3 engine(s)".to_owned(),
    ] {
        assert_eq!(
            node.count(&needle),
            1,
            "{needle}:\n{}",
            node.seen.join("\n")
        );
    }
    assert_eq!(
        node.count(&format!(":{free}")),
        0,
        "a free port is not news"
    );

    let status = node.status_when_up(3);
    let engines: Vec<(Value, Value, Value)> = status["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].clone(),
                e["url"].clone(),
                e["models"][0]["name"].clone(),
            )
        })
        .collect();
    assert_eq!(
        engines,
        [
            (
                json!("ollama"),
                json!(format!("http://127.0.0.1:{ollama}")),
                json!("llama3.2:3b")
            ),
            (
                json!("lm-studio"),
                json!(format!("http://127.0.0.1:{lms}")),
                json!("qwen2.5-7b-instruct")
            ),
            (
                json!("openai-compat"),
                json!(format!("http://127.0.0.1:{llama}")),
                json!("phi3:mini")
            ),
        ]
    );
    let text = node.status(false);
    let text = String::from_utf8_lossy(&text.stdout);
    for port in [ollama, lms, llama] {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("127.0.0.1:{port} up")))
            .unwrap_or_else(|| panic!("no engine line for {port}:\n{text}"));
        assert!(line.contains("slot"), "{line}");
    }
    assert!(text.lines().any(|l| l.starts_with("engines ")), "{text}");

    // Every engine found serves an Ollama client.
    for model in ["llama3.2:3b", "qwen2.5-7b-instruct", "phi3:mini"] {
        let (code, body) = node.chat(model);
        assert_eq!(code, 200, "{model}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert!(!v["message"]["content"].as_str().unwrap().is_empty(), "{v}");
    }
    drop(node.dir);
}

#[test]
fn with_nothing_found_it_says_what_to_run_and_picks_the_engine_up_when_it_starts() {
    let awaited = closed_port();
    let other = closed_port();
    let ports = format!("{awaited},{other}");
    let mut args = FACES.to_vec();
    args.extend(["--detect-ports", &ports]);
    let mut node = Node::start(&args);
    let hint = node
        .seen
        .iter()
        .find(|l| l.contains("no engine found"))
        .cloned()
        .unwrap_or_else(|| panic!("no hint:\n{}", node.seen.join("\n")));
    for needle in [
        format!("looked at {awaited}, {other}"),
        "OLLAMA_HOST=127.0.0.1:11435 ollama serve".to_owned(),
        "lms server start --port 1235".to_owned(),
        "--engine KIND=URL".to_owned(),
        format!("Waiting for Ollama on 127.0.0.1:{awaited}"),
    ] {
        assert!(hint.contains(&needle), "{needle}: {hint}");
    }
    assert_eq!(node.count("no engine found"), 1);
    // Nothing claims the engine is there or ready.
    assert_eq!(node.count("engine up"), 0, "{}", node.seen.join("\n"));
    assert_eq!(node.count("ready"), 0, "{}", node.seen.join("\n"));
    let down = node.status_when_up(0);
    assert_eq!(down["engines"][0]["healthy"], false, "{down}");

    // The engine starts on the awaited port: one line, and it serves.
    let listener = TcpListener::bind(("127.0.0.1", awaited)).unwrap();
    emulated_on(listener, Flavor::Ollama, &["llama3.2:3b"]);
    let up = node.expect(|l| l.contains("engine up"));
    assert!(up.contains(&format!("127.0.0.1:{awaited}")), "{up}");
    assert!(up.contains("llama3.2:3b"), "{up}");
    let (code, body) = node.chat("llama3.2:3b");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        node.count(&format!("waiting for ollama at http://127.0.0.1:{awaited}")),
        1
    );
}

/// Runs `pair-node run` expecting a configuration refusal (exit 64, one
/// line on stderr), which it returns.
fn refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["run", "--mdns", "off", "--cluster", "127.0.0.1:0"])
        .args(args)
        .arg("--state-dir")
        .arg(dir.path())
        .env("PAIR_LOG", "error")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one clear line: {err}");
    err
}

#[test]
fn an_engine_on_a_face_port_is_told_the_command_that_moves_it() {
    let free = closed_port().to_string();
    for (flavor, face, says) in [
        (
            Flavor::LmStudio,
            "--openai-face",
            "lms server start --port 1235",
        ),
        (
            Flavor::Ollama,
            "--ollama-face",
            "OLLAMA_HOST=127.0.0.1:11435 ollama serve",
        ),
    ] {
        let port = emulated(flavor, &["m"]);
        let held = format!("127.0.0.1:{port}");
        let mut args = vec![face, held.as_str(), "--detect-ports", &free];
        args.extend(if face == "--openai-face" {
            ["--ollama-face", "127.0.0.1:0"]
        } else {
            ["--openai-face", "127.0.0.1:0"]
        });
        let err = refused(&args);
        assert!(err.contains(says), "{err}");
        assert!(err.contains(&held), "names the port: {err}");
    }
}

#[test]
fn engine_cmd_starts_the_engine_that_engine_names_and_stops_it() {
    // A real process on the port pair gives it: Python's static file
    // server answering an OpenAI model listing.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("v1")).unwrap();
    std::fs::write(
        root.path().join("v1/models"),
        r#"{"object":"list","data":[{"id":"static-model","object":"model","owned_by":"me"}]}"#,
    )
    .unwrap();
    let port = closed_port();
    let engine = format!("openai-compat=http://127.0.0.1:{port}");
    let cmd = format!(
        "python3 -m http.server {{port}} --bind {{host}} --directory '{}'",
        root.path().display()
    );
    let mut args = FACES.to_vec();
    args.extend(["--engine", &engine, "--engine-cmd", &cmd]);
    let mut node = Node::start(&args);
    assert_eq!(
        node.count(&format!("started openai-compat at http://127.0.0.1:{port}")),
        1,
        "{}",
        node.seen.join("\n")
    );
    let status = node.status_when_up(1);
    assert_eq!(status["engines"][0]["models"][0]["name"], "static-model");

    // Stopping the node stops the engine it started.
    let pid = node.proc.0.id();
    assert!(
        Command::new("kill")
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while node.proc.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "node did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    node.seen.clear();
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the engine the node started still runs"
    );

    // With two engines named, which one to start is not guessed.
    let second = format!("ollama=http://127.0.0.1:{}", closed_port());
    let mut args = FACES.to_vec();
    args.extend([
        "--engine",
        &engine,
        "--engine",
        &second,
        "--engine-cmd",
        "ollama serve",
    ]);
    assert!(refused(&args).contains("--engine-cmd starts one engine"));
}
