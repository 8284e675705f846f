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

pub mod addr;
pub mod alias;
pub mod engine;
pub mod error;
pub mod id;
pub mod job;
pub mod model;
pub mod node_info;
pub mod pressure;
pub mod prompt;
pub mod request;
pub mod snapshot;

pub use addr::{AddrError, PeerAddrParts, Zone, parse_peer_addr};
pub use alias::ModelAlias;
pub use engine::{ApiFlavor, EngineKind};
pub use error::{CoreError, FAILURE_CLASSES, FailureClass, RetryAdvice, failure_class};
pub use id::{JobId, NodeId, Role};
pub use job::{EngineTiming, JobRecord, JobStatus, JobWait, Resumption, WaitReason};
pub use model::ModelName;
pub use node_info::{NODE_INFO_PATH, NODE_INFO_VERSION, NodeInfo, NodeInfoConfig};
pub use pressure::{ComputeSource, HostStats, PressureConfig, PressureTracker, Sample, Telemetry};
pub use prompt::{Block, ChainBuilder, PromptChain, Routed};
pub use request::{Priority, RequestProfile, SessionKey};
pub use snapshot::{
    Admitted, Binding, ClusterSnapshot, EngineSnapshot, GpuDevice, Liveness, ModelEntry, ModelPerf,
    NodeSnapshot, Pressure, Workload,
};

/// `t` as the milliseconds since the Unix epoch that every snapshot and job
/// record carries (0 before the epoch, saturating far after it). Callers
/// pass the clock in: `unix_ms(SystemTime::now())`.
pub fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// RFC 3339 UTC time with nanoseconds (`2026-12-03T12:00:00.000000000Z`),
/// as Ollama writes `created_at`.
pub fn rfc3339(secs: u64, nanos: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
