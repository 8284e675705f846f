//! Loopback integration tests: real mdns-sd daemons on 127.0.0.1 only, each
//! test on its own mDNS port, real node-info servers on 127.0.0.1:0.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use pair_core::{Liveness, NodeId};
use pair_discovery::{PeerState, StaticPeer};
use support::{NodeOptions, free_udp_port, start_node, wait_for};

fn ids() -> (NodeId, NodeId) {
    let base = u128::from(std::process::id()) << 64 | u128::from(rand_u32());
    (
        NodeId::from_u128(base | 1 << 32),
        NodeId::from_u128(base | 2 << 32),
    )
}

/// Distinct per call, so tests in parallel never share identities.
fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

const DISCOVERY_TARGET: Duration = Duration::from_secs(2);
const EVICTION_TARGET: Duration = Duration::from_secs(3);
/// mdns-sd keeps a goodbye record one second (RFC 6762 section 10.1)
/// before it reports the removal; anything near that is "at once".
const GOODBYE_TARGET: Duration = Duration::from_millis(1_500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_discover_each_other_on_loopback() {
    let port = free_udp_port();
    let (a_id, b_id) = ids();
    let a = start_node(NodeOptions::loopback(a_id, port)).await;
    let b = start_node(NodeOptions::loopback(b_id, port)).await;
    let mut a_rx = a.discovery.peers();
    let mut b_rx = b.discovery.peers();
    let routable = |id| {
        move |s: &pair_discovery::PeerSet| s.get(id).is_some_and(|p| p.state == PeerState::Alive)
    };
    let took = wait_for(&mut a_rx, DISCOVERY_TARGET, routable(b_id))
        .await
        .unwrap_or_else(|s| panic!("A never saw B: {s:#?}"));
    wait_for(&mut b_rx, DISCOVERY_TARGET, routable(a_id))
        .await
        .unwrap_or_else(|s| panic!("B never saw A: {s:#?}"));
    eprintln!("discovered in {took:?}");
    let set = a_rx.borrow().clone();
    let p = set.get(b_id).unwrap();
    assert_eq!(p.addrs[0], std::net::IpAddr::from([127, 0, 0, 1]));
    assert_eq!(p.cluster_port, b.cluster_port);
    assert_eq!(
        p.name.as_deref(),
        Some(format!("test-{}", b_id.short()).as_str())
    );
    assert!(p.rtt_us.is_some());
    assert!(p.via_mdns && !p.via_static);
    // The probe's node-info answer rides along: the peer's telemetry.
    let info = p.info.as_ref().expect("node info of the peer");
    assert_eq!(info.id, b_id);
    assert_eq!(info.cluster_port, b.cluster_port);
    assert!(set.get(a_id).is_none(), "a node never lists itself");
    assert_eq!(
        a.discovery.advertised_addrs(),
        &[std::net::IpAddr::from([127, 0, 0, 1])]
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodbye_removes_a_peer_at_once() {
    let port = free_udp_port();
    let (a_id, b_id) = ids();
    let a = start_node(NodeOptions::loopback(a_id, port)).await;
    let b = start_node(NodeOptions::loopback(b_id, port)).await;
    let mut a_rx = a.discovery.peers();
    wait_for(&mut a_rx, DISCOVERY_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.state == PeerState::Alive)
    })
    .await
    .unwrap_or_else(|s| panic!("A never saw B: {s:#?}"));
    b.shutdown().await;
    // Removed outright (a goodbye), not evicted (which would leave it Dead).
    let took = wait_for(&mut a_rx, GOODBYE_TARGET, |s| s.get(b_id).is_none())
        .await
        .unwrap_or_else(|s| panic!("goodbye did not remove B: {s:#?}"));
    eprintln!("removed {took:?} after goodbye");
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_is_evicted_within_3_s() {
    let port = free_udp_port();
    let (a_id, b_id) = ids();
    let a = start_node(NodeOptions::loopback(a_id, port)).await;
    let b = start_node(NodeOptions::loopback(b_id, port)).await;
    let mut a_rx = a.discovery.peers();
    wait_for(&mut a_rx, DISCOVERY_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.state == PeerState::Alive)
    })
    .await
    .unwrap_or_else(|s| panic!("A never saw B: {s:#?}"));
    b.kill().await;
    let took = wait_for(&mut a_rx, EVICTION_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.liveness == Liveness::Dead)
    })
    .await
    .unwrap_or_else(|s| panic!("B not evicted in time: {s:#?}"));
    eprintln!("evicted {took:?} after kill");
    assert!(a_rx.borrow().routable().all(|p| p.id != b_id));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_node_is_evicted_within_3_s() {
    let port = free_udp_port();
    let (a_id, b_id) = ids();
    let a = start_node(NodeOptions::loopback(a_id, port)).await;
    let b = start_node(NodeOptions::loopback(b_id, port)).await;
    let mut a_rx = a.discovery.peers();
    wait_for(&mut a_rx, DISCOVERY_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.state == PeerState::Alive)
    })
    .await
    .unwrap_or_else(|s| panic!("A never saw B: {s:#?}"));
    // The process lives and accepts TCP, mDNS still answers, but node info hangs.
    b.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let took = wait_for(&mut a_rx, EVICTION_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.liveness == Liveness::Dead)
    })
    .await
    .unwrap_or_else(|s| panic!("hung B not evicted in time: {s:#?}"));
    eprintln!("hung node evicted after {took:?}");
    // It recovers: un-hang and it is probed back to life (slow dead-probe period).
    b.hang.store(false, std::sync::atomic::Ordering::SeqCst);
    wait_for(&mut a_rx, Duration::from_secs(7), |s| {
        s.get(b_id).is_some_and(|p| p.state == PeerState::Alive)
    })
    .await
    .unwrap_or_else(|s| panic!("B did not come back: {s:#?}"));
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_peer_is_found_without_multicast() {
    let (a_id, b_id) = ids();
    let mut b_opts = NodeOptions::loopback(b_id, 0);
    b_opts.mdns = false;
    let b = start_node(b_opts).await;
    let mut a_opts = NodeOptions::loopback(a_id, 0);
    a_opts.mdns = false;
    a_opts.static_peers = vec![
        format!("127.0.0.1:{}", b.cluster_port)
            .parse::<StaticPeer>()
            .unwrap(),
        // An address with nothing behind it must not disturb the rest.
        "127.0.0.1:1".parse().unwrap(),
    ];
    let a = start_node(a_opts).await;
    let mut a_rx = a.discovery.peers();
    wait_for(&mut a_rx, DISCOVERY_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.state == PeerState::Alive)
    })
    .await
    .unwrap_or_else(|s| panic!("static B not found: {s:#?}"));
    let set = a_rx.borrow().clone();
    assert_eq!(set.peers.len(), 1);
    let p = &set.peers[0];
    assert!(p.via_static && !p.via_mdns);
    assert_eq!(p.cluster_port, b.cluster_port);
    b.kill().await;
    wait_for(&mut a_rx, EVICTION_TARGET, |s| {
        s.get(b_id).is_some_and(|p| p.liveness == Liveness::Dead)
    })
    .await
    .unwrap_or_else(|s| panic!("static B not evicted: {s:#?}"));
    a.shutdown().await;
}

/// mDNS reflectors and some responders drop answers that do not come from
/// port 5353 (RFC 6762 §6: a response's source port must be the mDNS
/// port); PAIR's own #1. mdns-sd sends every packet, announcements and
/// answers and queries, from its socket bound to the mDNS port: a node's
/// packets, caught by a listener sharing that port, all come from it (in
/// production the port is 5353; tests use their own).
// SO_REUSEPORT, to listen beside the node on its port, is Unix's.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mdns_packets_go_out_from_the_mdns_port() {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::net::{Ipv4Addr, SocketAddr};
    let port = free_udp_port();
    let listener = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    listener.set_reuse_address(true).unwrap();
    listener.set_reuse_port(true).unwrap();
    listener
        .bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)).into())
        .unwrap();
    listener
        .join_multicast_v4(&Ipv4Addr::new(224, 0, 0, 251), &Ipv4Addr::LOCALHOST)
        .unwrap();
    listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let listener: std::net::UdpSocket = listener.into();
    let (a_id, b_id) = ids();
    let a = start_node(NodeOptions::loopback(a_id, port)).await;
    let b = start_node(NodeOptions::loopback(b_id, port)).await;
    let sources = tokio::task::spawn_blocking(move || {
        let mut sources = Vec::new();
        let mut buf = [0u8; 9000];
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until && sources.len() < 8 {
            if let Ok((_, from)) = listener.recv_from(&mut buf) {
                sources.push(from.port());
            }
        }
        sources
    })
    .await
    .unwrap();
    assert!(!sources.is_empty(), "no mDNS packet seen");
    assert!(
        sources.iter().all(|p| *p == port),
        "every packet from the mDNS port {port}: {sources:?}"
    );
    drop((a, b));
}
