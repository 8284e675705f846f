//! The namespace test itself (Linux: network namespaces, `ip netns`,
//! SIGTERM); `netns.rs` runs it there and skips it elsewhere.

#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{NodeOptions, start_node};
use pair_core::{Liveness, NodeId};
use pair_discovery::{Interfaces, PeerSet, PeerState};

const TEST_NAME: &str = "namespace_discovery_goodbye_and_eviction";
const DISCOVERY_TARGET: Duration = Duration::from_secs(2);
const EVICTION_TARGET: Duration = Duration::from_secs(3);
const GOODBYE_TARGET: Duration = Duration::from_millis(1_500);

pub(crate) fn main() -> ExitCode {
    if std::env::var_os("PAIR_NETNS_NODE").is_some() {
        return node_main();
    }
    if !pair_testkit::harness::wanted(TEST_NAME) {
        return ExitCode::SUCCESS;
    }
    if std::env::var("PAIR_SKIP_NETNS").as_deref() == Ok("1") {
        eprintln!("test {TEST_NAME} ... skipped (PAIR_SKIP_NETNS=1)");
        return ExitCode::SUCCESS;
    }
    eprintln!("test {TEST_NAME} ...");
    match std::panic::catch_unwind(scenario) {
        Ok(()) => {
            eprintln!("test {TEST_NAME} ... ok");
            ExitCode::SUCCESS
        }
        Err(_) => {
            eprintln!("test {TEST_NAME} ... FAILED");
            ExitCode::FAILURE
        }
    }
}

/// Two namespaces and the veth pair between them; removed on drop.
struct Netns {
    a: String,
    b: String,
    if_a: String,
    if_b: String,
    children: Vec<Child>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    fn create() -> Netns {
        let pid = std::process::id();
        let ns = Netns {
            a: format!("pair-a-{pid}"),
            b: format!("pair-b-{pid}"),
            // Interface names are at most 15 bytes.
            if_a: format!("pva{pid}"),
            if_b: format!("pvb{pid}"),
            children: Vec::new(),
        };
        if let Err(e) = ip(&["netns", "add", &ns.a]) {
            panic!(
                "cannot create network namespaces ({e}). This test needs root and `ip netns` \
                 (iproute2); set PAIR_SKIP_NETNS=1 to skip it where that is impossible."
            );
        }
        let (a, b, if_a, if_b) = (&ns.a, &ns.b, &ns.if_a, &ns.if_b);
        let steps: [&[&str]; 11] = [
            &["netns", "add", b],
            &["link", "add", if_a, "type", "veth", "peer", "name", if_b],
            &["link", "set", if_a, "netns", a],
            &["link", "set", if_b, "netns", b],
            &["-n", a, "addr", "add", "10.77.0.1/24", "dev", if_a],
            &["-n", b, "addr", "add", "10.77.0.2/24", "dev", if_b],
            &["-n", a, "link", "set", "lo", "up"],
            &["-n", b, "link", "set", "lo", "up"],
            &["-n", a, "link", "set", if_a, "up"],
            &["-n", b, "link", "set", if_b, "up"],
            &["-n", a, "route", "add", "224.0.0.0/4", "dev", if_a],
        ];
        for step in steps {
            // `ns` is dropped on panic, which removes what exists so far.
            ip(step).unwrap();
        }
        ip(&["-n", b, "route", "add", "224.0.0.0/4", "dev", if_b]).unwrap();
        ns
    }

    /// Starts a node inside namespace `ns` on interface `iface`.
    fn spawn_node(
        &mut self,
        ns: &str,
        iface: &str,
        bind: &str,
        id: NodeId,
        tx: mpsc::Sender<(NodeId, Line)>,
    ) -> usize {
        let exe = std::env::current_exe().unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(exe)
            .env("PAIR_NETNS_NODE", "1")
            .env("PAIR_NODE_ID", id.to_string())
            .env("PAIR_NODE_IFACE", iface)
            .env("PAIR_NODE_BIND", bind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let parsed = if let Some(port) = line.strip_prefix("READY ") {
                    Line::Ready(port.parse().unwrap())
                } else if let Some(json) = line.strip_prefix("PEERS ") {
                    Line::Peers(serde_json::from_str(json).unwrap())
                } else if line == "BYE" {
                    Line::Bye
                } else {
                    continue;
                };
                if tx.send((id, parsed)).is_err() {
                    break;
                }
            }
        });
        self.children.push(child);
        self.children.len() - 1
    }

    fn signal(&self, child: usize, signal: &str) {
        let pid = self.children[child].id().to_string();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting a namespace deletes the veth end inside it, and with it
        // the pair; the explicit delete covers a half-finished setup.
        let _ = ip(&["link", "del", &self.if_a]);
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

#[derive(Debug)]
enum Line {
    Ready(u16),
    Peers(PeerSet),
    Bye,
}

/// What the parent knows of each child's output.
struct Watch {
    rx: mpsc::Receiver<(NodeId, Line)>,
    tables: std::collections::HashMap<NodeId, PeerSet>,
    ready: std::collections::HashMap<NodeId, u16>,
    bye: std::collections::HashSet<NodeId>,
}

impl Watch {
    fn pump(&mut self, until: Instant) -> bool {
        let left = until.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left.max(Duration::from_millis(1))) {
            Ok((id, Line::Ready(port))) => {
                self.ready.insert(id, port);
                true
            }
            Ok((id, Line::Peers(set))) => {
                self.tables.insert(id, set);
                true
            }
            Ok((id, Line::Bye)) => {
                self.bye.insert(id);
                true
            }
            Err(_) => false,
        }
    }

    /// Waits until `pred(self)` holds; returns the time it took.
    fn until(&mut self, what: &str, timeout: Duration, pred: impl Fn(&Watch) -> bool) -> Duration {
        let start = Instant::now();
        let deadline = start + timeout;
        while !pred(self) {
            if Instant::now() >= deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; tables: {:#?}",
                    self.tables
                );
            }
            self.pump(deadline);
        }
        start.elapsed()
    }

    fn peer_state(&self, observer: NodeId, peer: NodeId) -> Option<PeerState> {
        self.tables.get(&observer)?.get(peer).map(|p| p.state)
    }
}

fn scenario() {
    let mut ns = Netns::create();
    let pid = u128::from(std::process::id());
    // Same first eight digits on purpose: the short id must not be what
    // tells two nodes apart (it once merged their mDNS host names).
    let a = NodeId::from_u128(pid << 64 | 0xa);
    let b = NodeId::from_u128(pid << 64 | 0xb);
    let (tx, rx) = mpsc::channel();
    let mut w = Watch {
        rx,
        tables: Default::default(),
        ready: Default::default(),
        bye: Default::default(),
    };
    let (ns_a, ns_b, if_a, if_b) = (ns.a.clone(), ns.b.clone(), ns.if_a.clone(), ns.if_b.clone());
    ns.spawn_node(&ns_a, &if_a, "10.77.0.1", a, tx.clone());
    w.until("node A ready", Duration::from_secs(10), |w| {
        w.ready.contains_key(&a)
    });

    // 1. Discovery across namespaces, both ways, within the target.
    let started = Instant::now();
    let b_child = ns.spawn_node(&ns_b, &if_b, "10.77.0.2", b, tx.clone());
    w.until("A to verify B", DISCOVERY_TARGET, |w| {
        w.peer_state(a, b) == Some(PeerState::Alive)
    });
    let took = started.elapsed();
    w.until("B to verify A", DISCOVERY_TARGET, |w| {
        w.peer_state(b, a) == Some(PeerState::Alive)
    });
    eprintln!("  B in A's table {took:?} after B started");
    let view = w.tables[&a].get(b).unwrap().clone();
    assert_eq!(
        view.addrs,
        vec!["10.77.0.2".parse::<std::net::IpAddr>().unwrap()],
        "only the veth address, never loopback"
    );
    assert_eq!(Some(&view.cluster_port), w.ready.get(&b));
    assert!(view.via_mdns && view.rtt_us.is_some());

    // 2. Goodbye: SIGTERM makes B announce TTL 0; A drops it at once
    // (absent, not evicted as dead).
    ns.signal(b_child, "-TERM");
    let took = w.until("A to drop B after goodbye", GOODBYE_TARGET, |w| {
        w.tables.get(&a).is_some_and(|t| t.get(b).is_none())
    });
    eprintln!("  B removed {took:?} after its goodbye");
    w.until("B to exit", Duration::from_secs(5), |w| w.bye.contains(&b));
    let _ = ns.children[b_child].wait();

    // 3. B restarts (same identity) and is back.
    w.ready.remove(&b);
    let b_child = ns.spawn_node(&ns_b, &if_b, "10.77.0.2", b, tx.clone());
    let took = w.until("A to verify restarted B", DISCOVERY_TARGET, |w| {
        w.peer_state(a, b) == Some(PeerState::Alive)
    });
    eprintln!("  restarted B back {took:?} after start");

    // 4. Kill B without a goodbye: evicted by the probes within the target.
    ns.children[b_child].kill().unwrap();
    let took = w.until("A to evict killed B", EVICTION_TARGET, |w| {
        w.tables
            .get(&a)
            .and_then(|t| t.get(b))
            .is_some_and(|p| p.liveness == Liveness::Dead)
    });
    eprintln!("  killed B evicted {took:?} after SIGKILL");
    assert!(w.tables[&a].routable().all(|p| p.id != b));
}

/// The node inside a namespace: prints `READY <port>`, then `PEERS <json>`
/// on every change; SIGTERM or a closed stdin stops it with a goodbye.
fn node_main() -> ExitCode {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
    let id: NodeId = var("PAIR_NODE_ID").parse().unwrap();
    let iface = var("PAIR_NODE_IFACE");
    let bind: std::net::IpAddr = var("PAIR_NODE_BIND").parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let opts = NodeOptions {
            id,
            bind,
            interfaces: Interfaces::Named(vec![iface]),
            mdns_port: pair_discovery::MDNS_PORT,
            mdns: true,
            static_peers: Vec::new(),
        };
        let node = start_node(opts).await;
        println!("READY {}", node.cluster_port);
        let mut peers = node.discovery.peers();
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        let mut stdin_closed = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin()
                .read_line(&mut sink)
                .map(|n| n > 0)
                .unwrap_or(false)
            {}
        });
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = &mut stdin_closed => break,
                r = peers.changed() => {
                    if r.is_err() { break; }
                    let json = serde_json::to_string(&*peers.borrow_and_update()).unwrap();
                    println!("PEERS {json}");
                }
            }
        }
        node.shutdown().await;
        println!("BYE");
    });
    // The stdin reader may still block; do not wait for it.
    rt.shutdown_background();
    ExitCode::SUCCESS
}
