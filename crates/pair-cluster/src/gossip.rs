//! Cluster state between peers: every node pushes its own report (engines,
//! models, workload, GPUs, pressure) and its finished job records to each
//! paired peer over mTLS, and publishes the snapshot its scheduler ranks,
//! assembled from its own report and the latest of each peer's.
//!
//! Report age is a liveness signal of its own: a node that stops reporting
//! (hung, not only crashed) turns suspect, then drops out of routing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use pair_core::{ClusterSnapshot, JobRecord, JobStatus, NodeId};
use pair_jobs::JobLog;
use tokio_util::sync::CancellationToken;

use crate::config::GossipConfig;
use crate::links::Peers;
use crate::now_ms;
use crate::reports::PeerReports;
use crate::routes::{JOBS_PATH, REPORT_PATH};
use crate::snapshot::{LocalReport, PeerStatus, assemble};

/// What gossip reads and where it publishes.
pub struct Gossip {
    pub node: NodeId,
    pub jobs: Arc<JobLog>,
    pub peers: Arc<Peers>,
    pub reports: Arc<PeerReports>,
    pub local: LocalReport,
    /// The peers that may be routed to, with what discovery says of them.
    pub statuses: Box<dyn Fn() -> HashMap<NodeId, PeerStatus> + Send + Sync>,
    /// Where each new snapshot goes (the request path's state).
    pub publish: Box<dyn Fn(ClusterSnapshot) + Send + Sync>,
}

impl std::fmt::Debug for Gossip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gossip")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Most job records replicated per tick (the newest; at high request rates
/// peers' Jobs views show a sample, not every request).
const REPLICATE_MAX: usize = 1024;

/// Pushes reports and job records to peers and republishes the snapshot
/// every interval, until `shutdown`.
pub async fn run(g: Gossip, cfg: GossipConfig, shutdown: CancellationToken) {
    let Gossip {
        node,
        jobs,
        peers,
        reports,
        local,
        statuses,
        publish,
    } = g;
    // Records from now on (replication sends what happens while it runs).
    let mut jobs_seen = jobs.end();
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
        let (recent, skipped) = jobs.since(&mut jobs_seen, REPLICATE_MAX);
        if skipped > 0 {
            tracing::debug!(skipped, "job replication lagged; some records stay local");
        }
        outbox.extend(
            recent
                .into_iter()
                .filter(|rec| rec.origin == node && rec.status != JobStatus::Running),
        );
        let mine = local.build();
        let links = peers.links();
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
        let mut views = statuses();
        for (id, v) in &mut views {
            if let Some(rtt) = rtts.get(id) {
                v.rtt_us = *rtt;
            }
        }
        generation += 1;
        let snapshot = assemble(generation, now_ms(), mine, reports.ages(), &views, &cfg);
        publish(snapshot);
    }
}
