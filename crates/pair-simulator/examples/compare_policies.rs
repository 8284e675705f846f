//! Compares two routing policies on a scenario from Rust: the few lines
//! another router's tests can copy to check a policy against pair's.
//!
//! ```text
//! cargo run -p pair-simulator --example compare_policies
//! cargo run -p pair-simulator --example compare_policies -- scenarios/heterogeneous.toml
//! ```
//!
//! Without an argument it runs the scenario written below; with one, that
//! scenario file.

use std::process::ExitCode;

use pair_simulator::{CompareOptions, Policy, Scenario, SimError, compare};

/// Two GPUs and a laptop serving one model to a dozen chatting users.
const SCENARIO: &str = r#"
name = "example"
description = "Two GPUs and a laptop, one model, chatting users."
seed = 42
duration_s = 120
warmup_s = 10
slo = { ttft_p95_ms = 2000 }

[[models]]
name = "llama3.1:8b"
size_gb = 4.9

[[nodes]]
name = "desk"
profile = "rtx4090"
models = ["llama3.1:8b"]

[[nodes]]
name = "den"
profile = "rtx3060"
models = ["llama3.1:8b"]

[[nodes]]
name = "laptop"
profile = "laptop"
models = ["llama3.1:8b"]

[[workload]]
name = "chat"
kind = "closed-loop"
users = 8
think_ms = { dist = "exponential", mean = 4000 }
prompt_tokens = { dist = "lognormal", median = 400, sigma = 0.8, max = 6000 }
output_tokens = { dist = "lognormal", median = 150, sigma = 0.6, max = 1000 }
streaming = 0.9
"#;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compare_policies: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), SimError> {
    let scenario = match std::env::args_os().nth(1) {
        Some(path) => Scenario::load(path.as_ref())?,
        // A scenario is plain data: change it in code before running it.
        None => Scenario::parse(SCENARIO)?.try_with_users(12)?,
    };
    let options = CompareOptions {
        policies: vec![Policy::PredictedLatency, Policy::RoundRobin],
        // One run per policy; `true` also searches users at the SLO.
        search: false,
        parallel: true,
    };
    // The last argument reports progress; a test has nothing to show.
    let report = compare(&scenario, &options, &|_| {})?;

    println!(
        "{} on {} nodes, seed {}:",
        report.scenario,
        report.nodes.len(),
        report.seed
    );
    for r in &report.policies {
        println!(
            "  {:<18} mean TTFT {:>7.0} ms, p95 {:>7.0} ms over {} requests",
            r.policy.as_str(),
            r.run.ttft.mean_ms,
            r.run.ttft.p95_ms,
            r.run.requests
        );
    }
    let best = report
        .policies
        .iter()
        .min_by(|a, b| a.run.ttft.mean_ms.total_cmp(&b.run.ttft.mean_ms));
    if let Some(best) = best {
        println!("better by mean TTFT: {}", best.policy.as_str());
    }
    Ok(())
}
