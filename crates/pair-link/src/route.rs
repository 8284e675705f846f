//! The inference routes: every path pair routes across the cluster, with
//! its API flavour, its kind of work, whether its body is a conversation,
//! the translation it takes and how a cut stream of it continues. This is
//! the only place in the workspace that spells an inference path (tidy).

use pair_core::ApiFlavor;
use pair_translate::Route;
use pair_translate::resume::Api;

/// What kind of work an inference route asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Text generation (chat, completion, generate, messages).
    Generate,
    /// Embeddings: no output tokens, never streamed.
    Embed,
    /// Model metadata (`/api/show`): tiny, but only an owner can answer.
    Show,
}

/// One inference route (a `POST` routed across the cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InferenceRoute {
    /// `/api/generate`.
    OllamaGenerate,
    /// `/api/chat`.
    OllamaChat,
    /// `/api/embed`.
    OllamaEmbed,
    /// `/api/embeddings`.
    OllamaEmbeddings,
    /// `/api/show`.
    OllamaShow,
    /// `/v1/chat/completions`.
    OpenAiChat,
    /// `/v1/completions`.
    OpenAiCompletion,
    /// `/v1/embeddings`.
    OpenAiEmbeddings,
    /// `/v1/messages`.
    AnthropicMessages,
    /// `/v1/messages/count_tokens`: counted by the engine that holds the
    /// model (no output tokens).
    AnthropicCountTokens,
    /// `/v1/responses`.
    OpenAiResponses,
}

impl InferenceRoute {
    /// Every inference route.
    pub const ALL: [InferenceRoute; 11] = [
        Self::OllamaGenerate,
        Self::OllamaChat,
        Self::OllamaEmbed,
        Self::OllamaEmbeddings,
        Self::OllamaShow,
        Self::OpenAiChat,
        Self::OpenAiCompletion,
        Self::OpenAiEmbeddings,
        Self::AnthropicMessages,
        Self::AnthropicCountTokens,
        Self::OpenAiResponses,
    ];

    /// Its path: the route's static name, for metrics and job records.
    pub const fn path(self) -> &'static str {
        match self {
            Self::OllamaGenerate => "/api/generate",
            Self::OllamaChat => "/api/chat",
            Self::OllamaEmbed => "/api/embed",
            Self::OllamaEmbeddings => "/api/embeddings",
            Self::OllamaShow => "/api/show",
            Self::OpenAiChat => "/v1/chat/completions",
            Self::OpenAiCompletion => "/v1/completions",
            Self::OpenAiEmbeddings => "/v1/embeddings",
            Self::AnthropicMessages => "/v1/messages",
            Self::AnthropicCountTokens => "/v1/messages/count_tokens",
            Self::OpenAiResponses => "/v1/responses",
        }
    }

    /// The route at exactly `path` (no trailing slash, no query).
    pub fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.path() == path)
    }

    /// Its API.
    pub const fn flavor(self) -> ApiFlavor {
        match self {
            Self::OllamaGenerate
            | Self::OllamaChat
            | Self::OllamaEmbed
            | Self::OllamaEmbeddings
            | Self::OllamaShow => ApiFlavor::Ollama,
            Self::OpenAiChat | Self::OpenAiCompletion | Self::OpenAiEmbeddings => ApiFlavor::OpenAi,
            Self::AnthropicMessages | Self::AnthropicCountTokens => ApiFlavor::Anthropic,
            Self::OpenAiResponses => ApiFlavor::Responses,
        }
    }

    /// Its kind of work.
    pub const fn work(self) -> Work {
        match self {
            Self::OllamaGenerate
            | Self::OllamaChat
            | Self::OpenAiChat
            | Self::OpenAiCompletion
            | Self::AnthropicMessages
            | Self::OpenAiResponses => Work::Generate,
            Self::OllamaEmbed | Self::OllamaEmbeddings | Self::OpenAiEmbeddings => Work::Embed,
            Self::OllamaShow | Self::AnthropicCountTokens => Work::Show,
        }
    }

    /// Whether its body is a conversation (a `messages` list re-sent from
    /// its start each turn).
    pub const fn is_chat(self) -> bool {
        matches!(
            self,
            Self::OllamaChat | Self::OpenAiChat | Self::AnthropicMessages
        )
    }

    /// The translation it takes to an engine that speaks only OpenAI's
    /// API, where it needs one.
    pub const fn translated(self) -> Option<Route> {
        Some(match self {
            Self::OllamaChat => Route::OllamaChat,
            Self::OllamaGenerate => Route::OllamaGenerate,
            Self::OllamaEmbed => Route::OllamaEmbed,
            Self::OllamaEmbeddings => Route::OllamaEmbeddings,
            Self::OllamaShow => Route::OllamaShow,
            Self::AnthropicMessages => Route::AnthropicMessages,
            Self::AnthropicCountTokens => Route::AnthropicCountTokens,
            Self::OpenAiResponses => Route::OpenAiResponses,
            Self::OpenAiChat | Self::OpenAiCompletion | Self::OpenAiEmbeddings => return None,
        })
    }

    /// How a cut stream of it continues (the API of its stream below
    /// translation), where it can.
    pub const fn continues(self) -> Option<Api> {
        Some(match self {
            Self::OpenAiChat => Api::OpenAiChat,
            Self::OpenAiCompletion => Api::OpenAiCompletion,
            Self::OllamaChat => Api::OllamaChat,
            Self::OllamaGenerate => Api::OllamaGenerate,
            _ => return None,
        })
    }

    /// The route a continuation in `api` is sent on.
    pub const fn continued(api: Api) -> Self {
        match api {
            Api::OpenAiChat => Self::OpenAiChat,
            Api::OpenAiCompletion => Self::OpenAiCompletion,
            Api::OllamaChat => Self::OllamaChat,
            Api::OllamaGenerate => Self::OllamaGenerate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_one_route_each() {
        for r in InferenceRoute::ALL {
            assert_eq!(InferenceRoute::from_path(r.path()), Some(r));
        }
        assert_eq!(InferenceRoute::from_path("/v1/models"), None);
    }

    #[test]
    fn continuations_go_back_to_their_route() {
        for r in InferenceRoute::ALL {
            if let Some(api) = r.continues() {
                assert_eq!(InferenceRoute::continued(api), r);
                assert_eq!(api.is_chat(), r.is_chat());
            }
        }
    }
}
