//! Engine adapters (Ollama, LM Studio, OpenAI-compatible): health, inventory
//! (installed and loaded models, sizes, queue depth) and port inversion.
//!
//! Layout, pure first:
//! - [`inventory`]: parsers of each engine's real JSON (and Prometheus text).
//! - [`state`]: how polls fold into a published [`EngineReport`] (health
//!   with a failure threshold, last inventory kept while down).
//! - [`ports`]: the start-up decision [`plan_ports`].
//! - [`detect`]: which engines listen on loopback, named by their answers
//!   (pure identification and plan, a scanning shell).
//! - shells: [`probe`] (one HTTP poll), [`poller`] (the owned polling task,
//!   `watch` publication), [`supervisor`] (adopt or launch the engine on the
//!   moved port).

// Tests may unwrap (the workspace rule); library code may not.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod config;
pub mod detect;
pub mod error;
pub mod inventory;
pub mod poller;
pub mod ports;
pub mod probe;
pub mod state;
pub mod supervisor;

pub use config::{EngineConfig, EngineUrl, PollConfig, moved_port};
pub use error::EngineError;
pub use inventory::{OllamaLoaded, QueueDepth};
pub use poller::{EngineHandle, spawn_poller};
pub use ports::{PortPair, PortPlan, PortUse, move_hint, plan_ports};
pub use probe::{EngineProbe, http_client};
pub use state::{
    EngineReport, EngineState, HealthTracker, InventoryRead, Observation, ProbeFailure, Transition,
};
pub use supervisor::{EngineCommand, EngineSupervisor, SupervisorConfig, inspect_port};
