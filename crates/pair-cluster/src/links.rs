//! The node's mTLS links to its paired peers: one [`PeerLink`] per paired
//! node whose address is known (from mDNS or static probing first, else
//! where it last reported from, else where we joined it), kept current as
//! peers move, pair and unpair.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use pair_core::{NodeId, Role};
use pair_discovery::PeerSet;
use pair_http::Timeouts;
use pair_identity::tls::Expect;
use pair_identity::{Identity, TrustStore};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use pair_link::{ClusterError, PeerLink};

use crate::reports::PeerReports;

/// Cluster addresses learned from pairing joins (peers that may not
/// multicast).
pub type AddrBook = Arc<Mutex<HashMap<NodeId, SocketAddr>>>;

/// The current links, read lock-free by every request that goes to a peer.
#[derive(Debug, Default)]
pub struct Peers {
    links: ArcSwap<HashMap<NodeId, PeerLink>>,
}

impl Peers {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn get(&self, id: NodeId) -> Option<PeerLink> {
        self.links.load().get(&id).cloned()
    }

    pub fn links(&self) -> Arc<HashMap<NodeId, PeerLink>> {
        self.links.load_full()
    }

    pub fn set(&self, links: HashMap<NodeId, PeerLink>) {
        self.links.store(Arc::new(links));
    }
}

/// Everything [`maintain`] reads.
#[derive(Debug)]
pub struct LinkSources {
    pub identity: Arc<Identity>,
    pub trust: TrustStore,
    pub discovered: watch::Receiver<PeerSet>,
    pub reports: Arc<PeerReports>,
    pub addrbook: AddrBook,
    pub timeouts: Timeouts,
}

/// Where discovery found `id`: its best address on the cluster port, a
/// link-local IPv6 one with its interface (scope id), without which it
/// cannot be dialled.
fn discovered_addr(set: &PeerSet, id: NodeId) -> Option<SocketAddr> {
    set.get(id)?.socket_addrs().next()
}

/// Keeps `peers` current until `shutdown`: every 200 ms, and forgets an
/// unpaired peer's report at once.
pub async fn maintain(peers: Arc<Peers>, src: LinkSources, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut events = src.trust.subscribe();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
            ev = events.recv() => {
                if let Ok(pair_identity::TrustEvent::Removed(id)) = ev {
                    src.reports.forget(id);
                }
            }
        }
        let reported = src.reports.addresses();
        let booked = src.addrbook.lock().map(|b| b.clone()).unwrap_or_default();
        let current = peers.links();
        let mut next: HashMap<NodeId, PeerLink> = HashMap::new();
        for peer in src.trust.peers() {
            if peer.role != Role::Node {
                continue;
            }
            let found = discovered_addr(&src.discovered.borrow(), peer.id);
            let Some(addr) = found
                .or_else(|| reported.get(&peer.id).copied())
                .or_else(|| booked.get(&peer.id).copied())
            else {
                continue;
            };
            if let Some(link) = current.get(&peer.id)
                && link.addr() == Some(addr)
            {
                next.insert(peer.id, link.clone());
                continue;
            }
            let link =
                pair_identity::tls::client_config(&src.identity, &src.trust, Expect::Peer(peer.id))
                    .map_err(ClusterError::from)
                    .and_then(|c| PeerLink::new(peer.id, addr, Arc::new(c), src.timeouts));
            match link {
                Ok(link) => {
                    tracing::info!(peer = %peer.id, name = %peer.name, %addr, "peer link up");
                    next.insert(peer.id, link);
                }
                Err(e) => tracing::warn!(peer = %peer.id, error = %e, "cannot build a peer link"),
            }
        }
        let changed = next.len() != current.len()
            || next
                .iter()
                .any(|(id, l)| current.get(id).map(PeerLink::addr) != Some(l.addr()));
        if changed {
            peers.set(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use pair_discovery::{LivenessConfig, PeerTable, ProbeOk};
    use pair_identity::PeerAddr;

    use super::*;

    /// The published table after a static probe of `addr` found node 2.
    fn found_at(addr: &str) -> PeerSet {
        let addr = PeerAddr::parse(addr).unwrap().socket_addr().unwrap();
        let mut table = PeerTable::new(NodeId::from_u128(1), LivenessConfig::default());
        let ok = ProbeOk {
            id: NodeId::from_u128(2),
            name: "far".into(),
            addr,
            port: addr.port(),
            rtt_us: 100,
            info: None,
        };
        table.on_static_found(Duration::ZERO, &ok);
        table.view(Duration::ZERO, 0)
    }

    fn scope_of(addr: SocketAddr) -> u32 {
        match addr {
            SocketAddr::V6(a) => a.scope_id(),
            SocketAddr::V4(_) => 0,
        }
    }

    #[test]
    fn a_link_local_peer_is_dialled_on_its_interface() {
        let far = NodeId::from_u128(2);
        let addr = discovered_addr(&found_at("[fe80::1%3]:14318"), far).unwrap();
        assert_eq!(
            (addr.to_string(), scope_of(addr)),
            ("[fe80::1%3]:14318".into(), 3)
        );
        if cfg!(target_os = "linux") {
            let lo = pair_identity::addr::interface_index("lo").unwrap();
            let addr = discovered_addr(&found_at("[fe80::1%lo]:14318"), far).unwrap();
            assert_eq!(scope_of(addr), lo);
        }
        let addr = discovered_addr(&found_at("10.0.0.2:14318"), far).unwrap();
        assert_eq!(addr, SocketAddr::from(([10, 0, 0, 2], 14318)));
        assert_eq!(
            discovered_addr(&found_at("10.0.0.2:1"), NodeId::from_u128(9)),
            None
        );
    }

    #[test]
    fn a_link_to_a_scoped_address_keeps_its_scope() {
        // `maintain` compares `PeerLink::addr` with the discovered address:
        // were the scope lost there, the link would be rebuilt every tick.
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let addr = discovered_addr(&found_at("[fe80::1%3]:14318"), NodeId::from_u128(2)).unwrap();
        let link = PeerLink::new(
            NodeId::from_u128(2),
            addr,
            Arc::new(tls),
            Timeouts::default(),
        )
        .unwrap();
        assert_eq!(link.addr(), Some(addr));
        assert_eq!(link.addr().map(scope_of), Some(3));
    }
}
