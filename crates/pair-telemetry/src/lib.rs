//! GPU and host telemetry for a pair node: probes, EWMA pressure bands with
//! hysteresis, a 1 s sampler publishing through a watch channel, and the
//! `GET /pair/v1/node-info` JSON endpoint.
//!
//! The pressure rule is a pure core ([`pressure`]) and the node-info
//! document a plain value ([`NodeInfo`]); both live in pair-core, so that
//! crates which only read them need none of this one's probes, runtime or
//! HTTP, and are re-exported here unchanged. Probes, the sampler and the
//! node-info router are the thin shell around them. NVML is optional
//! (feature `nvml`, on by default) and a missing driver means "no GPU",
//! never an error at start. On macOS the Apple GPU is read from the IOKit
//! registry ([`apple`]), its unified memory counted as VRAM.

// Tests may unwrap: a panic is the failure report there.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod apple;
pub mod error;
pub mod gpu;
pub mod host;
pub mod node_info;
pub mod sampler;

pub use pair_core::pressure;

pub use apple::{AppleGpuProbe, parse_ioreg};
pub use error::TelemetryError;
#[cfg(feature = "nvml")]
pub use gpu::NvmlProbe;
pub use gpu::{FakeGpuProbe, FedGpuProbe, GpuFeed, GpuProbe, NoGpu, default_gpu_probe};
pub use host::{FakeHostProbe, HostProbe, HostStats, SysinfoHost};
pub use node_info::{
    NODE_INFO_PATH, NODE_INFO_VERSION, NodeInfo, NodeInfoConfig, node_info_router,
};
pub use pressure::{
    ComputeSource, EWMA_ALPHA, PressureConfig, PressureTracker, STALE_AFTER, Sample, Telemetry,
    band_for, compute_sample,
};
pub use sampler::{Sampler, SamplerConfig, sample_once};
