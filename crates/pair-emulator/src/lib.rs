//! Engine performance model and emulated engines speaking the Ollama, OpenAI
//! and LM Studio APIs.
//!
//! Two layers: [`EngineModel`] is a pure, event-driven model of one engine on
//! one machine in virtual time (the simulator drives it), and [`http`] runs
//! the same model in real time behind real HTTP routes, with fault injection
//! (tests, the demo and benchmarks use it).

pub mod error;
pub mod model;
pub mod profile;

pub use error::EmulatorError;
pub use model::{EngineEvent, EngineModel, JobSpec, JobTiming, ModelStatus, Residency};
pub use profile::{BatchScaling, HardwareProfile, ModelRates, ModelSpec};
pub mod http;

pub use http::{
    EmulatedEngine, EngineConfig, FaultAction, FaultRule, Faults, Flavor, HitCounts, serve,
};
