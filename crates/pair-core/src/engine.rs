//! Engine kinds and the API flavours they speak.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::CoreError;

/// The inference server behind a node's proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    Ollama,
    LmStudio,
    /// Any OpenAI-compatible server: llama.cpp server, vLLM, llama-cpp-python.
    OpenAiCompat,
}

impl EngineKind {
    pub const ALL: [EngineKind; 3] = [
        EngineKind::Ollama,
        EngineKind::LmStudio,
        EngineKind::OpenAiCompat,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Ollama => "ollama",
            EngineKind::LmStudio => "lm-studio",
            EngineKind::OpenAiCompat => "openai-compat",
        }
    }

    /// Whether this engine answers requests of `flavor` itself: every kind
    /// speaks OpenAI's API; Ollama also its own. Anthropic's Messages API
    /// and OpenAI's Responses API are always translated (not every engine
    /// version has them, and translated they behave the same everywhere).
    pub fn speaks(self, flavor: ApiFlavor) -> bool {
        matches!(
            (self, flavor),
            (_, ApiFlavor::OpenAi) | (EngineKind::Ollama, ApiFlavor::Ollama)
        )
    }

    /// Whether this engine can serve requests of `flavor`: itself, or
    /// through the node's translation into OpenAI's API, which every
    /// kind speaks. A model is eligible wherever an engine holds it.
    pub fn serves(self, flavor: ApiFlavor) -> bool {
        self.speaks(flavor) || flavor.translates_to_openai()
    }

    /// Ollama resolves an untagged model name to `:latest`; other engines
    /// match names exactly.
    pub fn has_implicit_latest_tag(self) -> bool {
        matches!(self, EngineKind::Ollama)
    }

    /// The engine's usual port, which pair's proxy takes over.
    pub fn usual_port(self) -> u16 {
        match self {
            EngineKind::Ollama => 11434,
            EngineKind::LmStudio | EngineKind::OpenAiCompat => 1234,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EngineKind {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "ollama" => Ok(EngineKind::Ollama),
            "lm-studio" | "lmstudio" => Ok(EngineKind::LmStudio),
            "openai-compat" | "openai" | "llama.cpp" | "llamacpp" | "vllm" => {
                Ok(EngineKind::OpenAiCompat)
            }
            _ => Err(CoreError::UnknownName {
                what: "engine kind",
                input: s.to_owned(),
                expected: "ollama, lm-studio, openai-compat",
            }),
        }
    }
}

/// The API a request was written against, decided by its route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApiFlavor {
    /// Ollama native: /api/generate, /api/chat, /api/embed, ...
    Ollama,
    /// OpenAI: /v1/chat/completions, /v1/completions, /v1/embeddings.
    OpenAi,
    /// Anthropic messages: /v1/messages.
    Anthropic,
    /// OpenAI's Responses API: /v1/responses (translated to chat
    /// completions for every engine, so it works the same on all).
    Responses,
}

impl ApiFlavor {
    /// Requests of this flavour can be put in OpenAI's shape for an engine
    /// that does not speak it (see `pair-translate`).
    pub fn translates_to_openai(self) -> bool {
        matches!(
            self,
            ApiFlavor::Ollama | ApiFlavor::Anthropic | ApiFlavor::Responses
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ApiFlavor::Ollama => "ollama",
            ApiFlavor::OpenAi => "openai",
            ApiFlavor::Anthropic => "anthropic",
            ApiFlavor::Responses => "responses",
        }
    }
}

impl fmt::Display for ApiFlavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_kind_parses_its_own_names_and_aliases() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>().unwrap(), k);
        }
        assert_eq!(
            "vllm".parse::<EngineKind>().unwrap(),
            EngineKind::OpenAiCompat
        );
        assert!("tgi".parse::<EngineKind>().is_err());
    }

    #[test]
    fn flavour_compatibility() {
        assert!(EngineKind::Ollama.speaks(ApiFlavor::Ollama));
        assert!(EngineKind::Ollama.speaks(ApiFlavor::OpenAi));
        assert!(!EngineKind::OpenAiCompat.speaks(ApiFlavor::Ollama));
        assert!(!EngineKind::LmStudio.speaks(ApiFlavor::Anthropic));
        assert!(EngineKind::LmStudio.speaks(ApiFlavor::OpenAi));
        for kind in EngineKind::ALL {
            assert!(!kind.speaks(ApiFlavor::Responses));
            for flavor in [
                ApiFlavor::Ollama,
                ApiFlavor::OpenAi,
                ApiFlavor::Anthropic,
                ApiFlavor::Responses,
            ] {
                assert!(
                    kind.serves(flavor),
                    "{kind} serves {flavor:?} through translation"
                );
            }
        }
    }
}
