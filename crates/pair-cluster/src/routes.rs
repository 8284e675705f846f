//! What a paired peer may post on the cluster port (behind mutual TLS): its
//! workload report and its finished job records. A node speaks only for
//! itself; a requester-only client posts neither.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Extension, Json, Query, State};
use axum::routing::post;
use http::StatusCode;
use pair_core::{JobRecord, NodeSnapshot, Role};
use pair_jobs::JobLog;

use crate::port::PeerIdentity;
use crate::reports::PeerReports;

pub const REPORT_PATH: &str = "/pair/v1/report";
pub const JOBS_PATH: &str = "/pair/v1/jobs";

/// Most records one post may carry.
const JOBS_PER_POST: usize = 2 * REPLICATE_MAX;
/// Most job records a node sends a peer in one post (about 200 KiB of
/// JSON, half what a peer takes): a peer that fell behind catches up this
/// many per gossip tick.
pub const REPLICATE_MAX: usize = 512;

#[derive(Clone)]
struct Inbox {
    reports: Arc<PeerReports>,
    jobs: Arc<JobLog>,
}

/// The report and job routes; requests carry [`PeerIdentity`] in their
/// extensions (the cluster port puts it there after the handshake).
pub fn router(reports: Arc<PeerReports>, jobs: Arc<JobLog>) -> Router {
    Router::new()
        .route(REPORT_PATH, post(report))
        .route(JOBS_PATH, post(jobs_posted))
        .with_state(Inbox { reports, jobs })
}

/// `?port=` names the reporter's cluster port, so a node learns where to
/// reach a peer that paired with it even without multicast.
#[derive(serde::Deserialize)]
struct ReportQuery {
    port: Option<u16>,
}

async fn report(
    State(inbox): State<Inbox>,
    Extension(peer): Extension<PeerIdentity>,
    Query(q): Query<ReportQuery>,
    Json(snapshot): Json<NodeSnapshot>,
) -> StatusCode {
    if peer.role != Role::Node || snapshot.id != peer.id {
        // A node reports only for itself; clients never report.
        return StatusCode::FORBIDDEN;
    }
    let addr = q
        .port
        .filter(|p| *p != 0)
        .map(|p| SocketAddr::new(peer.remote.ip(), p));
    inbox.reports.accept(snapshot, addr);
    StatusCode::NO_CONTENT
}

async fn jobs_posted(
    State(inbox): State<Inbox>,
    Extension(peer): Extension<PeerIdentity>,
    Json(records): Json<Vec<JobRecord>>,
) -> StatusCode {
    if peer.role != Role::Node {
        return StatusCode::FORBIDDEN;
    }
    // A node passes on the records it holds (its own, the jobs it ran for
    // others, and what it learned from peers), so a job whose origin
    // crashed is still known everywhere; the log keeps, per job, the
    // record that supersedes the rest. The 2xx acknowledges the batch.
    if records.len() > JOBS_PER_POST {
        return StatusCode::PAYLOAD_TOO_LARGE;
    }
    inbox.jobs.merge(records);
    StatusCode::NO_CONTENT
}
