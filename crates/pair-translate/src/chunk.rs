//! One chunk of an OpenAI-compatible engine's stream (`data: {...}` of a
//! chat or text completion), read into borrowed types: the one reading of
//! it that Ollama's lines and Anthropic's events are made from. Every field
//! may be absent or `null`; a chunk that does not fit is skipped.

use std::borrow::Cow;

use serde::Deserialize;

#[derive(Deserialize)]
pub(crate) struct Chunk<'a> {
    #[serde(default)]
    pub(crate) error: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    pub(crate) usage: Option<Usage>,
    #[serde(default, borrow)]
    pub(crate) choices: Option<Vec<Choice<'a>>>,
    /// pair's own receipt on a stream's final chunk (where a cut answer
    /// moved), carried into the client's final event.
    #[serde(default)]
    pub(crate) x_pair: Option<serde_json::Value>,
    /// llama.cpp's server: its timings, with the prompt tokens it reused.
    #[serde(default)]
    pub(crate) timings: Option<Timings>,
}

impl Chunk<'_> {
    /// Prompt tokens the engine took from its prompt cache, where it says:
    /// OpenAI's `usage.prompt_tokens_details.cached_tokens` (vLLM,
    /// llama.cpp) or llama.cpp's `timings.cache_n`.
    pub(crate) fn cached_tokens(&self) -> Option<u64> {
        self.usage
            .as_ref()
            .and_then(|u| u.prompt_tokens_details.as_ref())
            .and_then(|d| d.cached_tokens)
            .or_else(|| self.timings.as_ref().and_then(|t| t.cache_n))
    }
}

#[derive(Deserialize)]
pub(crate) struct Usage {
    #[serde(default)]
    pub(crate) prompt_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
pub(crate) struct PromptDetails {
    #[serde(default)]
    pub(crate) cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
pub(crate) struct Timings {
    #[serde(default)]
    pub(crate) cache_n: Option<u64>,
}

#[derive(Deserialize)]
pub(crate) struct Choice<'a> {
    #[serde(default, borrow)]
    pub(crate) finish_reason: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) delta: Option<Delta<'a>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct Delta<'a> {
    #[serde(default, borrow)]
    pub(crate) content: Option<Cow<'a, str>>,
    /// A reasoning model's thinking (llama.cpp, vLLM: `reasoning_content`;
    /// Ollama and newer vLLM: `reasoning`).
    #[serde(default, borrow, alias = "reasoning")]
    pub(crate) reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) tool_calls: Option<Vec<ToolCall<'a>>>,
}

#[derive(Deserialize)]
pub(crate) struct ToolCall<'a> {
    #[serde(default)]
    pub(crate) index: Option<u64>,
    #[serde(default, borrow)]
    pub(crate) id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) function: Option<Function<'a>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct Function<'a> {
    #[serde(default, borrow)]
    pub(crate) name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub(crate) arguments: Option<Cow<'a, str>>,
}
