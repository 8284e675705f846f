//! What the client knows of the cluster: the nodes of its last probe round
//! (each with its answer and the round trip measured to it), every address
//! it has learned, and the nodes that failed since. Kept in memory, and in
//! the state dir so the next process starts from it; a damaged file is
//! dropped with a warning and rebuilt by the next round.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pair_core::{ClusterSnapshot, Liveness, NodeId, NodeSnapshot};
use pair_link::edge::ProbeModel;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

const FORMAT: u32 = 1;

/// One node as its last probe found it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    /// The address that answered.
    pub addr: SocketAddr,
    /// Measured on this client.
    pub rtt_us: u32,
    /// Its own report (load, engines, speeds), `rtt_us` set to ours.
    pub snapshot: NodeSnapshot,
    /// Its models, as the probe listed them.
    pub models: Vec<ProbeModel>,
}

/// The client's picture of the cluster.
#[derive(Clone, Debug)]
pub struct View {
    /// When the round that made it ended (tokio's clock, so tests can move
    /// it), and the same in Unix ms for the file.
    pub taken_at: Instant,
    pub taken_at_ms: u64,
    pub nodes: BTreeMap<NodeId, NodeView>,
    /// Every node address learned (probed, listed as a member, cached).
    pub known: BTreeMap<NodeId, SocketAddr>,
    /// Nodes that failed a request since the round; not ranked until a
    /// probe finds them again.
    pub down: BTreeSet<NodeId>,
    /// What the scheduler ranks: `nodes` less `down`.
    pub cluster: Arc<ClusterSnapshot>,
    generation: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    v: u32,
    taken_at_ms: u64,
    nodes: Vec<NodeView>,
    known: Vec<(NodeId, SocketAddr)>,
}

impl View {
    /// A view of `nodes` taken now.
    pub fn new(
        nodes: BTreeMap<NodeId, NodeView>,
        known: BTreeMap<NodeId, SocketAddr>,
        generation: u64,
    ) -> Self {
        let mut v = Self {
            taken_at: Instant::now(),
            taken_at_ms: unix_ms(),
            nodes,
            known,
            down: BTreeSet::new(),
            cluster: Arc::new(ClusterSnapshot::new(0, 0, Vec::new())),
            generation,
        };
        v.rebuild();
        v
    }

    pub fn age(&self) -> Duration {
        self.taken_at.elapsed()
    }

    pub fn is_fresh(&self, ttl: Duration) -> bool {
        self.age() < ttl
    }

    /// Takes `id` out of ranking until a probe finds it again.
    pub fn mark_down(&mut self, id: NodeId) -> bool {
        let changed = self.down.insert(id);
        if changed {
            self.rebuild();
        }
        changed
    }

    /// Puts a node back with what its probe just said.
    pub fn restore(&mut self, node: NodeView) {
        self.known.insert(node.id, node.addr);
        self.down.remove(&node.id);
        self.nodes.insert(node.id, node);
        self.rebuild();
    }

    /// Whether any node of the last round holds `model` (down or not).
    pub fn holds(&self, model: &str, flavor: pair_core::ApiFlavor) -> bool {
        self.nodes
            .values()
            .any(|n| n.snapshot.find_model(model, flavor).is_some())
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    fn rebuild(&mut self) {
        self.generation += 1;
        let nodes = self
            .nodes
            .values()
            .filter(|n| !self.down.contains(&n.id))
            .map(|n| {
                let mut s = n.snapshot.clone();
                s.rtt_us = n.rtt_us;
                s.liveness = Liveness::Alive;
                // Reservations made after the probe count on top of it.
                s.reported_at_ms = self.taken_at_ms;
                s
            })
            .collect();
        self.cluster = Arc::new(ClusterSnapshot::new(
            self.generation,
            self.taken_at_ms,
            nodes,
        ));
    }

    /// Writes the view to `path` (whole, crash-safe: `pair_fs::write_atomic`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let file = CacheFile {
            v: FORMAT,
            taken_at_ms: self.taken_at_ms,
            nodes: self.nodes.values().cloned().collect(),
            known: self.known.iter().map(|(id, a)| (*id, *a)).collect(),
        };
        let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        Ok(pair_fs::write_atomic(path, &bytes, 0o600)?)
    }

    /// The view saved at `path`, aged by the time since it was taken.
    /// `None` when there is none; a damaged file is removed with a warning.
    pub fn load(path: &Path) -> Option<Self> {
        pair_fs::clean_leftovers(path);
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the ranking cache; probing afresh");
                return None;
            }
        };
        let file = match serde_json::from_slice::<CacheFile>(&bytes) {
            Ok(f) if f.v == FORMAT => f,
            Ok(f) => {
                tracing::warn!(path = %path.display(), version = f.v, "ranking cache of another format discarded; probing afresh");
                let _ = std::fs::remove_file(path);
                return None;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "damaged ranking cache discarded; probing afresh");
                let _ = std::fs::remove_file(path);
                return None;
            }
        };
        let age = Duration::from_millis(unix_ms().saturating_sub(file.taken_at_ms));
        // Taken "in the future" (a clock set back): treat it as stale.
        let taken_at = if file.taken_at_ms > unix_ms() {
            None
        } else {
            Instant::now().checked_sub(age)
        };
        let mut v = Self::new(
            file.nodes.into_iter().map(|n| (n.id, n)).collect(),
            file.known.into_iter().collect(),
            0,
        );
        v.taken_at_ms = file.taken_at_ms;
        match taken_at {
            Some(t) => v.taken_at = t,
            None => v.taken_at_ms = 0,
        }
        v.rebuild();
        Some(v)
    }

    /// Whether the view was taken long enough ago that it is stale, however
    /// the clock moved ([`View::load`] of a file from the future).
    pub fn stale_file(&self) -> bool {
        self.taken_at_ms == 0
    }
}

fn unix_ms() -> u64 {
    pair_core::unix_ms(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u128, rtt_us: u32) -> NodeView {
        let id = NodeId::from_u128(n);
        NodeView {
            id,
            name: format!("n{n}"),
            addr: SocketAddr::from(([127, 0, 0, 1], 14_000 + n as u16)),
            rtt_us,
            snapshot: NodeSnapshot::new(id, format!("n{n}")),
            models: Vec::new(),
        }
    }

    #[test]
    fn a_saved_view_loads_with_its_age_and_its_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge-cache.json");
        let nodes: BTreeMap<_, _> = [node(1, 300), node(2, 900)]
            .into_iter()
            .map(|n| (n.id, n))
            .collect();
        let mut known: BTreeMap<_, _> = nodes.values().map(|n| (n.id, n.addr)).collect();
        known.insert(NodeId::from_u128(3), SocketAddr::from(([127, 0, 0, 1], 9)));
        let v = View::new(nodes, known.clone(), 0);
        v.save(&path).unwrap();
        let back = View::load(&path).unwrap();
        assert_eq!(back.nodes, v.nodes);
        assert_eq!(back.known, known);
        assert!(back.is_fresh(Duration::from_secs(60)));
        assert_eq!(back.cluster.len(), 2);
        assert_eq!(back.cluster.node(NodeId::from_u128(2)).unwrap().rtt_us, 900);
    }

    #[test]
    fn a_damaged_cache_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge-cache.json");
        std::fs::write(&path, b"{\"v\":1,\"taken_at_ms\":").unwrap();
        assert!(View::load(&path).is_none());
        assert!(!path.exists(), "the damaged file is removed");
    }

    #[test]
    fn a_node_marked_down_leaves_the_ranked_cluster_until_restored() {
        let mut v = View::new(
            [node(1, 300), node(2, 900)]
                .into_iter()
                .map(|n| (n.id, n))
                .collect(),
            BTreeMap::new(),
            0,
        );
        assert!(v.mark_down(NodeId::from_u128(1)));
        assert!(!v.mark_down(NodeId::from_u128(1)));
        assert_eq!(v.cluster.len(), 1);
        v.restore(node(1, 250));
        assert_eq!(v.cluster.len(), 2);
        assert_eq!(v.cluster.node(NodeId::from_u128(1)).unwrap().rtt_us, 250);
    }
}
