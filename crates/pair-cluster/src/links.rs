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

use crate::ClusterError;
use crate::link::PeerLink;
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
            let found = src.discovered.borrow().get(peer.id).and_then(|d| {
                d.addrs
                    .first()
                    .map(|ip| SocketAddr::new(*ip, d.cluster_port))
            });
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
