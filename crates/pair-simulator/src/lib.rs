//! pair-simulator: a deterministic cluster simulator for comparing pair's
//! routing policies, and its live twin over pair-emulator's engines.
//!
//! Everything the `pair-sim` binary does lives here, so tests, benches and
//! other routers drive the same code: [`Scenario::load`] (or
//! [`Scenario::parse`]) turns a scenario into typed values,
//! [`report::compare`] runs the chosen policies on it (and searches users at
//! SLO), and [`report::render_table`], [`report::to_json`] and
//! [`report::write_svgs`] present the results. `examples/compare_policies.rs`
//! compares two policies from Rust in a few lines.
//!
//! Nothing here reads a clock or a global RNG: a run is a function of the
//! scenario, the policy and the seed, so the same seed gives byte-identical
//! JSON. Only [`live`] starts processes and talks to sockets.

// Tests may unwrap: a panic there is a failed test with its location.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod bench;
pub mod dist;
pub mod error;
pub mod live;
pub mod metrics;
pub mod pressure;
pub mod report;
pub mod scenario;
pub mod search;
pub mod sim;
pub mod svg;
pub mod workload;

pub use error::SimError;
/// The policies a scenario runs under (from pair-scheduler, re-exported so
/// an embedder needs this crate only).
pub use pair_scheduler::Policy;
pub use report::{CompareOptions, PolicyResult, ScenarioReport, compare};
pub use scenario::Scenario;
pub use sim::{Cluster, RunOutput, simulate};

/// Parses a `--policy` value: one policy name, or `all`.
pub fn parse_policies(arg: &str) -> Result<Vec<pair_scheduler::Policy>, SimError> {
    if arg.trim().eq_ignore_ascii_case("all") {
        return Ok(pair_scheduler::Policy::ALL.to_vec());
    }
    arg.split(',')
        .map(|p| {
            p.parse::<pair_scheduler::Policy>()
                .map_err(|_| SimError::UnknownPolicy(p.trim().to_owned()))
        })
        .collect()
}
