//! What a request asks of the cluster, as the scheduler sees it.

use serde::{Deserialize, Serialize};

use crate::{ApiFlavor, NodeId, PromptChain};

/// Identifies a conversation for session affinity (a hash of whatever the
/// proxy uses: a header, or the first messages of the chat).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionKey(pub u64);

impl SessionKey {
    /// The key of a session name (an `x-pair-session` header, an edge
    /// client's session): FNV-1a, stable across processes and versions
    /// (unlike std's SipHash keys), so every node and client map a name to
    /// the same key.
    pub fn of(name: &[u8]) -> Self {
        SessionKey(name.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        }))
    }
}

/// A request's class (the Gateway API Inference Extension's criticality,
/// named as `x-pair-priority` takes it).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// A person is waiting (chat, an editor): goes before batch work.
    #[default]
    Interactive,
    /// An agent farm, an evaluation, a backfill: yields to interactive
    /// work for up to `pair_scheduler::queue::BATCH_DELAY_MS`.
    Batch,
}

impl Priority {
    /// Parses `interactive`, `batch`, and the ecosystem's other names for
    /// them: `high`, `normal`, `critical`, `standard` (interactive); `low`,
    /// `sheddable` (batch). Case-insensitive.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let is = |name: &str| s.eq_ignore_ascii_case(name);
        if ["interactive", "high", "normal", "critical", "standard"]
            .iter()
            .any(|n| is(n))
        {
            Some(Self::Interactive)
        } else if ["batch", "low", "sheddable"].iter().any(|n| is(n)) {
            Some(Self::Batch)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}

/// The scheduler's view of one request. Built once by the proxy (or the
/// simulator) from the route and the request body; never holds prompt text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestProfile {
    /// Model as the client named it; matching is engine-aware.
    pub model: String,
    pub flavor: ApiFlavor,
    /// Streaming: the client feels time to first token. Otherwise it feels
    /// the whole answer.
    pub streaming: bool,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// The answer's limit: the request's max, or a default; 0 for
    /// embeddings.
    pub max_output_tokens: u32,
    /// The answer's predicted length, learned from earlier answers of the
    /// same model and client shape (`pair_scheduler`'s answer lengths);
    /// `None` until predicted: the limit stands in for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_output_tokens: Option<u32>,
    /// The request offers tools (an agent's turn): its client acts on the
    /// whole answer, where a tool call comes last.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tools: bool,
    /// Its class (`x-pair-priority`, or its API key's or alias's default).
    #[serde(default)]
    pub priority: Priority,
    pub session: Option<SessionKey>,
    /// A node the user asked for by name; goes first when eligible.
    pub pinned: Option<NodeId>,
    /// The prompt as engines' caches see it (block hashes, no text): what
    /// a node already holds of it is not prefilled again. Empty when the
    /// prompt is not known.
    #[serde(default, skip_serializing_if = "PromptChain::is_empty")]
    pub prefix: PromptChain,
}

impl RequestProfile {
    /// Output tokens assumed when a request sets no limit.
    pub const DEFAULT_OUTPUT_TOKENS: u32 = 256;

    pub fn new(model: impl Into<String>, flavor: ApiFlavor) -> Self {
        Self {
            model: model.into(),
            flavor,
            streaming: false,
            prompt_tokens: 0,
            max_output_tokens: Self::DEFAULT_OUTPUT_TOKENS,
            expected_output_tokens: None,
            tools: false,
            priority: Priority::Interactive,
            session: None,
            pinned: None,
            prefix: PromptChain::EMPTY,
        }
    }

    /// The output tokens to plan for: the predicted length within the
    /// limit, or the limit where nothing is predicted.
    pub fn answer_tokens(&self) -> u32 {
        self.expected_output_tokens
            .map_or(self.max_output_tokens, |e| e.min(self.max_output_tokens))
    }

    /// Whether the client waits for the whole answer rather than its first
    /// token: it did not ask for a stream, or it is an agent that acts on
    /// the tool call at the answer's end.
    pub fn wants_whole_answer(&self) -> bool {
        !self.streaming || self.tools
    }

    /// A cheap prompt-token estimate from the size of the request body: about
    /// four bytes of English text per token, as BPE tokenizers give.
    pub fn estimate_tokens_from_bytes(body_bytes: usize) -> u32 {
        u32::try_from(body_bytes.div_ceil(4)).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_keys_are_fnv1a() {
        assert_eq!(SessionKey::of(b""), SessionKey(0xcbf2_9ce4_8422_2325));
        assert_eq!(SessionKey::of(b"a"), SessionKey(0xaf63_dc4c_8601_ec8c));
    }
}
