//! `pair-client`: the edge SDK as a command line, and `serve`, local
//! Ollama and OpenAI faces for unmodified apps on a machine without an
//! engine, made of the node's own face and pipeline code.

pub mod serve;
