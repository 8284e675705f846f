//! The request path of a pair node.
//!
//! Local apps talk plain HTTP to the node's faces on loopback (Ollama on
//! 11434, OpenAI / LM Studio on 1234). Each inference request is classified
//! ([`route`]), its top-level `model` read ([`body`]), the cluster snapshot
//! ranked by pair-scheduler, and the ordered candidates tried by the
//! failover executor ([`forward`]): the local engine directly, or a peer over
//! mutual TLS on its cluster port ([`dispatch`], [`relay`]). Answers stream
//! through as they arrive ([`stream`]); every request leaves a job record
//! ([`jobs`]) and metrics ([`metrics`]).
//!
//! Only this crate knows HTTP routes.

pub mod body;
pub mod dispatch;
pub mod error;
pub mod face;
pub mod forward;
pub mod gate;
pub mod listing;
pub mod metrics;
pub mod receipt;
pub mod relay;
pub mod route;
pub mod state;
pub mod stream;
