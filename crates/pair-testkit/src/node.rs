//! What the process-level tests of pair-node share: a `pair-node run`
//! started on ephemeral ports in a temporary state dir, an emulated engine
//! for it, and the CLI run against it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failure is the test's

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::process::{KillOnDrop, wait_for_output};

/// `pair-client serve` (the binary `client`) on the joined client state in
/// `state`, its faces on ephemeral loopback ports: the process and the
/// Ollama and OpenAI face URLs it printed.
pub fn client_serve(client: &Path, state: &Path) -> (KillOnDrop, String, String) {
    let mut child = Command::new(client)
        .arg("--state-dir")
        .arg(state)
        .args([
            "serve",
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
        ])
        .env("PAIR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pair-client serve");
    let stderr = child.stderr.take().unwrap();
    let serve = KillOnDrop(child);
    let mut faces = None;
    wait_for_output(stderr, Duration::from_secs(30), |line| {
        let urls: Vec<&str> = line
            .split_whitespace()
            .filter(|w| w.starts_with("http://"))
            .collect();
        if line.starts_with("pair-client serving") && urls.len() == 2 {
            faces = Some((urls[0].to_owned(), urls[1].to_owned()));
        }
        faces.is_some()
    })
    .expect("serve did not start");
    let (ollama, openai) = faces.unwrap();
    (serve, ollama, openai)
}

/// The `pair-node` binary of this build: `PAIR_NODE_BIN`, else the one
/// beside the test executable's directory (`target/<profile>/pair-node`
/// for `target/<profile>/deps/<test>`), which cargo builds for pair-node's
/// own tests (`CARGO_BIN_EXE_pair-node` names the same file there).
pub fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PAIR_NODE_BIN") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let dir = exe.parent()?;
            let dir = if dir.ends_with("deps") {
                dir.parent()?
            } else {
                dir
            };
            Some(dir.join(format!("pair-node{}", std::env::consts::EXE_SUFFIX)))
        })
        .unwrap_or_else(|| PathBuf::from("pair-node"))
}

/// The `pair-client` binary of this build, beside [`bin`]; a clear
/// failure when it was not built (`cargo test --workspace` builds it).
pub fn client_bin() -> PathBuf {
    let client = bin().with_file_name(format!("pair-client{}", std::env::consts::EXE_SUFFIX));
    assert!(
        client.exists(),
        "{} is built by `cargo test --workspace` (or `cargo build -p pair-client`)",
        client.display()
    );
    client
}

/// A running `pair-node run`.
#[derive(Debug)]
pub struct Running {
    pub proc: KillOnDrop,
    /// `http://` base URL of the Ollama face.
    pub face: String,
    /// `http://` base URL of the OpenAI face.
    pub openai: String,
    /// The cluster port's address, `HOST:PORT`.
    pub cluster: String,
    /// The LAN face's `HOST:PORT`, when `--lan-face` opened one.
    pub lan: Option<String>,
    pub dir: tempfile::TempDir,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// The face's `HOST:PORT`.
    pub fn face_addr(&self) -> &str {
        self.face.trim_start_matches("http://")
    }
}

/// Starts `pair-node run` with an emulated Ollama engine on `engine_port`,
/// `threads` event loops and `extra` flags, in a new temporary state dir.
pub fn start(name: &str, engine_port: u16, threads: u16) -> Running {
    start_with(name, engine_port, threads, &[])
}

pub fn start_with(name: &str, engine_port: u16, threads: u16, extra: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    start_in(dir, name, engine_port, threads, extra, None)
}

/// [`start_with`] in a given state dir; `shell`: run it through `bash -c`
/// with this prefix (e.g. `ulimit -n 1024;`).
pub fn start_in(
    dir: tempfile::TempDir,
    name: &str,
    engine_port: u16,
    threads: u16,
    extra: &[&str],
    shell: Option<&str>,
) -> Running {
    let (child, stderr) = spawn(dir.path(), name, engine_port, threads, extra, shell);
    let proc = KillOnDrop(child);
    let mut line = String::new();
    wait_for_output(stderr, Duration::from_secs(30), |l| {
        if l.contains("pair-node running") {
            line = l.to_owned();
        }
        !line.is_empty()
    })
    .unwrap();
    let line = strip_ansi(&line);
    let field = |key: &str| {
        let start = line.find(&format!("{key}=")).unwrap() + key.len() + 1;
        line[start..].split_whitespace().next().unwrap().to_owned()
    };
    let node = Running {
        face: format!("http://{}", field("ollama")),
        openai: format!("http://{}", field("openai")),
        cluster: field("cluster"),
        lan: Some(field("lan")).filter(|l| l != "off"),
        proc,
        dir,
    };
    wait_ready(&node);
    node
}

/// Waits until the node's own snapshot lists its engine's models (its
/// first engine poll has landed), so a test's first request is routable.
pub fn wait_ready(node: &Running) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = get_json(node.face_addr(), "/_pair/cluster").unwrap_or(Value::Null);
        let me = &v["self"];
        let has_models = v["snapshot"]["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().any(|n| {
                &n["id"] == me
                    && n["engines"].as_array().is_some_and(|e| {
                        e.iter()
                            .any(|e| e["models"].as_array().is_some_and(|m| !m.is_empty()))
                    })
            })
        });
        if has_models {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node never became ready: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `s` without terminal colour codes.
pub fn strip_ansi(s: &str) -> String {
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

/// Starts `pair-node run` and hands back the child and its stderr, for
/// tests that read its log themselves.
pub fn spawn(
    dir: &Path,
    name: &str,
    engine_port: u16,
    threads: u16,
    extra: &[&str],
    shell: Option<&str>,
) -> (std::process::Child, std::process::ChildStderr) {
    let mut args: Vec<String> = [
        "run",
        "--name",
        name,
        "--mdns",
        "off",
        "--ollama-face",
        "127.0.0.1:0",
        "--openai-face",
        "127.0.0.1:0",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    if !extra.contains(&"--cluster") {
        args.extend(["--cluster".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    args.push("--engine".into());
    args.push(format!("ollama=http://127.0.0.1:{engine_port}"));
    args.push("--state-dir".into());
    args.push(dir.display().to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let mut cmd = match shell {
        Some(prefix) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("{prefix} exec \"$0\" \"$@\""))
                .arg(bin())
                .args(&args);
            c
        }
        None => {
            let mut c = Command::new(bin());
            c.args(&args);
            c
        }
    };
    let mut child = cmd
        .env("PAIR_LOG", "info")
        .env("PAIR_THREADS", threads.to_string())
        // No NO_COLOR: stderr is a pipe, and the node must leave colour
        // codes out on its own (tests/cli.rs checks it).
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    (child, stderr)
}

/// `GET path` on `addr` (`HOST:PORT`), its body as JSON.
pub fn get_json(addr: &str, path: &str) -> Option<Value> {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut got = Vec::new();
    tcp.read_to_end(&mut got).ok()?;
    let text = String::from_utf8(got).ok()?;
    serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
}

/// Runs the CLI against `node` (its face and state dir) with `--json`.
pub fn cli(node: &Running, args: &[&str]) -> Value {
    let out = cli_output(node, args);
    assert!(
        out.status.success(),
        "pair-node {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The CLI's whole output, success or not.
pub fn cli_output(node: &Running, args: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(args)
        .args(["--control", &node.face, "--json", "--state-dir"])
        .arg(node.dir.path())
        .output()
        .unwrap()
}

/// An emulated Ollama engine on a free port, served by a small runtime on
/// its own thread for the rest of the test process.
pub fn engine() -> u16 {
    emulated(pair_emulator::Flavor::Ollama, &["llama3.2:3b"])
}

/// An emulated engine of `flavor` holding `models`, on a free port.
pub fn emulated(flavor: pair_emulator::Flavor, models: &'static [&'static str]) -> u16 {
    emulated_on(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        flavor,
        models,
    )
}

/// An emulated engine of `flavor` holding `models` on `listener`, served
/// by a small runtime on its own thread for the rest of the test process.
pub fn emulated_on(
    listener: std::net::TcpListener,
    flavor: pair_emulator::Flavor,
    models: &'static [&'static str],
) -> u16 {
    emulated_with(
        listener,
        pair_emulator::EmulatorConfig::new(flavor, models.iter().copied()),
    )
}

/// An emulated engine configured by `cfg` on `listener`, served by a small
/// runtime on its own thread for the rest of the test process.
pub fn emulated_with(listener: std::net::TcpListener, cfg: pair_emulator::EmulatorConfig) -> u16 {
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let _engine = pair_emulator::EmulatedEngine::spawn(cfg, listener).unwrap();
            std::future::pending::<()>().await;
        });
    });
    port
}

/// A port nothing listens on (bound by the system, then closed).
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
