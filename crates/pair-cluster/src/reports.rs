//! The latest workload report of each peer, as it arrived over mTLS, with
//! when it came and where the peer said its cluster port is.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pair_core::{NodeId, NodeSnapshot};

#[derive(Debug)]
struct Received {
    snapshot: NodeSnapshot,
    at: Instant,
    /// The peer's cluster address, as seen on its last report.
    addr: Option<SocketAddr>,
}

/// The latest report of each peer.
#[derive(Debug, Default)]
pub struct PeerReports {
    latest: Mutex<HashMap<NodeId, Received>>,
    /// Told of each report as it arrives (reports that arrive while no
    /// one waits are told once).
    arrived: tokio::sync::Notify,
}

impl PeerReports {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn accept(&self, snapshot: NodeSnapshot, addr: Option<SocketAddr>) {
        if let Ok(mut m) = self.latest.lock() {
            m.insert(
                snapshot.id,
                Received {
                    snapshot,
                    at: Instant::now(),
                    addr,
                },
            );
        }
        self.arrived.notify_one();
    }

    /// Until a report arrives (at once if one arrived since this was
    /// last awaited).
    pub async fn arrived(&self) {
        self.arrived.notified().await;
    }

    /// Where each reporting peer said its cluster port is.
    pub fn addresses(&self) -> HashMap<NodeId, SocketAddr> {
        self.latest
            .lock()
            .map(|m| {
                m.iter()
                    .filter_map(|(id, r)| r.addr.map(|a| (*id, a)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets a peer (unpaired).
    pub fn forget(&self, id: NodeId) {
        if let Ok(mut m) = self.latest.lock() {
            m.remove(&id);
        }
    }

    /// Each reporting peer's boot id (it changes when the peer restarts).
    pub fn boots(&self) -> HashMap<NodeId, u64> {
        self.latest
            .lock()
            .map(|m| m.iter().map(|(id, r)| (*id, r.snapshot.boot)).collect())
            .unwrap_or_default()
    }

    /// (report, age) of every peer that reported.
    pub fn ages(&self) -> Vec<(NodeSnapshot, Duration)> {
        self.latest
            .lock()
            .map(|m| {
                m.values()
                    .map(|r| (r.snapshot.clone(), r.at.elapsed()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
