//! Cluster state between peers: every node pushes its own report (engines,
//! models, workload, GPUs, pressure) and its job records to each paired
//! peer over mTLS, and publishes the snapshot its scheduler ranks,
//! assembled from its own report and the latest of each peer's.
//!
//! Job records are delivered with acknowledgement: each peer has a cursor
//! into this node's log that moves only past a batch the peer answered
//! 2xx, so a peer that was paused, partitioned or down catches up when it
//! is back (bounded: the log keeps the newest 10,000 records and a batch
//! is at most [`REPLICATE_MAX`] of them). Every record goes on, not only
//! this node's own: a record of a job whose origin crashed still reaches
//! everyone through the node that ran it. A record comes to rest because
//! a log takes in only what supersedes what it holds.
//!
//! Report age is a liveness signal of its own: a node that stops reporting
//! (hung, not only crashed) turns suspect, then drops out of routing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::join_all;
use pair_core::{ClusterSnapshot, JobRecord, JobStatus, Liveness, NodeId};
use pair_jobs::JobLog;
use tokio_util::sync::CancellationToken;

use crate::config::GossipConfig;
use crate::links::Peers;
use crate::now_ms;
use crate::reports::PeerReports;
use crate::routes::{JOBS_PATH, REPLICATE_MAX, REPORT_PATH};
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

/// Where one peer is in this node's job log.
#[derive(Debug)]
struct Delivery {
    /// The first position the peer has not acknowledged.
    cursor: usize,
    /// The peer's boot id when it last acknowledged: a new one means it
    /// restarted and may have lost what it had not yet written, so the
    /// log is sent again from its start.
    boot: u64,
    /// Up to here the peer gets its own records back too: it may have
    /// lost the last ones it made in a crash (set when the history is
    /// sent again from the start).
    echo_until: usize,
}

impl Delivery {
    /// From the start of the log, the peer's own records included.
    fn from_start(boot: u64, jobs: &JobLog) -> Self {
        Self {
            cursor: 0,
            boot,
            echo_until: jobs.end(),
        }
    }
}

/// Pushes reports and job records to peers every interval, and publishes
/// the snapshot after each push and as each peer's report arrives (at
/// most every tenth of an interval), so that what a peer reports is seen
/// at once rather than at this node's next push; until `shutdown`.
pub async fn run(g: Gossip, cfg: GossipConfig, shutdown: CancellationToken) {
    let Gossip {
        node: _,
        jobs,
        peers,
        reports,
        local,
        statuses,
        publish,
    } = g;
    let mut pushes = Pushes::default();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut generation = 0u64;
    let gap = cfg.interval / 10;
    let mut published = tokio::time::Instant::now();
    loop {
        let push = tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => true,
            () = reports.arrived() => {
                // Reports arriving together make one snapshot.
                tokio::time::sleep_until(published + gap).await;
                false
            }
        };
        let mine = local.build();
        if push {
            pushes.push(&mine, &cfg, &jobs, &peers, &reports).await;
        }
        let mut views = statuses();
        for (id, v) in &mut views {
            if let Some(rtt) = pushes.rtts.get(id) {
                v.rtt_us = *rtt;
            }
            // A peer whose address does not answer as that peer (another
            // node's certificate, or nothing) is not routed to, however
            // fresh its last report.
            let unreached = pushes
                .reached
                .get(id)
                .map_or(Duration::ZERO, Instant::elapsed);
            v.liveness = probed(v.liveness, unreached, &cfg);
        }
        generation += 1;
        let snapshot = assemble(generation, now_ms(), mine, reports.ages(), &views, &cfg);
        publish(snapshot);
        published = tokio::time::Instant::now();
    }
}

/// What the pushes to peers keep between intervals.
#[derive(Debug, Default)]
struct Pushes {
    deliveries: HashMap<NodeId, Delivery>,
    /// When each peer last took a report: a push over mTLS pinned to the
    /// peer's certificate is this node's identity probe of it.
    reached: HashMap<NodeId, Instant>,
    /// Each peer's round trip, smoothed.
    rtts: HashMap<NodeId, u32>,
}

impl Pushes {
    /// Pushes this node's report `mine` and the job records each peer
    /// lacks to every paired peer, and notes which answered and how fast.
    async fn push(
        &mut self,
        mine: &pair_core::NodeSnapshot,
        cfg: &GossipConfig,
        jobs: &JobLog,
        peers: &Peers,
        reports: &PeerReports,
    ) {
        let Pushes {
            deliveries,
            reached,
            rtts,
        } = self;
        let links = peers.links();
        let boots = reports.boots();
        deliveries.retain(|id, _| links.contains_key(id));
        reached.retain(|id, _| links.contains_key(id));
        let started = Instant::now();
        for id in links.keys() {
            // A new link has until `dead_after` to answer.
            reached.entry(*id).or_insert(started);
        }
        // Serialise only for someone: a lone node just republishes.
        let report = if links.is_empty() {
            Bytes::new()
        } else {
            Bytes::from(serde_json::to_vec(mine).unwrap_or_default())
        };
        let deadline = cfg.interval.max(Duration::from_millis(500));
        let report_path = format!("{REPORT_PATH}?port={}", cfg.cluster_port);
        let pushes = links.values().map(|link| {
            let report = report.clone();
            let report_path = report_path.as_str();
            let boot = boots.get(&link.id).copied().unwrap_or(0);
            let d = deliveries
                .entry(link.id)
                .or_insert_with(|| Delivery::from_start(boot, jobs));
            if boot != d.boot {
                tracing::debug!(peer = %link.id, "peer restarted; sending it the job history again");
                *d = Delivery::from_start(boot, jobs);
            }
            let echo = d.cursor < d.echo_until;
            let (batch, next) = outbox(jobs, d.cursor, (!echo).then_some(link.id));
            async move {
                let t = Instant::now();
                let ok = matches!(
                    link.call(http::Method::POST, report_path, report, deadline).await,
                    Ok(r) if r.status().is_success()
                );
                let rtt = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
                // Acknowledged or not sent (nothing to send): move on.
                let acked = match batch {
                    None => true,
                    Some(b) => match link.call(http::Method::POST, JOBS_PATH, b, deadline).await {
                        Ok(r) if r.status().is_success() => true,
                        Ok(r) => {
                            tracing::warn!(peer = %link.id, status = %r.status(), "a peer refused job records; resending them");
                            false
                        }
                        Err(_) => false,
                    },
                };
                (link.id, ok.then_some(rtt), acked.then_some(next))
            }
        });
        for (id, rtt, next) in join_all(pushes).await {
            if let (Some(next), Some(d)) = (next, deliveries.get_mut(&id)) {
                d.cursor = next;
            }
            if rtt.is_some() {
                reached.insert(id, started);
            }
            if let Some(rtt) = rtt {
                // A light EWMA: one slow push must not reorder the cluster.
                let e = rtts.entry(id).or_insert(rtt);
                *e = ((u64::from(*e) * 3 + u64::from(rtt)) / 4) as u32;
            }
        }
    }
}

/// The job records after `cursor` that a peer may lack (as JSON; `None`
/// when there are none), and the cursor past them. A record the peer
/// `skip_own` itself made is not sent back to it; a `running` one is not
/// sent at all.
fn outbox(jobs: &JobLog, cursor: usize, skip_own: Option<NodeId>) -> (Option<Bytes>, usize) {
    let (records, next) = jobs.after(cursor, REPLICATE_MAX);
    let batch: Vec<&JobRecord> = records
        .iter()
        .map(AsRef::as_ref)
        .filter(|r| {
            r.status != JobStatus::Running && (skip_own.is_none() || r.recorded_by != skip_own)
        })
        .collect();
    if batch.is_empty() {
        return (None, next);
    }
    (
        Some(Bytes::from(serde_json::to_vec(&batch).unwrap_or_default())),
        next,
    )
}

/// A peer's liveness given how long its link has gone without taking a
/// report: no better than `suspect` past `suspect_after`, `dead` past
/// `dead_after`.
fn probed(liveness: Liveness, unreached: Duration, cfg: &GossipConfig) -> Liveness {
    if unreached >= cfg.dead_after {
        Liveness::Dead
    } else if unreached >= cfg.suspect_after && liveness == Liveness::Alive {
        Liveness::Suspect
    } else {
        liveness
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u128, by: u128) -> JobRecord {
        let by = NodeId::from_u128(by);
        JobRecord {
            streaming: false,
            origin: by,
            ran_on: Some(by),
            created_at_ms: 1,
            recorded_by: Some(by),
            ..JobRecord::fixture(id)
        }
    }

    #[test]
    fn a_peer_gets_its_own_records_back_only_after_a_restart() {
        let jobs = JobLog::in_memory();
        let peer = NodeId::from_u128(2);
        jobs.record(record(1, 1));
        jobs.record(record(2, 2));
        let sent = |batch: Option<Bytes>| -> Vec<JobRecord> {
            serde_json::from_slice(&batch.unwrap()).unwrap()
        };
        let (batch, next) = outbox(&jobs, 0, Some(peer));
        assert_eq!(next, 2);
        assert_eq!(sent(batch).len(), 1, "not its own");
        let (batch, _) = outbox(&jobs, 0, None);
        assert_eq!(sent(batch).len(), 2, "its own too");
        assert_eq!(outbox(&jobs, 2, None).0, None, "nothing new");
    }

    #[test]
    fn a_peer_that_does_not_answer_as_itself_leaves_routing() {
        let cfg = GossipConfig {
            suspect_after: Duration::from_secs(1),
            dead_after: Duration::from_secs(3),
            ..GossipConfig::default()
        };
        let s = |ms| probed(Liveness::Alive, Duration::from_millis(ms), &cfg);
        assert_eq!(s(0), Liveness::Alive);
        assert_eq!(s(999), Liveness::Alive);
        assert_eq!(s(1_000), Liveness::Suspect);
        assert_eq!(s(3_000), Liveness::Dead);
        // Never better than discovery says.
        assert_eq!(probed(Liveness::Dead, Duration::ZERO, &cfg), Liveness::Dead);
    }
}
