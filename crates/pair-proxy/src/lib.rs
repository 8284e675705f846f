//! The request path of a pair node: its doors, and the one pipeline every
//! request goes through.
//!
//! Doors: the local faces ([`face`]: Ollama on 11434, OpenAI / LM Studio on
//! 1234, plain HTTP for this machine's apps), the opt-in LAN face ([`lan`]:
//! every API on one port, for other devices, each request with an API key)
//! and the relay ([`relay`]: a
//! request a paired peer sent here over mTLS). Each reads a request whole
//! and hands it to [`pipeline::handle`], which reads top to bottom: the
//! gate ([`gate`]), the route ([`route`]), and for inference the body's
//! routing fields ([`body`]) and its conversation ([`conversation`]), the
//! plan and the failover core, the attempts
//! ([`dispatch`]: the local engine, or a peer's cluster port), the answer
//! streamed back ([`stream`]) with its receipt ([`receipt`]), and the job
//! record and metrics ([`job`], [`metrics`]). Listings are merged across
//! the cluster ([`listing`]); what no route claims goes to the local engine
//! ([`passthrough`]). Edge clients rank this node by its [`probe`].
//!
//! Only this crate knows inference routes.

pub(crate) mod attempt;
pub mod body;
pub mod conversation;
pub mod dispatch;
pub mod engine_report;
pub mod error;
pub mod face;
pub mod gate;
pub mod job;
pub mod lan;
pub mod listing;
pub mod metrics;
pub(crate) mod outcome;
pub mod passthrough;
pub mod pipeline;
pub(crate) mod preempt;
pub mod probe;
pub mod receipt;
pub mod relay;
pub mod resume;
pub mod route;
pub mod state;
pub mod stream;
pub mod translate;
pub mod waiting;
