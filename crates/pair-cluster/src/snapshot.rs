//! The cluster snapshot a node ranks: its own report, built from its
//! engines, telemetry, live workload and learned speeds, plus the latest
//! report of each paired peer that is fresh enough, with what discovery
//! says of it. [`assemble`] is pure; [`LocalReport`] and
//! [`peer_statuses`] read the node's live parts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pair_core::{ClusterSnapshot, Liveness, ModelPerf, NodeId, NodeSnapshot, Role, Telemetry};
use pair_discovery::PeerSet;
use pair_engines::EngineHandle;
use pair_identity::TrustStore;
use tokio::sync::watch;

use crate::config::GossipConfig;
use crate::learning::SpeedLearner;
use crate::links::Peers;
use crate::load::LocalLoad;
use crate::now_ms;
use crate::progress::Progress;

/// What the node knows about a peer besides its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStatus {
    /// From discovery's liveness state machine.
    pub liveness: Liveness,
    /// Measured round trip, microseconds.
    pub rtt_us: u32,
}

/// Builds the cluster snapshot: ourselves, plus every paired peer whose
/// report is fresh enough. `peers` lists the peers we may route to (paired,
/// with a link), with what discovery says of them. Pure.
pub fn assemble(
    generation: u64,
    now_ms: u64,
    local: NodeSnapshot,
    reports: Vec<(NodeSnapshot, Duration)>,
    peers: &HashMap<NodeId, PeerStatus>,
    cfg: &GossipConfig,
) -> ClusterSnapshot {
    let mut nodes = Vec::with_capacity(reports.len() + 1);
    let local_id = local.id;
    nodes.push(local);
    for (mut snap, age) in reports {
        let Some(view) = peers.get(&snap.id) else {
            continue;
        };
        if snap.id == local_id || age >= cfg.dead_after || view.liveness == Liveness::Dead {
            continue;
        }
        snap.liveness = if age >= cfg.suspect_after {
            Liveness::Suspect
        } else {
            view.liveness
        };
        snap.rtt_us = view.rtt_us;
        nodes.push(snap);
    }
    ClusterSnapshot::new(generation, now_ms, nodes)
}

/// A model's seed speed from its weight bytes.
#[derive(Clone)]
pub struct SeedBySize(pub Arc<dyn Fn(u64) -> ModelPerf + Send + Sync>);

impl std::fmt::Debug for SeedBySize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SeedBySize(..)")
    }
}

/// This node's own entry of the cluster snapshot, made from its live parts.
#[derive(Debug)]
pub struct LocalReport {
    pub id: NodeId,
    pub name: String,
    pub engines: Vec<EngineHandle>,
    /// Each engine's progress, in the order of `engines`: a stalled one is
    /// reported unhealthy until it cools down or makes progress.
    pub progress: Vec<Arc<Progress>>,
    pub telemetry: watch::Receiver<Telemetry>,
    /// Seed speed for models not yet learned (the demo derives it from the
    /// emulated hardware profile).
    pub base_perf: Option<ModelPerf>,
    /// Seed speed of a model by its weight bytes, ahead of `base_perf`
    /// (an emulated engine's hardware profile).
    pub seed_by_size: Option<SeedBySize>,
    pub load: Arc<LocalLoad>,
    /// Where conversations that entered here were sent.
    pub bindings: Arc<crate::Bindings>,
    pub learner: Arc<SpeedLearner>,
    /// This process's boot id ([`NodeSnapshot::boot`]).
    pub boot: u64,
    /// The node's pins; the report carries a digest of the clients it
    /// vouches for ([`NodeSnapshot::vouches`]).
    pub trust: TrustStore,
    /// The model aliases configured here ([`NodeSnapshot::aliases`]).
    pub aliases: Vec<pair_core::ModelAlias>,
    /// The API keys this node holds; the report carries their digest.
    pub keys: pair_identity::keys::KeyStore,
}

impl LocalReport {
    /// The report as of now.
    pub fn build(&self) -> NodeSnapshot {
        let now = now_ms();
        let mut n = NodeSnapshot::new(self.id, self.name.clone());
        n.engines = self.engines.iter().map(EngineHandle::snapshot).collect();
        for ((e, h), p) in n.engines.iter_mut().zip(&self.engines).zip(&self.progress) {
            if let Some(at) = h.worked_at_ms() {
                p.worked_at(at);
            }
            e.healthy &= !p.stalled();
            e.silent = p.silent();
        }
        for e in &mut n.engines {
            // Overlapping requests prove slots the engine does not report.
            let learned = e
                .models
                .iter()
                .filter_map(|m| self.learner.slots(m.name.as_str()))
                .max()
                .unwrap_or(1);
            e.slots = e.slots.max(learned);
            for m in &mut e.models {
                let advertised = m.perf.or_else(|| {
                    let by_size = self.seed_by_size.as_ref()?;
                    Some((by_size.0)(m.size_bytes?))
                });
                let seed = advertised.or(self.base_perf);
                if let Some(learned) = self.learner.learned(
                    self.id,
                    m.name.as_str(),
                    seed.unwrap_or(ModelPerf::FALLBACK),
                ) {
                    m.perf = Some(learned);
                    m.learned = true;
                } else {
                    m.perf = seed;
                }
            }
        }
        let t = self.telemetry.borrow();
        n.gpus = t.gpus.clone();
        n.pressure = t.pressure_at(now);
        drop(t);
        // Work sent straight to an engine's own port (vLLM reports its
        // queue) is invisible to PAIR; count it here.
        let (running, waiting) = self
            .engines
            .iter()
            .filter_map(|h| h.report().queue)
            .fold((0u32, 0u32), |(r, w), q| {
                (r.saturating_add(q.running), w.saturating_add(q.waiting))
            });
        self.load.set_engine_queue(running, waiting);
        // What was admitted before the workload is read: every request it
        // names is counted in the workload.
        n.admitted = self.load.admitted();
        n.workload = self.load.workload(n.slots());
        n.reported_at_ms = now;
        n.boot = self.boot;
        n.vouches = self.trust.vouch_digest(Role::Client);
        n.base_perf = self.base_perf;
        n.bindings = self.bindings.reported(now);
        n.routed = self.bindings.routed(now);
        n.aliases.clone_from(&self.aliases);
        n.keys = self.keys.digest();
        n
    }
}

/// The peers the scheduler may route to: paired nodes with a link, with
/// what discovery says of them (peers known only by address are taken as
/// alive; their report age decides).
pub fn peer_statuses(
    trust: &TrustStore,
    discovered: &watch::Receiver<PeerSet>,
    peers: &Peers,
) -> HashMap<NodeId, PeerStatus> {
    let set = discovered.borrow();
    let links = peers.links();
    trust
        .peers()
        .into_iter()
        .filter(|p| p.role == Role::Node && links.contains_key(&p.id))
        .map(|p| {
            let status = set.get(p.id).map_or(
                PeerStatus {
                    liveness: Liveness::Alive,
                    rtt_us: 0,
                },
                |d| PeerStatus {
                    liveness: d.liveness,
                    rtt_us: d.rtt_us.unwrap_or(0),
                },
            );
            (p.id, status)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(id: u128) -> NodeSnapshot {
        NodeSnapshot::new(NodeId::from_u128(id), format!("n{id}"))
    }

    #[test]
    fn fresh_reports_of_known_peers_only() {
        let cfg = GossipConfig::default();
        let mut peers = HashMap::new();
        let view = PeerStatus {
            liveness: Liveness::Alive,
            rtt_us: 120,
        };
        peers.insert(NodeId::from_u128(2), view);
        peers.insert(NodeId::from_u128(3), view);
        peers.insert(NodeId::from_u128(4), view);
        let reports = vec![
            (n(2), Duration::from_millis(100)),
            (n(3), Duration::from_millis(2_000)),
            (n(4), Duration::from_secs(10)),
            (n(5), Duration::ZERO), // not paired/linked
            (n(1), Duration::ZERO), // claims to be us
        ];
        let s = assemble(7, 0, n(1), reports, &peers, &cfg);
        let ids: Vec<_> = s.nodes().iter().map(|x| x.id).collect();
        assert_eq!(
            ids,
            [
                NodeId::from_u128(1),
                NodeId::from_u128(2),
                NodeId::from_u128(3)
            ]
        );
        assert_eq!(s.node(NodeId::from_u128(2)).unwrap().rtt_us, 120);
        assert_eq!(
            s.node(NodeId::from_u128(3)).unwrap().liveness,
            Liveness::Suspect
        );
        assert_eq!(s.generation, 7);
    }

    #[test]
    fn discovery_death_wins_over_a_fresh_report() {
        let mut peers = HashMap::new();
        peers.insert(
            NodeId::from_u128(2),
            PeerStatus {
                liveness: Liveness::Dead,
                rtt_us: 0,
            },
        );
        let s = assemble(
            1,
            0,
            n(1),
            vec![(n(2), Duration::ZERO)],
            &peers,
            &GossipConfig::default(),
        );
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn default_thresholds_are_the_documented_ones() {
        let cfg = GossipConfig::default();
        let mut peers = HashMap::new();
        let alive = PeerStatus {
            liveness: Liveness::Alive,
            rtt_us: 0,
        };
        peers.insert(NodeId::from_u128(2), alive);
        let at = |ms| {
            let s = assemble(
                1,
                0,
                n(1),
                vec![(n(2), Duration::from_millis(ms))],
                &peers,
                &cfg,
            );
            s.node(NodeId::from_u128(2)).map(|x| x.liveness)
        };
        assert_eq!(at(1_590), Some(Liveness::Alive));
        assert_eq!(at(1_610), Some(Liveness::Suspect));
        assert_eq!(at(2_490), Some(Liveness::Suspect));
        assert_eq!(at(2_510), None);
    }
}
