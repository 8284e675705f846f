//! Answer lengths learned per model and client shape: what a request is
//! expected to generate, from what the same kind of request generated
//! before, rather than its `max_tokens` (Claude Code asks for 32,000 and
//! answers a few hundred).
//!
//! A client's shape is its API flavour, whether it streams, whether it
//! offers tools, and the order of magnitude of its limit: a classifier
//! capped at 16 tokens and an agent capped at 32k are told apart without
//! any client naming itself. Each (model, shape) keeps a decayed histogram
//! of lengths in powers of two and a decayed mean, so it follows a client
//! whose answers change and forgets old ones; at most [`MAX_SHAPES`] are
//! kept, the least recently taught going first.

use pair_core::RequestProfile;

/// (model, client shape) pairs kept; the least recently taught is
/// forgotten first.
pub const MAX_SHAPES: usize = 256;

/// Each answer weighs `1 - DECAY` of what was learned before it: about
/// the last 32 answers count.
const DECAY: f32 = 31.0 / 32.0;

/// Histogram buckets: bucket `b > 0` holds lengths in `[2^(b-1), 2^b)`,
/// bucket 0 holds 0; the last holds everything above.
const BUCKETS: usize = 18;

/// The quantile [`Expected::tail`] reads.
const TAIL_QUANTILE: f32 = 0.9;

/// The model and client shape an answer length is learned under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AnswerKey(u64);

impl AnswerKey {
    /// The key of `request`: its model's name, API flavour, streaming,
    /// tools, and the bit length of its limit (FNV-1a, stable across
    /// processes).
    pub fn of(request: &RequestProfile) -> Self {
        let limit_class = 32 - request.max_output_tokens.leading_zeros();
        let shape = [
            request.flavor as u8,
            u8::from(request.streaming),
            u8::from(request.tools),
            limit_class as u8,
        ];
        let h = request
            .model
            .bytes()
            .chain([0xFF])
            .chain(shape)
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
            });
        Self(h)
    }
}

/// A predicted answer length, within the request's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expected {
    /// The mean: what the request is priced at.
    pub mean: u32,
    /// The 90th percentile: a long answer of this kind.
    pub tail: u32,
    /// Whether it was learned (`false`: the prior, the default length).
    pub learned: bool,
}

#[derive(Clone, Debug)]
struct Shape {
    key: AnswerKey,
    /// When it was last taught, in [`AnswerLengths::clock`] ticks.
    taught: u64,
    /// Decayed count of answers, and of their tokens.
    weight: f32,
    tokens: f32,
    hist: [f32; BUCKETS],
}

impl Shape {
    fn new(key: AnswerKey) -> Self {
        Self {
            key,
            taught: 0,
            weight: 0.0,
            tokens: 0.0,
            hist: [0.0; BUCKETS],
        }
    }

    fn learn(&mut self, tokens: u32) {
        self.weight = self.weight * DECAY + 1.0;
        self.tokens = self.tokens * DECAY + tokens as f32;
        for h in &mut self.hist {
            *h *= DECAY;
        }
        self.hist[bucket(tokens)] += 1.0;
    }

    fn mean(&self) -> f32 {
        self.tokens / self.weight
    }

    /// The `q` quantile, read off the histogram (geometrically within a
    /// bucket).
    fn quantile(&self, q: f32) -> f32 {
        let target = q * self.hist.iter().sum::<f32>();
        let mut below = 0.0;
        for (b, &w) in self.hist.iter().enumerate() {
            if w > 0.0 && below + w >= target {
                if b == 0 {
                    return 0.0;
                }
                let lo = (1u64 << (b - 1)) as f32;
                let within = ((target - below) / w).clamp(0.0, 1.0);
                return lo * 2f32.powf(within);
            }
            below += w;
        }
        self.mean()
    }
}

/// The histogram bucket of a length.
fn bucket(tokens: u32) -> usize {
    ((32 - tokens.leading_zeros()) as usize).min(BUCKETS - 1)
}

/// Answer lengths, per (model, client shape). Plain data: no clock, no
/// I/O; memory stays within [`MAX_SHAPES`] shapes of fixed size.
#[derive(Clone, Debug, Default)]
pub struct AnswerLengths {
    /// Sorted by key.
    shapes: Vec<Shape>,
    clock: u64,
}

impl AnswerLengths {
    pub fn new() -> Self {
        Self::default()
    }

    /// Shapes learned.
    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// Learns that a request of `key` generated `tokens`.
    pub fn learn(&mut self, key: AnswerKey, tokens: u32) {
        self.clock += 1;
        let i = match self.shapes.binary_search_by_key(&key, |s| s.key) {
            Ok(i) => i,
            Err(_) => {
                if self.shapes.len() >= MAX_SHAPES
                    && let Some(stalest) =
                        (0..self.shapes.len()).min_by_key(|&i| self.shapes[i].taught)
                {
                    self.shapes.remove(stalest);
                }
                let i = self.shapes.partition_point(|s| s.key < key);
                self.shapes.insert(i, Shape::new(key));
                i
            }
        };
        let s = &mut self.shapes[i];
        s.taught = self.clock;
        s.learn(tokens);
    }

    /// The expected answer of `request`: learned for its model and shape,
    /// otherwise [`RequestProfile::DEFAULT_OUTPUT_TOKENS`]; never above
    /// its limit.
    pub fn expect(&self, request: &RequestProfile) -> Expected {
        let limit = request.max_output_tokens;
        let cap = |t: f32| (t.round() as u32).min(limit);
        match self
            .shapes
            .binary_search_by_key(&AnswerKey::of(request), |s| s.key)
        {
            Ok(i) => {
                let s = &self.shapes[i];
                Expected {
                    mean: cap(s.mean()),
                    tail: cap(s.quantile(TAIL_QUANTILE).max(s.mean())),
                    learned: true,
                }
            }
            Err(_) => {
                let prior = RequestProfile::DEFAULT_OUTPUT_TOKENS.min(limit);
                Expected {
                    mean: prior,
                    tail: prior,
                    learned: false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::ApiFlavor;

    fn req(model: &str, max: u32) -> RequestProfile {
        let mut r = RequestProfile::new(model, ApiFlavor::OpenAi);
        r.max_output_tokens = max;
        r
    }

    #[test]
    fn learns_the_length_of_a_shape_not_its_limit() {
        let mut a = AnswerLengths::new();
        let agent = {
            let mut r = req("m", 32_000);
            r.streaming = true;
            r.tools = true;
            r
        };
        assert_eq!(a.expect(&agent).mean, 256, "the prior");
        for t in [200, 300, 250, 350, 150] {
            a.learn(AnswerKey::of(&agent), t);
        }
        let e = a.expect(&agent);
        assert!(e.learned);
        assert!((240..=260).contains(&e.mean), "{e:?}");
        assert!(e.tail >= e.mean && e.tail <= 512, "{e:?}");
        // Another shape of the same model is not taught by it.
        assert!(!a.expect(&req("m", 32_000)).learned);
        // Nor is the same client with a limit of another magnitude.
        let mut short = agent.clone();
        short.max_output_tokens = 16;
        assert_eq!(a.expect(&short).mean, 16, "the prior, within the limit");
    }

    #[test]
    fn follows_a_client_whose_answers_change() {
        let mut a = AnswerLengths::new();
        let r = req("m", 4_096);
        let k = AnswerKey::of(&r);
        for _ in 0..100 {
            a.learn(k, 2_000);
        }
        // About the last 32 answers count: after 200, the old ones hardly.
        for _ in 0..200 {
            a.learn(k, 40);
        }
        let e = a.expect(&r);
        assert!(e.mean < 60, "{e:?}");
        assert!(e.tail < 80, "{e:?}");
    }

    #[test]
    fn the_stalest_shape_goes_first() {
        let mut a = AnswerLengths::new();
        for m in 0..=MAX_SHAPES {
            a.learn(AnswerKey::of(&req(&format!("m{m}"), 100)), 10);
        }
        assert_eq!(a.len(), MAX_SHAPES);
        assert!(!a.expect(&req("m0", 100)).learned);
        assert!(a.expect(&req(&format!("m{MAX_SHAPES}"), 100)).learned);
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!((bucket(2), bucket(3)), (2, 2));
        assert_eq!(bucket(u32::MAX), BUCKETS - 1);
    }
}
