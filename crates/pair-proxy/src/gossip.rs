//! Cluster state between peers: every node pushes its own report (engines,
//! models, workload, GPUs, pressure) and its finished job records to each
//! paired peer over mTLS, and assembles the snapshot its scheduler ranks from
//! its own state plus the latest report of each peer.
//!
//! Report age is a liveness signal of its own: a node that stops reporting
//! (hung, not only crashed) turns suspect, then drops out of routing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use pair_core::{ClusterSnapshot, JobRecord, JobStatus, Liveness, NodeId, NodeSnapshot};
use tokio_util::sync::CancellationToken;

use crate::relay::{JOBS_PATH, REPORT_PATH};
use crate::state::{ProxyState, now_ms};

#[derive(Clone, Copy, Debug)]
pub struct GossipConfig {
    /// How often reports are pushed and the snapshot rebuilt.
    pub interval: Duration,
    /// A report older than this makes its node suspect (ranked last).
    pub suspect_after: Duration,
    /// A report older than this takes its node out of routing.
    pub dead_after: Duration,
    /// Our cluster port, told to peers with each report.
    pub cluster_port: u16,
}

impl Default for GossipConfig {
    fn default() -> Self {
        // Killed or hung nodes leave the routing set within ~3 s (issue 5's
        // target for discovery): 1.6 s without a report (3 missed 500 ms
        // reports) makes a node suspect; 2.5 s removes it.
        Self {
            interval: Duration::from_millis(500),
            suspect_after: Duration::from_millis(1_600),
            dead_after: Duration::from_millis(2_500),
            cluster_port: 0,
        }
    }
}

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

    /// (report, age) of every peer that reported.
    fn ages(&self) -> Vec<(NodeSnapshot, Duration)> {
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

/// What the node knows about a peer besides its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerView {
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
    peers: &HashMap<NodeId, PeerView>,
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

/// Most job records replicated per tick (the newest; at high request rates
/// peers' Jobs views show a sample, not every request).
const REPLICATE_MAX: usize = 1024;

/// Pushes reports and job records to peers and republishes the snapshot
/// every interval, until `shutdown`.
pub async fn run(
    st: Arc<ProxyState>,
    reports: Arc<PeerReports>,
    local: impl Fn() -> NodeSnapshot + Send + Sync,
    peers: impl Fn() -> HashMap<NodeId, PeerView> + Send + Sync,
    cfg: GossipConfig,
    shutdown: CancellationToken,
) {
    // Records from now on (replication sends what happens while it runs).
    let mut jobs_seen = st.jobs.end();
    let mut outbox: Vec<Arc<JobRecord>> = Vec::new();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut generation = 0u64;
    let mut rtts: HashMap<NodeId, u32> = HashMap::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // Our own terminal jobs, for the peers' Jobs views.
        let (recent, skipped) = st.jobs.since(&mut jobs_seen, REPLICATE_MAX);
        if skipped > 0 {
            tracing::debug!(skipped, "job replication lagged; some records stay local");
        }
        outbox.extend(
            recent
                .into_iter()
                .filter(|rec| rec.origin == st.node.id && rec.status != JobStatus::Running),
        );
        let mine = local();
        let links = st.peer_links();
        // Serialise only for someone: a lone node just republishes.
        let report = if links.is_empty() {
            Bytes::new()
        } else {
            Bytes::from(serde_json::to_vec(&mine).unwrap_or_default())
        };
        let batch = (!outbox.is_empty() && !links.is_empty())
            .then(|| Bytes::from(serde_json::to_vec(&outbox).unwrap_or_default()));
        outbox.clear();
        let deadline = cfg.interval.max(Duration::from_millis(500));
        let report_path = format!("{REPORT_PATH}?port={}", cfg.cluster_port);
        let pushes = links.values().map(|link| {
            let report = report.clone();
            let batch = batch.clone();
            let report_path = report_path.as_str();
            async move {
                let t = Instant::now();
                let ok = matches!(
                    link.call(http::Method::POST, report_path, report, deadline).await,
                    Ok(r) if r.status().is_success()
                );
                let rtt = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
                if let Some(b) = batch {
                    let _ = link.call(http::Method::POST, JOBS_PATH, b, deadline).await;
                }
                (link.id, ok.then_some(rtt))
            }
        });
        for (id, rtt) in join_all(pushes).await {
            if let Some(rtt) = rtt {
                // A light EWMA: one slow push must not reorder the cluster.
                let e = rtts.entry(id).or_insert(rtt);
                *e = ((u64::from(*e) * 3 + u64::from(rtt)) / 4) as u32;
            }
        }
        let mut views = peers();
        for (id, v) in &mut views {
            if let Some(rtt) = rtts.get(id) {
                v.rtt_us = *rtt;
            }
        }
        generation += 1;
        let snapshot = assemble(generation, now_ms(), mine, reports.ages(), &views, &cfg);
        st.publish(snapshot);
    }
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
        let view = PeerView {
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
            PeerView {
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
        let alive = PeerView {
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
