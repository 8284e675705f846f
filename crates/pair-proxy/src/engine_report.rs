//! What an engine says of its own work at the end of an answer: token
//! counts and, where it gives them, how long it took over the prompt and
//! over the answer on its own clock. Ollama's last line carries
//! `prompt_eval_count` / `prompt_eval_duration` / `eval_count` /
//! `eval_duration` (ns); llama.cpp's server its `timings` (`prompt_n`,
//! `prompt_ms`, `predicted_n`, `predicted_ms`); OpenAI-shaped answers their
//! `usage`. Speeds learned from these leave out the time a job queued for
//! a slot, which the node's own clock cannot.
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
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Timings {
    prompt_n: Option<u64>,
    prompt_ms: Option<f64>,
    predicted_n: Option<u64>,
    predicted_ms: Option<f64>,
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
    let r = Reported {
        prompt_tokens: t
            .prompt_eval_count
            .or(timings.prompt_n)
            .or(usage.prompt_tokens)
            .and_then(small),
        output_tokens: t
            .eval_count
            .or(timings.predicted_n)
            .or(usage.completion_tokens)
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
        assert_eq!(read(br#"{"choices":[]}"#), None);
        assert_eq!(read(b"{\"done\":tru"), None);
        assert_eq!(read(br#"{"timings":{"prompt_ms":-1.0}}"#), None);
    }
}
