//! The edge SDK of pair: a program on a machine without an engine (a
//! laptop, an agent host, a CI runner) uses a pair cluster directly.
//!
//! The client pairs once with any node as a requester-only `client` (the
//! same PIN and SPAKE2 exchange as nodes; [`Client::join`]); that node
//! vouches for it to the rest of the cluster and tells it the others'
//! pins. It then probes the nodes itself over mutual TLS
//! (`GET /pair/v1/probe` on each cluster port: models, load, warm models,
//! learned speeds), measures its own round trip to each, and ranks them with
//! [`pair_scheduler`], the nodes' own policies: time to first token from
//! queue, speed, cold loads and the client's distance. The ranking is cached
//! (five minutes by default, in the state dir too, so short-lived processes
//! probe once) and a request goes straight to the best node's cluster port.
//! A node that fails before the first byte hands the request to the next
//! one of the cached ranking (no new probe round; the failed node is probed
//! again in the background), by the nodes' failover rules
//! ([`pair_scheduler::Failover`]); after the first byte nothing is resent.
//!
//! ```no_run
//! use pair_sdk::{Client, api::openai};
//! use futures_util::StreamExt;
//!
//! # async fn run() -> pair_sdk::Result<()> {
//! let dir = pair_sdk::config::default_state_dir().expect("a home folder");
//! let client = Client::builder(dir)
//!     .seed("gpu-box.lan:14318")
//!     .build()
//!     .await?;
//! // Once: client.join("gpu-box.lan:14318", "123456").await?;
//!
//! let chat = openai::ChatRequest::new("qwen2.5:7b", vec![openai::Message::user("hi")]);
//! let mut chunks = client.stream(chat).await?;
//! while let Some(chunk) = chunks.next().await {
//!     print!("{}", chunk?.text());
//! }
//! println!("\nserved by {} in {:?}", chunks.node_name, chunks.first_byte);
//! # Ok(()) }
//! ```
//!
//! The example is whole in `examples/chat.rs`
//! (`cargo run -p pair-sdk --example chat -- --seed HOST:PORT -m MODEL PROMPT`).

pub mod api;
pub mod client;
pub mod config;
pub mod error;
pub mod probe;
pub mod response;
pub mod view;

pub use client::{Client, Request, Stats, Survey};
pub use config::{ClientBuilder, Config, Mdns};
pub use error::{Attempts, Error, Result, Tried};
pub use response::{BodyStream, Chunks, Framing, Response};
