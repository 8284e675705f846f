//! Property tests of the ranking contract over random clusters, requests and
//! reservations, for every policy.

// Strategy helpers outside `#[test]` functions unwrap values they just built.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use pair_scheduler::answer::MAX_SHAPES;
use pair_scheduler::pair_core::{
    ApiFlavor, ClusterSnapshot, EngineKind, EngineSnapshot, GpuDevice, Liveness, ModelEntry,
    ModelName, ModelPerf, NodeId, NodeSnapshot, Pressure, RequestProfile, Workload,
};
use pair_scheduler::predict::{MAX_VIEW_AGE_MS, unseen_arrivals_ms};
use pair_scheduler::{
    AnswerKey, AnswerLengths, ClusterQueue, Cuttable, Order, Policy, Priority, Ranking,
    Reservations, Scheduler, SchedulerConfig, Waiting, preempt,
};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

const NAMES: [&str; 4] = ["llama3", "llama3:latest", "qwen2.5:7b", "Mistral"];
const REQUESTED: [&str; 5] = ["llama3", "llama3", "qwen2.5:7b", "mistral", "absent"];

fn perf() -> impl Strategy<Value = ModelPerf> {
    (
        1.0f32..20_000.0,
        0.5f32..300.0,
        0u32..5_000,
        0u32..100,
        prop::option::of(-0.5f32..1.5),
    )
        .prop_map(
            |(prefill_tps, decode_tps, load_ms, overhead_ms, batch_exponent)| ModelPerf {
                prefill_tps,
                decode_tps,
                load_ms,
                overhead_ms,
                batch_exponent,
            },
        )
}

fn entry() -> impl Strategy<Value = ModelEntry> {
    (
        prop::sample::select(&NAMES[..]),
        prop::option::of(1u64..30_000_000_000),
        any::<bool>(),
        prop::option::of(perf()),
    )
        .prop_map(|(name, size_bytes, loaded, perf)| ModelEntry {
            name: ModelName::new(name).unwrap(),
            size_bytes,
            loaded,
            perf,
            learned: false,
        })
}

fn engine() -> impl Strategy<Value = EngineSnapshot> {
    (
        prop::sample::select(&EngineKind::ALL[..]),
        prop::bool::weighted(0.9),
        0u16..6,
        prop::collection::vec(entry(), 1..4),
    )
        .prop_map(|(kind, healthy, slots, models)| EngineSnapshot {
            kind,
            healthy,
            silent: false,
            continues_chat: None,
            slots,
            models,
        })
}

fn workload() -> impl Strategy<Value = Workload> {
    (0u32..6, 0u32..6, 0u64..20_000, 0u64..5_000).prop_map(
        |(running, queued, prefill_tokens, decode_tokens)| Workload {
            running,
            queued,
            prefill_tokens,
            decode_tokens,
        },
    )
}

fn node() -> impl Strategy<Value = NodeSnapshot> {
    (
        any::<u128>(),
        prop::sample::select(
            &[
                Liveness::Alive,
                Liveness::Alive,
                Liveness::Suspect,
                Liveness::Dead,
            ][..],
        ),
        0u32..20_000,
        prop::collection::vec(engine(), 1..3),
        prop::option::of((0u64..20_000_000_000, 0u64..24_000_000_000)),
        0u8..4,
        workload(),
        0u64..100,
        prop::option::of(perf()),
    )
        .prop_map(
            |(
                id,
                liveness,
                rtt_us,
                engines,
                gpu,
                pressure,
                workload,
                reported_at_ms,
                base_perf,
            )| {
                let mut n = NodeSnapshot::new(NodeId::from_u128(id), "n");
                n.liveness = liveness;
                n.rtt_us = rtt_us;
                n.engines = engines;
                n.gpus = gpu
                    .map(|(used, total)| GpuDevice {
                        index: 0,
                        name: "g".into(),
                        utilisation_pct: 50,
                        vram_used_bytes: used,
                        vram_total_bytes: total,
                    })
                    .into_iter()
                    .collect();
                n.pressure = Pressure::new(pressure).unwrap();
                n.workload = workload;
                n.reported_at_ms = reported_at_ms;
                n.base_perf = base_perf;
                n
            },
        )
}

/// A request; `pin` picks one of the nodes (by index modulo their count).
fn request() -> impl Strategy<Value = (RequestProfile, Option<usize>)> {
    (
        prop::sample::select(&REQUESTED[..]),
        prop::sample::select(
            &[
                ApiFlavor::OpenAi,
                ApiFlavor::OpenAi,
                ApiFlavor::Ollama,
                ApiFlavor::Anthropic,
            ][..],
        ),
        any::<bool>(),
        prop_oneof![Just(0u32), 0u32..4_000],
        prop_oneof![Just(0u32), 0u32..1_000],
        prop::option::of(any::<usize>()),
    )
        .prop_map(|(model, flavor, streaming, prompt, out, pin)| {
            let mut r = RequestProfile::new(model, flavor);
            r.streaming = streaming;
            r.prompt_tokens = prompt;
            r.max_output_tokens = out;
            (r, pin)
        })
}

/// (node index, at_ms) reservations to make.
fn reservation_plan() -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((any::<usize>(), 0u64..200), 0..20)
}

#[derive(Clone, Debug)]
struct Case {
    cluster: ClusterSnapshot,
    request: RequestProfile,
    reservations: Reservations,
    /// (node, at_ms) of every reservation made, for reference computations.
    made: Vec<(NodeId, u64)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(node(), 0..12),
        request(),
        reservation_plan(),
    )
        .prop_map(|(nodes, (mut request, pin), plan)| {
            let cluster = ClusterSnapshot::new(1, 100, nodes);
            let ids: Vec<NodeId> = cluster.nodes().iter().map(|n| n.id).collect();
            if !ids.is_empty() {
                request.pinned = pin.map(|i| ids[i % ids.len()]);
            }
            let mut reservations = Reservations::new();
            let mut made = Vec::new();
            if !ids.is_empty() {
                let mut plan = plan;
                plan.sort_by_key(|(_, at)| *at);
                for (i, at) in plan {
                    let id = ids[i % ids.len()];
                    reservations.reserve(id, &request, at);
                    made.push((id, at));
                }
            }
            Case {
                cluster,
                request,
                reservations,
                made,
            }
        })
}

fn rank(policy: Policy, c: &Case, seed: u64) -> Ranking {
    Scheduler::with_policy(policy).rank(
        &c.cluster,
        &c.request,
        &c.reservations,
        100,
        &mut ChaCha8Rng::seed_from_u64(seed),
    )
}

fn eligible(c: &Case) -> Vec<NodeId> {
    c.cluster
        .nodes()
        .iter()
        .filter(|n| n.is_eligible(&c.request.model, c.request.flavor))
        .map(|n| n.id)
        .collect()
}

/// PAIR's rule written out plainly, without the scheduler's machinery.
fn reference_pair(c: &Case) -> Vec<NodeId> {
    let mut rows: Vec<(u64, u8, NodeId)> = c
        .cluster
        .nodes()
        .iter()
        .filter(|n| n.liveness != Liveness::Dead)
        .filter(|n| {
            n.engines.iter().any(|e| {
                e.healthy
                    && e.kind.serves(c.request.flavor)
                    && e.models
                        .iter()
                        .any(|m| m.name.matches(&c.request.model, e.kind))
            })
        })
        .map(|n| {
            let reserved = c
                .made
                .iter()
                .filter(|(id, at)| *id == n.id && *at > n.reported_at_ms)
                .count() as u64;
            let pending = u64::from(n.workload.running) + u64::from(n.workload.queued) + reserved;
            let pressure = n.pressure.band();
            (pending + u64::from(pressure), pressure, n.id)
        })
        .collect();
    rows.sort();
    let mut order: Vec<NodeId> = rows.into_iter().map(|(_, _, id)| id).collect();
    if let Some(p) = c.request.pinned
        && let Some(i) = order.iter().position(|id| *id == p)
    {
        let pinned = order.remove(i);
        order.insert(0, pinned);
    }
    order
}

/// The generators must make eligible nodes common, or the properties
/// below would hold vacuously.
#[test]
fn generated_cases_usually_have_several_eligible_nodes() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut with_two = 0;
    for _ in 0..200 {
        let c = case().new_tree(&mut runner).unwrap().current();
        if eligible(&c).len() >= 2 {
            with_two += 1;
        }
    }
    assert!(
        with_two >= 60,
        "only {with_two} of 200 cases have 2+ eligible nodes"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn ranking_is_a_permutation_of_the_eligible_nodes(c in case(), seed in any::<u64>()) {
        let mut want = eligible(&c);
        want.sort();
        for policy in Policy::ALL {
            let r = rank(policy, &c, seed);
            let mut got: Vec<NodeId> = r.nodes().collect();
            got.sort();
            prop_assert_eq!(&got, &want, "{}", policy);
            for cand in &r {
                let n = c.cluster.node(cand.node).unwrap();
                prop_assert!(n.liveness.is_routable());
                prop_assert!(n.find_model(&c.request.model, c.request.flavor).is_some());
                // A route receipt adds up.
                if let Some(p) = cand.score.prediction() {
                    let parts = [p.queue_ms, p.prefill_ms, p.decode_ms, p.overhead_ms, p.load_ms, p.rtt_ms];
                    prop_assert_eq!(
                        u64::from(p.total_ms),
                        parts.iter().map(|x| u64::from(*x)).sum::<u64>().min(u64::from(u32::MAX))
                    );
                }
            }
        }
    }

    #[test]
    fn same_inputs_and_seed_give_the_same_ranking(c in case(), seed in any::<u64>()) {
        for policy in Policy::ALL {
            let a = rank(policy, &c, seed);
            let b = rank(policy, &c, seed);
            prop_assert_eq!(&a, &b, "{}", policy);
            // Reusing a dirty buffer changes nothing either.
            let mut reused = rank(policy, &c, seed ^ 1);
            Scheduler::with_policy(policy).rank_into(
                &mut reused, &c.cluster, &c.request, &c.reservations, 100,
                &mut ChaCha8Rng::seed_from_u64(seed),
            );
            prop_assert_eq!(&a, &reused, "{}", policy);
        }
    }

    #[test]
    fn a_pinned_eligible_node_comes_first(c in case(), seed in any::<u64>()) {
        let pinned_eligible = c.request.pinned.filter(|p| eligible(&c).contains(p));
        for policy in Policy::ALL {
            let r = rank(policy, &c, seed);
            if let Some(p) = pinned_eligible {
                prop_assert_eq!(r.first().map(|x| x.node), Some(p), "{}", policy);
            }
            prop_assert!(
                r.iter().skip(1).all(|x| Some(x.node) != c.request.pinned),
                "{}", policy
            );
        }
    }

    #[test]
    fn more_pending_work_never_moves_a_node_up(
        c in case(),
        seed in any::<u64>(),
        which in any::<usize>(),
        extra in workload(),
    ) {
        prop_assume!(!c.cluster.is_empty());
        let target = c.cluster.nodes()[which % c.cluster.len()].id;
        let mut nodes = c.cluster.nodes().to_vec();
        for n in nodes.iter_mut().filter(|n| n.id == target) {
            n.workload.running += extra.running;
            n.workload.queued += extra.queued;
            n.workload.prefill_tokens += extra.prefill_tokens;
            n.workload.decode_tokens += extra.decode_tokens;
        }
        let busier = Case {
            cluster: ClusterSnapshot::new(1, 100, nodes),
            request: c.request.clone(),
            reservations: c.reservations.clone(),
            made: c.made.clone(),
        };
        for policy in [Policy::LeastPending, Policy::Pair, Policy::PredictedLatency, Policy::P2c] {
            let before = rank(policy, &c, seed).position(target);
            let after = rank(policy, &busier, seed).position(target);
            prop_assert_eq!(before.is_some(), after.is_some());
            prop_assert!(after >= before, "{}: {:?} -> {:?}", policy, before, after);
        }
    }

    #[test]
    fn pair_matches_a_plain_reference_of_pairs_rule(c in case()) {
        let got: Vec<NodeId> = rank(Policy::Pair, &c, 0).nodes().collect();
        prop_assert_eq!(got, reference_pair(&c));
    }

    #[test]
    fn a_burst_over_identical_idle_nodes_spreads_evenly(
        n in 1usize..8,
        k in 1usize..40,
        slots in 1u16..5,
        p in perf(),
        loaded in any::<bool>(),
        streaming in any::<bool>(),
        prompt in prop_oneof![Just(0u32), 0u32..2_000],
        out in prop_oneof![Just(0u32), 0u32..500],
    ) {
        let nodes: Vec<NodeSnapshot> = (0..n)
            .map(|i| {
                let mut node = NodeSnapshot::new(NodeId::from_u128(i as u128 + 1), "twin");
                node.pressure = Pressure::IDLE;
                node.engines.push(EngineSnapshot {
                    kind: EngineKind::Ollama,
                    healthy: true,
                    silent: false,
                    continues_chat: None,
                    slots,
                    models: vec![ModelEntry {
                        name: ModelName::new("m").unwrap(),
                        size_bytes: None,
                        loaded,
                        perf: Some(p),
                        learned: false,
                    }],
                });
                node
            })
            .collect();
        let cluster = ClusterSnapshot::new(1, 0, nodes);
        let mut request = RequestProfile::new("m", ApiFlavor::Ollama);
        request.streaming = streaming;
        request.prompt_tokens = prompt;
        request.max_output_tokens = out;
        for policy in [Policy::Pair, Policy::LeastPending, Policy::PredictedLatency] {
            let mut s = Scheduler::new(SchedulerConfig { policy, affinity: None });
            let mut reservations = Reservations::new();
            let mut counts: BTreeMap<NodeId, usize> = BTreeMap::new();
            let mut rng = ChaCha8Rng::seed_from_u64(0);
            for t in 0..k as u64 {
                let r = s.rank(&cluster, &request, &reservations, t + 1, &mut rng);
                let first = r.first().unwrap().node;
                reservations.reserve(first, &request, t + 1);
                *counts.entry(first).or_default() += 1;
            }
            let max = counts.values().copied().max().unwrap_or(0);
            prop_assert!(max <= k.div_ceil(n), "{}: {:?}", policy, counts);
        }
    }

    #[test]
    fn reservations_match_a_plain_model(
        ops in prop::collection::vec((0u8..4, 0u128..4, 0u64..100, 0u32..1000), 0..60),
    ) {
        // op 0/1: reserve; 2: release the n-th made; 3: sync with a report at t.
        // A reservation a report covered, released later, is credited until
        // a report made after its release.
        struct Made {
            rid: pair_scheduler::ReservationId,
            node: NodeId,
            at: u64,
            tokens: u32,
            covered: bool,
        }
        let mut res = Reservations::new();
        let mut model: Vec<Made> = Vec::new();
        let mut credits: Vec<(NodeId, u64, u32)> = Vec::new();
        // Finished before a report was seen to cover them: (node,
        // dispatched, finished, tokens).
        let mut finished: Vec<(NodeId, u64, u64, u32)> = Vec::new();
        // A credit's time: its finish, kept in order per node.
        fn credit(credits: &mut Vec<(NodeId, u64, u32)>, node: NodeId, at: u64, tokens: u32) {
            let last = credits.iter().filter(|c| c.0 == node).map(|c| c.1).max();
            credits.push((node, last.map_or(at, |l| l.max(at)), tokens));
        }
        let mut clock = 0u64;
        for (op, node, t, tokens) in ops {
            let id = NodeId::from_u128(node);
            clock += t % 7;
            match op {
                0 | 1 => {
                    let mut r = RequestProfile::new("m", ApiFlavor::Ollama);
                    r.prompt_tokens = tokens;
                    let rid = res.reserve(id, &r, clock);
                    model.push(Made { rid, node: id, at: clock, tokens, covered: false });
                }
                2 => {
                    if !model.is_empty() {
                        let m = model.remove(tokens as usize % model.len());
                        prop_assert!(res.release(m.rid, clock));
                        if m.covered {
                            credit(&mut credits, m.node, clock, m.tokens);
                        } else {
                            finished.push((m.node, m.at, clock, m.tokens));
                        }
                    }
                }
                _ => {
                    let mut n = NodeSnapshot::new(id, "n");
                    n.reported_at_ms = t;
                    res.sync(&ClusterSnapshot::new(1, t, vec![n]));
                    for m in model.iter_mut().filter(|m| m.node == id && m.at <= t) {
                        m.covered = true;
                    }
                    credits.retain(|(nid, at, _)| *nid != id || *at > t);
                    // This report saw running what finished after it.
                    let mut still = Vec::new();
                    for f in finished.drain(..) {
                        if f.0 != id {
                            still.push(f);
                        } else if f.2 <= t {
                        } else if f.1 <= t {
                            credit(&mut credits, f.0, f.2, f.3);
                        } else {
                            still.push(f);
                        }
                    }
                    finished = still;
                }
            }
            for probe in 0..4u128 {
                let pid = NodeId::from_u128(probe);
                for reported in [0, clock / 2, clock] {
                    let want: Vec<_> = model
                        .iter()
                        .filter(|m| m.node == pid && !m.covered && m.at > reported)
                        .collect();
                    let got = res.on_node(pid, reported);
                    prop_assert_eq!(got.jobs as usize, want.len());
                    prop_assert_eq!(
                        got.prefill_tokens,
                        want.iter().map(|m| u64::from(m.tokens)).sum::<u64>()
                    );
                    let want: Vec<_> = credits
                        .iter()
                        .filter(|(nid, at, _)| *nid == pid && *at > reported)
                        .collect();
                    let got = res.credited(pid, reported);
                    prop_assert_eq!(got.jobs as usize, want.len());
                    prop_assert_eq!(
                        got.prefill_tokens,
                        want.iter().map(|(.., tok)| u64::from(*tok)).sum::<u64>()
                    );
                }
            }
            prop_assert_eq!(res.len(), model.len());
        }
    }

    /// The price of a stale view never falls as the view shows more jobs or
    /// grows older, never exceeds a nominal answer's slot time per expected
    /// arrival, and is nothing for a view read live.
    #[test]
    fn unseen_arrivals_are_priced_monotonically(
        jobs in 0u32..40,
        more in 0u32..8,
        slots in 1u32..16,
        age in 0u64..20_000,
        older in 0u64..20_000,
        decode_tps in 0.5f64..500.0,
        overhead in 0.0f64..200.0,
        exponent in prop::option::of(-1.0f32..2.0),
    ) {
        let price = |j, a| unseen_arrivals_ms(j, slots, a, decode_tps, overhead, exponent);
        let p = price(jobs, age);
        prop_assert!(p >= 0.0 && p.is_finite());
        prop_assert!(price(jobs + more, age) >= p - 1e-9);
        prop_assert!(price(jobs, age + older) >= p - 1e-9);
        prop_assert_eq!(price(jobs, 0), 0.0);
        prop_assert_eq!(price(jobs, age.min(MAX_VIEW_AGE_MS)), p);
    }
}

/// A chain of `blocks` 64-token blocks, the first `shared` of them common
/// to every `family` (a shared system prompt), the rest the family's own.
fn family_chain(
    family: u64,
    shared: usize,
    blocks: usize,
) -> pair_scheduler::pair_core::PromptChain {
    let mut b = pair_scheduler::pair_core::ChainBuilder::new();
    for i in 0..blocks {
        let owner = if i < shared { 0 } else { family + 1 };
        b.segment(owner << 32 | i as u64, 64);
    }
    b.finish()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The same node, the same moment, more of the prompt cached: never
    /// predicted slower, and the receipt still adds up.
    #[test]
    fn a_longer_cached_prefix_never_predicts_a_node_slower(
        c in case(),
        a in 0u32..5_000,
        b in 0u32..5_000,
        age in 0u64..6_000,
    ) {
        let (less, more) = (a.min(b), a.max(b));
        for n in c.cluster.nodes() {
            let Some((_, entry)) = n.find_model(&c.request.model, c.request.flavor) else {
                continue;
            };
            let at = |cached| pair_scheduler::predict::predict_cached(
                n, &n.workload, entry, &c.request, pair_scheduler::Reserved::default(), age, cached,
            );
            let (p, q) = (at(less), at(more));
            prop_assert!(q.total_ms <= p.total_ms, "{} cached: {}; {} cached: {}", less, p, more, q);
            prop_assert!(q.prefill_ms <= p.prefill_ms);
            prop_assert!(q.cached_tokens <= c.request.prompt_tokens);
            prop_assert_eq!(at(0), pair_scheduler::predict::predict(
                n, &n.workload, entry, &c.request, pair_scheduler::Reserved::default(), age,
            ));
        }
    }

    /// The prefix index is plain data: the same records and corrections
    /// give the same ranking, from a clone or from a scheduler that saw
    /// them again, for every policy.
    #[test]
    fn ranking_is_deterministic_for_a_snapshot_and_an_index(
        c in case(),
        ops in prop::collection::vec((any::<usize>(), 0u64..4, 1usize..40, prop::option::of(0u32..3_000)), 0..24),
        family in 0u64..4,
        seed in any::<u64>(),
    ) {
        let ids: Vec<NodeId> = c.cluster.nodes().iter().map(|n| n.id).collect();
        let mut request = c.request.clone();
        request.prefix = family_chain(family, 8, 32);
        request.prompt_tokens = request.prefix.tokens();
        for policy in Policy::ALL {
            let build = || {
                let mut s = Scheduler::with_policy(policy);
                for (at, &(i, fam, len, cached)) in ops.iter().enumerate() {
                    if ids.is_empty() {
                        break;
                    }
                    let node = ids[i % ids.len()];
                    let chain = family_chain(fam, 8, len);
                    s.note_routed(&c.cluster, node, &chain, at as u64);
                    if let Some(cached) = cached {
                        s.note_cached(node, &chain, cached, at as u64);
                    }
                }
                s
            };
            let (mut s1, mut s2) = (build(), build());
            let mut s3 = s1.clone();
            let mut ranks = [&mut s1, &mut s2, &mut s3].map(|s| {
                s.rank(&c.cluster, &request, &c.reservations, 100, &mut ChaCha8Rng::seed_from_u64(seed))
            });
            let first = ranks[0].clone();
            for r in &mut ranks[1..] {
                prop_assert_eq!(&first, &*r, "{}", policy);
            }
            for cand in &first {
                if let Some(p) = cand.score.prediction() {
                    prop_assert_eq!(
                        p.cached_tokens,
                        s1.prefix().cached_tokens(cand.node, &request.prefix).min(request.prompt_tokens)
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Learned answer lengths stay within what was seen and the request's
    /// limit, the tail never under the mean, whatever the order.
    #[test]
    fn an_expected_answer_lies_within_what_its_shape_generated(
        lengths in prop::collection::vec(0u32..40_000, 1..80),
        limit in 1u32..65_536,
        streaming in any::<bool>(),
        tools in any::<bool>(),
    ) {
        let mut request = RequestProfile::new("llama3", ApiFlavor::OpenAi);
        request.max_output_tokens = limit;
        request.streaming = streaming;
        request.tools = tools;
        let mut a = AnswerLengths::new();
        for &t in &lengths {
            a.learn(AnswerKey::of(&request), t);
        }
        let e = a.expect(&request);
        let (lo, hi) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
        prop_assert!(e.learned);
        prop_assert!(e.mean <= limit && e.tail <= limit, "{:?} over {}", e, limit);
        prop_assert!(e.mean >= (*lo).min(limit) && e.mean <= (*hi).min(limit), "{:?} outside {}..={}", e, lo, hi);
        prop_assert!(e.tail >= e.mean, "{:?}", e);
        // Plain data: the same answers give the same expectation.
        let mut b = AnswerLengths::new();
        for &t in &lengths {
            b.learn(AnswerKey::of(&request), t);
        }
        prop_assert_eq!(b.expect(&request), e);
    }

    /// However many models and shapes teach it, the learner keeps at most
    /// its cap of them, and the newest is always among them.
    #[test]
    fn answer_lengths_stay_within_their_cap(
        taught in prop::collection::vec((0u32..600, 0u32..5, any::<bool>(), 1u32..40_000), 1..700),
    ) {
        let mut a = AnswerLengths::new();
        for &(model, flavor, tools, tokens) in &taught {
            let mut r = RequestProfile::new(format!("m{model}"), [ApiFlavor::OpenAi, ApiFlavor::Ollama, ApiFlavor::Anthropic][flavor as usize % 3]);
            r.tools = tools;
            r.max_output_tokens = 1 << (flavor * 3);
            a.learn(AnswerKey::of(&r), tokens);
            prop_assert!(a.len() <= MAX_SHAPES);
            prop_assert!(a.expect(&r).learned);
        }
    }

    /// A request expected to answer longer is never predicted to finish
    /// sooner on the same node, and one waited on at its first token does
    /// not depend on its answer's length.
    #[test]
    fn a_longer_expected_answer_never_predicts_sooner(
        c in case(),
        a in 0u32..4_000,
        b in 0u32..4_000,
        whole in any::<bool>(),
    ) {
        let (short, long) = (a.min(b), a.max(b));
        let mut request = c.request.clone();
        request.max_output_tokens = 4_000;
        request.streaming = !whole;
        for n in c.cluster.nodes() {
            let Some((_, entry)) = n.find_model(&request.model, request.flavor) else {
                continue;
            };
            let at = |tokens| {
                let mut r = request.clone();
                r.expected_output_tokens = Some(tokens);
                pair_scheduler::predict::predict(
                    n, &n.workload, entry, &r, pair_scheduler::Reserved::default(), 0,
                )
            };
            let (p, q) = (at(short), at(long));
            prop_assert!(p.total_ms <= q.total_ms, "{}: {}; {}: {}", short, p, long, q);
            if !whole {
                prop_assert_eq!(p.total_ms, q.total_ms);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever arrives and whenever slots free, a request is never passed
    /// by one that arrived after it was due, every request leaves once,
    /// and first come first served is exactly arrival order.
    #[test]
    fn the_cluster_queue_never_lets_a_later_request_pass_one_that_is_due(
        ops in prop::collection::vec((0u64..3_000, 1u32..20_000, any::<bool>(), 0u32..3, any::<bool>()), 1..120),
        order in prop::sample::select(vec![Order::Fifo, Order::ShortestFirst, Order::Priorities]),
    ) {
        let mut q = ClusterQueue::new(order);
        let mut now = 0u64;
        let mut waiting: Vec<(u64, Waiting)> = Vec::new();
        let mut served = Vec::new();
        for (i, &(gap, work_ms, batch, lane, pop)) in ops.iter().enumerate() {
            now += gap;
            let w = Waiting {
                lane,
                arrived_ms: now,
                work_ms,
                priority: if batch { Priority::Batch } else { Priority::Interactive },
            };
            q.push(w, i as u64);
            waiting.push((i as u64, w));
            if pop {
                let lanes = [0, 1, 2];
                let (got, id) = q.pop_first(&lanes).unwrap();
                for (other, o) in &waiting {
                    if *other == id {
                        continue;
                    }
                    prop_assert!(
                        got.arrived_ms <= q.due_ms(o),
                        "{:?} passed {:?}, due at {}", got, o, q.due_ms(o)
                    );
                    if order == Order::Fifo {
                        prop_assert!(got.arrived_ms <= o.arrived_ms);
                    }
                }
                waiting.retain(|(other, _)| *other != id);
                served.push(id);
            }
        }
        while let Some((_, id)) = q.pop_first(&[0, 1, 2]) {
            served.push(id);
        }
        served.sort_unstable();
        prop_assert_eq!(served, (0..ops.len() as u64).collect::<Vec<_>>());
        prop_assert!(q.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Interactive work cuts a batch job only when it would wait longer
    /// than the bound, never a job cut its share of times or about to end,
    /// and always the one that loses least (then has most left), wherever
    /// it sits in the list; cut again and again, every job runs out of cuts.
    #[test]
    fn preemption_cuts_the_cheapest_eligible_job_and_runs_out(
        jobs in prop::collection::vec((0u32..20_000, 0u32..20_000, 0u32..4), 0..12),
        wait_ms in 0u32..2_000,
    ) {
        use pair_scheduler::queue::{MAX_CUTS, PREEMPT_WAIT_MS};
        let mut running: Vec<Cuttable> = jobs
            .iter()
            .map(|&(sunk_ms, left_ms, cuts)| Cuttable { sunk_ms, left_ms, cuts })
            .collect();
        let eligible = |c: &Cuttable| c.cuts < MAX_CUTS && c.left_ms > PREEMPT_WAIT_MS;
        let key = |c: &Cuttable| (c.sunk_ms, std::cmp::Reverse(c.left_ms));
        let pick = preempt(wait_ms, &running);
        prop_assert_eq!(
            pick.is_some(),
            wait_ms > PREEMPT_WAIT_MS && running.iter().any(eligible)
        );
        if let Some(i) = pick {
            prop_assert!(eligible(&running[i]));
            prop_assert!(running.iter().filter(|c| eligible(c)).all(|c| key(c) >= key(&running[i])));
            let reversed: Vec<Cuttable> = running.iter().rev().copied().collect();
            let j = preempt(wait_ms, &reversed).unwrap();
            prop_assert_eq!(key(&reversed[j]), key(&running[i]));
        }
        let mut cuts = 0;
        while let Some(i) = preempt(u32::MAX, &running) {
            running[i].cuts += 1;
            cuts += 1;
            prop_assert!(cuts <= running.len() as u32 * MAX_CUTS);
        }
    }
}
