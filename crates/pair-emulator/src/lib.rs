//! Engine performance model and emulated engines speaking the Ollama, OpenAI
//! and LM Studio APIs.
//!
//! Two layers: [`EngineModel`] is a pure, event-driven model of one engine on
//! one machine in virtual time (the simulator drives it), and [`http`] runs
//! the same model in real time behind real HTTP routes, with fault injection
//! (tests, the demo and benchmarks use it). Both keep the engine's prompt
//! cache ([`cache`]: a context per slot, or a shared pool of prefix blocks),
//! so a prompt whose prefix the engine holds prefills only the rest.
//!
//! Virtual time, as the simulator drives it:
//!
//! ```
//! use pair_core::PromptChain;
//! use pair_emulator::{EngineEvent, EngineModel, HardwareProfile, JobSpec, ModelSpec};
//!
//! let profile = HardwareProfile::cpu_smollm2_135m();
//! let model = ModelSpec::new("smollm2", profile.reference_model_bytes);
//! let mut engine = EngineModel::new(&profile, &[model], None);
//! engine.preload(0).unwrap();
//! let job = JobSpec {
//!     id: 1,
//!     model: 0,
//!     prompt_tokens: 20,
//!     output_tokens: 64,
//!     prompt: PromptChain::EMPTY,
//! };
//! engine.submit(0, job).unwrap();
//! let mut events = Vec::new();
//! while let Some(t) = engine.next_event_at() {
//!     engine.advance(t, &mut events);
//! }
//! let Some(EngineEvent::Finished(timing)) = events.last() else { panic!() };
//! // 30 ms overhead + 20 tokens at 390 tok/s, then 63 tokens at 126 tok/s.
//! assert_eq!(timing.ttft_us(), 81_283);
//! assert_eq!(timing.latency_us(), 581_283);
//! ```
//!
//! Real time, as tests use it:
//!
//! ```no_run
//! # async fn demo() -> Result<(), pair_emulator::EmulatorError> {
//! use pair_emulator::{EmulatedEngine, EmulatorConfig, Flavor};
//!
//! let cfg = EmulatorConfig::new(Flavor::Ollama, ["llama3.2:3b"]).with_time_scale(0.01);
//! let engine = EmulatedEngine::start(cfg).await?;
//! engine.faults().fail(Some("llama3.2:3b"), 500, Some(1));
//! // ... point a client at engine.base_url(), then:
//! assert_eq!(engine.hits_for("/api/chat"), 0);
//! engine.shutdown().await;
//! # Ok(()) }
//! ```

pub mod cache;
pub mod error;
pub mod model;
pub mod profile;

pub use cache::{CacheKind, HostCache, IdleSlots, Lease, PromptCache};
pub use error::EmulatorError;
pub use model::{Cut, EngineEvent, EngineModel, JobSpec, JobTiming, ModelStatus, Residency};
pub use profile::{BatchScaling, HardwareProfile, ModelRates, ModelSpec};
pub mod http;

pub use http::{
    AnswerLength, EmulatedEngine, EmulatorConfig, FaultAction, FaultRule, Faults, Flavor,
    HitCounts, REQUEST_ID, RequestHits, serve,
};
