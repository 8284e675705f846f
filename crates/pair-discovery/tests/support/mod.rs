//! Test support: a minimal pair node (node-info server on the cluster port +
//! discovery) for the loopback and namespace tests.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use pair_core::{NODE_INFO_PATH, NodeId, NodeInfo, NodeInfoConfig, Role, Telemetry};
use pair_discovery::{Discovery, DiscoveryConfig, Interfaces, PeerSet, PeerView, StaticPeer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A node under test.
pub struct TestNode {
    pub id: NodeId,
    pub cluster_port: u16,
    pub discovery: Discovery,
    /// While set, node info never answers: a hung node.
    pub hang: Arc<AtomicBool>,
    server: JoinHandle<()>,
}

/// Options of [`start_node`].
pub struct NodeOptions {
    pub id: NodeId,
    pub bind: IpAddr,
    pub interfaces: Interfaces,
    pub mdns_port: u16,
    pub mdns: bool,
    pub static_peers: Vec<StaticPeer>,
}

impl NodeOptions {
    pub fn loopback(id: NodeId, mdns_port: u16) -> Self {
        Self {
            id,
            bind: IpAddr::from([127, 0, 0, 1]),
            interfaces: Interfaces::LoopbackOnly,
            mdns_port,
            mdns: true,
            static_peers: Vec::new(),
        }
    }
}

/// Starts the node-info server on `bind:0`, then discovery.
pub async fn start_node(opts: NodeOptions) -> TestNode {
    let listener = TcpListener::bind(SocketAddr::new(opts.bind, 0))
        .await
        .unwrap();
    let cluster_port = listener.local_addr().unwrap().port();
    let node = NodeInfoConfig {
        id: opts.id,
        name: format!("test-{}", opts.id.short()),
        role: Role::Node,
        cluster_port,
    };
    let hang = Arc::new(AtomicBool::new(false));
    let (_tx, telemetry) = watch::channel(Telemetry::default());
    let hang_flag = hang.clone();
    let app = Router::new().route(
        NODE_INFO_PATH,
        get(move || {
            let hang = hang_flag.clone();
            let node = node.clone();
            let telemetry = telemetry.clone();
            async move {
                if hang.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let info = NodeInfo::new(&node, &telemetry.borrow(), 0);
                axum::Json(info)
            }
        }),
    );
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let mut config = DiscoveryConfig::new(opts.id, "test", cluster_port, opts.interfaces);
    config.mdns_port = opts.mdns_port;
    config.mdns = opts.mdns;
    config.static_peers = opts.static_peers;
    let discovery = Discovery::start(config, tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    TestNode {
        id: opts.id,
        cluster_port,
        discovery,
        hang,
        server,
    }
}

impl TestNode {
    /// Graceful stop: goodbye, then the server goes.
    pub async fn shutdown(self) {
        self.discovery.shutdown().await;
        self.server.abort();
        let _ = self.server.await;
    }

    /// A crash: no goodbye, the cluster port closes.
    pub async fn kill(self) {
        self.server.abort();
        let _ = self.server.await;
        self.discovery.abort().await;
    }
}

/// A UDP port free right now on loopback, so each test's mDNS traffic is
/// its own (mdns-sd binds with SO_REUSEPORT; a unique port keeps parallel
/// tests from hearing each other).
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `pred` holds for the published table; returns how long it
/// took, or the last table seen on timeout.
pub async fn wait_for(
    rx: &mut watch::Receiver<PeerSet>,
    timeout: Duration,
    mut pred: impl FnMut(&PeerSet) -> bool,
) -> Result<Duration, PeerSet> {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    loop {
        if pred(&rx.borrow_and_update()) {
            return Ok(started.elapsed());
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            _ => return Err(rx.borrow().clone()),
        }
    }
}

pub fn peer(set: &PeerSet, id: NodeId) -> Option<&PeerView> {
    set.get(id)
}
