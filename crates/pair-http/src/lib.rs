//! HTTP/1.1 plumbing that knows no routes: what a pair node needs to take
//! requests from local apps and pass them to engines at nginx's cost.
//!
//! - [`h1`]: the hand-framed codec on `httparse` (heads, RFC 9112 body
//!   lengths, chunked bodies, writing heads), fuzzed (`fuzz/`).
//! - [`server`]: one face connection served by hand (keep-alive,
//!   pipelining, the client's deadlines and hang-ups); what it does not
//!   serve itself is handed to hyper's server ([`hyper_conn`]).
//! - [`client`]: keep-alive connections from one event loop to the local
//!   engines.
//! - [`request`] and [`reply`]: a request kept for replay and an answer on
//!   its way back, with hop-by-hop headers handled once.
//! - [`conns`]: the cap on open connections and the clients' deadlines.
//!
//! The event loops it runs on (thread per core) are `pair-runtime`'s.
//!
//! Why by hand: measured side by side, hyper's server and hyper-util's
//! client cost about 60 % more CPU per proxied request than this code and
//! miss the bar the faces are held to (docs/benchmarks/proxy.md); hyper
//! still serves what this code leaves to it.

pub mod client;
pub mod conns;
pub mod h1;
pub mod hyper_conn;
pub mod reply;
pub mod request;
pub mod server;

pub use client::{ClientError, EngineAnswer, EngineBody, HttpStack, LocalPool, Outgoing, Timeouts};
pub use h1::{Fields, FramingError, Headers};
pub use reply::{Extra, Reply};
pub use request::RequestHead;
