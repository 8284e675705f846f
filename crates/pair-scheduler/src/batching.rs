//! Learns how an engine's decode speed falls as streams are batched, per
//! model, from the requests it ran: each finished request's per-stream
//! decode rate beside the number of streams it shared the engine with.
//!
//! Batched decoding on a GPU is memory-bound: `k` streams together produce
//! about `k^e` times one stream's tokens (llama.cpp on an RTX 3090: e ~0.8
//! up to 4 streams); a CPU gains much less (e ~0.3), and an engine that
//! runs streams in turn gains nothing (e = 0). One stream among `k` then
//! decodes at `solo * k^(e - 1)`, so `ln rate = ln solo + (e - 1) ln k`:
//! a straight line in `ln k`, fitted by exponentially weighted least
//! squares, with a weak prior at [`BatchLearner::PRIOR_EXPONENT`] that holds
//! the slope until the engine has been seen at more than one stream count.
//!
//! A request's stream count is the time-average, over its own decode, of
//! the requests streaming on the same node and model (itself included),
//! taken once the requests that could overlap it have finished. Times are
//! one node's clock: a node learns its own engines and advertises the fit
//! in its report.

use std::collections::{BTreeMap, VecDeque};

use pair_core::{ModelPerf, NodeId};

use crate::learner::LearnedRates;
use crate::slots::Streamed;

/// One finished request on an engine: when it streamed, and how many
/// tokens it generated in how long (the engine's own decode duration when
/// it reports one, else the streaming interval).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub streamed: Streamed,
    pub output_tokens: u32,
    pub decode_ms: u32,
}

/// What was learned for one (node, model).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchFit {
    /// One stream's decode rate, alone on the engine, tokens/s.
    pub decode_tps: f32,
    /// `k` streams decode `k^exponent` times one stream's tokens.
    pub exponent: f32,
    /// Requests the fit was made from.
    pub samples: u32,
    /// Whether the engine has been seen at more than one stream count
    /// (before, the exponent is the prior's).
    pub varied: bool,
}

impl BatchFit {
    /// `perf` with the solo decode rate and the exponent put in.
    pub fn over(&self, perf: ModelPerf) -> ModelPerf {
        ModelPerf {
            decode_tps: self.decode_tps,
            batch_exponent: Some(self.exponent),
            ..perf
        }
    }
}

/// What a node advertises for a model from what its jobs taught:
/// `seed` with the speed learner's `rates` put in, then the batching `fit`'s
/// solo decode rate and exponent; `None` when neither learned anything.
pub fn learned_perf(
    rates: Option<LearnedRates>,
    fit: Option<BatchFit>,
    seed: ModelPerf,
) -> Option<ModelPerf> {
    let rates = rates.map(|r| r.over(seed));
    match fit {
        Some(fit) => Some(fit.over(rates.unwrap_or(seed))),
        None => rates,
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    streamed: Streamed,
    /// ln(per-stream rate); `None`: too short to time, kept for overlaps.
    ln_rate: Option<f64>,
}

/// Exponentially weighted sums of (x = ln streams, y = ln rate).
#[derive(Clone, Copy, Debug, Default)]
struct Fit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    samples: u32,
}

#[derive(Clone, Debug, Default)]
struct Learned {
    /// Recent requests, oldest first: fitted ones kept for the overlaps of
    /// later ones, then the `unfitted` newest.
    recent: VecDeque<Pending>,
    unfitted: usize,
    fit: Fit,
}

/// Batching fits per (node, model).
#[derive(Clone, Debug, Default)]
pub struct BatchLearner {
    table: BTreeMap<(NodeId, String), Learned>,
}

impl BatchLearner {
    /// Requests kept per (node, model) to count overlaps among.
    pub const WINDOW: usize = 48;
    /// A request is fitted once this many newer ones have finished: by then
    /// those that streamed beside it have too.
    pub const SETTLE: usize = 16;
    /// Weight of each new request in the fit.
    pub const ALPHA: f64 = 0.03;
    /// The exponent assumed until the data say otherwise (k^0.7: 1.0 / 1.6
    /// / 2.6 / 4.3 at 1/2/4/8 streams).
    pub const PRIOR_EXPONENT: f64 = 0.7;
    /// The prior's weight, in units of the variance of ln(streams): the
    /// data win once stream counts vary by more than about 7 %.
    pub const PRIOR_WEIGHT: f64 = 0.005;
    /// Shorter decodes say nothing about speed.
    pub const MIN_OUTPUT_TOKENS: u32 = 8;

    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one finished request in; returns whether the fit moved.
    pub fn observe(&mut self, node: NodeId, model: &str, d: Decoded) -> bool {
        let l = self.table.entry((node, model.to_owned())).or_default();
        let rate = (d.output_tokens >= Self::MIN_OUTPUT_TOKENS && d.decode_ms > 0)
            .then(|| f64::from(d.output_tokens - 1) * 1000.0 / f64::from(d.decode_ms))
            .filter(|r| r.is_finite() && *r > 0.0);
        l.recent.push_back(Pending {
            streamed: d.streamed,
            ln_rate: rate.map(f64::ln),
        });
        l.unfitted += 1;
        let mut moved = false;
        while l.unfitted > Self::SETTLE {
            moved |= l.settle_oldest();
        }
        while l.recent.len() > Self::WINDOW {
            l.recent.pop_front();
        }
        moved
    }

    /// The fit for `model` on `node`, once a request has been fitted.
    pub fn fitted(&self, node: NodeId, model: &str) -> Option<BatchFit> {
        let f = self.table.get(&(node, model.to_owned()))?.fit;
        (f.samples > 0).then(|| f.result())
    }
}

impl Learned {
    /// Fits the oldest request not yet fitted against every request kept
    /// (older ones too: they may have streamed beside it).
    fn settle_oldest(&mut self) -> bool {
        let i = self.recent.len() - self.unfitted;
        self.unfitted -= 1;
        let p = self.recent[i];
        let Some(y) = p.ln_rate else {
            return false;
        };
        let k = streams(&self.recent, &p.streamed);
        self.fit.add(k.ln(), y);
        true
    }
}

/// The time-average number of requests streaming during `s`'s stream
/// (itself included): the overlap of each with `s`, over `s`'s length.
fn streams(recent: &VecDeque<Pending>, s: &Streamed) -> f64 {
    let len = s.end_ms.saturating_sub(s.first_token_ms);
    if len == 0 {
        return 1.0;
    }
    let overlap: u64 = recent
        .iter()
        .map(|o| {
            o.streamed
                .end_ms
                .min(s.end_ms)
                .saturating_sub(o.streamed.first_token_ms.max(s.first_token_ms))
        })
        .sum();
    (overlap as f64 / len as f64).max(1.0)
}

impl Fit {
    fn add(&mut self, x: f64, y: f64) {
        let a = BatchLearner::ALPHA;
        let keep = 1.0 - a;
        self.w = keep * self.w + a;
        self.x = keep * self.x + a * x;
        self.y = keep * self.y + a * y;
        self.xx = keep * self.xx + a * x * x;
        self.xy = keep * self.xy + a * x * y;
        self.samples = self.samples.saturating_add(1);
    }

    fn result(&self) -> BatchFit {
        let mx = self.x / self.w;
        let my = self.y / self.w;
        let var = (self.xx / self.w - mx * mx).max(0.0);
        let cov = self.xy / self.w - mx * my;
        let prior = BatchLearner::PRIOR_EXPONENT - 1.0;
        let slope = (cov + BatchLearner::PRIOR_WEIGHT * prior) / (var + BatchLearner::PRIOR_WEIGHT);
        // Aggregate throughput never falls with more streams (e >= 0) and
        // one stream never speeds up because others joined (e <= 1).
        let slope = slope.clamp(-1.0, 0.0);
        let solo = (my - slope * mx).exp();
        BatchFit {
            decode_tps: (solo as f32).clamp(0.05, 1_000_000.0),
            exponent: (1.0 + slope) as f32,
            samples: self.samples,
            varied: var > BatchLearner::PRIOR_WEIGHT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NODE: NodeId = NodeId::from_u128(3);

    /// An engine decoding `solo` tokens/s alone whose `k` streams together
    /// make `k^e` times that: rounds of `k` requests started together, 200
    /// tokens each, one round after another.
    fn engine(l: &mut BatchLearner, solo: f64, e: f64, counts: &[u32]) {
        let mut t = 0u64;
        for &k in counts {
            let per_stream = solo * f64::from(k).powf(e - 1.0);
            let ms = (199.0 * 1000.0 / per_stream).round() as u32;
            for _ in 0..k {
                l.observe(
                    NODE,
                    "m",
                    Decoded {
                        streamed: Streamed {
                            first_token_ms: t,
                            end_ms: t + u64::from(ms),
                        },
                        output_tokens: 200,
                        decode_ms: ms,
                    },
                );
            }
            t += u64::from(ms) + 100;
        }
    }

    #[test]
    fn recovers_the_solo_rate_and_the_exponent_of_a_batching_engine() {
        for (solo, e) in [(48.0, 0.8), (20.0, 0.3), (100.0, 0.0), (60.0, 1.0)] {
            let mut l = BatchLearner::new();
            let counts: Vec<u32> = (0..200).map(|i| [1, 2, 4, 3, 2, 4][i % 6]).collect();
            engine(&mut l, solo, e, &counts);
            let fit = l.fitted(NODE, "m").unwrap();
            assert!(fit.varied, "{fit:?}");
            assert!(
                (f64::from(fit.exponent) - e).abs() < 0.03,
                "{solo} {e}: {fit:?}"
            );
            let got = f64::from(fit.decode_tps);
            assert!((got - solo).abs() / solo < 0.03, "{solo} {e}: {fit:?}");
            let perf = fit.over(ModelPerf::FALLBACK);
            assert_eq!(perf.batch_exponent, Some(fit.exponent));
            assert_eq!(perf.prefill_tps, ModelPerf::FALLBACK.prefill_tps);
        }
    }

    #[test]
    fn one_stream_at_a_time_keeps_the_prior_exponent() {
        let mut l = BatchLearner::new();
        assert_eq!(l.fitted(NODE, "m"), None);
        engine(&mut l, 48.0, 0.8, &[1; 40]);
        let fit = l.fitted(NODE, "m").unwrap();
        assert!(!fit.varied);
        assert!((f64::from(fit.exponent) - BatchLearner::PRIOR_EXPONENT).abs() < 1e-6);
        assert!((f64::from(fit.decode_tps) - 48.0).abs() < 0.5, "{fit:?}");
        // Fitted only once SETTLE newer requests have finished.
        assert_eq!(fit.samples as usize, 40 - BatchLearner::SETTLE);
        assert_eq!(l.fitted(NODE, "other"), None);
    }

    proptest! {
        #[test]
        fn any_requests_leave_a_fit_in_range(
            jobs in prop::collection::vec(
                (0u64..100_000, 0u64..100_000, any::<u32>(), any::<u32>()),
                0..120,
            ),
        ) {
            let mut l = BatchLearner::new();
            for (first, len, out, ms) in jobs {
                l.observe(NODE, "m", Decoded {
                    streamed: Streamed { first_token_ms: first, end_ms: first + len },
                    output_tokens: out,
                    decode_ms: ms,
                });
                if let Some(f) = l.fitted(NODE, "m") {
                    prop_assert!((0.0..=1.0).contains(&f.exponent), "{f:?}");
                    prop_assert!(f.decode_tps.is_finite() && f.decode_tps > 0.0, "{f:?}");
                }
                prop_assert!(l.table.values().all(|x| x.recent.len() <= BatchLearner::WINDOW));
            }
        }
    }
}
