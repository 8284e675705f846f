//! Comparing policies on one scenario: the runs, the users-at-SLO searches,
//! and their presentation as a terminal table, JSON and SVG files.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pair_scheduler::Policy;
use serde::Serialize;

use crate::SimError;
use crate::metrics::{RunSummary, cdf_points};
use crate::scenario::{Micros, Scenario, US_PER_MS};
use crate::search::{Probe, SearchOutcome, users_at_slo};
use crate::sim::{Cluster, simulate};
use crate::svg;

/// One policy's results on a scenario.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    pub policy: Policy,
    /// The run with the scenario's own users and duration.
    pub run: RunSummary,
    /// Users at SLO (absent when the scenario has no closed-loop source or
    /// the search was not asked for).
    pub search: Option<SearchOutcome>,
    /// The same user counts for every policy (see [`sweep_grid`]), for the
    /// p95-against-users plot.
    pub sweep: Vec<Probe>,
    /// (TTFT ms, fraction) points of the run's TTFT CDF.
    pub ttft_cdf: Vec<(f64, f64)>,
}

/// Everything `pair-sim run` found on one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub description: String,
    pub seed: u64,
    pub slo_ttft_p95_ms: f64,
    pub nodes: Vec<NodeInfo>,
    pub users: Option<u32>,
    pub policies: Vec<PolicyResult>,
}

impl ScenarioReport {
    /// The report of `scn`, run on `plan`, with each policy's results.
    pub fn new(scn: &Scenario, plan: &Cluster, policies: Vec<PolicyResult>) -> Self {
        ScenarioReport {
            scenario: scn.name.clone(),
            description: scn.description.clone(),
            seed: scn.seed,
            slo_ttft_p95_ms: scn.slo.ttft_p95 as f64 / US_PER_MS as f64,
            nodes: plan
                .names()
                .into_iter()
                .map(|(name, profile)| NodeInfo { name, profile })
                .collect(),
            users: scn.configured_users(),
            policies,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NodeInfo {
    pub name: String,
    pub profile: String,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub policies: Vec<Policy>,
    /// Search users at SLO (one full simulation per probe).
    pub search: bool,
    /// Run policies on separate threads (results are identical either way).
    pub parallel: bool,
}

/// One full simulation at `users` closed-loop users, as a search probe.
fn probe(scn: &Scenario, plan: &Cluster, policy: Policy, users: u32) -> Result<Probe, SimError> {
    let r = simulate(&scn.with_users(users), plan, policy)?;
    Ok(Probe {
        users,
        ttft_p95_ms: r.summary.ttft.p95_ms,
        e2e_p95_ms: r.summary.e2e.p95_ms,
        pass: slo_met(&r.summary, scn.search.source, scn.slo.ttft_p95),
    })
}

/// Runs `f` for every policy, on threads when asked; results keep the
/// policies' order, so output does not depend on scheduling.
fn per_policy<T: Send>(
    policies: &[Policy],
    parallel: bool,
    f: impl Fn(usize, Policy) -> Result<T, SimError> + Sync,
) -> Result<Vec<T>, SimError> {
    let results: Vec<Result<T, SimError>> = if parallel && policies.len() > 1 {
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = policies
                .iter()
                .enumerate()
                .map(|(i, &p)| s.spawn(move || f(i, p)))
                .collect();
            handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(r) => r,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
        })
    } else {
        policies.iter().enumerate().map(|(i, &p)| f(i, p)).collect()
    };
    results.into_iter().collect()
}

/// The common user counts every policy is also run at, so the users plot
/// compares policies on the same x values: about a dozen points up to half
/// again the best policy's users at SLO.
pub fn sweep_grid(best: u32, max_users: u32) -> Vec<u32> {
    let top = (best.saturating_mul(3) / 2).max(4).min(max_users.max(1));
    let step = top.div_ceil(12).max(1);
    let mut grid: Vec<u32> = (1..=top).filter(|u| u % step == 0 || *u == 1).collect();
    if grid.last() != Some(&top) {
        grid.push(top);
    }
    grid
}

/// Runs every policy (and its users-at-SLO search) on a scenario. `tick` is
/// called after each simulation with a short description, for progress.
pub fn compare(
    scn: &Scenario,
    opts: &CompareOptions,
    tick: &(dyn Fn(&str) + Sync),
) -> Result<ScenarioReport, SimError> {
    let plan = Cluster::build(scn)?;
    let plan = &plan;
    let searching = opts.search && scn.search.source.is_some();
    let mut results = per_policy(&opts.policies, opts.parallel, |_, policy| {
        let out = simulate(scn, plan, policy)?;
        tick(&format!("{} {policy}: run", scn.name));
        let search = if searching {
            Some(users_at_slo(scn.search.max_users, &[], |users| {
                let p = probe(scn, plan, policy, users)?;
                tick(&format!("{} {policy}: {users} users", scn.name));
                Ok::<_, SimError>(p)
            })?)
        } else {
            None
        };
        Ok(PolicyResult {
            policy,
            ttft_cdf: cdf_points(&out.ttft_sorted, 240),
            run: out.summary,
            search,
            sweep: Vec::new(),
        })
    })?;
    if searching {
        let best = results
            .iter()
            .filter_map(|r| r.search.as_ref().map(|s| s.users_at_slo))
            .max()
            .unwrap_or(0);
        let grid = sweep_grid(best, scn.search.max_users);
        let sweeps = per_policy(&opts.policies, opts.parallel, |i, policy| {
            let known = results[i]
                .search
                .as_ref()
                .map_or(&[][..], |s| &s.probes[..]);
            grid.iter()
                .map(|&u| match known.iter().find(|p| p.users == u) {
                    Some(p) => Ok(*p),
                    None => {
                        let p = probe(scn, plan, policy, u)?;
                        tick(&format!("{} {policy}: sweep {u} users", scn.name));
                        Ok(p)
                    }
                })
                .collect::<Result<Vec<_>, SimError>>()
        })?;
        // Search again with everything known: a count the sweep found
        // passing above the gallop's answer is refined the same way.
        let refined = per_policy(&opts.policies, opts.parallel, |i, policy| {
            let mut known = sweeps[i].clone();
            if let Some(s) = &results[i].search {
                known.extend(s.probes.iter().copied());
            }
            users_at_slo(scn.search.max_users, &known, |users| {
                let p = probe(scn, plan, policy, users)?;
                tick(&format!("{} {policy}: {users} users", scn.name));
                Ok::<_, SimError>(p)
            })
        })?;
        for ((r, sweep), search) in results.iter_mut().zip(sweeps).zip(refined) {
            r.sweep = sweep;
            r.search = Some(search);
        }
    }
    Ok(ScenarioReport::new(scn, plan, results))
}

/// The SLO test of the search: the searched users' own p95 TTFT (all
/// requests when no source is given) within the target, with at least one
/// measured request (an empty run proves nothing).
pub fn slo_met(run: &RunSummary, source: Option<usize>, ttft_p95: Micros) -> bool {
    let (n, p95) = match source.and_then(|i| run.sources.get(i)) {
        Some(s) => (s.requests, s.ttft.p95_ms),
        None => (run.requests, run.ttft.p95_ms),
    };
    n > 0 && p95 <= ttft_p95 as f64 / US_PER_MS as f64
}

/// Upper bound on the number of simulations `compare` runs, for a progress
/// bar: one run per policy plus a search's worst case.
pub fn planned_simulations(scn: &Scenario, opts: &CompareOptions) -> u64 {
    let per_search = if opts.search && scn.search.source.is_some() {
        let bits = u64::from(32 - scn.search.max_users.max(1).leading_zeros());
        2 * bits + 1
    } else {
        0
    };
    opts.policies.len() as u64 * (1 + per_search + if per_search > 0 { 13 } else { 0 })
}

fn fmt_ms(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}s", v / 1_000.0)
    } else if v >= 1_000.0 {
        format!("{:.2}s", v / 1_000.0)
    } else {
        format!("{v:.0}ms")
    }
}

/// The terminal table: one row per policy, then each node's share.
pub fn render_table(r: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {} (seed {}, SLO p95 TTFT {}){}",
        r.scenario,
        r.seed,
        fmt_ms(r.slo_ttft_p95_ms),
        r.users.map_or(String::new(), |u| format!(", {u} users"))
    );
    if !r.description.is_empty() {
        let _ = writeln!(out, "  {}", r.description);
    }
    let _ = writeln!(
        out,
        "{:<18} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7}",
        "policy",
        "users@SLO",
        "ttft p50",
        "ttft p95",
        "ttft p99",
        "e2e p50",
        "e2e p95",
        "e2e p99",
        "queue95",
        "req/s",
        "misses"
    );
    for p in &r.policies {
        let users = match &p.search {
            Some(s) if s.capped => format!(">={}", s.users_at_slo),
            Some(s) if s.fails_below => format!("{}*", s.users_at_slo),
            Some(s) => s.users_at_slo.to_string(),
            None => "-".into(),
        };
        let miss_pct = if p.run.requests == 0 {
            0.0
        } else {
            p.run.slo_misses as f64 * 100.0 / p.run.requests as f64
        };
        let _ = writeln!(
            out,
            "{:<18} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8.2} {:>6.1}%",
            p.policy.as_str(),
            users,
            fmt_ms(p.run.ttft.p50_ms),
            fmt_ms(p.run.ttft.p95_ms),
            fmt_ms(p.run.ttft.p99_ms),
            fmt_ms(p.run.e2e.p50_ms),
            fmt_ms(p.run.e2e.p95_ms),
            fmt_ms(p.run.e2e.p99_ms),
            fmt_ms(p.run.queue.p95_ms),
            p.run.throughput_rps,
            miss_pct
        );
    }
    if r.policies
        .iter()
        .any(|p| p.search.as_ref().is_some_and(|s| s.fails_below))
    {
        let _ = writeln!(
            out,
            "* also fails the SLO at some smaller user count (light load sends idle traffic to slow nodes)"
        );
    }
    let sources: Vec<&str> = r
        .policies
        .first()
        .map(|p| p.run.sources.iter().map(|s| s.name.as_str()).collect())
        .unwrap_or_default();
    if sources.len() > 1 {
        let _ = writeln!(out, "per source: p95 TTFT / p95 end-to-end");
        let _ = write!(out, "{:<36}", "source");
        for p in &r.policies {
            let _ = write!(out, " {:>18}", p.policy.as_str());
        }
        out.push('\n');
        for (i, name) in sources.iter().enumerate() {
            let _ = write!(out, "{name:<36}");
            for p in &r.policies {
                if let Some(s) = p.run.sources.get(i) {
                    let cell = format!("{} / {}", fmt_ms(s.ttft.p95_ms), fmt_ms(s.e2e.p95_ms));
                    let _ = write!(out, " {cell:>18}");
                }
            }
            out.push('\n');
        }
    }
    if r.policies.iter().any(|p| p.run.fan_out.is_some()) {
        let _ = writeln!(
            out,
            "agent jobs: makespan p50 / capacity-weighted ideal p50 (makespan / ideal, p50 and p95) / whole-task ideal p50 (makespan / it, p50 and p95)"
        );
        let _ = write!(out, "{:<36}", "");
        for p in &r.policies {
            let _ = write!(out, " {:>44}", p.policy.as_str());
        }
        out.push('\n');
        let _ = write!(out, "{:<36}", "agent jobs");
        for p in &r.policies {
            let cell = p.run.fan_out.map_or_else(String::new, |f| {
                format!(
                    "{} / {} ({:.2}x, {:.2}x) / {} ({:.2}x, {:.2}x)",
                    fmt_ms(f.makespan_p50_ms),
                    fmt_ms(f.ideal_p50_ms),
                    f.ratio_p50,
                    f.ratio_p95,
                    fmt_ms(f.whole_ideal_p50_ms),
                    f.whole_ratio_p50,
                    f.whole_ratio_p95
                )
            });
            let _ = write!(out, " {cell:>44}");
        }
        out.push('\n');
        let _ = write!(out, "{:<36}", "  fastest node alone p50 (makespan / it)");
        for p in &r.policies {
            let cell = p.run.fan_out.map_or_else(String::new, |f| {
                format!(
                    "{} ({:.2}x, {:.2}x)",
                    fmt_ms(f.alone_p50_ms),
                    f.alone_ratio_p50,
                    f.alone_ratio_p95
                )
            });
            let _ = write!(out, " {cell:>44}");
        }
        out.push('\n');
    }
    if r.policies.iter().any(|p| p.run.cache.is_some()) {
        let _ = write!(out, "{:<36}", "prompt tokens cached (% of oracle)");
        for p in &r.policies {
            let cell = p.run.cache.map_or_else(String::new, |c| {
                format!("{:.1}% ({:.1}%)", c.hit_share * 100.0, c.of_oracle * 100.0)
            });
            let _ = write!(out, " {cell:>18}");
        }
        out.push('\n');
    }
    if r.policies.iter().any(|p| p.run.turns.is_some()) {
        let _ = write!(out, "{:<36}", "later turns on the previous node");
        for p in &r.policies {
            let cell = p
                .run
                .turns
                .map_or_else(String::new, |t| format!("{:.0}%", t.share() * 100.0));
            let _ = write!(out, " {cell:>18}");
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "per node: share of requests / share of SLO misses / utilisation"
    );
    let _ = write!(out, "{:<18} {:<17}", "node", "profile");
    for p in &r.policies {
        let _ = write!(out, " {:>18}", p.policy.as_str());
    }
    out.push('\n');
    for (i, n) in r.nodes.iter().enumerate() {
        let _ = write!(out, "{:<18} {:<17}", n.name, n.profile);
        for p in &r.policies {
            if let Some(s) = p.run.nodes.get(i) {
                let cell = format!(
                    "{:.0}/{:.0}/{:.0}%",
                    s.request_share * 100.0,
                    s.miss_share * 100.0,
                    s.utilisation * 100.0
                );
                let _ = write!(out, " {cell:>18}");
            }
        }
        out.push('\n');
    }
    out
}

/// The simulator's and the live twin's runs of one scenario side by side:
/// per policy, users at SLO where searched, TTFT p50 / p95, end-to-end p95
/// and SLO misses as `sim / live`, and live p95 over the simulator's; then
/// each node's share of requests.
/// Repeated live runs of one scenario beside the simulator's: per policy,
/// each live figure as its median over the runs with its range (the
/// spread run to run, which a single run hides), and the median's ratio to
/// the simulator's figure (the live gap).
pub fn render_spread(sim: &ScenarioReport, lives: &[ScenarioReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {}: simulator against {} live runs (median [min-max])",
        sim.scenario,
        lives.len()
    );
    let _ = writeln!(
        out,
        "{:<18} {:>9} {:>24} {:>9} {:>9} {:>24} {:>9} {:>11}",
        "policy",
        "sim p50",
        "live p50",
        "live/sim",
        "sim p95",
        "live p95",
        "live/sim",
        "live cached"
    );
    for s in &sim.policies {
        let runs: Vec<&crate::metrics::RunSummary> = lives
            .iter()
            .filter_map(|l| l.policies.iter().find(|p| p.policy == s.policy))
            .map(|p| &p.run)
            .collect();
        if runs.is_empty() {
            continue;
        }
        let spread = |f: &dyn Fn(&crate::metrics::RunSummary) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
            v.sort_by(f64::total_cmp);
            let median = if v.len() % 2 == 1 {
                v[v.len() / 2]
            } else {
                (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
            };
            (median, v[0], v[v.len() - 1])
        };
        let shown =
            |(m, lo, hi): (f64, f64, f64)| format!("{} [{}-{}]", fmt_ms(m), fmt_ms(lo), fmt_ms(hi));
        let ratio = |live: f64, sim: f64| {
            if sim > 0.0 {
                format!("{:.2}x", live / sim)
            } else {
                "-".to_owned()
            }
        };
        let p50 = spread(&|r| r.ttft.p50_ms);
        let p95 = spread(&|r| r.ttft.p95_ms);
        let cached = spread(&|r| r.cache.as_ref().map_or(0.0, |c| c.hit_share * 100.0));
        let _ = writeln!(
            out,
            "{:<18} {:>9} {:>24} {:>9} {:>9} {:>24} {:>9} {:>10.0}%",
            s.policy.as_str(),
            fmt_ms(s.run.ttft.p50_ms),
            shown(p50),
            ratio(p50.0, s.run.ttft.p50_ms),
            fmt_ms(s.run.ttft.p95_ms),
            shown(p95),
            ratio(p95.0, s.run.ttft.p95_ms),
            cached.0
        );
    }
    out
}

pub fn render_side_by_side(sim: &ScenarioReport, live: &ScenarioReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scenario {}: simulator / live (SLO p95 TTFT {}){}",
        sim.scenario,
        fmt_ms(sim.slo_ttft_p95_ms),
        sim.users.map_or(String::new(), |u| format!(", {u} users"))
    );
    let _ = writeln!(
        out,
        "{:<18} {:>11} {:>15} {:>15} {:>15} {:>13} {:>9}",
        "policy", "users@SLO", "ttft p50", "ttft p95", "e2e p95", "misses", "live/sim"
    );
    let pct = |r: &crate::metrics::RunSummary| {
        if r.requests == 0 {
            0.0
        } else {
            r.slo_misses as f64 * 100.0 / r.requests as f64
        }
    };
    let users = |p: &PolicyResult| {
        p.search
            .as_ref()
            .map_or("-".to_owned(), |s| s.users_at_slo.to_string())
    };
    for s in &sim.policies {
        let Some(l) = live.policies.iter().find(|l| l.policy == s.policy) else {
            continue;
        };
        let pair = |a: f64, b: f64| format!("{} / {}", fmt_ms(a), fmt_ms(b));
        let _ = writeln!(
            out,
            "{:<18} {:>11} {:>15} {:>15} {:>15} {:>13} {:>8.2}x",
            s.policy.as_str(),
            format!("{} / {}", users(s), users(l)),
            pair(s.run.ttft.p50_ms, l.run.ttft.p50_ms),
            pair(s.run.ttft.p95_ms, l.run.ttft.p95_ms),
            pair(s.run.e2e.p95_ms, l.run.e2e.p95_ms),
            format!("{:.1}% / {:.1}%", pct(&s.run), pct(&l.run)),
            l.run.ttft.p95_ms / s.run.ttft.p95_ms.max(1e-9)
        );
    }
    let _ = writeln!(out, "per node: share of requests, simulator / live");
    let _ = write!(out, "{:<18}", "node");
    for p in &sim.policies {
        let _ = write!(out, " {:>18}", p.policy.as_str());
    }
    out.push('\n');
    for (i, n) in sim.nodes.iter().enumerate() {
        let _ = write!(out, "{:<18}", n.name);
        for s in &sim.policies {
            let share =
                |r: &PolicyResult| r.run.nodes.get(i).map_or(0.0, |x| x.request_share * 100.0);
            let live_share = live
                .policies
                .iter()
                .find(|l| l.policy == s.policy)
                .map_or(0.0, share);
            let cell = format!("{:.0}% / {:.0}%", share(s), live_share);
            let _ = write!(out, " {cell:>18}");
        }
        out.push('\n');
    }
    let turns = |p: &PolicyResult| {
        p.run
            .turns
            .map_or("-".to_owned(), |t| format!("{:.0}%", t.share() * 100.0))
    };
    if sim.policies.iter().any(|p| p.run.turns.is_some()) {
        let _ = write!(out, "{:<18}", "later turns kept");
        for s in &sim.policies {
            let l = live.policies.iter().find(|l| l.policy == s.policy);
            let cell = format!("{} / {}", turns(s), l.map_or("-".to_owned(), turns));
            let _ = write!(out, " {cell:>18}");
        }
        out.push('\n');
    }
    out
}

/// Writes the three plots for a scenario into `dir`; returns their paths.
pub fn write_svgs(r: &ScenarioReport, dir: &Path) -> Result<Vec<PathBuf>, SimError> {
    std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let mut written = Vec::new();
    let mut put = |name: String, body: String| -> Result<(), SimError> {
        let path = dir.join(name);
        std::fs::write(&path, body).map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })?;
        written.push(path);
        Ok(())
    };
    let cdf: Vec<(String, Vec<(f64, f64)>)> = r
        .policies
        .iter()
        .map(|p| (p.policy.as_str().to_owned(), p.ttft_cdf.clone()))
        .collect();
    put(
        format!("{}-ttft-cdf.svg", r.scenario),
        svg::ttft_cdf(
            &format!("{}: TTFT CDF per policy", r.scenario),
            &cdf,
            r.slo_ttft_p95_ms,
        ),
    )?;
    let users: Vec<svg::UsersSeries> = r
        .policies
        .iter()
        .filter_map(|p| {
            p.search.as_ref().map(|s| {
                // The common sweep plus the search's probes within its range.
                let top = p.sweep.iter().map(|x| x.users).max().unwrap_or(0);
                let mut points: Vec<(u32, f64)> = p
                    .sweep
                    .iter()
                    .chain(s.probes.iter().filter(|x| x.users <= top))
                    .map(|x| (x.users, x.ttft_p95_ms))
                    .collect();
                points.sort_by_key(|x| x.0);
                points.dedup_by_key(|x| x.0);
                svg::UsersSeries {
                    policy: p.policy.as_str().to_owned(),
                    points,
                    users_at_slo: s.users_at_slo,
                }
            })
        })
        .collect();
    if !users.is_empty() {
        put(
            format!("{}-users.svg", r.scenario),
            svg::p95_vs_users(
                &format!("{}: p95 TTFT against users", r.scenario),
                &users,
                r.slo_ttft_p95_ms,
            ),
        )?;
    }
    let rows: Vec<svg::ShareRow> = r
        .policies
        .iter()
        .map(|p| svg::ShareRow {
            policy: p.policy.as_str().to_owned(),
            shares: p
                .run
                .nodes
                .iter()
                .map(|n| (n.request_share, n.miss_share))
                .collect(),
        })
        .collect();
    let names: Vec<String> = r.nodes.iter().map(|n| n.name.clone()).collect();
    put(
        format!("{}-nodes.svg", r.scenario),
        svg::node_shares(
            &format!("{}: where requests and SLO misses go", r.scenario),
            &names,
            &rows,
        ),
    )?;
    Ok(written)
}

/// The report as pretty JSON (byte-identical for the same seed).
pub fn to_json(reports: &[ScenarioReport]) -> Result<String, SimError> {
    let mut s = if reports.len() == 1 {
        serde_json::to_string_pretty(&reports[0])
    } else {
        serde_json::to_string_pretty(reports)
    }
    .map_err(SimError::Json)?;
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Three live runs of the smoke scenario, made up from the simulator's
    /// own report: the table gives each figure's median and range, and the
    /// median's ratio to the simulator's.
    #[test]
    fn repeated_live_runs_show_their_median_and_range() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scenarios/ci-smoke.toml");
        let scn = crate::scenario::Scenario::load(std::path::Path::new(path)).unwrap();
        let sim = compare(
            &scn,
            &CompareOptions {
                policies: vec![Policy::PredictedLatency],
                search: false,
                parallel: false,
            },
            &|_| {},
        )
        .unwrap();
        let p50 = sim.policies[0].run.ttft.p50_ms;
        let lives: Vec<ScenarioReport> = [1.5, 1.0, 2.0]
            .iter()
            .map(|k| {
                let mut r = sim.clone();
                r.policies[0].run.ttft.p50_ms = p50 * k;
                r
            })
            .collect();
        let table = render_spread(&sim, &lives);
        let row = table
            .lines()
            .find(|l| l.starts_with("predicted-latency"))
            .unwrap();
        let expected = format!(
            "{} [{}-{}]",
            fmt_ms(p50 * 1.5),
            fmt_ms(p50),
            fmt_ms(p50 * 2.0)
        );
        assert!(row.contains(&expected), "{table}");
        assert!(row.contains("1.50x"), "{table}");
        assert!(table.contains("3 live runs"), "{table}");
    }

    proptest! {
        #[test]
        fn sweep_grid_is_short_sorted_and_bounded(best in 0u32..5_000, max in 1u32..5_000) {
            let g = sweep_grid(best, max);
            prop_assert!(!g.is_empty() && g.len() <= 14, "{:?}", g);
            prop_assert!(g.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(g[0], 1);
            prop_assert!(*g.last().unwrap() <= max.max(1));
        }
    }
}
