//! Deterministic content for emulated answers: generated words, embedding
//! vectors, digests and timestamps. Same seed and request, same bytes.

use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// Words the emulated model "generates". Each token is one word plus a space.
const WORDS: [&str; 64] = [
    "the", "a", "model", "cluster", "node", "token", "fast", "quiet", "river", "stone", "light",
    "answer", "pair", "route", "engine", "slot", "queue", "warm", "cold", "memory", "prompt",
    "stream", "peer", "latency", "gentle", "bright", "north", "south", "ember", "cloud", "signal",
    "harbor", "meadow", "copper", "silver", "amber", "orbit", "pulse", "whisper", "lantern",
    "compass", "garden", "thread", "window", "mirror", "candle", "feather", "shadow", "summit",
    "valley", "forest", "ocean", "desert", "canyon", "island", "bridge", "castle", "market",
    "library", "village", "station", "tower", "harvest", "morning",
];

/// A 64-bit seed for one request, from the engine seed and the request text.
pub(crate) fn request_seed(seed: u64, model: &str, prompt: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(model.as_bytes());
    h.update([0]);
    h.update(prompt.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b)
}

/// splitmix64: a tiny deterministic mixer, so token `i` needs no state.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// How long an emulated answer runs when the request does not say
/// (`x-emulator-answer-tokens` overrides both).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerLength {
    /// To the request's limit in full (answer ends "length"), or
    /// `default_max_tokens` without one (ends "stop"): tests that count
    /// tokens.
    Limit,
    /// Ends on its own ("stop") at a length drawn per request from a
    /// log-normal, unless the request's limit cuts it first: an agent's
    /// `max_tokens: 32000` still gets an answer of a few hundred tokens.
    Natural {
        median_tokens: u32,
        /// Spread of the log (1.0: a tenth of answers run past 3.6 × the
        /// median).
        sigma: f64,
        max_tokens: u32,
    },
}

impl AnswerLength {
    /// Median 150 tokens, sigma 1.0, at most 4,096 (E: chat answers are a
    /// few hundred tokens; no measured distribution behind it).
    pub const NATURAL: Self = Self::Natural {
        median_tokens: 150,
        sigma: 1.0,
        max_tokens: 4096,
    };

    /// The natural length of the answer seeded by `seed`; `None` for
    /// [`Self::Limit`]. Same seed, same length.
    pub fn draw(self, seed: u64) -> Option<u32> {
        let Self::Natural {
            median_tokens,
            sigma,
            max_tokens,
        } = self
        else {
            return None;
        };
        // Box-Muller over two uniforms in (0, 1] from the seed.
        let uniform = |salt: u64| ((mix(seed ^ salt) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let z = (-2.0 * uniform(0x5851_F42D_4C95_7F2D).ln()).sqrt()
            * (std::f64::consts::TAU * uniform(0x1405_7B7E_F767_814F)).cos();
        let n = f64::from(median_tokens) * (sigma * z).exp();
        Some((n.round() as u32).clamp(1, max_tokens.max(1)))
    }
}

/// The text of token `i` of a request.
pub(crate) fn token(seed: u64, i: u32) -> String {
    let w = WORDS[(mix(seed ^ u64::from(i).wrapping_mul(0xA24B_AED4_963E_E407)) % 64) as usize];
    if i == 0 {
        let mut s = w.to_owned();
        if let Some(c) = s.get_mut(0..1) {
            c.make_ascii_uppercase();
        }
        s
    } else {
        format!(" {w}")
    }
}

/// The whole answer of `n` tokens.
pub fn generated_text(seed: u64, n: u32) -> String {
    (0..n).map(|i| token(seed, i)).collect()
}

/// How many tokens of the answer seeded by `seed` `text` is, when `text`
/// is exactly its first tokens.
pub(crate) fn answered_tokens(seed: u64, text: &str) -> Option<u32> {
    let mut at = 0usize;
    let mut i = 0u32;
    while at < text.len() {
        let tok = token(seed, i);
        if !text[at..].starts_with(tok.as_str()) {
            return None;
        }
        at += tok.len();
        i += 1;
    }
    Some(i)
}

/// A unit-length embedding of `dims` values.
pub(crate) fn embedding(seed: u64, dims: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..dims as u64)
        .map(|i| {
            ((mix(seed ^ i.wrapping_mul(0x1000_0000_01B3)) >> 11) as f64 / (1u64 << 53) as f64
                * 2.0
                - 1.0) as f32
        })
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::MIN_POSITIVE);
    for x in &mut v {
        *x /= norm;
    }
    v
}

/// Prompt tokens for a text: about four characters a token, as BPE
/// tokenisers average on English.
pub(crate) fn count_tokens(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4))
        .unwrap_or(u32::MAX)
        .max(1)
}

/// A stable sha256 digest (hex) for a model name, like Ollama's digests.
pub(crate) fn digest(name: &str) -> String {
    hex::encode(Sha256::digest(name.as_bytes()))
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// RFC 3339 UTC time with nanoseconds, as Ollama writes `created_at`.
pub(crate) fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_nanos())
}

pub(crate) fn rfc3339(secs: u64, nanos: u32) -> String {
    pair_core::rfc3339(secs, nanos)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn natural_lengths_are_deterministic_and_centred_on_the_median() {
        assert_eq!(AnswerLength::Limit.draw(1), None);
        let n = AnswerLength::NATURAL;
        assert_eq!(n.draw(42), n.draw(42));
        let mut lengths: Vec<u32> = (0..2001u64).map(|s| n.draw(mix(s)).unwrap()).collect();
        lengths.sort_unstable();
        let median = lengths[1000];
        assert!((120..=180).contains(&median), "{median}");
        assert!(lengths[0] >= 1 && lengths[2000] <= 4096);
        assert!(lengths[1900] > 500, "a long tail: {}", lengths[1900]);
    }

    #[test]
    fn text_is_deterministic_per_seed_and_request() {
        let a = request_seed(1, "m", "hello");
        assert_eq!(
            generated_text(a, 12),
            generated_text(request_seed(1, "m", "hello"), 12)
        );
        assert_ne!(
            generated_text(a, 12),
            generated_text(request_seed(2, "m", "hello"), 12)
        );
        assert_ne!(
            generated_text(a, 12),
            generated_text(request_seed(1, "m", "hullo"), 12)
        );
        assert_eq!(generated_text(a, 5).split(' ').count(), 5);
        assert!(
            generated_text(a, 1)
                .chars()
                .next()
                .unwrap()
                .is_ascii_uppercase()
        );
    }

    #[test]
    fn an_answer_s_start_is_counted_in_tokens() {
        let seed = request_seed(1, "m", "hello");
        let text = generated_text(seed, 9);
        assert_eq!(answered_tokens(seed, &text), Some(9));
        assert_eq!(answered_tokens(seed, ""), Some(0));
        assert_eq!(answered_tokens(seed, &format!("{text}x")), None);
        assert_eq!(answered_tokens(seed, &text[..text.len() - 1]), None);
    }

    #[test]
    fn embeddings_are_unit_vectors() {
        let v = embedding(9, 64);
        let n: f32 = v.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-4);
        assert_eq!(v, embedding(9, 64));
    }

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(1_709_251_200, 5), "2024-03-01T00:00:00.000000005Z");
        assert_eq!(
            rfc3339(951_782_400 - 1, 0),
            "2000-02-28T23:59:59.000000000Z"
        );
    }
}
