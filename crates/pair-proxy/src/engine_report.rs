//! What an engine says of its own work at the end of an answer: token
//! counts and, where it gives them, how long it took over the prompt and
//! over the answer on its own clock. Ollama's last line carries
//! `prompt_eval_count` / `prompt_eval_duration` / `eval_count` /
//! `eval_duration` (ns); llama.cpp's server its `timings` (`prompt_n`,
//! `prompt_ms`, `predicted_n`, `predicted_ms`); OpenAI-shaped answers their
//! `usage`. Speeds learned from these leave out the time a job queued for
//! a slot, which the node's own clock cannot.
//!
//! What it says of its prompt cache corrects the scheduler's prefix index
//! ([`PromptCache::cached_share`]): llama.cpp's `timings.cache_n`, OpenAI's
//! `usage.prompt_tokens_details.cached_tokens` (vLLM, llama.cpp), and
//! Ollama's `prompt_eval_count`, which counts only the tokens it evaluated.
//!
//! [`read`] is pure; `stream::LastEvent` keeps the last event of an answer
//! as it streams past, to read.

use pair_core::EngineTiming;
use serde::Deserialize;

/// The engine's account of a finished answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub prompt_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    pub timing: Option<EngineTiming>,
    /// What the engine said of its prompt cache, where it said anything.
    pub cache: Option<PromptCache>,
}

/// An engine's account of its prompt cache for one answer, in its own
/// tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptCache {
    /// Prompt tokens taken from its cache; `None` where the engine counts
    /// only what it evaluated (Ollama).
    pub cached: Option<u32>,
    /// Prompt tokens it evaluated.
    pub evaluated: u32,
}

/// Below this share of the prompt's estimated tokens evaluated, an engine
/// that counts only what it evaluated (Ollama) is taken to have found the
/// rest in its cache; above it, the gap is the estimate's error (a body's
/// JSON is more bytes per token than its text), not a cache hit.
const EVALUATED_ONLY_HIT: f64 = 0.5;

impl PromptCache {
    /// The whole prompt and its cached part, in the engine's tokens: as it
    /// counted them, or for an engine that counts only what it evaluated,
    /// the cached part as the share [`PromptCache::cached_share`] finds of
    /// the node's estimate.
    pub fn account(&self, estimated: u32) -> (u32, u32) {
        let cached = self.cached.unwrap_or_else(|| {
            // `as` saturates; the share is in [0, 1].
            (f64::from(estimated) * self.cached_share(estimated) + 0.5) as u32
        });
        (self.evaluated.saturating_add(cached), cached)
    }

    /// The share of the prompt the engine took from its cache, in [0, 1];
    /// `estimated` is the node's estimate of the prompt in tokens (for an
    /// engine that does not say how long the prompt was).
    pub fn cached_share(&self, estimated: u32) -> f64 {
        let evaluated = f64::from(self.evaluated);
        match self.cached {
            Some(cached) => {
                let total = f64::from(cached) + evaluated;
                if total > 0.0 {
                    f64::from(cached) / total
                } else {
                    0.0
                }
            }
            None => {
                let estimated = f64::from(estimated.max(1));
                let share = evaluated / estimated;
                if share < EVALUATED_ONLY_HIT {
                    1.0 - share
                } else {
                    0.0
                }
            }
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Tail {
    // Ollama.
    prompt_eval_count: Option<u64>,
    prompt_eval_duration: Option<u64>,
    eval_count: Option<u64>,
    eval_duration: Option<u64>,
    // OpenAI.
    usage: Option<Usage>,
    // llama.cpp's server.
    timings: Option<Timings>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    // Anthropic's (a translated answer): what was not cached, and what was.
    input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Timings {
    prompt_n: Option<u64>,
    prompt_ms: Option<f64>,
    predicted_n: Option<u64>,
    predicted_ms: Option<f64>,
    cache_n: Option<u64>,
}

fn small(n: u64) -> Option<u32> {
    u32::try_from(n).ok()
}

fn ns_to_ms(ns: u64) -> Option<u32> {
    small(ns / 1_000_000)
}

fn float_ms(ms: f64) -> Option<u32> {
    // `as` saturates; NaN and negatives are not durations.
    (ms.is_finite() && ms >= 0.0).then_some(ms as u32)
}

impl Reported {
    /// What an answer pair translated says that is still the engine's: its
    /// counts, and a cached count it stated (Anthropic's
    /// `cache_read_input_tokens`), not the durations pair made nor a count
    /// of evaluated tokens only (a translated Ollama answer's
    /// `prompt_eval_count` is the engine's whole prompt).
    pub fn counts_only(mut self) -> Self {
        self.timing = None;
        self.cache = self.cache.filter(|c| c.cached.is_some());
        self
    }
}

/// What an answer's last event says of the prompt cache: llama.cpp's
/// server what it reused and evaluated; Ollama what it evaluated; OpenAI's
/// usage the prompt whole and the part cached (only with its details:
/// without them it says nothing of a cache).
fn prompt_cache(
    timings: &Timings,
    usage: &Usage,
    evaluated_only: Option<u64>,
) -> Option<PromptCache> {
    if let (Some(cached), Some(evaluated)) = (timings.cache_n, timings.prompt_n) {
        return Some(PromptCache {
            cached: Some(small(cached)?),
            evaluated: small(evaluated)?,
        });
    }
    if let Some(evaluated) = evaluated_only {
        return Some(PromptCache {
            cached: None,
            evaluated: small(evaluated)?,
        });
    }
    if let (Some(evaluated), Some(cached)) = (usage.input_tokens, usage.cache_read_input_tokens) {
        return Some(PromptCache {
            cached: Some(small(cached)?),
            evaluated: small(evaluated)?,
        });
    }
    let cached = usage.prompt_tokens_details.as_ref()?.cached_tokens?;
    let total = usage.prompt_tokens?;
    Some(PromptCache {
        cached: Some(small(cached)?),
        evaluated: small(total.saturating_sub(cached))?,
    })
}

/// What the last event of an answer (or a whole answer) reports, if it
/// reports anything.
pub fn read(document: &[u8]) -> Option<Reported> {
    let t: Tail = serde_json::from_slice(document).ok()?;
    let usage = t.usage.unwrap_or_default();
    let timings = t.timings.unwrap_or_default();
    let prompt_ms = t
        .prompt_eval_duration
        .and_then(ns_to_ms)
        .or_else(|| timings.prompt_ms.and_then(float_ms));
    let decode_ms = t
        .eval_duration
        .and_then(ns_to_ms)
        .or_else(|| timings.predicted_ms.and_then(float_ms));
    let cache = prompt_cache(&timings, &usage, t.prompt_eval_count);
    let r = Reported {
        cache,
        prompt_tokens: t
            .prompt_eval_count
            .or(timings.prompt_n)
            .or(usage.prompt_tokens)
            .or(usage
                .input_tokens
                .map(|i| i.saturating_add(usage.cache_read_input_tokens.unwrap_or(0))))
            .and_then(small),
        output_tokens: t
            .eval_count
            .or(timings.predicted_n)
            .or(usage.completion_tokens)
            .or(usage.output_tokens)
            .and_then(small),
        timing: (prompt_ms.is_some() || decode_ms.is_some()).then_some(EngineTiming {
            prompt_ms,
            decode_ms,
        }),
    };
    (r != Reported::default()).then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_report_counts_and_their_own_durations() {
        let ollama = br#"{"model":"m","response":"","done":true,"done_reason":"stop","total_duration":900000000,
            "prompt_eval_count":26,"prompt_eval_duration":130000000,"eval_count":290,"eval_duration":4700000000}"#;
        let r = read(ollama).unwrap();
        assert_eq!((r.prompt_tokens, r.output_tokens), (Some(26), Some(290)));
        assert_eq!(
            r.timing,
            Some(EngineTiming {
                prompt_ms: Some(130),
                decode_ms: Some(4700)
            })
        );
        let llama = br#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],
            "timings":{"prompt_n":12,"prompt_ms":40.5,"predicted_n":33,"predicted_ms":410.2}}"#;
        let r = read(llama).unwrap();
        assert_eq!((r.prompt_tokens, r.output_tokens), (Some(12), Some(33)));
        assert_eq!(
            r.timing,
            Some(EngineTiming {
                prompt_ms: Some(40),
                decode_ms: Some(410)
            })
        );
        // OpenAI usage: counts, no durations.
        let r =
            read(br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}"#).unwrap();
        assert_eq!(
            (r.prompt_tokens, r.output_tokens, r.timing),
            (Some(5), Some(7), None)
        );
        // Nothing reported, not JSON, nonsense durations: nothing.
        assert_eq!(
            r.cache, None,
            "usage without details says nothing of a cache"
        );
        assert_eq!(read(br#"{"choices":[]}"#), None);
        assert_eq!(read(b"{\"done\":tru"), None);
        assert_eq!(read(br#"{"timings":{"prompt_ms":-1.0}}"#), None);
    }

    #[test]
    fn engines_say_what_they_took_from_their_prompt_cache() {
        let cache = |doc: &[u8]| read(doc).and_then(|r| r.cache);
        // llama.cpp's server: 1,900 reused, 100 evaluated.
        let llama =
            cache(br#"{"timings":{"prompt_n":100,"cache_n":1900,"prompt_ms":9.0}}"#).unwrap();
        assert_eq!((llama.cached, llama.evaluated), (Some(1900), 100));
        assert!((llama.cached_share(0) - 0.95).abs() < 1e-9);
        // OpenAI's usage with details (vLLM, llama.cpp): of 2,000, 1,536.
        let openai = cache(
            br#"{"usage":{"prompt_tokens":2000,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":1536}}}"#,
        )
        .unwrap();
        assert_eq!((openai.cached, openai.evaluated), (Some(1536), 464));
        assert!((openai.cached_share(10) - 0.768).abs() < 1e-9);
        // Ollama counts what it evaluated: 120 of an estimated 6,000 means
        // the rest came from its cache; 4,000 of 6,000 is a cold prompt
        // whose estimate ran high.
        let ollama = cache(br#"{"done":true,"prompt_eval_count":120,"eval_count":3}"#).unwrap();
        assert_eq!((ollama.cached, ollama.evaluated), (None, 120));
        assert!((ollama.cached_share(6_000) - 0.98).abs() < 1e-9);
        // Anthropic's usage (an answer pair translated): the uncached part
        // and the cache reads.
        let anthropic = read(
            br#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},
            "usage":{"input_tokens":20,"cache_read_input_tokens":1500,"output_tokens":3}}"#,
        )
        .unwrap();
        assert_eq!(
            (anthropic.prompt_tokens, anthropic.output_tokens),
            (Some(1520), Some(3))
        );
        assert_eq!(
            anthropic.cache,
            Some(PromptCache {
                cached: Some(1500),
                evaluated: 20
            })
        );
        // Of a translated answer only the engine's own counts are kept.
        assert_eq!(anthropic.counts_only(), anthropic);
        let translated =
            read(br#"{"done":true,"prompt_eval_count":120,"prompt_eval_duration":9000000}"#)
                .unwrap()
                .counts_only();
        assert_eq!((translated.timing, translated.cache), (None, None));
        assert_eq!(translated.prompt_tokens, Some(120));
        let cold = cache(br#"{"done":true,"prompt_eval_count":4000}"#).unwrap();
        assert_eq!(cold.cached_share(6_000), 0.0);
        // Nothing evaluated and nothing cached: no share to speak of.
        let none = PromptCache {
            cached: Some(0),
            evaluated: 0,
        };
        assert_eq!(none.cached_share(100), 0.0);
        // The record's account: the whole prompt and its cached part.
        assert_eq!(llama.account(0), (2_000, 1_900));
        assert_eq!(openai.account(0), (2_000, 1_536));
        assert_eq!(ollama.account(6_000), (120 + 5_880, 5_880));
        assert_eq!(cold.account(6_000), (4_000, 0));
    }
}
