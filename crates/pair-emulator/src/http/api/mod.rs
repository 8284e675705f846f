//! Route handlers: the Ollama, OpenAI and LM Studio request and response
//! shapes, driven by the engine model through [`Core`](super::driver::Core).
//!
//! The files are layered so that none uses a file above it: `errors` (the
//! engines' error answers) and `prefix` (a request's prompt chain) at the
//! bottom, `common` (body, model, waiting on a job) on them, `render` (what a generation sends back) on that, and the
//! routes (`generate`, `embed`, `listing`) on top.

// Early returns carry the finished error response; it is built once per
// failed request, so its size does not matter.
#![allow(clippy::result_large_err)]

mod common;
mod embed;
mod errors;
mod generate;
mod listing;
mod prefix;
mod render;

pub(super) use embed::{ollama_embed, ollama_embeddings, openai_embeddings};
pub(super) use errors::{bad_request, fault_status, not_found};
pub use generate::ANSWER_TOKENS;
pub(super) use generate::{ollama_chat, ollama_generate, openai_chat, openai_completions};
pub(super) use listing::{
    health, llamacpp_props, lmstudio_v0_model, lmstudio_v0_models, lmstudio_v1_models, ollama_ps,
    ollama_root, ollama_show, ollama_tags, ollama_version, openai_model, openai_models,
};
