//! Thread per core, with no HTTP in it: [`runtime`] runs N event loops
//! (one current-thread tokio runtime each) and deals connections over them
//! round-robin; [`per_loop`] keeps what a request writes once per loop, for
//! readers to add up. The faces and the cluster port (pair-http,
//! pair-cluster, pair-proxy) run on it, and the job store (pair-jobs)
//! stages its records per loop without depending on HTTP.

pub mod per_loop;
pub mod runtime;

pub use per_loop::{PerLoop, PerLoopArc};
pub use runtime::EventLoops;
