//! The speed benchmark: a synthetic open-loop scenario of a given size, run
//! once, timed in wall-clock and CPU time.

use std::time::Instant;

use pair_scheduler::Policy;

use crate::scenario::US_PER_S;
use crate::sim::{Cluster, simulate};
use crate::{Scenario, SimError};

/// What one bench run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    pub policy: Policy,
    pub nodes: usize,
    pub requests: u64,
    pub events: u64,
    pub simulated_s: f64,
    pub wall_s: f64,
    /// Process CPU time (user + system) where the OS reports it.
    pub cpu_s: Option<f64>,
    pub ttft_p95_ms: f64,
}

/// A heterogeneous open-loop cluster sized so that `requests` arrive at
/// about 70 % of its capacity (4090s, 3060s and laptops in turn).
pub fn bench_scenario(requests: u64, nodes: usize) -> Result<Scenario, SimError> {
    let nodes = nodes.max(1);
    let profiles = ["rtx4090", "rtx3060", "rtx4090", "laptop"];
    // Rough requests/s each profile sustains on an 8B model with ~180
    // output tokens (aggregate decode with its slots busy).
    let capacity = |p: &str| match p {
        "rtx4090" => 2.0,
        "rtx3060" => 0.75,
        _ => 0.1,
    };
    let chosen: Vec<&str> = (0..nodes).map(|i| profiles[i % profiles.len()]).collect();
    let rate = 0.7 * chosen.iter().map(|p| capacity(p)).sum::<f64>();
    let duration = (requests as f64 / rate).max(1.0);
    let mut text = format!(
        "name = \"bench\"\nseed = 1\nduration_s = {duration:.3}\nslo = {{ ttft_p95_ms = 2000 }}\n\
         [[models]]\nname = \"llama3.1:8b\"\nsize_gb = 4.9\n"
    );
    for (i, p) in chosen.iter().enumerate() {
        text.push_str(&format!(
            "[[nodes]]\nname = \"node-{i:02}\"\nprofile = \"{p}\"\nmodels = [\"llama3.1:8b\"]\n"
        ));
    }
    text.push_str(&format!(
        "[[workload]]\nname = \"open\"\nkind = \"poisson\"\nrate_per_s = {rate:.4}\nstreaming = 0.8\n\
         prompt_tokens = {{ dist = \"lognormal\", median = 400, sigma = 0.9, max = 8000 }}\n\
         output_tokens = {{ dist = \"lognormal\", median = 150, sigma = 0.7, max = 2000 }}\n"
    ));
    Scenario::parse(&text)
}

/// Builds the bench scenario and runs it once under `policy`.
pub fn run_bench(requests: u64, nodes: usize, policy: Policy) -> Result<BenchResult, SimError> {
    let scn = bench_scenario(requests, nodes)?;
    let plan = Cluster::build(&scn)?;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let out = simulate(&scn, &plan, policy)?;
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = match (cpu0, cpu_seconds()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    Ok(BenchResult {
        policy,
        nodes,
        requests: out.summary.generated,
        events: out.events,
        simulated_s: scn.duration as f64 / US_PER_S as f64,
        wall_s,
        cpu_s,
        ttft_p95_ms: out.summary.ttft.p95_ms,
    })
}

/// User + system CPU seconds of this process (Linux `/proc/self/stat`,
/// in clock ticks of 1/100 s); `None` elsewhere.
#[cfg(target_os = "linux")]
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// No portable source of a process's CPU time: `None`.
#[cfg(not(target_os = "linux"))]
pub fn cpu_seconds() -> Option<f64> {
    None
}
