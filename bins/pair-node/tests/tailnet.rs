//! Peers on a tailnet: two `pair-node run` processes whose only link is a
//! veth pair with addresses from Tailscale's range (100.64.0.0/10, the
//! CGNAT block PAIR refuses), one of them in a network namespace that
//! names the other by a MagicDNS-style name (`box.tailnet.ts.net`, in the
//! namespace's own hosts file as Tailscale's resolver would answer). They
//! pair with `pair join box.tailnet.ts.net:PORT`, keep it as a static
//! `--peer`, and route requests to each other; an edge client on the
//! tailnet joins with `pair-client pair join` by the same name.
//!
//! Needs root for `ip netns` (CI runs as root); fails loudly otherwise.

// Linux: network namespaces (`ip netns`) and their hosts files.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pair_testkit::netns::Joined;
use pair_testkit::node::{cli, emulated_on, start_with, strip_ansi};
use pair_testkit::process::{KillOnDrop, wait_for_output};
const BIN: &str = env!("CARGO_BIN_EXE_pair-node");

const A_IP: &str = "100.100.7.1";
const B_IP: &str = "100.100.7.2";
const MAGIC_NAME: &str = "box.tailnet.ts.net";

/// Namespace `b` joined to this one; its hosts file names this side by a
/// tailnet name. Removed on drop.
struct Tailnet {
    net: Joined,
    etc: std::path::PathBuf,
}

impl Tailnet {
    fn create() -> Self {
        let net = Joined::create("tn", A_IP, B_IP);
        // `ip netns exec` puts /etc/netns/NAME/hosts over /etc/hosts.
        let etc = std::path::Path::new("/etc/netns").join(&net.ns);
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(
            etc.join("hosts"),
            format!("127.0.0.1 localhost\n{A_IP} {MAGIC_NAME}\n"),
        )
        .unwrap();
        Tailnet { net, etc }
    }

    fn exec(&self) -> Command {
        self.net.exec()
    }
}

impl Drop for Tailnet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.etc);
    }
}

/// A field of a "pair-node running" line.
fn field(line: &str, key: &str) -> String {
    let line = strip_ansi(line);
    let start = line.find(&format!("{key}=")).unwrap() + key.len() + 1;
    line[start..].split_whitespace().next().unwrap().to_owned()
}

#[test]
fn tailnet_peers_pair_by_magicdns_name_and_route() {
    let net = Tailnet::create();
    // Node a, on this side: its engine on loopback, its cluster port on the
    // tailnet address.
    let a = start_with(
        "alpha",
        emulated_on(
            std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
            pair_emulator::Flavor::Ollama,
            &["only-on-a:1b"],
        ),
        1,
        &["--cluster", &format!("{A_IP}:0")],
    );
    let a_port = a.cluster.rsplit_once(':').unwrap().1.to_owned();
    // Node b, in the namespace: its engine reached across the veth (on
    // this side, so the test serves it), its faces on the namespace's own
    // loopback.
    let b_engine = emulated_on(
        std::net::TcpListener::bind(format!("{A_IP}:0")).unwrap(),
        pair_emulator::Flavor::Ollama,
        &["only-on-b:1b"],
    );
    let b_dir = tempfile::tempdir().unwrap();
    let peer = format!("{MAGIC_NAME}:{a_port}");
    let mut child = net
        .exec()
        .arg(BIN)
        .args([
            "run",
            "--name",
            "beta",
            "--mdns",
            "off",
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
            "--cluster",
        ])
        .arg(format!("{B_IP}:0"))
        .args([
            "--engine",
            &format!("ollama=http://{A_IP}:{b_engine}"),
            "--allow-remote-engine",
        ])
        .args(["--peer", &peer, "--state-dir"])
        .arg(b_dir.path())
        .env("PAIR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let b_proc = KillOnDrop(child);
    let mut running = String::new();
    wait_for_output(stderr, Duration::from_secs(30), |l| {
        if l.contains("pair-node running") {
            running = l.to_owned();
        }
        !running.is_empty()
    })
    .unwrap();
    let b_face = format!("http://{}", field(&running, "ollama"));

    // Pair: a invites, b joins by the tailnet name.
    let pin = cli(&a, &["pair", "invite"])["pin"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = net
        .exec()
        .arg(BIN)
        .args([
            "pair",
            "join",
            &peer,
            "--pin",
            &pin,
            "--control",
            &b_face,
            "--json",
            "--state-dir",
        ])
        .arg(b_dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "join by a MagicDNS name: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Each routes to the other: b's face serves a's model, a's face b's.
    let chat = |model: &str| {
        format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"stream":false}}"#
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = net
            .exec()
            .args(["curl", "-s", "-i", "-m", "10", "-d", &chat("only-on-a:1b")])
            .arg(format!("{b_face}/api/chat"))
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        if answer.starts_with("http/1.1 200") {
            assert!(answer.contains("x-pair-node: alpha"), "{answer}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b never reached a's model: {answer}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new("curl")
            .args(["-s", "-i", "-m", "10", "-d", &chat("only-on-b:1b")])
            .arg(format!("{}/api/chat", a.face))
            .output()
            .unwrap();
        let answer = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
        if answer.starts_with("http/1.1 200") {
            assert!(answer.contains("x-pair-node: beta"), "{answer}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a never reached b's model: {answer}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let peers = cli(&a, &["peers"]);
    assert!(
        peers.to_string().contains(B_IP),
        "a knows b at its tailnet address: {peers}"
    );

    // An edge client on the tailnet joins by the same name, and its first
    // probe lists both nodes.
    let client = pair_testkit::node::client_bin();
    let pin = cli(&a, &["pair", "invite"])["pin"]
        .as_str()
        .unwrap()
        .to_owned();
    let client_dir = tempfile::tempdir().unwrap();
    let pair_client = |args: &[&str]| {
        let out = net
            .exec()
            .arg(&client)
            .arg("--state-dir")
            .arg(client_dir.path())
            .args(args)
            .env("PAIR_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pair-client {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = pair_client(&["pair", "join", &peer, "--pin", &pin]);
    assert!(said.contains("paired with alpha"), "{said}");
    let probe: serde_json::Value =
        serde_json::from_str(&pair_client(&["probe", "--json"])).unwrap();
    let names: Vec<&str> = probe["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["name"].as_str())
        .collect();
    assert!(
        names.contains(&"alpha") && names.contains(&"beta"),
        "the first probe lists both nodes: {probe}"
    );
    drop(b_proc);
    drop(net);
}
