//! The library as another router would use it: a shipped scenario run from
//! Rust under two policies, with a report that is complete, plausible and a
//! function of the seed.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use pair_simulator::{CompareOptions, Policy, Scenario, compare, report};

fn smoke() -> Scenario {
    Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ci-smoke.toml"))
        .unwrap()
}

fn two_policies() -> CompareOptions {
    CompareOptions {
        policies: vec![Policy::RoundRobin, Policy::PredictedLatency],
        search: false,
        parallel: true,
    }
}

#[test]
fn two_policies_give_a_complete_plausible_report() {
    let scn = smoke();
    let ticks = std::sync::atomic::AtomicUsize::new(0);
    let r = compare(&scn, &two_policies(), &|_| {
        ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    })
    .unwrap();

    assert_eq!(r.scenario, "ci-smoke");
    assert_eq!(r.nodes.len(), scn.nodes.len());
    assert_eq!(r.users, Some(8));
    assert_eq!(ticks.into_inner(), 2, "one progress tick per policy run");
    // The requested policies, in the requested order.
    let policies: Vec<Policy> = r.policies.iter().map(|p| p.policy).collect();
    assert_eq!(policies, [Policy::RoundRobin, Policy::PredictedLatency]);

    let window_s = (scn.duration - scn.warmup) as f64 / 1e6;
    for p in &r.policies {
        let run = &p.run;
        let name = p.policy.as_str();
        assert!(p.search.is_none(), "{name}: no search was asked for");
        // 8 users for 110 measured seconds: each got answers (even round
        // robin, which queues behind the laptop), and none was turned away.
        assert!(run.requests >= 8, "{name}: {} requests", run.requests);
        assert!(run.generated >= run.requests);
        assert_eq!(run.rejected, 0, "{name}: one model every node holds");
        assert!(run.completed >= run.requests);
        let t = &run.ttft;
        assert!(t.mean_ms > 0.0 && t.mean_ms.is_finite(), "{name}: {t:?}");
        assert!(
            t.p50_ms <= t.p95_ms && t.p95_ms <= t.p99_ms && t.p99_ms <= t.max_ms,
            "{name}: {t:?}"
        );
        assert!(t.mean_ms <= t.max_ms, "{name}: {t:?}");
        // The whole answer takes at least as long as its first token.
        assert!(run.e2e.mean_ms >= t.mean_ms, "{name}");
        let rps = run.requests as f64 / window_s;
        assert!(
            run.throughput_rps > 0.5 * rps && run.throughput_rps < 2.0 * rps,
            "{name}: {} rps for {} requests in {window_s} s",
            run.throughput_rps,
            run.requests
        );
        assert!(!p.ttft_cdf.is_empty(), "{name}: no TTFT CDF");
    }
}

#[test]
fn a_report_is_a_function_of_the_seed() {
    let scn = smoke();
    let once = compare(&scn, &two_policies(), &|_| {}).unwrap();
    let sequential = CompareOptions {
        parallel: false,
        ..two_policies()
    };
    let again = compare(&scn, &sequential, &|_| {}).unwrap();
    assert_eq!(
        report::to_json(std::slice::from_ref(&once)).unwrap(),
        report::to_json(std::slice::from_ref(&again)).unwrap()
    );
}
