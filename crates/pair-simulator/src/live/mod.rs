//! The live twin of a scenario (`pair-sim live`): the scenario's nodes as
//! real `pair-node` processes on loopback in front of emulated engines, its
//! workload sent by real HTTP clients to their faces, measured the way the
//! simulator measures (same demand, same summaries), and set beside the
//! simulator's per-node run of the same scenario.
//!
//! Unlike the rest of this crate, this reads the clock and starts
//! processes: a live run is a measurement, not a function of its seed.
//! Engines run at a time scale (0.25: four times faster than modelled);
//! every figure is reported in modelled time.

mod cluster;
mod drive;

use std::path::PathBuf;

use pair_scheduler::Policy;

use crate::SimError;
use crate::metrics::{cdf_points, summarise};
use crate::report::{PolicyResult, ScenarioReport, slo_met};
use crate::scenario::{Entry, Routing, Scenario};
use crate::search::{Probe, users_at_slo};
use crate::sim::Cluster;

pub use cluster::default_pair_node;

/// How to run a scenario live.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    pub policies: Vec<Policy>,
    /// The `pair-node` binary.
    pub pair_node: PathBuf,
    /// Wall seconds per modelled second of the emulated engines.
    pub time_scale: f64,
    /// Event loops per node (`PAIR_THREADS`).
    pub threads: u16,
    /// Search users at SLO live, up to this many users (one live run per
    /// probe, at the scenario's duration).
    pub search_max: Option<u32>,
    /// Conversations name themselves with `x-pair-session` (as an app that
    /// keeps conversation ids does); by default they carry no header and
    /// the nodes find them from the body.
    pub session_header: bool,
}

/// The scenario as its live twin runs it: every node routes its own
/// clients (a live cluster has no single router), entering as the scenario
/// says or spread over the nodes.
pub fn as_live(scn: &Scenario) -> Scenario {
    let mut s = scn.clone();
    if s.routing == Routing::Single {
        s.routing = Routing::PerNode(Entry::Spread);
    }
    s
}

/// Runs `scn` live under every policy, one fresh cluster per policy (no
/// policy inherits another's learning). `tick` is told when each starts.
pub fn compare_live(
    scn: &Scenario,
    opts: &LiveOptions,
    tick: &(dyn Fn(&str) + Sync),
) -> Result<ScenarioReport, SimError> {
    if !(opts.time_scale.is_finite() && opts.time_scale > 0.0) {
        return Err(SimError::invalid(
            "--time-scale",
            "must be a positive number",
        ));
    }
    let scn = as_live(scn);
    let plan = Cluster::build(&scn)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| SimError::live("async runtime", e))?;
    let mut policies = Vec::with_capacity(opts.policies.len());
    for &policy in &opts.policies {
        tick(&format!("{} {policy}: live", scn.name));
        let mut result = rt.block_on(run_policy(&scn, &plan, policy, opts))?;
        if let Some(max) = opts.search_max {
            let known: Vec<Probe> = scn
                .configured_users()
                .map(|users| probe_of(&scn, users, &result))
                .into_iter()
                .collect();
            result.search = Some(users_at_slo(max, &known, |users| {
                tick(&format!("{} {policy}: live, {users} users", scn.name));
                let r = rt.block_on(run_policy(
                    &scn.with_users_kept_running(users),
                    &plan,
                    policy,
                    opts,
                ))?;
                Ok::<_, SimError>(probe_of(&scn, users, &r))
            })?);
        }
        policies.push(result);
    }
    Ok(ScenarioReport::new(&scn, &plan, policies))
}

async fn run_policy(
    scn: &Scenario,
    plan: &Cluster,
    policy: Policy,
    opts: &LiveOptions,
) -> Result<PolicyResult, SimError> {
    let live =
        cluster::LiveCluster::start(scn, policy, &opts.pair_node, opts.time_scale, opts.threads)
            .await?;
    let faces: Vec<String> = live.nodes.iter().map(|n| n.face()).collect();
    let names: Vec<String> = live.nodes.iter().map(|n| n.name.clone()).collect();
    let busy_before = live.busy_us();
    let out = drive::drive(scn, plan, faces, names, opts).await;
    let busy_after = live.busy_us();
    live.stop().await;
    let out = out?;
    let end = out.last_finish.max(scn.duration).max(1);
    let nodes: Vec<(String, String, f64)> = plan
        .names()
        .into_iter()
        .zip(busy_before.iter().zip(&busy_after))
        .map(|((name, profile), (b, a))| (name, profile, a.saturating_sub(*b) as f64 / end as f64))
        .collect();
    let sources: Vec<String> = scn.sources.iter().map(|s| s.name.clone()).collect();
    let (mut summary, ttft_sorted) = summarise(
        &out.records,
        &nodes,
        &sources,
        scn.slo.ttft_miss,
        out.generated,
        out.completed,
        (scn.warmup, scn.duration),
    );
    summary.fan_out = out.jobs.summary();
    summary.turns = out.turns.summary();
    Ok(PolicyResult {
        policy,
        ttft_cdf: cdf_points(&ttft_sorted, 240),
        run: summary,
        search: None,
        sweep: Vec::new(),
    })
}

/// A live run as a users-at-SLO probe.
fn probe_of(scn: &Scenario, users: u32, r: &PolicyResult) -> Probe {
    Probe {
        users,
        ttft_p95_ms: r.run.ttft.p95_ms,
        e2e_p95_ms: r.run.e2e.p95_ms,
        pass: slo_met(&r.run, scn.search.source, scn.slo.ttft_p95),
    }
}

/// Where the live ranking of policies contradicts the simulator's: every
/// two policies the simulator separates clearly (one's mean TTFT more than
/// `margin` times the other's) must come out in the same order live. Close
/// calls in the simulator are not held against the live run. The mean,
/// not the p95: a short run's p95 hangs on its few slowest requests, and
/// where a policy sends a few percent of them to a slow node it jumps
/// between the fast and the slow node's figures from run to run; the mean
/// weighs every request.
pub fn ranking_differences(
    sim: &ScenarioReport,
    live: &ScenarioReport,
    margin: f64,
) -> Vec<String> {
    let mean = |r: &ScenarioReport, p: Policy| {
        r.policies
            .iter()
            .find(|x| x.policy == p)
            .map(|x| x.run.ttft.mean_ms)
    };
    let mut out = Vec::new();
    for a in &sim.policies {
        for b in &sim.policies {
            let (sa, sb) = (a.run.ttft.mean_ms, b.run.ttft.mean_ms);
            if sa * margin >= sb {
                continue;
            }
            // The simulator says `a` is clearly better than `b`.
            if let (Some(la), Some(lb)) = (mean(live, a.policy), mean(live, b.policy))
                && la >= lb
            {
                out.push(format!(
                    "{} ahead of {} in the simulator (mean TTFT {:.0} vs {:.0} ms) but not live ({:.0} vs {:.0} ms)",
                    a.policy, b.policy, sa, sb, la, lb
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Percentiles, RunSummary};

    fn report(means: &[(Policy, f64)]) -> ScenarioReport {
        ScenarioReport {
            scenario: "s".into(),
            description: String::new(),
            seed: 0,
            slo_ttft_p95_ms: 2000.0,
            nodes: Vec::new(),
            users: None,
            policies: means
                .iter()
                .map(|&(policy, mean)| PolicyResult {
                    policy,
                    run: RunSummary {
                        requests: 1,
                        generated: 1,
                        completed: 1,
                        rejected: 0,
                        ttft: Percentiles {
                            mean_ms: mean,
                            ..Percentiles::default()
                        },
                        e2e: Percentiles::default(),
                        queue: Percentiles::default(),
                        throughput_rps: 0.0,
                        output_tokens_per_s: 0.0,
                        slo_misses: 0,
                        simulated_s: 0.0,
                        nodes: Vec::new(),
                        sources: Vec::new(),
                        fan_out: None,
                        turns: None,
                        cache: None,
                    },
                    search: None,
                    sweep: Vec::new(),
                    ttft_cdf: Vec::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn only_clear_orders_of_the_simulator_must_hold_live() {
        use Policy::*;
        let sim = report(&[
            (PredictedLatency, 500.0),
            (Pair, 1900.0),
            (LeastPending, 7000.0),
            (P2c, 9000.0),
        ]);
        // Same clear order; least-pending and p2c swap (a close call).
        let live = report(&[
            (PredictedLatency, 700.0),
            (Pair, 2500.0),
            (LeastPending, 9900.0),
            (P2c, 8000.0),
        ]);
        assert!(ranking_differences(&sim, &live, 1.5).is_empty());
        // Pair overtakes predicted-latency live: reported, once.
        let swapped = report(&[
            (PredictedLatency, 3000.0),
            (Pair, 2500.0),
            (LeastPending, 9900.0),
            (P2c, 8000.0),
        ]);
        let d = ranking_differences(&sim, &swapped, 1.5);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].starts_with("predicted-latency ahead of pair"), "{d:?}");
    }

    #[test]
    fn a_single_router_scenario_runs_live_with_a_router_per_node() {
        let scn = Scenario::parse(
            "name = \"s\"\nduration_s = 10\nslo = { ttft_p95_ms = 1000 }\n\
             [[models]]\nname = \"m\"\nsize_gb = 1\n\
             [[nodes]]\nname = \"a\"\nprofile = \"rtx4090\"\nmodels = [\"m\"]\n\
             [[workload]]\nname = \"c\"\nkind = \"closed-loop\"\nusers = 2\n\
             think_ms = { dist = \"fixed\", value = 100 }\n\
             prompt_tokens = { dist = \"fixed\", value = 10 }\n\
             output_tokens = { dist = \"fixed\", value = 10 }\n",
        )
        .unwrap();
        assert_eq!(scn.routing, Routing::Single);
        assert_eq!(as_live(&scn).routing, Routing::PerNode(Entry::Spread));
        let mut at = scn.clone();
        at.routing = Routing::PerNode(Entry::At(0));
        assert_eq!(as_live(&at).routing, Routing::PerNode(Entry::At(0)));
    }
}
