//! pair-sim: a deterministic cluster simulator for comparing pair's routing
//! policies, and the shell around pair-emulator's emulated engines.
//!
//! The simulator is a library so tests, benches and other tools drive the
//! same code as the `pair-sim` binary:
//! [`Scenario::load`] parses a scenario file into typed values,
//! [`report::compare`] runs every policy on it (and searches users at SLO),
//! and [`report::render_table`], [`report::to_json`] and
//! [`report::write_svgs`] present the results.
//!
//! Nothing here reads a clock or a global RNG: a run is a function of the
//! scenario, the policy and the seed, so the same seed gives byte-identical
//! JSON.

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
