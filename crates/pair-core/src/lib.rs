//! Shared vocabulary of pair: who the nodes are, which models they hold, how
//! busy they are, what a request asks for and what happened to it, what a
//! node answers on its node-info route, and the pressure rule (EWMA bands
//! with hysteresis), which discovery and the simulator read without
//! pair-telemetry's probes.
//!
//! This crate does no I/O, owns no clock and spawns nothing. Times are plain
//! numbers handed in by the caller (milliseconds since the Unix epoch, or
//! durations), so every other crate, including the pure scheduler and the
//! simulator, can reason about the same values in real or virtual time.

pub mod engine;
pub mod error;
pub mod id;
pub mod job;
pub mod model;
pub mod node_info;
pub mod pressure;
pub mod request;
pub mod snapshot;

pub use engine::{ApiFlavor, EngineKind};
pub use error::{CoreError, RetryAdvice};
pub use id::{JobId, NodeId, Role};
pub use job::{JobRecord, JobStatus};
pub use model::ModelName;
pub use node_info::{NODE_INFO_PATH, NODE_INFO_VERSION, NodeInfo, NodeInfoConfig};
pub use pressure::{ComputeSource, HostStats, PressureConfig, PressureTracker, Sample, Telemetry};
pub use request::{RequestProfile, SessionKey};
pub use snapshot::{
    ClusterSnapshot, EngineSnapshot, GpuDevice, Liveness, ModelEntry, ModelPerf, NodeSnapshot,
    Pressure, Workload,
};

/// `t` as the milliseconds since the Unix epoch that every snapshot and job
/// record carries (0 before the epoch, saturating far after it). Callers
/// pass the clock in: `unix_ms(SystemTime::now())`.
pub fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn unix_ms_counts_from_the_epoch() {
        assert_eq!(
            super::unix_ms(UNIX_EPOCH + Duration::from_millis(1_234)),
            1_234
        );
        assert_eq!(super::unix_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
    }
}
