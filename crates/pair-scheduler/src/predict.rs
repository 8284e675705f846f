//! The latency model behind `predicted-latency`: how long this client would
//! wait on a given node, from running totals only (no queue is walked).
//!
//! Slot-aware: work queued ahead is spread over the node's parallel slots,
//! and a request that finds a free slot starts at once but shares the engine
//! with what is already running. Every term is non-decreasing in the work
//! ahead, so more pending work never makes a node look faster.
//!
//! Stale-view aware: a peer's workload is as old as its last report, and
//! other routers may have sent it requests since. Those unseen arrivals are
//! a risk to price, not an average to ignore: when every router sees the
//! same free slot, they all send there and all but the first wait. See
//! [`unseen_arrivals_ms`].

use pair_core::{Liveness, ModelEntry, ModelPerf, NodeSnapshot, RequestProfile, Workload};

use crate::ranking::{Metric, Prediction, RateSource};
use crate::reservations::Reserved;

/// Output tokens assumed per job ahead when a report counts jobs but not
/// tokens (PAIR-style reports), so jobs without token estimates still weigh.
pub const MIN_DECODE_TOKENS_PER_JOB: u64 = 32;

/// Slowest rate believed, tokens/s: guards against zero or garbage figures.
const MIN_TPS: f64 = 0.1;

/// The answer length (tokens) the node is taken to turn over when the rate
/// of unseen arrivals is estimated: the length assumed for a request that
/// declares none.
const NOMINAL_ANSWER_TOKENS: f64 = RequestProfile::DEFAULT_OUTPUT_TOKENS as f64;

/// Views older than this are priced as this old (peers' clocks may be
/// skewed; a node silent for longer turns suspect anyway).
pub const MAX_VIEW_AGE_MS: u64 = 5_000;

/// The batching exponent assumed where none was learned: `k` streams
/// decode k^0.7 times one stream's tokens (llama.cpp on an RTX 3090: 1.0 /
/// 1.8 / 3.0 / 3.7x at 1/2/4/8 streams; k^0.7 gives 1.0 / 1.6 / 2.6 / 4.3).
pub const DEFAULT_BATCH_EXPONENT: f32 = 0.7;

/// Exponents are tabulated in steps of 1 / EXPONENT_STEPS over [0, 1].
const EXPONENT_STEPS: usize = 20;
/// Stream counts tabulated (0..=32); `powf` beyond.
const TABULATED_STREAMS: usize = 33;

/// `k^e` for every tabulated exponent and stream count: `powf` is the
/// costliest step of a prediction otherwise.
static SPEEDUP: std::sync::LazyLock<[[f64; TABULATED_STREAMS]; EXPONENT_STEPS + 1]> =
    std::sync::LazyLock::new(|| {
        let mut t = [[1.0; TABULATED_STREAMS]; EXPONENT_STEPS + 1];
        for (q, row) in t.iter_mut().enumerate() {
            let e = q as f64 / EXPONENT_STEPS as f64;
            for (k, v) in row.iter_mut().enumerate().skip(1) {
                *v = (k as f64).powf(e);
            }
        }
        t
    });

/// How `k` streams decoding together compare with one, on an engine whose
/// batching exponent is `exponent` (a learned figure, clamped into [0, 1]
/// and rounded to 0.05; `None`: the default): looked up once per
/// prediction.
#[derive(Clone, Copy)]
struct Batching {
    row: &'static [f64; TABULATED_STREAMS],
    exponent: f64,
}

impl Batching {
    fn of(exponent: Option<f32>) -> Self {
        let e = exponent
            .filter(|e| e.is_finite())
            .unwrap_or(DEFAULT_BATCH_EXPONENT)
            .clamp(0.0, 1.0);
        // Adding a half and truncating rounds without a libm call.
        let q = ((e * EXPONENT_STEPS as f32) + 0.5) as usize;
        Self {
            row: &SPEEDUP[q.min(EXPONENT_STEPS)],
            exponent: q as f64 / EXPONENT_STEPS as f64,
        }
    }

    /// Throughput of `k` streams together, in units of one stream.
    fn speedup(self, k: u32) -> f64 {
        match self.row.get(k as usize) {
            Some(s) => *s,
            None => f64::from(k).powf(self.exponent),
        }
    }
}

/// Milliseconds, rounded, saturating (NaN cannot occur: rates are clamped).
fn ms(x: f64) -> u32 {
    // `as` saturates on overflow, which is what a latency estimate wants;
    // adding a half and truncating rounds without a libm call.
    (x.max(0.0) + 0.5) as u32
}

fn rate(x: f32, fallback: f32) -> f64 {
    let x = if x.is_finite() { x } else { fallback };
    f64::from(x).max(MIN_TPS)
}

/// The speed figures used for `entry` on `node`, and where they came from.
pub fn rates_for(node: &NodeSnapshot, entry: &ModelEntry) -> (ModelPerf, RateSource) {
    match (entry.perf, node.base_perf) {
        (Some(p), _) => (p, RateSource::Model),
        (None, Some(p)) => (p, RateSource::Node),
        (None, None) => match crate::prior::from_hardware(&node.gpus, entry.size_bytes) {
            Some(p) => (p, RateSource::Hardware),
            None => (ModelPerf::FALLBACK, RateSource::Fallback),
        },
    }
}

/// Whether the model can be brought into free VRAM. A loaded model already
/// sits in VRAM; without a size or GPU figures nothing can be said.
pub fn fits_vram(node: &NodeSnapshot, entry: &ModelEntry) -> bool {
    if entry.loaded {
        return true;
    }
    match (entry.size_bytes, node.vram_free_bytes()) {
        (Some(size), Some(free)) => size <= free,
        _ => true,
    }
}

/// Expected wait (ms) for requests that other routers sent to a node in
/// the `age_ms` since its workload was seen, when that view showed
/// `jobs_ahead` jobs on `slots` slots.
///
/// The rule: unseen arrivals come at the rate the node turns over nominal
/// answers while it runs `jobs_ahead` streams (in a steady state, what
/// arrives is what leaves), as a Poisson count `A` with mean `mu`. With `c`
/// slots still free after this request's own, every arrival past `c`
/// waits a nominal answer's slot time ahead of it: `E[(A - c)+]` of them.
/// On a node seen full, arrivals queue ahead in the mean (`mu` of them).
/// Departures since the view are not subtracted: a view's age is a risk to
/// price, not a reason for optimism. An idle view (no jobs) or a view read
/// live (`age_ms` 0) carries no risk.
///
/// Non-decreasing in `jobs_ahead` (fewer free slots, faster turnover) and
/// in `age_ms`; independent of the tokens ahead.
pub fn unseen_arrivals_ms(
    jobs_ahead: u32,
    slots: u32,
    age_ms: u64,
    decode_tps: f64,
    overhead_ms: f64,
    batch_exponent: Option<f32>,
) -> f64 {
    unseen_arrivals(
        jobs_ahead,
        slots,
        age_ms,
        decode_tps,
        overhead_ms,
        Batching::of(batch_exponent),
    )
}

/// [`unseen_arrivals_ms`] with the batching row already looked up.
fn unseen_arrivals(
    jobs_ahead: u32,
    slots: u32,
    age_ms: u64,
    decode_tps: f64,
    overhead_ms: f64,
    batching: Batching,
) -> f64 {
    if jobs_ahead == 0 || age_ms == 0 {
        return 0.0;
    }
    let streams = jobs_ahead.min(slots);
    let per_s = decode_tps * batching.speedup(streams) / NOMINAL_ANSWER_TOKENS;
    let mu = per_s * age_ms.min(MAX_VIEW_AGE_MS) as f64 / 1000.0;
    let slot_ms =
        NOMINAL_ANSWER_TOKENS * 1000.0 / (decode_tps * batching.speedup(slots)) + overhead_ms;
    let expected = match slots.checked_sub(jobs_ahead + 1) {
        // E[(A - c)+] = mu - c + sum over k < c of (c - k) P(A = k).
        Some(c) if c > 0 => {
            let (mut pk, mut below) = ((-mu).exp(), 0.0);
            for k in 0..c {
                below += f64::from(c - k) * pk;
                pk *= mu / f64::from(k + 1);
            }
            (mu - f64::from(c) + below).max(0.0)
        }
        // The last free slot, or none: every arrival counts.
        _ => mu,
    };
    expected * slot_ms
}

/// Predicts what `request` would feel on `node`, served by `entry`, with
/// `workload` running or queued there (usually `node.workload`, the
/// reported one) and `reserved` work dispatched there on top of it;
/// `age_ms` is how long ago `workload` was seen (0: read live), which
/// prices the requests other routers may have sent since
/// ([`unseen_arrivals_ms`]). The whole prompt is priced as prefill; see
/// [`predict_cached`] for a node that holds part of it.
pub fn predict(
    node: &NodeSnapshot,
    workload: &Workload,
    entry: &ModelEntry,
    request: &RequestProfile,
    reserved: Reserved,
    age_ms: u64,
) -> Prediction {
    predict_cached(node, workload, entry, request, reserved, age_ms, 0)
}

/// [`predict`] for a node believed to hold `cached_tokens` of the prompt
/// in its KV cache (from [`crate::PrefixIndex::cached_tokens`]): only the
/// rest is prefilled. Staying and moving are priced alike this way: a
/// conversation's next turn costs its new tokens where it ran, and its
/// whole context anywhere else. More cached never predicts slower.
pub fn predict_cached(
    node: &NodeSnapshot,
    workload: &Workload,
    entry: &ModelEntry,
    request: &RequestProfile,
    reserved: Reserved,
    age_ms: u64,
    cached_tokens: u32,
) -> Prediction {
    let (perf, rates) = rates_for(node, entry);
    let fb = ModelPerf::FALLBACK;
    let prefill_tps = rate(perf.prefill_tps, fb.prefill_tps);
    let decode_tps = rate(perf.decode_tps, fb.decode_tps);
    let overhead = f64::from(perf.overhead_ms);
    let batching = Batching::of(perf.batch_exponent);

    let slots = node.slots();
    let w = workload;
    let jobs_ahead = w.pending().saturating_add(reserved.jobs);
    let prefill_ahead = w.prefill_tokens.saturating_add(reserved.prefill_tokens);
    let decode_ahead = w
        .decode_tokens
        .saturating_add(reserved.decode_tokens)
        .max(u64::from(jobs_ahead) * MIN_DECODE_TOKENS_PER_JOB);

    // Waiting for a slot: none if one is free. Otherwise the request starts
    // once (jobs_ahead - slots + 1) of the jobs ahead have finished; take that
    // share of the work ahead, processed at the node's aggregate rate.
    let queue_ms = if jobs_ahead < slots {
        0.0
    } else {
        let work_ms = prefill_ahead as f64 * 1000.0 / prefill_tps
            + decode_ahead as f64 * 1000.0 / (decode_tps * batching.speedup(slots))
            + f64::from(jobs_ahead) * overhead;
        let share = f64::from(jobs_ahead - slots + 1) / f64::from(jobs_ahead);
        work_ms * share
    } + unseen_arrivals(
        // Other routers' arrivals follow the traffic the view showed: this
        // router's own reservations are its own, not a sign of others'.
        w.pending(),
        slots.saturating_sub(reserved.jobs).max(1),
        age_ms,
        decode_tps,
        overhead,
        batching,
    );

    // Prefill is compute-bound: prompts prefilling together share the
    // engine (each of n at 1/n of its speed), while decoding streams add a
    // token each per step and barely slow it. A prompt of p tokens is
    // delayed by min(r, p) for each prompt ahead with r tokens left; with
    // only running totals known, by at most p per job ahead and never more
    // than the prompt tokens ahead.
    // The prompt's size is an estimate from its bytes, the cached count
    // whole blocks of the same estimate: never more cached than the prompt.
    let cached_tokens = cached_tokens.min(request.prompt_tokens);
    let prompt = f64::from(request.prompt_tokens - cached_tokens);
    let contention = (prefill_ahead as f64).min(prompt * f64::from(jobs_ahead));
    let prefill_ms = (prompt + contention) * 1000.0 / prefill_tps;
    // Once decoding, the request shares the engine with the other streams
    // in flight; each of `active` streams gets speedup(active)/active of one.
    let active = jobs_ahead.min(slots - 1) + 1;
    let sharing = f64::from(active) / batching.speedup(active);
    let metric = if request.wants_whole_answer() {
        Metric::WholeAnswer
    } else {
        Metric::FirstToken
    };
    let answer_ms = f64::from(request.answer_tokens()) * 1000.0 / decode_tps * sharing;
    let decode_ms = match metric {
        Metric::FirstToken => 0.0,
        Metric::WholeAnswer => answer_ms,
    };
    let load_ms = if entry.loaded { 0 } else { perf.load_ms };
    let rtt_ms = node.rtt_us.div_ceil(1000);

    let mut p = Prediction {
        metric,
        total_ms: 0,
        queue_ms: ms(queue_ms),
        prefill_ms: ms(prefill_ms),
        cached_tokens,
        decode_ms: ms(decode_ms),
        answer_ms: ms(answer_ms),
        overhead_ms: perf.overhead_ms,
        load_ms,
        rtt_ms,
        jobs_ahead,
        slots,
        fits_vram: fits_vram(node, entry),
        suspect: node.liveness == Liveness::Suspect,
        // The engine's, which the caller knows (the matcher found it).
        silent: false,
        rates,
        learned: entry.learned && rates == RateSource::Model,
    };
    p.total_ms = [
        p.queue_ms,
        p.prefill_ms,
        p.decode_ms,
        p.overhead_ms,
        p.load_ms,
        p.rtt_ms,
    ]
    .into_iter()
    .fold(0u32, u32::saturating_add);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn speedup(k: u32) -> f64 {
        Batching::of(None).speedup(k)
    }

    #[test]
    fn speedup_table_is_k_to_the_0_7_and_increasing() {
        let mut last = 0.0;
        for k in 1..100u32 {
            let s = speedup(k);
            assert!((s - f64::from(k).powf(0.7)).abs() < 1e-9, "{k}");
            assert!(s > last);
            assert!(f64::from(k) / s >= f64::from(k - 1) / speedup(k - 1));
            last = s;
        }
    }

    use pair_core::{
        ApiFlavor, EngineKind, EngineSnapshot, GpuDevice, ModelName, NodeId, Workload,
    };

    fn node(slots: u16, perf: ModelPerf, loaded: bool) -> NodeSnapshot {
        let mut n = NodeSnapshot::new(NodeId::from_u128(1), "n");
        n.engines.push(EngineSnapshot {
            kind: EngineKind::Ollama,
            healthy: true,
            silent: false,
            continues_chat: None,
            slots,
            models: vec![ModelEntry {
                name: ModelName::new("m").unwrap(),
                size_bytes: Some(5_000_000_000),
                loaded,
                perf: Some(perf),
                learned: false,
            }],
        });
        n
    }

    fn req(streaming: bool, prompt: u32, out: u32) -> RequestProfile {
        let mut r = RequestProfile::new("m", ApiFlavor::Ollama);
        r.streaming = streaming;
        r.prompt_tokens = prompt;
        r.max_output_tokens = out;
        r
    }

    const GPU: ModelPerf = ModelPerf {
        prefill_tps: 4_000.0,
        decode_tps: 100.0,
        load_ms: 2_000,
        overhead_ms: 20,
        batch_exponent: None,
    };

    fn one(n: &NodeSnapshot, r: &RequestProfile) -> Prediction {
        predict(
            n,
            &n.workload,
            &n.engines[0].models[0],
            r,
            Reserved::default(),
            0,
        )
    }

    #[test]
    fn idle_warm_streaming_is_prefill_plus_overhead_plus_rtt() {
        let mut n = node(1, GPU, true);
        n.rtt_us = 1_500;
        let p = one(&n, &req(true, 400, 100));
        assert_eq!(p.metric, Metric::FirstToken);
        assert_eq!(
            (p.queue_ms, p.prefill_ms, p.decode_ms, p.load_ms),
            (0, 100, 0, 0)
        );
        assert_eq!(p.rtt_ms, 2);
        assert_eq!(p.total_ms, 100 + 20 + 2);
        assert_eq!(
            p.to_string(),
            "predicted ttft 122ms = queue 0 + prefill 100 + overhead 20 + load 0 + rtt 2 \
             [0 ahead on 1 slot; model rates]"
        );
    }

    #[test]
    fn whole_answer_adds_decode_and_exceeds_first_token() {
        let n = node(1, GPU, true);
        let s = one(&n, &req(true, 400, 100));
        let w = one(&n, &req(false, 400, 100));
        assert_eq!(w.metric, Metric::WholeAnswer);
        assert_eq!(w.decode_ms, 1_000);
        assert_eq!(w.total_ms, s.total_ms + 1_000);
        assert!(w.to_string().contains("+ decode 1000"));
    }

    #[test]
    fn queued_work_on_a_single_slot_is_waited_for_in_full() {
        let mut n = node(1, GPU, true);
        n.workload = Workload {
            running: 1,
            queued: 0,
            prefill_tokens: 0,
            decode_tokens: 200,
        };
        let p = one(&n, &req(true, 0, 0));
        assert_eq!(p.queue_ms, 2_000 + 20);
    }

    #[test]
    fn jobs_without_token_estimates_still_weigh() {
        let mut n = node(1, GPU, true);
        n.workload.queued = 2;
        let p = one(&n, &req(true, 0, 0));
        assert!(p.queue_ms >= 2 * 32 * 10, "{p}");
    }

    #[test]
    fn cold_adds_load_and_vram_fit_is_judged_only_when_cold() {
        let mut n = node(1, GPU, false);
        n.gpus.push(GpuDevice {
            index: 0,
            name: "g".into(),
            utilisation_pct: 0,
            vram_used_bytes: 20_000_000_000,
            vram_total_bytes: 24_000_000_000,
        });
        let p = one(&n, &req(true, 0, 0));
        assert_eq!(p.load_ms, 2_000);
        assert!(!p.fits_vram);
        assert!(p.to_string().contains("does not fit"));
        n.engines[0].models[0].loaded = true;
        let p = one(&n, &req(true, 0, 0));
        assert_eq!(p.load_ms, 0);
        assert!(p.fits_vram);
    }

    #[test]
    fn garbage_rates_are_clamped_not_propagated() {
        let bad = ModelPerf {
            prefill_tps: f32::NAN,
            decode_tps: 0.0,
            load_ms: 0,
            overhead_ms: 0,
            batch_exponent: None,
        };
        let p = one(&node(1, bad, true), &req(false, 100, 10));
        assert_eq!(p.prefill_ms, 100);
        assert_eq!(p.decode_ms, 100_000);
    }

    #[test]
    fn a_view_read_live_or_idle_carries_no_unseen_arrivals() {
        assert_eq!(unseen_arrivals_ms(3, 4, 0, 50.0, 20.0, None), 0.0);
        assert_eq!(unseen_arrivals_ms(0, 4, 900, 50.0, 20.0, None), 0.0);
        let mut n = node(4, GPU, true);
        n.workload.running = 3;
        let live = one(&n, &req(true, 400, 100));
        let seen = |age| {
            predict(
                &n,
                &n.workload,
                &n.engines[0].models[0],
                &req(true, 400, 100),
                Reserved::default(),
                age,
            )
        };
        assert_eq!(live.queue_ms, 0);
        assert_eq!(seen(0), live);
        assert!(seen(800).queue_ms > 0, "{}", seen(800));
        assert_eq!(seen(800).total_ms - live.total_ms, seen(800).queue_ms);
    }

    #[test]
    fn the_last_free_slot_seen_long_ago_is_a_risk_and_more_free_slots_are_safer() {
        // 100 tokens/s and 4 slots: a nominal 256-token answer's slot time
        // is 256 / (100 * 4^0.7) s + 20 ms overhead = 990 ms.
        let slot_ms = 256_000.0 / (100.0 * speedup(4)) + 20.0;
        let risk = |jobs, age| unseen_arrivals_ms(jobs, 4, age, 100.0, 20.0, None);
        // Seen full: arrivals queue ahead in the mean, mu of them, and mu
        // is the view's age times the rate of turning over nominal answers.
        let mu = 100.0 * speedup(4) / 256.0 * 0.5;
        assert!((risk(4, 500) - mu * slot_ms).abs() < 1e-6);
        assert!((risk(9, 500) - risk(4, 500)).abs() < 1e-9);
        // One free slot: every arrival waits (E[A] = mu, at three streams).
        let mu3 = 100.0 * speedup(3) / 256.0 * 0.5;
        assert!((risk(3, 500) - mu3 * slot_ms).abs() < 1e-6);
        // Two free slots: only arrivals past the first: E[(A - 1)+].
        let mu2 = 100.0 * speedup(2) / 256.0 * 0.5;
        let e = mu2 - 1.0 + (-mu2).exp();
        assert!((risk(2, 500) - e * slot_ms).abs() < 1e-6);
        assert!(risk(1, 500) < risk(2, 500) && risk(2, 500) < risk(3, 500));
        assert!(risk(3, 500) < risk(3, 1_000));
        // Ages past the cap are priced at the cap.
        assert_eq!(risk(3, MAX_VIEW_AGE_MS), risk(3, 60 * MAX_VIEW_AGE_MS));
    }

    #[test]
    fn a_learned_batching_exponent_sets_how_streams_share_the_engine() {
        let mut n = node(4, GPU, true);
        n.workload.running = 2;
        let mut shared = |e: Option<f32>| {
            n.engines[0].models[0].perf = Some(ModelPerf {
                batch_exponent: e,
                ..GPU
            });
            one(&n, &req(false, 400, 100)).decode_ms
        };
        // 100 tokens at 100/s alone: 1 s. Three streams on an engine that
        // takes them in turn (e = 0): 3 s; batched for free (e = 1): 1 s;
        // the default k^0.7: 3^0.3 s.
        assert_eq!(shared(Some(0.0)), 3_000);
        assert_eq!(shared(Some(1.0)), 1_000);
        assert_eq!(shared(None), 1_390);
        assert_eq!(shared(Some(0.7)), 1_390);
        // Out of range or garbage: clamped, or the default.
        assert_eq!(shared(Some(-3.0)), 3_000);
        assert_eq!(shared(Some(7.0)), 1_000);
        assert_eq!(shared(Some(f32::NAN)), 1_390);
    }

    /// Prompts still prefilling share the engine with a new one; streams
    /// that only decode do not slow it.
    #[test]
    fn prompts_prefilling_ahead_delay_a_prefill_and_decoding_streams_do_not() {
        let mut n = node(4, GPU, true);
        n.workload.running = 2;
        n.workload.decode_tokens = 400;
        // 400 tokens at 4,000/s: 100 ms, however many streams decode.
        assert_eq!(one(&n, &req(true, 400, 100)).prefill_ms, 100);
        // A long prompt ahead costs at most as many tokens as this one.
        n.workload.prefill_tokens = 10_000;
        assert_eq!(one(&n, &req(true, 400, 100)).prefill_ms, 300);
        // A short one ahead costs what is left of it.
        n.workload.prefill_tokens = 200;
        assert_eq!(one(&n, &req(true, 400, 100)).prefill_ms, 150);
        // More prompt ahead never makes the node look faster.
        let mut last = 0;
        for ahead in (0..20_000).step_by(500) {
            n.workload.prefill_tokens = ahead;
            let p = one(&n, &req(true, 400, 100)).total_ms;
            assert!(p >= last, "{ahead}: {p} < {last}");
            last = p;
        }
    }
}
