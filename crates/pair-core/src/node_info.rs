//! Node info: the plain-HTTP JSON document at `GET /pair/v1/node-info` on the
//! cluster port, as a value. Telemetry and identity only: no models, no jobs
//! (those go over mutual TLS to paired peers). Format documented in
//! docs/node-info.md; pair-telemetry serves it, discovery's probes read it.

use serde::{Deserialize, Serialize};

use crate::id::{NodeId, Role};
use crate::pressure::{ComputeSource, HostStats, Telemetry};
use crate::snapshot::{GpuDevice, Pressure};

/// Where the document is served.
pub const NODE_INFO_PATH: &str = "/pair/v1/node-info";
/// Version of the document's format; bumped on incompatible changes.
pub const NODE_INFO_VERSION: u32 = 1;

/// The static part of node info: who this node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfoConfig {
    pub id: NodeId,
    /// Human name, display only.
    pub name: String,
    pub role: Role,
    pub cluster_port: u16,
}

/// The node-info document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Format version ([`NODE_INFO_VERSION`]).
    pub format: u32,
    /// Software version of the node (crate version).
    pub version: String,
    pub id: NodeId,
    pub name: String,
    pub role: Role,
    pub cluster_port: u16,
    /// When the telemetry was sampled, ms since the Unix epoch (0: never).
    pub taken_at_ms: u64,
    pub host: Option<HostStats>,
    pub gpus: Vec<GpuDevice>,
    pub compute: ComputeSource,
    pub utilisation_ewma_pct: Option<f32>,
    /// Pressure band with staleness applied at the time of the response.
    pub pressure: Pressure,
    /// Free VRAM over all GPUs; absent on a node without GPUs.
    pub vram_free_bytes: Option<u64>,
}

impl NodeInfo {
    /// The document for `node` from telemetry `t`, as seen at `now_ms`.
    pub fn new(node: &NodeInfoConfig, t: &Telemetry, now_ms: u64) -> Self {
        Self {
            format: NODE_INFO_VERSION,
            // Every crate of the workspace carries the workspace's version,
            // so pair-core's is the node's.
            version: env!("CARGO_PKG_VERSION").to_owned(),
            id: node.id,
            name: node.name.clone(),
            role: node.role,
            cluster_port: node.cluster_port,
            taken_at_ms: t.taken_at_ms,
            host: t.host,
            gpus: t.gpus.clone(),
            compute: t.compute,
            utilisation_ewma_pct: t.utilisation_ewma_pct,
            pressure: t.pressure_at(now_ms),
            vram_free_bytes: t.vram_free_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_applies_staleness_and_round_trips_through_json() {
        let node = NodeInfoConfig {
            id: NodeId::from_u128(7),
            name: "box".into(),
            role: Role::Client,
            cluster_port: 14318,
        };
        let t = Telemetry {
            taken_at_ms: 1_000,
            pressure: Pressure::MAX,
            ..Telemetry::default()
        };
        let fresh = NodeInfo::new(&node, &t, 2_000);
        assert_eq!(fresh.format, NODE_INFO_VERSION);
        assert_eq!(fresh.pressure, Pressure::MAX);
        assert_eq!(fresh.vram_free_bytes, None);
        let stale = NodeInfo::new(&node, &t, 60_000);
        assert_eq!(stale.pressure, Pressure::UNKNOWN);
        let json = serde_json::to_string(&fresh).unwrap();
        let back: NodeInfo = serde_json::from_str(&json).unwrap();
        assert_eq!(back, fresh);
    }
}
