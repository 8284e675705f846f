//! The LAN face from another machine's network: a network namespace joined
//! to this one by a veth pair, with addresses from a tailnet's range
//! (100.64.0.0/10, as Tailscale gives), so the clients are not the node's
//! own. The real `openai` and `anthropic` SDKs and curl use it with an API
//! key; a missing, wrong or revoked key gets a 401 in each API's shape; a
//! key made on one node works on the other, and its revocation reaches
//! the other within a report interval; a key's rate answers 429 with
//! `Retry-After`; a key limited to some models gets a 404 for the rest;
//! a page from an allowed origin calls it from headless Chromium.
//!
//! Needs root for `ip netns` (CI runs as root); fails loudly otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pair_daemon::cli::ControlClient;
use pair_daemon::config::LanFace;
use pair_daemon::control::NewKey;
use pair_testkit::cluster::LocalCluster;
use pair_testkit::cluster::{cluster, http};
use pair_testkit::netns::Joined;
use serde_json::Value;

/// The node side of the veth pair, and the client side in the namespace.
const NODE_IP: &str = "100.64.77.1";
const CLIENT_IP: &str = "100.64.77.2";

/// The client's network: a namespace with one veth to this one.
struct ClientNet(Joined);

impl ClientNet {
    fn create() -> Self {
        ClientNet(Joined::create("lan", NODE_IP, CLIENT_IP))
    }

    /// `program args...` inside the namespace.
    fn run(&self, program: &str, args: &[&str]) -> std::process::Output {
        self.0.run(program, args)
    }

    /// curl from the namespace: (status, body).
    fn curl(&self, url: &str, headers: &[&str], body: Option<&str>) -> (u16, String) {
        let mut args = vec!["-s", "-m", "20", "-w", "\n%{http_code}"];
        for h in headers {
            args.extend(["-H", h]);
        }
        if let Some(b) = body {
            args.extend(["-H", "content-type: application/json", "-d", b]);
        }
        args.push(url);
        let out = self.run("curl", &args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }
}

fn control(c: &LocalCluster, i: usize) -> ControlClient {
    ControlClient::new(&c.nodes[i].ollama_url())
        .unwrap()
        .with_token(c.nodes[i].control_token.clone())
}

fn lan_url(c: &LocalCluster, i: usize) -> String {
    format!("http://{}", c.nodes[i].lan_addr.expect("a LAN face"))
}

const CHAT: &str =
    r#"{"model":"llama3.2:3b","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lan_face_serves_keyed_clients_from_another_network() {
    let net = ClientNet::create();
    // The pages a browser loads: one from an allowed origin, one not.
    let (allowed_page, other_page) = (PageServer::bind(), PageServer::bind());
    let origin = allowed_page.origin();
    let c = cluster(2, move |s| {
        for n in &mut s.nodes {
            n.lan = Some(LanFace {
                addr: SocketAddr::new(NODE_IP.parse().unwrap(), 0),
                origins: vec![origin.clone()],
                per_address: 16,
            });
        }
    })
    .await
    .unwrap();
    let made = control(&c, 0)
        .add_key(&NewKey {
            name: "colleague".into(),
            models: Vec::new(),
            rate_per_min: None,
            priority: None,
        })
        .await
        .unwrap();
    let key = made.secret.clone();
    let url0 = lan_url(&c, 0);
    let bearer = format!("authorization: Bearer {key}");

    // No key, in each API's shape.
    let (s, b) = net.curl(&format!("{url0}/v1/chat/completions"), &[], Some(CHAT));
    assert_eq!(s, 401, "{b}");
    assert_eq!(
        serde_json::from_str::<Value>(&b).unwrap()["error"]["type"],
        "authentication_error"
    );
    let (s, b) = net.curl(&format!("{url0}/api/chat"), &[], Some(CHAT));
    assert_eq!(s, 401, "{b}");
    assert!(serde_json::from_str::<Value>(&b).unwrap()["error"].is_string());
    // With it: served, and the job records the key's name.
    let (s, b) = net.curl(
        &format!("{url0}/v1/chat/completions"),
        &[&bearer],
        Some(CHAT),
    );
    assert_eq!(s, 200, "{b}");
    // Missing or wrong, in the shape of the API asked: Anthropic's,
    // Ollama's, the Responses API's (OpenAI's).
    let (s, b) = net.curl(
        &format!("{url0}/v1/messages"),
        &["anthropic-version: 2023-06-01"],
        Some(CHAT),
    );
    assert_eq!(s, 401, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["type"], "error", "{b}");
    assert_eq!(v["error"]["type"], "authentication_error", "{b}");
    let (s, b) = net.curl(
        &format!("{url0}/api/chat"),
        &["authorization: Bearer pair-sk-not-a-key"],
        Some(CHAT),
    );
    assert_eq!(s, 401, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert!(v["error"].as_str().unwrap().contains("not valid"), "{b}");
    let (s, b) = net.curl(
        &format!("{url0}/v1/responses"),
        &[],
        Some(r#"{"model":"llama3.2:3b","input":"hi"}"#),
    );
    assert_eq!(s, 401, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error", "{b}");
    // The node's own routes are not on this face, key or not.
    let (s, _) = net.curl(&format!("{url0}/_pair/status"), &[&bearer], None);
    assert_eq!(s, 404);

    // The real SDKs from the other network.
    let py = pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/lan_clients.py");
    let out = net.run(
        py.to_str().unwrap(),
        &[script.to_str().unwrap(), &url0, &key, "llama3.2:3b"],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.trim_end().ends_with("checks"),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs = control(&c, 0).jobs(20).await.unwrap();
    assert!(
        jobs.iter().any(|j| j.key.as_deref() == Some("colleague")),
        "the key's name is in the job records"
    );
    // And in the Jobs view, as a browser renders it.
    let dom = dump_dom(&format!("{}/ui", c.nodes[0].ollama_url())).await;
    let table = dom.split("<tbody id=\"jobs\">").nth(1).unwrap_or_default();
    assert!(table.contains("<td>colleague</td>"), "{table}");

    // Made on node 0, the key works on node 1; revoked on node 1, it is
    // refused on node 0 within a report interval or two.
    let url1 = lan_url(&c, 1);
    let started = Instant::now();
    loop {
        let (s, _) = net.curl(
            &format!("{url1}/v1/chat/completions"),
            &[&bearer],
            Some(CHAT),
        );
        if s == 200 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the key did not reach node 1: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    control(&c, 1).revoke_key("colleague").await.unwrap();
    let revoked = Instant::now();
    loop {
        let (s, _) = net.curl(
            &format!("{url0}/v1/chat/completions"),
            &[&bearer],
            Some(CHAT),
        );
        if s == 401 {
            break;
        }
        // A report interval (500 ms) carries the store's digest; the
        // store itself is fetched at once; curl from the namespace is the
        // rest.
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "the revocation did not reach node 0 within a report interval: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "revocation reached the other node in {:?}",
        revoked.elapsed()
    );

    // A key's rate, and a key limited to some models.
    let limited = control(&c, 0)
        .add_key(&NewKey {
            name: "phone".into(),
            models: vec!["qwen*".into()],
            rate_per_min: std::num::NonZeroU32::new(2),
            priority: None,
        })
        .await
        .unwrap()
        .secret;
    let h = format!("x-api-key: {limited}");
    let qwen = CHAT.replace("llama3.2:3b", "qwen2.5:7b");
    let (s, b) = net.curl(&format!("{url0}/v1/messages"), &[&h], Some(&qwen));
    assert_eq!(s, 200, "{b}");
    let (s, b) = net.curl(&format!("{url0}/v1/chat/completions"), &[&h], Some(CHAT));
    assert_eq!(s, 404, "a model the key may not use: {b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{b}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("qwen*"),
        "it names what the key may use: {b}"
    );
    let out = net.run(
        "curl",
        &[
            "-s",
            "-i",
            "-m",
            "20",
            "-H",
            &h,
            "-H",
            "content-type: application/json",
            "-d",
            &qwen,
            &format!("{url0}/v1/chat/completions"),
        ],
    );
    let head = String::from_utf8_lossy(&out.stdout).to_ascii_lowercase();
    assert!(
        head.starts_with("http/1.1 429"),
        "over its rate of 2 a minute: {head}"
    );
    assert!(head.contains("retry-after:"), "{head}");

    // Browser pages: from the allowed origin the call (a preflight, then
    // the POST) is answered; from another origin the browser blocks it.
    let key = key_for_browser(&c).await;
    let said = allowed_page.render(&url0, &key).await;
    assert!(
        said.contains("status 200") && said.contains("chat.completion"),
        "{said}"
    );
    let said = other_page.render(&url0, &key).await;
    assert!(
        said.contains("error"),
        "a page from another origin is not let in: {said}"
    );

    // Wrong keys again and again from one address are slowed down.
    let wrong = "x-api-key: pair-sk-guessing";
    let statuses: Vec<u16> = (0..8)
        .map(|_| {
            net.curl(&format!("{url0}/v1/chat/completions"), &[wrong], Some(CHAT))
                .0
        })
        .collect();
    assert!(statuses.contains(&429), "{statuses:?}");
    c.stop().await;
    drop(net);
}

async fn key_for_browser(c: &LocalCluster) -> String {
    control(c, 0)
        .add_key(&NewKey {
            name: "open-webui".into(),
            models: Vec::new(),
            rate_per_min: None,
            priority: None,
        })
        .await
        .unwrap()
        .secret
}

/// The page at `url` as headless Chromium renders it, scripts run.
async fn dump_dom(url: &str) -> String {
    let url = url.to_owned();
    let profile = tempfile::tempdir().unwrap();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("/usr/bin/chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-proxy-server",
                "--virtual-time-budget=8000",
                "--dump-dom",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(&url)
            .output()
            .expect("chromium (scripts/setup.sh installs it)")
    })
    .await
    .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A web page's origin: serves one page (set by [`PageServer::render`])
/// on a loopback port.
struct PageServer {
    listener: std::net::TcpListener,
}

impl PageServer {
    fn bind() -> Self {
        Self {
            listener: std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.listener.local_addr().unwrap())
    }

    /// Headless Chromium loads this origin's page, whose script calls
    /// `lan` with `key`: the text the page shows after.
    async fn render(&self, lan: &str, key: &str) -> String {
        let html = format!(
            r#"<html><body><pre id="out">waiting</pre><script>
fetch("{lan}/v1/chat/completions", {{method: "POST",
  headers: {{"Authorization": "Bearer {key}", "Content-Type": "application/json"}},
  body: JSON.stringify({{model: "llama3.2:3b", messages: [{{role: "user", content: "hi"}}], max_tokens: 4}})}})
  .then(r => r.json().then(j => {{ document.getElementById("out").textContent = "status " + r.status + " " + j.object; }}))
  .catch(e => {{ document.getElementById("out").textContent = "error " + e; }});
</script></body></html>"#
        );
        let listener = self.listener.try_clone().unwrap();
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            // The page, then its favicon's 404: two requests at most.
            for stream in listener.incoming().take(2).flatten() {
                let mut stream = stream;
                let mut buf = [0u8; 4096];
                let n = stream.read(&mut buf).unwrap_or(0);
                let page = buf[..n].starts_with(b"GET / ");
                let body = if page { html.as_str() } else { "" };
                let status = if page { "200 OK" } else { "404 Not Found" };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let dom = dump_dom(&format!("{}/", self.origin())).await;
        dom.split("<pre id=\"out\">")
            .nth(1)
            .and_then(|t| t.split("</pre>").next())
            .unwrap_or(&dom)
            .to_owned()
    }
}

/// A key's default class: requests under a key made `--priority batch`
/// are batch work unless they say otherwise. On a one-slot node queueing
/// with priorities, where interactive work was just served, its request
/// waits for the slot batch work leaves free (here past its deadline),
/// and the same request marked interactive goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_requests_carry_its_priority() {
    // A network of its own, beside the other test's.
    let (node_ip, client_ip) = ("100.64.78.1", "100.64.78.2");
    let net = ClientNet(Joined::create("lq", node_ip, client_ip));
    let c = cluster(1, |s| {
        s.nodes[0].slots = Some(1);
        s.queue = Some(pair_scheduler::Order::Priorities);
        s.nodes[0].lan = Some(LanFace {
            addr: SocketAddr::new(node_ip.parse().unwrap(), 0),
            origins: Vec::new(),
            per_address: 16,
        });
    })
    .await
    .unwrap();
    let made = control(&c, 0)
        .add_key(&NewKey {
            name: "farm".into(),
            models: Vec::new(),
            rate_per_min: None,
            priority: Some(pair_core::Priority::Batch),
        })
        .await
        .unwrap();
    let rows = control(&c, 0).keys().await.unwrap();
    assert_eq!(rows[0].priority, Some(pair_core::Priority::Batch));
    let bearer = format!("authorization: Bearer {}", made.secret);
    let url = format!("{}/v1/chat/completions", lan_url(&c, 0));
    // Interactive work on the node's own face.
    let r = http()
        .post(format!("{}/v1/chat/completions", c.nodes[0].openai_url()))
        .body(CHAT)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (s, b) = net.curl(&url, &[&bearer, "x-pair-deadline: 1"], Some(CHAT));
    assert_eq!(s, 503, "batch by its key: {b}");
    let (s, b) = net.curl(
        &url,
        &[
            &bearer,
            "x-pair-deadline: 1",
            "x-pair-priority: interactive",
        ],
        Some(CHAT),
    );
    assert_eq!(s, 200, "the header wins: {b}");
    c.stop().await;
}
