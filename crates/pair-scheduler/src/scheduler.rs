//! The `Scheduler` value: a policy, its small state (round-robin cursor,
//! session affinity table, prefix index, answer lengths) and the ranking
//! pass itself.

use pair_core::{ClusterSnapshot, NodeId, PromptChain, RequestProfile, SessionKey};
use rand_core::RngCore;
use serde::{Deserialize, Serialize};

use crate::affinity::AffinityTable;
use crate::answer::{AnswerKey, AnswerLengths, Expected};
use crate::matcher::Wanted;
use crate::predict::predict_cached;
use crate::prefix::PrefixIndex;
use crate::ranking::{Candidate, RateSource, Reason, Score, SortKey};
use crate::reservations::Reserved;
use crate::{AffinityConfig, Policy, Ranking, Reservations};

/// How a [`Scheduler`] ranks. Plain data: parse it from flags or a config
/// file once, then build the scheduler from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    pub policy: Policy,
    /// Session affinity (predicted-latency only); `None` turns it off.
    pub affinity: Option<AffinityConfig>,
}

impl SchedulerConfig {
    /// `policy` with the default affinity settings.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            affinity: Some(AffinityConfig::default()),
        }
    }
}

/// Ranks eligible nodes for requests. A plain value: no clock, no RNG, no
/// I/O, no interior mutability; share it behind whatever lock the embedder
/// likes, or keep one per worker.
#[derive(Clone, Debug)]
pub struct Scheduler {
    policy: Policy,
    rr_cursor: u64,
    affinity: Option<AffinityTable>,
    prefix: PrefixIndex,
    answers: AnswerLengths,
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new(SchedulerConfig::new(Policy::default()))
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            policy: config.policy,
            rr_cursor: 0,
            affinity: config.affinity.map(AffinityTable::new),
            prefix: PrefixIndex::new(),
            answers: AnswerLengths::new(),
        }
    }

    /// A scheduler running `policy` with default settings.
    pub fn with_policy(policy: Policy) -> Self {
        Self::new(SchedulerConfig::new(policy))
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            policy: self.policy,
            affinity: self.affinity.as_ref().map(|t| *t.config()),
        }
    }

    /// Ranks the eligible nodes of `cluster` for `request`. Allocates the
    /// returned list; see [`Scheduler::rank_into`] to reuse one.
    pub fn rank<R: RngCore + ?Sized>(
        &mut self,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
        now_ms: u64,
        rng: &mut R,
    ) -> Ranking {
        let mut out = Ranking::with_capacity(cluster.len());
        self.rank_into(&mut out, cluster, request, reservations, now_ms, rng);
        out
    }

    /// [`Scheduler::rank`] into a caller-owned buffer: once `out` has held
    /// as many candidates as the cluster has nodes, this allocates nothing.
    ///
    /// Order: the pinned node if eligible; then the session's node if
    /// affinity keeps it (a tie-break: no other node predicted clearly
    /// sooner); then the policy's order; then any eligible node the policy
    /// did not order, by node id. `rng` is drawn from only by `p2c`;
    /// `now_ms` ages session affinity and, for `predicted-latency`, the
    /// peers' reported workloads. `predicted-latency` prices each node's
    /// prefill as the prompt tokens its [`PrefixIndex`] says it lacks.
    pub fn rank_into<R: RngCore + ?Sized>(
        &mut self,
        out: &mut Ranking,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
        now_ms: u64,
        rng: &mut R,
    ) {
        out.policy = self.policy;
        out.candidates.clear();
        out.scratch.clear();
        out.keys.clear();
        self.score_eligible(&mut out.scratch, cluster, request, reservations, now_ms);
        let c = &mut out.scratch;
        match self.policy {
            Policy::RoundRobin => self.order_round_robin(c),
            Policy::P2c => order_p2c(c, rng),
            Policy::LeastPending | Policy::Pair => {}
            Policy::PredictedLatency => {
                explore(c, request);
                self.apply_affinity(c, cluster, request, now_ms);
            }
        }
        if let Some(pinned) = request.pinned
            && let Ok(i) = c.binary_search_by_key(&pinned, |x| x.node)
        {
            c[i].key.tier = SortKey::PINNED;
            c[i].reason = Reason::Pinned;
        }
        let packed = out.scratch.len() <= SortKey::PACKED_MAX;
        sort_into(out, packed);
    }

    /// Remembers that `session` is served by `node` (call it when a request
    /// of the session commits to a node). No-op without affinity.
    pub fn bind_session(&mut self, session: SessionKey, node: NodeId, now_ms: u64) {
        if let Some(t) = &mut self.affinity {
            t.bind(session, node, now_ms);
        }
    }

    /// The prefix index `predicted-latency` prices cached prompt tokens
    /// from.
    pub fn prefix(&self) -> &PrefixIndex {
        &self.prefix
    }

    /// The prefix index, to record, correct or size it directly.
    pub fn prefix_mut(&mut self) -> &mut PrefixIndex {
        &mut self.prefix
    }

    /// Call after dispatching a request whose prompt is `chain` to `node`
    /// (the node it commits to; a failed attempt's node too, since its
    /// engine may have prefilled the prompt before failing): one of the
    /// node's slots will hold the prompt. Sizes the node's slots from
    /// `cluster` first when it lists the node.
    pub fn note_routed(
        &mut self,
        cluster: &ClusterSnapshot,
        node: NodeId,
        chain: &PromptChain,
        now_ms: u64,
    ) {
        if let Some(n) = cluster.node(node) {
            self.prefix.set_capacity(node, PrefixIndex::capacity_of(n));
        }
        self.prefix.record(node, chain, now_ms);
    }

    /// Call when `node`'s engine reported how many of `chain`'s prompt
    /// tokens it found cached (see [`PrefixIndex::correct`]).
    pub fn note_cached(
        &mut self,
        node: NodeId,
        chain: &PromptChain,
        cached_tokens: u32,
        now_ms: u64,
    ) {
        self.prefix.correct(node, chain, cached_tokens, now_ms);
    }

    /// Predicts `request`'s answer length from the answers of its model
    /// and client shape ([`AnswerLengths`]) and sets it on the request
    /// (`expected_output_tokens`): call it before ranking, so that the
    /// prediction, the reservation and the node's workload plan for it
    /// rather than for the request's limit.
    pub fn expect_answer(&self, request: &mut RequestProfile) -> Expected {
        let e = self.answers.expect(request);
        request.expected_output_tokens = Some(e.mean);
        e
    }

    /// Call when an answer to a request of `key` ([`AnswerKey::of`]) ended
    /// whole, with the `tokens` it generated.
    pub fn note_answer(&mut self, key: AnswerKey, tokens: u32) {
        self.answers.learn(key, tokens);
    }

    /// The answer lengths learned so far.
    pub fn answers(&self) -> &AnswerLengths {
        &self.answers
    }

    /// Forgets a session's node; returns whether it was known.
    pub fn forget_session(&mut self, session: SessionKey) -> bool {
        self.affinity.as_mut().is_some_and(|t| t.forget(session))
    }

    /// Sessions currently remembered.
    pub fn sessions(&self) -> usize {
        self.affinity.as_ref().map_or(0, AffinityTable::len)
    }

    /// The node `session` is bound to, if any and not expired.
    pub fn session_node(&self, session: SessionKey, now_ms: u64) -> Option<NodeId> {
        self.affinity.as_ref().and_then(|t| t.get(session, now_ms))
    }

    /// One pass over the (id-sorted) snapshot, walking the (id-sorted)
    /// reservations beside it: eligibility, then the policy's score and key.
    fn score_eligible(
        &self,
        out: &mut Vec<Candidate>,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
        now_ms: u64,
    ) {
        let reserved_lists = reservations.sorted();
        let live = reservations.live();
        let wanted = Wanted::new(&request.model, request.flavor);
        let mut r = 0;
        for node in cluster.nodes() {
            if !node.liveness.is_routable() {
                continue;
            }
            let Some((engine, entry)) = wanted.find(node) else {
                continue;
            };
            // Ids compared as integers: big-endian u128 order is the ids' order,
            // and it spares a memcmp call per step.
            let id = node.id.as_uuid().as_u128();
            while r < reserved_lists.len() && reserved_lists[r].node.as_uuid().as_u128() < id {
                r += 1;
            }
            let age_ms = now_ms.saturating_sub(node.reported_at_ms);
            let (workload, reserved, age_ms) = match (reserved_lists.get(r), live) {
                (_, Some((live_node, w))) if live_node == node.id => (w, Reserved::default(), 0),
                (Some(list), _) if list.node == node.id => (
                    list.less_credited(node.workload, node.reported_at_ms),
                    list.uncovered(node.reported_at_ms),
                    age_ms,
                ),
                _ => (node.workload, Reserved::default(), age_ms),
            };
            let reported = workload.pending();
            let policy_key = |primary: u64, secondary: u64| SortKey {
                tier: SortKey::POLICY,
                class: 0,
                primary,
                secondary,
            };
            let pending = u64::from(reported) + u64::from(reserved.jobs);
            let (score, key) = match self.policy {
                Policy::RoundRobin => (Score::RoundRobin { turn: 0 }, policy_key(0, 0)),
                Policy::LeastPending => (
                    Score::LeastPending {
                        reported,
                        reserved: reserved.jobs,
                    },
                    policy_key(pending, 0),
                ),
                Policy::P2c => (
                    Score::P2c {
                        reported,
                        reserved: reserved.jobs,
                        sampled: false,
                    },
                    SortKey {
                        tier: SortKey::FALLBACK,
                        ..SortKey::default()
                    },
                ),
                Policy::Pair => {
                    let pressure = node.pressure.band();
                    (
                        Score::Pair {
                            reported,
                            reserved: reserved.jobs,
                            pressure,
                        },
                        policy_key(pending + u64::from(pressure), u64::from(pressure)),
                    )
                }
                Policy::PredictedLatency => {
                    let cached = self
                        .prefix
                        .cached_tokens_at(node.id, &request.prefix, now_ms);
                    let mut p =
                        predict_cached(node, &workload, entry, request, reserved, age_ms, cached);
                    p.silent = engine.silent;
                    let key = SortKey {
                        tier: SortKey::POLICY,
                        // Suspect nodes and silent engines after live ones;
                        // within each, nodes the model cannot fit into
                        // after those it can.
                        class: u8::from(p.suspect || p.silent) * 2 + u8::from(!p.fits_vram),
                        primary: u64::from(p.total_ms),
                        // Equal predictions: fewer jobs ahead, then more
                        // of the prompt cached (keeps a conversation where
                        // its context is and the other node's cache free).
                        secondary: u64::from(p.jobs_ahead.min(63)) << 10
                            | u64::from(request.prompt_tokens.saturating_sub(p.cached_tokens) >> 8)
                                .min(1023),
                    };
                    (Score::PredictedLatency(p), key)
                }
            };
            let reason = if key.tier == SortKey::FALLBACK {
                Reason::Fallback
            } else {
                Reason::Policy(self.policy)
            };
            out.push(Candidate {
                node: node.id,
                reason,
                score,
                key,
            });
        }
    }

    /// Rotates the id-ordered candidates by the cursor, which moves one
    /// step per ranking.
    fn order_round_robin(&mut self, c: &mut [Candidate]) {
        let n = c.len() as u64;
        if n > 0 {
            let start = self.rr_cursor % n;
            for (i, cand) in c.iter_mut().enumerate() {
                let turn = (i as u64 + n - start) % n;
                cand.key.primary = turn;
                cand.score = Score::RoundRobin {
                    turn: u32::try_from(turn).unwrap_or(u32::MAX),
                };
            }
        }
        self.rr_cursor = self.rr_cursor.wrapping_add(1);
    }

    /// Keeps the session on its node unless the policy's best other node is
    /// predicted sooner by more than the tie margin (both bars of
    /// [`AffinityConfig`]), or the session's node sank (suspect, model does
    /// not fit). The prediction already prices the cache the session left
    /// on its node, so this only settles near-ties.
    fn apply_affinity(
        &self,
        c: &mut [Candidate],
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        now_ms: u64,
    ) {
        let (Some(table), Some(session)) = (&self.affinity, request.session) else {
            return;
        };
        let Some(home) = table.home(session, cluster, now_ms) else {
            return;
        };
        if request.pinned == Some(home) {
            return;
        }
        // `c` is in node-id order.
        let Ok(h) = c.binary_search_by_key(&home, |x| x.node) else {
            return;
        };
        let pinned = request
            .pinned
            .and_then(|p| c.binary_search_by_key(&p, |x| x.node).ok());
        // `c` is in node-id order, so the index breaks ties by node id.
        let best_other = c
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != h && Some(*i) != pinned)
            .min_by_key(|(i, x)| (x.key.pack(0), *i))
            .map(|(_, x)| x.key);
        let home_key = c[h].key;
        let stay = match best_other {
            None => true,
            Some(other) if other.class != home_key.class => home_key.class < other.class,
            Some(other) => !table.config().should_move(
                u32::try_from(home_key.primary).unwrap_or(u32::MAX),
                u32::try_from(other.primary).unwrap_or(u32::MAX),
            ),
        };
        if stay {
            c[h].key.tier = SortKey::AFFINITY;
            c[h].reason = Reason::Affinity;
        }
    }
}

/// Orders `out.scratch` (node-id order) into `out.candidates`. Packed:
/// sort one integer per candidate and gather, far cheaper than moving whole
/// candidates; beyond [`SortKey::PACKED_MAX`] candidates, sort them whole by
/// the same (saturated) key. Both give the same order.
fn sort_into(out: &mut Ranking, packed: bool) {
    if packed {
        out.keys
            .extend(out.scratch.iter().enumerate().map(|(i, x)| x.key.pack(i)));
        out.keys.sort_unstable();
        let scratch = &out.scratch;
        out.candidates
            .extend(out.keys.iter().map(|k| scratch[(*k & 0xFFFF) as usize]));
    } else {
        out.scratch
            .sort_unstable_by_key(|x| (x.key.saturated(), x.node));
        out.candidates.extend_from_slice(&out.scratch);
    }
}

/// Power of two choices (as linkerd's `gen_pair`): two distinct indices
/// drawn uniformly; the one with fewer pending jobs first, then the other.
fn order_p2c<R: RngCore + ?Sized>(c: &mut [Candidate], rng: &mut R) {
    let n = c.len();
    let (a, b) = match n {
        0 => return,
        1 => (0, None),
        _ => {
            let a = index_below(rng, n);
            let mut b = index_below(rng, n - 1);
            if b >= a {
                b += 1;
            }
            (a, Some(b))
        }
    };
    let pending = |x: &Candidate| x.score.pending().unwrap_or(0);
    let (win, lose) = match b {
        Some(b) if (pending(&c[b]), c[b].node) < (pending(&c[a]), c[a].node) => (b, Some(a)),
        Some(b) => (a, Some(b)),
        None => (a, None),
    };
    for (i, rank) in [(Some(win), 0), (lose, 1)] {
        if let Some(i) = i {
            let cand = &mut c[i];
            cand.key = SortKey {
                tier: SortKey::POLICY,
                class: 0,
                primary: rank,
                secondary: 0,
            };
            cand.reason = Reason::Policy(Policy::P2c);
            if let Score::P2c { sampled, .. } = &mut cand.score {
                *sampled = true;
            }
        }
    }
}

/// A uniform index in `0..n` (n > 0) by Lemire's multiply-shift; the bias is
/// below n / 2^64, far under anything a scheduler could notice.
fn index_below<R: RngCore + ?Sized>(rng: &mut R, n: usize) -> usize {
    let wide = u128::from(rng.next_u64()) * n as u128;
    usize::try_from(wide >> 64).unwrap_or(0)
}

/// How many times the policy's pick a node's GPU may predict it at and the
/// node still be tried.
pub(crate) const EXPLORE_MAX_RATIO: u32 = 3;

/// Exploration, the rule and its reason: a node that has learned nothing
/// about the model yet is priced from a prior (its GPU, a seed, or a
/// fallback), and a prior that undersells it would keep it unused forever,
/// since only jobs teach speeds. So when the policy's pick has learned
/// rates and an eligible node has none and is idle (nothing running,
/// queued or reserved there), that node goes first, unless a prior with
/// figures behind it (its GPU, or the speed it advertises) predicts it at
/// more than [`EXPLORE_MAX_RATIO`] times the pick: a fast newcomer is found
/// within a request or two, and a slow one costs a request it runs alone,
/// which must not be a coding agent's 12-20k-token turn on a laptop (half
/// a minute of its job). The ratio leaves out the node's cold load, paid
/// once and bringing the model up there for later requests. Only the
/// fallback, which says nothing of the node, is tried whatever it
/// predicts. Requests with a session or a pinned node are not used to
/// explore.
fn explore(c: &mut [Candidate], request: &RequestProfile) {
    if request.session.is_some() || request.pinned.is_some() {
        return;
    }
    let prediction = |x: &Candidate| match x.score {
        Score::PredictedLatency(p) if x.key.tier == SortKey::POLICY && x.key.class == 0 => Some(p),
        _ => None,
    };
    let Some(best) = c
        .iter()
        .filter_map(|x| prediction(x).map(|p| (x.key.pack(0), p)))
        .min_by_key(|(k, _)| *k)
        .map(|(_, p)| p)
    else {
        return;
    };
    if !best.learned {
        return;
    }
    let limit = best.total_ms.max(1).saturating_mul(EXPLORE_MAX_RATIO);
    let newcomer = c
        .iter()
        .enumerate()
        .filter_map(|(i, x)| prediction(x).map(|p| (i, p)))
        .filter(|(_, p)| {
            !p.learned
                && p.jobs_ahead == 0
                && (p.rates == RateSource::Fallback
                    || p.total_ms.saturating_sub(p.load_ms) <= limit)
        })
        .min_by_key(|(i, p)| (p.total_ms, *i))
        .map(|(i, _)| i);
    if let Some(i) = newcomer {
        c[i].key.tier = SortKey::AFFINITY;
        c[i].reason = Reason::Explore;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::{
        ApiFlavor, EngineKind, EngineSnapshot, GpuDevice, Liveness, ModelEntry, ModelName,
        ModelPerf, NodeSnapshot, Pressure, Workload,
    };
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::SeedableRng;

    const FAST: ModelPerf = ModelPerf {
        prefill_tps: 7_000.0,
        decode_tps: 130.0,
        load_ms: 2_000,
        overhead_ms: 20,
        batch_exponent: None,
    };
    const LAPTOP: ModelPerf = ModelPerf {
        prefill_tps: 300.0,
        decode_tps: 20.0,
        load_ms: 4_000,
        overhead_ms: 40,
        batch_exponent: None,
    };

    fn id(n: u128) -> NodeId {
        NodeId::from_u128(n)
    }

    fn node(n: u128, slots: u16, perf: ModelPerf, loaded: bool) -> NodeSnapshot {
        let mut s = NodeSnapshot::new(id(n), format!("n{n}"));
        s.pressure = Pressure::IDLE;
        s.engines.push(EngineSnapshot {
            kind: EngineKind::Ollama,
            healthy: true,
            silent: false,
            continues_chat: None,
            slots,
            models: vec![ModelEntry {
                name: ModelName::new("llama3.1:8b").unwrap(),
                size_bytes: Some(4_900_000_000),
                loaded,
                perf: Some(perf),
                learned: false,
            }],
        });
        s
    }

    /// One request running, `tokens` of output still to come.
    fn decoding(tokens: u64) -> Workload {
        Workload {
            running: 1,
            decode_tokens: tokens,
            ..Workload::default()
        }
    }

    fn req(streaming: bool) -> RequestProfile {
        let mut r = RequestProfile::new("llama3.1:8b", ApiFlavor::Ollama);
        r.streaming = streaming;
        r.prompt_tokens = 500;
        r.max_output_tokens = 200;
        r
    }

    fn rank(s: &mut Scheduler, nodes: Vec<NodeSnapshot>, r: &RequestProfile) -> Ranking {
        rank_with(s, nodes, r, &Reservations::new(), 0)
    }

    fn rank_with(
        s: &mut Scheduler,
        nodes: Vec<NodeSnapshot>,
        r: &RequestProfile,
        res: &Reservations,
        now_ms: u64,
    ) -> Ranking {
        let cluster = ClusterSnapshot::new(1, now_ms, nodes);
        s.rank(&cluster, r, res, now_ms, &mut ChaCha8Rng::seed_from_u64(1))
    }

    fn order(r: &Ranking) -> Vec<NodeId> {
        r.nodes().collect()
    }

    /// A node that learned `perf` for the model from its jobs.
    fn learned(n: u128, perf: ModelPerf) -> NodeSnapshot {
        let mut s = node(n, 1, perf, true);
        s.engines[0].models[0].learned = true;
        s
    }

    /// A node nothing is learned about, on `gpu`, its model loaded.
    fn newcomer(n: u128, gpu: &str) -> NodeSnapshot {
        let mut s = node(n, 1, FAST, true);
        s.engines[0].models[0].perf = None;
        s.gpus.push(GpuDevice {
            index: 0,
            name: gpu.into(),
            utilisation_pct: 0,
            vram_used_bytes: 0,
            vram_total_bytes: 24 << 30,
        });
        s
    }

    #[test]
    fn an_idle_node_nothing_is_learned_about_is_tried_first() {
        let mut s = Scheduler::new(SchedulerConfig::new(Policy::PredictedLatency));
        let mid = ModelPerf {
            prefill_tps: 1_500.0,
            decode_tps: 50.0,
            ..FAST
        };
        // A new 4090's prior already beats what the other node learned.
        let r = rank(
            &mut s,
            vec![learned(1, mid), newcomer(2, "RTX 4090")],
            &req(true),
        );
        assert_eq!(order(&r), [id(2), id(1)]);
        let Score::PredictedLatency(p) = r.candidates[0].score else {
            panic!()
        };
        assert_eq!(p.rates, crate::RateSource::Hardware);
        // An unknown GPU gets the fallback rates, which sell it short of
        // the learned node; idle and within reach, it is tried first.
        let r = rank(
            &mut s,
            vec![learned(1, mid), newcomer(2, "Some GPU")],
            &req(true),
        );
        assert_eq!(order(&r), [id(2), id(1)]);
        assert_eq!(r.candidates[0].reason, Reason::Explore);
        // Busy, it is not explored now.
        let mut busy = newcomer(2, "Some GPU");
        busy.workload = decoding(100);
        let r = rank(&mut s, vec![learned(1, mid), busy], &req(true));
        assert_eq!(r.candidates[0].node, id(1));
        // A GPU known to be far slower than the learned pick is not worth
        // a request; an unknown one is (nothing says it is slow).
        let r = rank(
            &mut s,
            vec![learned(1, FAST), newcomer(2, "RTX 3060")],
            &req(true),
        );
        assert_eq!(r.candidates[0].node, id(1), "{r:?}");
        let r = rank(
            &mut s,
            vec![learned(1, FAST), newcomer(2, "Some GPU")],
            &req(true),
        );
        assert_eq!(r.candidates[0].reason, Reason::Explore);
        // A speed the node advertises (its model's seed, or its base
        // profile) is a prior with figures behind it, as a GPU is: a
        // laptop saying it is far slower is not sent a long prompt to
        // prove it, and one within reach is tried.
        let mut long = req(true);
        long.prompt_tokens = 12_000;
        let advertised = |perf| node(2, 1, perf, true);
        let mut base_only = node(2, 1, LAPTOP, true);
        base_only.engines[0].models[0].perf = None;
        base_only.base_perf = Some(LAPTOP);
        for (slow, source) in [
            (advertised(LAPTOP), crate::RateSource::Model),
            (base_only, crate::RateSource::Node),
        ] {
            let r = rank(&mut s, vec![learned(1, FAST), slow], &long);
            assert_eq!(r.candidates[0].node, id(1), "{r:?}");
            let Score::PredictedLatency(p) = r.candidates[1].score else {
                panic!()
            };
            assert_eq!(p.rates, source);
            assert!(!p.learned);
        }
        let near = ModelPerf {
            prefill_tps: 3_500.0,
            ..FAST
        };
        let r = rank(&mut s, vec![learned(1, FAST), advertised(near)], &long);
        assert_eq!(r.candidates[0].node, id(2), "{r:?}");
        assert_eq!(r.candidates[0].reason, Reason::Explore);
        // Its cold load is not held against it: paid once, it brings the
        // model up there (past 3x with the load, within it without).
        let r = rank(
            &mut s,
            vec![learned(1, FAST), node(2, 1, near, false)],
            &long,
        );
        let (Score::PredictedLatency(p), Score::PredictedLatency(pick)) =
            (r.candidates[0].score, r.candidates[1].score)
        else {
            panic!()
        };
        assert!(p.load_ms > 0 && p.total_ms > 3 * pick.total_ms, "{p:?}");
        assert_eq!(r.candidates[0].reason, Reason::Explore, "{r:?}");
        // A session's request or a pinned one does not explore.
        let mut with_session = req(true);
        with_session.session = Some(SessionKey(1));
        let r = rank(
            &mut s,
            vec![learned(1, mid), newcomer(2, "Some GPU")],
            &with_session,
        );
        assert_eq!(r.candidates[0].node, id(1));
        // Nothing learned anywhere: the policy's order stands.
        let r = rank(
            &mut s,
            vec![newcomer(1, "RTX 3060"), newcomer(2, "RTX 4090")],
            &req(true),
        );
        assert!(r.candidates.iter().all(|c| c.reason != Reason::Explore));
        assert_eq!(r.candidates[0].node, id(2), "the better prior wins");
    }

    #[test]
    fn a_fast_four_slot_node_with_one_busy_beats_an_idle_one_slot_laptop() {
        let mut fast = node(2, 4, FAST, true);
        fast.workload = decoding(400);
        fast.pressure = Pressure::new(2).unwrap();
        let laptop = node(1, 1, LAPTOP, true);
        for streaming in [true, false] {
            let mut s = Scheduler::with_policy(Policy::PredictedLatency);
            let r = rank(&mut s, vec![fast.clone(), laptop.clone()], &req(streaming));
            assert_eq!(order(&r), [id(2), id(1)], "{}", r.candidates()[0]);
        }
        // PAIR's rule counts the busy job and the pressure, and picks the laptop.
        let mut s = Scheduler::with_policy(Policy::Pair);
        let r = rank(&mut s, vec![fast, laptop], &req(true));
        assert_eq!(order(&r), [id(1), id(2)]);
    }

    #[test]
    fn warm_beats_cold_on_identical_nodes() {
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        // The cold node has the lower id, so only the prediction can put it second.
        let r = rank(
            &mut s,
            vec![node(1, 1, FAST, false), node(2, 1, FAST, true)],
            &req(true),
        );
        assert_eq!(order(&r), [id(2), id(1)]);
        let cold = r.candidates()[1].score.prediction().copied().unwrap();
        assert_eq!(cold.load_ms, FAST.load_ms);
    }

    #[test]
    fn a_model_that_does_not_fit_in_free_vram_sinks_but_stays_listed() {
        let mut full = node(1, 4, FAST, false);
        full.gpus.push(GpuDevice {
            index: 0,
            name: "RTX 4090".into(),
            utilisation_pct: 0,
            vram_used_bytes: 22_000_000_000,
            vram_total_bytes: 24_000_000_000,
        });
        // Even a very slow node that can load it comes first.
        let slow = node(2, 1, LAPTOP, false);
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let r = rank(&mut s, vec![full, slow], &req(false));
        assert_eq!(order(&r), [id(2), id(1)]);
        let sunk = r.candidates()[1].score.prediction().copied().unwrap();
        assert!(!sunk.fits_vram);
        assert!(sunk.total_ms < r.candidates()[0].score.prediction().unwrap().total_ms);
    }

    #[test]
    fn suspect_nodes_rank_after_live_ones_and_dead_ones_not_at_all() {
        let mut fast = node(1, 4, FAST, true);
        fast.liveness = Liveness::Suspect;
        let mut dead = node(3, 4, FAST, true);
        dead.liveness = Liveness::Dead;
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let r = rank(
            &mut s,
            vec![fast, node(2, 1, LAPTOP, true), dead],
            &req(true),
        );
        assert_eq!(order(&r), [id(2), id(1)]);
        assert!(r.candidates()[1].to_string().contains("node suspect"));
    }

    #[test]
    fn a_silent_engine_ranks_after_live_ones_and_a_node_prefers_its_other_engine() {
        let mut fast = node(1, 4, FAST, true);
        fast.engines[0].silent = true;
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let r = rank(
            &mut s,
            vec![fast.clone(), node(2, 1, LAPTOP, true)],
            &req(true),
        );
        assert_eq!(order(&r), [id(2), id(1)], "sunk, not dropped");
        assert!(r.candidates()[1].to_string().contains("engine silent"));
        // Alone, it still takes the request.
        let r = rank(&mut s, vec![fast.clone()], &req(true));
        assert_eq!(order(&r), [id(1)]);
        // A second engine on the node with the model: the node is ranked
        // by it, unsunk, even though only the silent one has it loaded.
        let mut other = fast.engines[0].clone();
        other.silent = false;
        other.models[0].loaded = false;
        fast.engines.push(other);
        let r = rank(&mut s, vec![fast], &req(true));
        let p = r.candidates()[0].score.prediction().copied().unwrap();
        assert!(!p.silent && p.load_ms > 0, "{p}");
    }

    #[test]
    fn streaming_predicts_first_token_and_non_streaming_the_whole_answer() {
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let nodes = vec![node(1, 1, FAST, true)];
        let st = rank(&mut s, nodes.clone(), &req(true));
        let wh = rank(&mut s, nodes, &req(false));
        let (st, wh) = (
            *st.first().unwrap().score.prediction().unwrap(),
            *wh.first().unwrap().score.prediction().unwrap(),
        );
        assert_eq!(st.metric, crate::Metric::FirstToken);
        assert_eq!(wh.metric, crate::Metric::WholeAnswer);
        assert_eq!(st.decode_ms, 0);
        // 200 tokens at 130 tok/s.
        assert_eq!(wh.decode_ms, 1_538);
        assert_eq!(wh.total_ms, st.total_ms + wh.decode_ms);
        assert!(st.to_string().starts_with("predicted ttft "));
        assert!(wh.to_string().starts_with("predicted total "));
    }

    #[test]
    fn streaming_and_whole_answer_can_choose_differently() {
        // Quick to start but slow to decode vs slower to start, fast decode.
        let quick_start = ModelPerf {
            prefill_tps: 20_000.0,
            decode_tps: 10.0,
            load_ms: 0,
            overhead_ms: 5,
            batch_exponent: None,
        };
        let fast_decode = ModelPerf {
            prefill_tps: 1_000.0,
            decode_tps: 150.0,
            load_ms: 0,
            overhead_ms: 5,
            batch_exponent: None,
        };
        let nodes = vec![node(1, 1, quick_start, true), node(2, 1, fast_decode, true)];
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        assert_eq!(order(&rank(&mut s, nodes.clone(), &req(true)))[0], id(1));
        assert_eq!(order(&rank(&mut s, nodes, &req(false)))[0], id(2));
    }

    #[test]
    fn affinity_breaks_ties_and_gives_way_to_a_clearly_sooner_node() {
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let session = pair_core::SessionKey(42);
        let mut r = req(true);
        r.session = Some(session);
        s.bind_session(session, id(2), 0);
        assert_eq!(s.session_node(session, 10), Some(id(2)));

        // Home (2) 60 ms further away than 1, within the tie margin: stays.
        let mut home = node(2, 1, FAST, true);
        home.rtt_us = 60_000;
        let other = node(1, 1, FAST, true);
        let ranked = rank_with(
            &mut s,
            vec![home.clone(), other.clone()],
            &r,
            &Reservations::new(),
            10,
        );
        assert_eq!(order(&ranked), [id(2), id(1)]);
        assert_eq!(ranked.candidates()[0].reason, Reason::Affinity);
        let p = |i: usize| ranked.candidates()[i].score.prediction().unwrap().total_ms;
        assert!(p(0) > p(1), "affinity, not the prediction, kept it first");

        // Home also busy, about 390 ms (and several times) slower: the old
        // 500 ms / 25 % gate kept the session; the tie margin does not.
        home.workload = decoding(40);
        let ranked = rank_with(
            &mut s,
            vec![home.clone(), other.clone()],
            &r,
            &Reservations::new(),
            10,
        );
        assert_eq!(order(&ranked), [id(1), id(2)], "{}", ranked.candidates()[1]);

        // A configured margin still acts as a gate.
        let mut gated = Scheduler::new(SchedulerConfig {
            policy: Policy::PredictedLatency,
            affinity: Some(AffinityConfig::new(500, 25, 16, 60_000).unwrap()),
        });
        gated.bind_session(session, id(2), 0);
        let ranked = rank_with(
            &mut gated,
            vec![home.clone(), other.clone()],
            &r,
            &Reservations::new(),
            10,
        );
        assert_eq!(order(&ranked), [id(2), id(1)]);
        assert_eq!(ranked.candidates()[0].reason, Reason::Affinity);

        // Home far busier: the session moves under either margin.
        home.workload.decode_tokens = 4_000;
        let ranked = rank_with(&mut gated, vec![home, other], &r, &Reservations::new(), 10);
        assert_eq!(order(&ranked), [id(1), id(2)]);
        assert_eq!(
            ranked.candidates()[0].reason,
            Reason::Policy(Policy::PredictedLatency)
        );

        // Without a session key nothing sticks.
        assert_eq!(s.sessions(), 1);
        assert!(s.forget_session(session));
        assert_eq!(s.session_node(session, 10), None);
    }

    /// A session's context cached on its (slower) node keeps the next turn
    /// there by the prediction alone: staying prefills the new tokens,
    /// moving the whole context.
    #[test]
    fn the_cache_a_session_left_keeps_it_where_the_tie_margin_would_not() {
        let slow = ModelPerf {
            prefill_tps: FAST.prefill_tps / 2.0,
            decode_tps: FAST.decode_tps / 2.0,
            ..FAST
        };
        let nodes = vec![node(1, 1, FAST, true), node(2, 1, slow, true)];
        let cluster = ClusterSnapshot::new(1, 0, nodes.clone());
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let session = pair_core::SessionKey(9);
        let mut r = req(true);
        r.session = Some(session);
        r.prompt_tokens = 8_000;
        let mut b = pair_core::ChainBuilder::new();
        b.segment(1, 7_500).segment(2, 500);
        r.prefix = b.finish();
        s.bind_session(session, id(2), 0);
        // Nothing cached: the fast node is 570 ms sooner and takes it.
        let ranked = rank(&mut s, nodes.clone(), &r);
        assert_eq!(order(&ranked), [id(1), id(2)]);
        // The earlier turns' 7,500 tokens cached on the slow node.
        let mut earlier = pair_core::ChainBuilder::new();
        earlier.segment(1, 7_500);
        s.note_routed(&cluster, id(2), &earlier.finish(), 0);
        let ranked = rank(&mut s, nodes, &r);
        assert_eq!(order(&ranked), [id(2), id(1)]);
        let home = ranked.candidates()[0].score.prediction().copied().unwrap();
        assert_eq!(home.cached_tokens, 7_500);
        assert!(home.total_ms < ranked.candidates()[1].score.prediction().unwrap().total_ms);
        assert!(
            ranked.candidates()[0]
                .to_string()
                .contains("prefill 143 (7500 cached)"),
            "{}",
            ranked.candidates()[0]
        );
    }

    #[test]
    fn a_conversation_is_followed_to_the_node_another_router_sent_it_to() {
        let session = pair_core::SessionKey(42);
        let mut r = req(true);
        r.session = Some(session);
        // Node 1 routed the first turn to node 2 and says so in its report.
        let mut entry = node(1, 1, FAST, true);
        entry.bindings.push(pair_core::Binding {
            session,
            node: id(2),
            at_ms: 5,
        });
        // The home a little slower than the others (60 ms further away),
        // within the tie margin, so only the binding puts it first.
        let mut home = node(2, 1, FAST, true);
        home.rtt_us = 60_000;
        // Node 3 has no binding of its own, and follows the report.
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let nodes = vec![entry.clone(), home.clone(), node(3, 1, FAST, true)];
        let ranked = rank_with(&mut s, nodes.clone(), &r, &Reservations::new(), 10);
        assert_eq!(order(&ranked)[0], id(2));
        assert_eq!(ranked.candidates()[0].reason, Reason::Affinity);
        // A newer binding of its own wins over an older report...
        s.bind_session(session, id(3), 8);
        let ranked = rank_with(&mut s, nodes.clone(), &r, &Reservations::new(), 10);
        assert_eq!(order(&ranked)[0], id(3));
        // ...and a newer report over an older own binding.
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        s.bind_session(session, id(3), 2);
        let ranked = rank_with(&mut s, nodes, &r, &Reservations::new(), 10);
        assert_eq!(order(&ranked)[0], id(2));
        // A report past the idle limit is not followed.
        let ttl = AffinityConfig::default().idle_ttl_ms;
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let ranked = rank_with(
            &mut s,
            vec![entry, home, node(3, 1, FAST, true)],
            &r,
            &Reservations::new(),
            6 + ttl,
        );
        assert_ne!(ranked.candidates()[0].reason, Reason::Affinity);
    }

    proptest::proptest! {
        /// Routers with no binding of their own that see the same reports
        /// put a conversation's turn on the same node, whatever the
        /// reports say and in whatever order the nodes list them.
        #[test]
        fn routers_agree_on_where_a_conversation_lives(
            claims in proptest::collection::vec((1u128..=4, 1u128..=4, 0u64..5), 0..8),
            busy in proptest::collection::vec(0u64..3_000, 4),
            rotate in 0usize..4,
        ) {
            let session = pair_core::SessionKey(7);
            let mut nodes: Vec<NodeSnapshot> = (1..=4u128)
                .map(|n| {
                    let mut x = node(n, 1, FAST, true);
                    x.workload = decoding(busy[usize::try_from(n - 1).unwrap()]);
                    x
                })
                .collect();
            for &(reporter, home, at) in &claims {
                nodes[usize::try_from(reporter - 1).unwrap()]
                    .bindings
                    .push(pair_core::Binding { session, node: id(home), at_ms: at });
            }
            let mut r = req(true);
            r.session = Some(session);
            let first = |nodes: Vec<NodeSnapshot>| {
                let mut s = Scheduler::with_policy(Policy::PredictedLatency);
                let ranked = rank_with(&mut s, nodes, &r, &Reservations::new(), 10);
                (order(&ranked)[0], ranked.candidates()[0].reason)
            };
            let a = first(nodes.clone());
            nodes.rotate_left(rotate);
            let b = first(nodes);
            proptest::prop_assert_eq!(a, b);
            // The newest claim is the home; it is kept unless clearly slower (the tie margin).
            if let Some(newest) = claims.iter().max_by_key(|c| (c.2, std::cmp::Reverse(c.1)))
                && a.1 == Reason::Affinity
            {
                proptest::prop_assert_eq!(a.0, id(newest.1));
            }
        }
    }

    #[test]
    fn affinity_expires_and_can_be_switched_off() {
        let mut s = Scheduler::new(SchedulerConfig {
            policy: Policy::PredictedLatency,
            affinity: None,
        });
        s.bind_session(pair_core::SessionKey(1), id(2), 0);
        assert_eq!(s.sessions(), 0);
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        s.bind_session(pair_core::SessionKey(1), id(2), 0);
        let ttl = AffinityConfig::default().idle_ttl_ms;
        assert_eq!(s.session_node(pair_core::SessionKey(1), ttl), Some(id(2)));
        assert_eq!(s.session_node(pair_core::SessionKey(1), ttl + 1), None);
    }

    #[test]
    fn pinned_goes_first_even_when_worst() {
        for policy in Policy::ALL {
            let mut s = Scheduler::with_policy(policy);
            let mut r = req(true);
            r.pinned = Some(id(1));
            let mut busy = node(1, 1, LAPTOP, false);
            busy.workload.queued = 9;
            let ranked = rank(&mut s, vec![busy, node(2, 4, FAST, true)], &r);
            assert_eq!(order(&ranked)[0], id(1), "{policy}");
            assert_eq!(ranked.candidates()[0].reason, Reason::Pinned);
            // A pin on a node without the model is ignored.
            r.pinned = Some(id(9));
            let ranked = rank(&mut s, vec![node(2, 4, FAST, true)], &r);
            assert_eq!(order(&ranked), [id(2)]);
        }
    }

    #[test]
    fn round_robin_rotates_one_step_per_request() {
        let mut s = Scheduler::with_policy(Policy::RoundRobin);
        let nodes = vec![
            node(1, 1, FAST, true),
            node(2, 1, FAST, true),
            node(3, 1, FAST, true),
        ];
        let firsts: Vec<_> = (0..4)
            .map(|_| order(&rank(&mut s, nodes.clone(), &req(true)))[0])
            .collect();
        assert_eq!(firsts, [id(1), id(2), id(3), id(1)]);
        let r = rank(&mut s, nodes, &req(true));
        assert_eq!(order(&r), [id(2), id(3), id(1)]);
        assert_eq!(r.candidates()[2].to_string(), "round-robin: turn 2");
    }

    #[test]
    fn p2c_puts_the_less_loaded_sample_first_and_the_rest_by_id() {
        let mut s = Scheduler::with_policy(Policy::P2c);
        let mut nodes: Vec<_> = (1..=5).map(|n| node(n, 1, FAST, true)).collect();
        for (i, n) in nodes.iter_mut().enumerate() {
            n.workload.queued = 5 - i as u32;
        }
        let r = rank(&mut s, nodes, &req(true));
        let sampled: Vec<_> = r
            .iter()
            .filter(|c| matches!(c.score, Score::P2c { sampled: true, .. }))
            .collect();
        assert_eq!(sampled.len(), 2);
        assert_eq!(r.candidates()[0].node, sampled[0].node);
        assert_eq!(r.candidates()[1].node, sampled[1].node);
        assert!(sampled[0].score.pending() <= sampled[1].score.pending());
        let rest: Vec<_> = r.nodes().skip(2).collect();
        assert!(rest.windows(2).all(|w| w[0] < w[1]));
        assert!(r.iter().skip(2).all(|c| c.reason == Reason::Fallback));
    }

    #[test]
    fn reservations_spread_a_burst_under_pair() {
        let mut s = Scheduler::with_policy(Policy::Pair);
        let nodes: Vec<_> = (1..=3).map(|n| node(n, 1, FAST, true)).collect();
        let mut res = Reservations::new();
        let mut firsts = Vec::new();
        for t in 0..3 {
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 1 + t);
            let first = r.first().unwrap();
            assert!(first.to_string().starts_with("pair: pending+pressure"));
            firsts.push(first.node);
            res.reserve(first.node, &req(true), 1 + t);
        }
        assert_eq!(firsts, [id(1), id(2), id(3)]);
    }

    /// The router's own node read live: a request that finished there since
    /// the last report no longer counts, and the node's reservations are
    /// not added on top (the live workload already holds them).
    #[test]
    fn a_live_workload_replaces_the_nodes_report_and_its_reservations() {
        let busy = Workload {
            running: 1,
            queued: 3,
            prefill_tokens: 2_000,
            decode_tokens: 800,
        };
        let mut fast = node(1, 1, FAST, true);
        fast.workload = busy;
        fast.reported_at_ms = 10;
        let laptop = node(2, 1, LAPTOP, true);
        let nodes = vec![fast, laptop];
        for policy in [Policy::PredictedLatency, Policy::LeastPending, Policy::Pair] {
            let mut s = Scheduler::with_policy(policy);
            let mut res = Reservations::new();
            // The stale report sinks the fast node...
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 20);
            assert_eq!(order(&r), [id(2), id(1)], "{policy}: {}", r.candidates()[0]);
            // ...its live workload (idle now) lifts it back...
            res.set_live(Some((id(1), Workload::default())));
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 20);
            assert_eq!(order(&r), [id(1), id(2)], "{policy}: {}", r.candidates()[0]);
            assert_eq!(r.candidates()[0].score.pending(), Some(0), "{policy}");
            // ...reservations on it made after the report do not count twice...
            for t in 0..4 {
                res.reserve(id(1), &req(true), 20 + t);
            }
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 30);
            assert_eq!(order(&r), [id(1), id(2)], "{policy}");
            // ...and a busy live workload sinks it again, on another node too.
            res.set_live(Some((id(1), busy)));
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 30);
            assert_eq!(order(&r), [id(2), id(1)], "{policy}");
            assert_eq!(
                r.candidates()[1].score.pending(),
                Some(busy.pending()),
                "{policy}"
            );
            res.set_live(Some((id(9), Workload::default())));
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 30);
            assert_eq!(order(&r), [id(2), id(1)], "{policy}");
        }
    }

    /// Every router that sees a peer's last free slot sends there; only the
    /// first gets it. A slightly faster peer whose last slot was seen free a
    /// report interval ago loses to this router's own node, read live with
    /// slots to spare; seen just now, it wins.
    #[test]
    fn the_last_free_slot_of_an_old_view_loses_to_a_sure_one() {
        let quicker = ModelPerf {
            prefill_tps: FAST.prefill_tps * 1.5,
            ..FAST
        };
        let mut peer = node(1, 4, quicker, true);
        peer.workload = Workload {
            running: 3,
            decode_tokens: 600,
            ..Workload::default()
        };
        peer.reported_at_ms = 1_000;
        let own = node(2, 4, FAST, true);
        let mut res = Reservations::new();
        res.set_live(Some((id(2), decoding(200))));
        let mut s = Scheduler::with_policy(Policy::PredictedLatency);
        let nodes = vec![peer, own];
        let fresh = rank_with(&mut s, nodes.clone(), &req(true), &res, 1_000);
        assert_eq!(order(&fresh), [id(1), id(2)], "{}", fresh.candidates()[0]);
        let old = rank_with(&mut s, nodes, &req(true), &res, 2_000);
        assert_eq!(order(&old), [id(2), id(1)], "{}", old.candidates()[1]);
        let Score::PredictedLatency(p) = old.candidates()[1].score else {
            panic!("{}", old.candidates()[1]);
        };
        assert!(p.queue_ms > 0 && p.jobs_ahead < p.slots, "{p}");
    }

    /// A peer's report made while this router's request ran there counts
    /// that request; once it has finished, ranking takes it off the report
    /// until the peer reports again.
    #[test]
    fn a_request_finished_since_the_report_no_longer_weighs_on_its_node() {
        let mut fast = node(1, 1, FAST, true);
        fast.workload = decoding(2_000);
        fast.reported_at_ms = 10;
        let laptop = node(2, 1, LAPTOP, true);
        let nodes = vec![fast.clone(), laptop];
        for policy in [Policy::PredictedLatency, Policy::LeastPending, Policy::Pair] {
            let mut s = Scheduler::with_policy(policy);
            let mut res = Reservations::new();
            let rid = res.reserve(id(1), &req(true), 5);
            res.sync(&ClusterSnapshot::new(1, 10, vec![fast.clone()]));
            // Still running: the report is right, the laptop goes first.
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 12);
            assert_eq!(order(&r), [id(2), id(1)], "{policy}");
            // Finished at 15: the fast node is idle again.
            assert!(res.release(rid, 15));
            let r = rank_with(&mut s, nodes.clone(), &req(true), &res, 16);
            assert_eq!(order(&r), [id(1), id(2)], "{policy}: {}", r.candidates()[0]);
            assert_eq!(r.candidates()[0].score.pending(), Some(0), "{policy}");
        }
    }

    #[test]
    fn packed_and_whole_candidate_sorts_agree_even_when_saturated() {
        let mut nodes = Vec::new();
        for n in 0..40u128 {
            let mut x = node(n * 7919 % 97, 1 + (n % 4) as u16, FAST, n % 3 != 0);
            x.workload.queued = (n % 5) as u32 * if n % 7 == 0 { 1 << 29 } else { 1 };
            x.workload.decode_tokens = (n as u64 % 6) << if n % 11 == 0 { 40 } else { 4 };
            x.pressure = Pressure::new((n % 4) as u8).unwrap();
            x.liveness = if n % 13 == 0 {
                Liveness::Suspect
            } else {
                Liveness::Alive
            };
            nodes.push(x);
        }
        for policy in Policy::ALL {
            let mut s = Scheduler::with_policy(policy);
            let mut r = req(streaming_for(policy));
            r.pinned = Some(id(5));
            let packed = rank(&mut s, nodes.clone(), &r);
            let mut whole = packed.clone();
            whole.candidates.clear();
            sort_into(&mut whole, false);
            assert_eq!(packed, whole, "{policy}");
            assert!(packed.len() > 30);
        }
    }

    fn streaming_for(p: Policy) -> bool {
        p.as_str().len().is_multiple_of(2)
    }

    #[test]
    fn nothing_eligible_is_an_empty_ranking() {
        let mut s = Scheduler::default();
        let mut r = req(true);
        r.model = "qwen3".into();
        let ranked = rank(&mut s, vec![node(1, 1, FAST, true)], &r);
        assert!(ranked.is_empty());
        assert_eq!(ranked.policy(), Policy::PredictedLatency);
    }
}
