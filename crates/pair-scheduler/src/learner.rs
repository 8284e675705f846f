//! Learns each node's real speed per model from finished jobs: an EWMA of
//! prefill and decode rates that the node shell puts into its snapshots.

use std::collections::BTreeMap;

use pair_core::{EngineTiming, JobRecord, JobStatus, ModelPerf, NodeId};

/// One finished job, as timed by the proxy (or, better, by the engine when
/// it reports its own prompt-eval and eval durations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation<'a> {
    pub node: NodeId,
    /// The model as the node's inventory names it.
    pub model: &'a str,
    pub prompt_tokens: u32,
    /// Time to first token.
    pub ttft_ms: u32,
    pub output_tokens: u32,
    /// Whole request.
    pub duration_ms: u32,
    /// A whole (non-streamed) answer timed by the node: its first byte was
    /// its last, so its time is prefill and decode together. It teaches
    /// prefill only, net of the decode the learned speed accounts for, and
    /// never decode.
    pub whole: bool,
}

impl<'a> Observation<'a> {
    /// The observation in a completed job record, if it carries timings:
    /// the engine's own durations when it reported both (no queueing, no
    /// network in them), else the node's clock.
    /// A job whose answer moved (`resumed`) teaches nothing: its times
    /// span its legs, the waits between them and more than one node.
    pub fn from_job(job: &'a JobRecord) -> Option<Self> {
        if job.status != JobStatus::Completed || !job.resumed.is_empty() {
            return None;
        }
        let (ttft_ms, duration_ms, whole) = match job.engine {
            Some(EngineTiming {
                prompt_ms: Some(p),
                decode_ms: Some(d),
            }) => (p, p.saturating_add(d), false),
            _ => (job.ttft_ms?, job.duration_ms?, !job.streaming),
        };
        Some(Self {
            node: job.ran_on?,
            model: &job.model,
            // Only what was not cached was prefilled: a prompt found in the
            // engine's cache would otherwise teach an absurd prefill speed.
            prompt_tokens: job
                .prompt_tokens?
                .saturating_sub(job.cached_tokens.unwrap_or(0)),
            ttft_ms,
            output_tokens: job.output_tokens.unwrap_or(0),
            duration_ms,
            whole,
        })
    }
}

/// Rates learned for one (node, model).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LearnedRates {
    pub prefill_tps: Option<f32>,
    pub decode_tps: Option<f32>,
    /// Observations that contributed at least one rate.
    pub samples: u32,
}

impl LearnedRates {
    /// `seed` with the learned rates put in (load time and overhead stay
    /// the seed's: a finished job says little about either).
    pub fn over(&self, seed: ModelPerf) -> ModelPerf {
        ModelPerf {
            prefill_tps: self.prefill_tps.unwrap_or(seed.prefill_tps),
            decode_tps: self.decode_tps.unwrap_or(seed.decode_tps),
            ..seed
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    rates: LearnedRates,
    touched: u64,
}

/// EWMA rates per (node, model), bounded in size (least recently updated
/// forgotten first).
#[derive(Clone, Debug)]
pub struct PerfLearner {
    alpha: f32,
    capacity: usize,
    tick: u64,
    len: usize,
    table: BTreeMap<NodeId, BTreeMap<String, Slot>>,
}

impl Default for PerfLearner {
    fn default() -> Self {
        Self::new()
    }
}

impl PerfLearner {
    /// Weight of each new observation.
    pub const DEFAULT_ALPHA: f32 = 0.2;
    pub const DEFAULT_CAPACITY: usize = 4096;
    /// Shorter prompts are dominated by fixed costs and say nothing about
    /// prefill speed.
    pub const MIN_PROMPT_TOKENS: u32 = 64;
    /// Fewer generated tokens say nothing about decode speed.
    pub const MIN_OUTPUT_TOKENS: u32 = 8;
    /// Rates outside this range are garbage, not measurements.
    pub const TPS_RANGE: (f32, f32) = (0.05, 1_000_000.0);
    /// After a few samples, one observation moves a rate at most this many
    /// times up or down (a job that sat in a queue is not a slow GPU).
    pub const MAX_STEP: f32 = 4.0;

    pub fn new() -> Self {
        Self::with(Self::DEFAULT_ALPHA, Self::DEFAULT_CAPACITY)
    }

    /// `alpha` is clamped into (0, 1]; capacity to at least 1.
    pub fn with(alpha: f32, capacity: usize) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(0.001, 1.0)
        } else {
            Self::DEFAULT_ALPHA
        };
        Self {
            alpha,
            capacity: capacity.max(1),
            tick: 0,
            len: 0,
            table: BTreeMap::new(),
        }
    }

    /// Folds one finished job in; returns whether it taught anything.
    pub fn observe(&mut self, obs: &Observation<'_>) -> bool {
        // A whole answer's prefill: its time less the decode the learned
        // speed accounts for (none learned yet: it teaches nothing).
        let prefill_ms = if obs.whole {
            let Some(decode_tps) = self
                .rates(obs.node, obs.model)
                .and_then(|r| r.decode_tps)
                .filter(|d| *d > 0.0)
            else {
                return false;
            };
            let decoding = obs.output_tokens.saturating_sub(1) as f32 * 1000.0 / decode_tps;
            obs.duration_ms as f32 - decoding
        } else {
            obs.ttft_ms as f32
        };
        let prefill = (obs.prompt_tokens >= Self::MIN_PROMPT_TOKENS && prefill_ms >= 1.0)
            .then(|| obs.prompt_tokens as f32 * 1000.0 / prefill_ms);
        let decode_ms = obs.duration_ms.saturating_sub(obs.ttft_ms);
        let decode = (!obs.whole
            && obs.output_tokens >= Self::MIN_OUTPUT_TOKENS
            && obs.duration_ms >= obs.ttft_ms
            && decode_ms > 0)
            .then(|| (obs.output_tokens - 1) as f32 * 1000.0 / decode_ms as f32);
        let in_range =
            |x: &f32| x.is_finite() && (Self::TPS_RANGE.0..=Self::TPS_RANGE.1).contains(x);
        let prefill = prefill.filter(in_range);
        let decode = decode.filter(in_range);
        if prefill.is_none() && decode.is_none() {
            return false;
        }
        self.tick += 1;
        let tick = self.tick;
        let alpha = self.alpha;
        if !self.contains(obs.node, obs.model) && self.len >= self.capacity {
            self.evict_oldest();
        }
        let per_node = self.table.entry(obs.node).or_default();
        let slot = match per_node.get_mut(obs.model) {
            Some(s) => s,
            None => {
                self.len += 1;
                per_node.entry(obs.model.to_owned()).or_insert(Slot {
                    rates: LearnedRates::default(),
                    touched: tick,
                })
            }
        };
        let settled = slot.rates.samples >= 3;
        let fold = |old: Option<f32>, new: Option<f32>| match (old, new) {
            (Some(o), Some(n)) => {
                let n = if settled {
                    n.clamp(o / Self::MAX_STEP, o * Self::MAX_STEP)
                } else {
                    n
                };
                Some(o + alpha * (n - o))
            }
            (None, n) => n,
            (o, None) => o,
        };
        slot.rates.prefill_tps = fold(slot.rates.prefill_tps, prefill);
        slot.rates.decode_tps = fold(slot.rates.decode_tps, decode);
        slot.rates.samples = slot.rates.samples.saturating_add(1);
        slot.touched = tick;
        true
    }

    /// What has been learned for `model` on `node`.
    pub fn rates(&self, node: NodeId, model: &str) -> Option<LearnedRates> {
        self.table.get(&node)?.get(model).map(|s| s.rates)
    }

    /// The figures to publish for `model` on `node`: `seed` with whatever
    /// has been learned put in.
    pub fn perf(&self, node: NodeId, model: &str, seed: ModelPerf) -> ModelPerf {
        self.rates(node, model).map_or(seed, |r| r.over(seed))
    }

    /// Forgets a node (unpaired, evicted).
    pub fn forget_node(&mut self, node: NodeId) {
        if let Some(m) = self.table.remove(&node) {
            self.len -= m.len();
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn contains(&self, node: NodeId, model: &str) -> bool {
        self.table.get(&node).is_some_and(|m| m.contains_key(model))
    }

    fn evict_oldest(&mut self) {
        let oldest = self
            .table
            .iter()
            .flat_map(|(n, m)| m.iter().map(move |(k, s)| (s.touched, *n, k)))
            .min()
            .map(|(_, n, k)| (n, k.clone()));
        if let Some((node, model)) = oldest
            && let Some(m) = self.table.get_mut(&node)
        {
            if m.remove(&model).is_some() {
                self.len -= 1;
            }
            if m.is_empty() {
                self.table.remove(&node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_inputs_leave_finite_rates_in_range(
            jobs in prop::collection::vec(
                (0u128..4, any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
                0..50,
            ),
            alpha in prop_oneof![Just(f32::NAN), Just(0.0f32), Just(-1.0f32), 0.0f32..2.0],
        ) {
            let mut l = PerfLearner::with(alpha, 3);
            for (node, prompt, ttft, out, dur) in jobs {
                l.observe(&obs(node, prompt, ttft, out, dur));
                prop_assert!(l.len() <= 3);
                for n in 0..4 {
                    if let Some(r) = l.rates(NodeId::from_u128(n), "m") {
                        for v in [r.prefill_tps, r.decode_tps].into_iter().flatten() {
                            prop_assert!(v.is_finite());
                            prop_assert!(v >= PerfLearner::TPS_RANGE.0 && v <= PerfLearner::TPS_RANGE.1);
                        }
                    }
                }
            }
        }
    }

    fn obs(node: u128, prompt: u32, ttft: u32, out: u32, dur: u32) -> Observation<'static> {
        Observation {
            node: NodeId::from_u128(node),
            model: "m",
            prompt_tokens: prompt,
            ttft_ms: ttft,
            output_tokens: out,
            duration_ms: dur,
            whole: false,
        }
    }

    /// A whole answer teaches prefill net of the decode already learned,
    /// and never decode: its first byte is its last.
    #[test]
    fn a_whole_answer_teaches_prefill_net_of_decode_and_no_decode() {
        let mut l = PerfLearner::with(1.0, 16);
        let whole = |prompt, out, dur| Observation {
            whole: true,
            ..obs(1, prompt, dur, out, dur)
        };
        // No decode speed learned yet: nothing to net out.
        assert!(!l.observe(&whole(1000, 101, 1500)));
        assert!(l.observe(&obs(1, 1000, 500, 101, 1500)));
        // 1,000 prompt tokens and 100 more decoded at 100/s in 1.5 s: 0.5 s
        // of prefill.
        assert!(l.observe(&whole(4000, 101, 2000)));
        let r = l.rates(NodeId::from_u128(1), "m").unwrap();
        assert_eq!(r.prefill_tps, Some(4000.0));
        assert_eq!(r.decode_tps, Some(100.0), "a whole answer moved decode");
        // All decode and no room for prefill: nothing learned.
        assert!(!l.observe(&whole(4000, 101, 900)));
    }

    #[test]
    fn first_sample_sets_rates_then_ewma_follows() {
        let mut l = PerfLearner::with(0.5, 16);
        assert!(l.observe(&obs(1, 1000, 500, 101, 1500)));
        let r = l.rates(NodeId::from_u128(1), "m").unwrap();
        assert_eq!(r.prefill_tps, Some(2000.0));
        assert_eq!(r.decode_tps, Some(100.0));
        assert!(l.observe(&obs(1, 1000, 250, 101, 750)));
        let r = l.rates(NodeId::from_u128(1), "m").unwrap();
        assert_eq!(r.prefill_tps, Some(3000.0));
        assert_eq!(r.decode_tps, Some(150.0));
        assert_eq!(r.samples, 2);
        let perf = l.perf(NodeId::from_u128(1), "m", ModelPerf::FALLBACK);
        assert_eq!(perf.decode_tps, 150.0);
        assert_eq!(perf.load_ms, ModelPerf::FALLBACK.load_ms);
    }

    #[test]
    fn zero_and_garbage_inputs_teach_nothing() {
        let mut l = PerfLearner::new();
        assert!(!l.observe(&obs(1, 0, 0, 0, 0)));
        assert!(
            !l.observe(&obs(1, 10, 5, 3, 9)),
            "too small to mean anything"
        );
        assert!(!l.observe(&obs(1, 1000, 0, 0, 0)), "zero ttft");
        assert!(!l.observe(&obs(1, 10, 50, 100, 40)), "duration < ttft");
        assert!(!l.observe(&obs(1, u32::MAX, 1, 0, 0)), "absurd rate");
        assert!(l.is_empty());
        assert_eq!(
            l.perf(NodeId::from_u128(1), "m", ModelPerf::FALLBACK),
            ModelPerf::FALLBACK
        );
    }

    #[test]
    fn a_settled_rate_moves_by_bounded_steps() {
        let mut l = PerfLearner::with(1.0, 16);
        for _ in 0..3 {
            l.observe(&obs(1, 1000, 1000, 0, 0));
        }
        // A job that waited 100 s in a queue must not make the node look 100x slower.
        l.observe(&obs(1, 1000, 100_000, 0, 0));
        let r = l.rates(NodeId::from_u128(1), "m").unwrap();
        assert_eq!(r.prefill_tps, Some(1000.0 / PerfLearner::MAX_STEP));
    }

    #[test]
    fn size_is_bounded_and_nodes_can_be_forgotten() {
        let mut l = PerfLearner::with(0.2, 3);
        for n in 0..10 {
            assert!(l.observe(&obs(n, 1000, 100, 0, 0)));
        }
        assert_eq!(l.len(), 3);
        assert!(l.rates(NodeId::from_u128(0), "m").is_none());
        assert!(l.rates(NodeId::from_u128(9), "m").is_some());
        l.forget_node(NodeId::from_u128(9));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn only_completed_jobs_with_timings_are_observations() {
        let mut job = JobRecord {
            key: None,
            resumed: Vec::new(),
            waited: None,
            id: pair_core::JobId::from_uuid(Default::default()),
            model: "m".into(),
            flavor: pair_core::ApiFlavor::Ollama,
            route: "/api/chat".into(),
            streaming: true,
            origin: NodeId::from_u128(1),
            ran_on: Some(NodeId::from_u128(2)),
            attempts: 1,
            status: JobStatus::Completed,
            http_status: Some(200),
            created_at_ms: 0,
            ttft_ms: Some(100),
            duration_ms: Some(1000),
            prompt_tokens: Some(500),
            output_tokens: Some(90),
            error: None,
            recorded_by: None,
            engine: None,
            cached_tokens: None,
        };
        let o = Observation::from_job(&job).unwrap();
        assert_eq!(o.node, NodeId::from_u128(2));
        assert_eq!(o.output_tokens, 90);
        assert_eq!((o.ttft_ms, o.duration_ms), (100, 1000));
        // The engine's own durations, when it gave both, replace the
        // node's clock (which counted 60 ms of queueing here).
        job.engine = Some(EngineTiming {
            prompt_ms: Some(40),
            decode_ms: Some(900),
        });
        let o = Observation::from_job(&job).unwrap();
        assert_eq!((o.ttft_ms, o.duration_ms), (40, 940));
        job.engine = Some(EngineTiming {
            prompt_ms: None,
            decode_ms: Some(900),
        });
        assert_eq!(Observation::from_job(&job).unwrap().ttft_ms, 100);
        // A whole answer timed only by the node (a translated one, say):
        // its first byte came with its last, which the observation says.
        job.engine = None;
        job.streaming = false;
        assert!(Observation::from_job(&job).unwrap().whole);
        job.engine = Some(EngineTiming {
            prompt_ms: Some(40),
            decode_ms: Some(900),
        });
        assert_eq!(Observation::from_job(&job).unwrap().ttft_ms, 40);
        // A prompt mostly found in the engine's cache was prefilled only in
        // its uncached part.
        assert_eq!(Observation::from_job(&job).unwrap().prompt_tokens, 500);
        job.cached_tokens = Some(440);
        assert_eq!(Observation::from_job(&job).unwrap().prompt_tokens, 60);
        job.status = JobStatus::Failed;
        assert!(Observation::from_job(&job).is_none());
    }
}
