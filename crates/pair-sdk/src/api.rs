//! Typed requests in both API shapes the nodes speak: OpenAI
//! (`/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`) and Ollama
//! (`/api/chat`, `/api/generate`, `/api/embed`). Fields the SDK does not
//! name travel in `extra`, untouched, so every engine option still reaches
//! the engine.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use pair_core::ApiFlavor;
use pair_link::InferenceRoute;

use crate::response::Framing;

/// One route of one API: where a request goes, what comes back whole and
/// what comes back chunk by chunk.
pub trait Endpoint: Serialize {
    const PATH: &'static str;
    const FLAVOR: ApiFlavor;
    /// The whole answer.
    type Answer: DeserializeOwned;
    /// One streamed chunk (the answer type for routes that do not stream).
    type Chunk: DeserializeOwned;
    fn model(&self) -> &str;
    /// Asks for a stream or a whole answer.
    fn set_stream(&mut self, stream: bool);
    fn framing() -> Framing {
        match Self::FLAVOR {
            ApiFlavor::Ollama => Framing::JsonLines,
            _ => Framing::Sse,
        }
    }
}

/// Implements [`Endpoint`] for request types, one line each: the request
/// type, its route ([`InferenceRoute`], which names its path and API), its
/// whole answer and, for a route that
/// streams, its chunk (`stream = Chunk`; the type's `stream` field says
/// which is asked for). A route that does not stream answers whole, its
/// chunk is its answer. Every request names its `model` field.
macro_rules! endpoints {
    ($($req:ty => $route:ident, $answer:ty $(, stream = $chunk:ty)?;)*) => {
        $(
            impl Endpoint for $req {
                const PATH: &'static str = InferenceRoute::$route.path();
                const FLAVOR: ApiFlavor = InferenceRoute::$route.flavor();
                type Answer = $answer;
                type Chunk = endpoints!(@chunk $answer $(, $chunk)?);
                fn model(&self) -> &str {
                    &self.model
                }
                fn set_stream(&mut self, stream: bool) {
                    endpoints!(@stream self, stream $(, $chunk)?);
                }
            }
        )*
    };
    (@chunk $answer:ty) => { $answer };
    (@chunk $answer:ty, $chunk:ty) => { $chunk };
    (@stream $self:ident, $stream:ident) => { let _ = $stream; };
    (@stream $self:ident, $stream:ident, $chunk:ty) => { $self.stream = $stream; };
}

endpoints! {
    openai::ChatRequest => OpenAiChat, openai::ChatResponse, stream = openai::ChatChunk;
    openai::CompletionRequest => OpenAiCompletion, openai::CompletionResponse, stream = openai::CompletionResponse;
    openai::EmbeddingsRequest => OpenAiEmbeddings, openai::EmbeddingsResponse;
    ollama::ChatRequest => OllamaChat, ollama::ChatResponse, stream = ollama::ChatResponse;
    ollama::GenerateRequest => OllamaGenerate, ollama::GenerateResponse, stream = ollama::GenerateResponse;
    ollama::EmbedRequest => OllamaEmbed, ollama::EmbedResponse;
}

/// A chunk of a streamed chat: its new text, whatever the API.
pub trait ChunkText {
    fn text(&self) -> &str;
}

impl ChunkText for openai::ChatChunk {
    fn text(&self) -> &str {
        openai::ChatChunk::text(self)
    }
}

impl ChunkText for ollama::ChatResponse {
    fn text(&self) -> &str {
        ollama::ChatResponse::text(self)
    }
}

/// OpenAI's API shapes.
pub mod openai {
    use super::*;

    /// One chat message.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Message {
        pub role: String,
        #[serde(default)]
        pub content: Option<String>,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    impl Message {
        pub fn user(text: impl Into<String>) -> Self {
            Self::new("user", text)
        }
        pub fn system(text: impl Into<String>) -> Self {
            Self::new("system", text)
        }
        pub fn new(role: &str, text: impl Into<String>) -> Self {
            Self {
                role: role.to_owned(),
                content: Some(text.into()),
                extra: Map::new(),
            }
        }
    }

    /// `POST /v1/chat/completions`.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct ChatRequest {
        pub model: String,
        pub messages: Vec<Message>,
        #[serde(default)]
        pub stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_tokens: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub temperature: Option<f32>,
        /// Any other field (`top_p`, `stop`, `tools`, `response_format`, ...).
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    impl ChatRequest {
        pub fn new(model: impl Into<String>, messages: Vec<Message>) -> Self {
            Self {
                model: model.into(),
                messages,
                ..Self::default()
            }
        }
    }

    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Usage {
        #[serde(default)]
        pub prompt_tokens: u32,
        #[serde(default)]
        pub completion_tokens: u32,
        #[serde(default)]
        pub total_tokens: u32,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct ChatChoice {
        pub index: u32,
        pub message: Message,
        #[serde(default)]
        pub finish_reason: Option<String>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct ChatResponse {
        #[serde(default)]
        pub id: String,
        #[serde(default)]
        pub model: String,
        pub choices: Vec<ChatChoice>,
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    impl ChatResponse {
        /// The first choice's text.
        pub fn text(&self) -> &str {
            self.choices
                .first()
                .and_then(|c| c.message.content.as_deref())
                .unwrap_or_default()
        }
    }

    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct Delta {
        #[serde(default)]
        pub role: Option<String>,
        #[serde(default)]
        pub content: Option<String>,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct ChunkChoice {
        pub index: u32,
        #[serde(default)]
        pub delta: Delta,
        #[serde(default)]
        pub finish_reason: Option<String>,
    }

    /// One server-sent event of a streamed chat.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct ChatChunk {
        #[serde(default)]
        pub id: String,
        #[serde(default)]
        pub model: String,
        #[serde(default)]
        pub choices: Vec<ChunkChoice>,
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    impl ChatChunk {
        /// The first choice's new text.
        pub fn text(&self) -> &str {
            self.choices
                .first()
                .and_then(|c| c.delta.content.as_deref())
                .unwrap_or_default()
        }
    }

    /// `POST /v1/completions` (text in, text out).
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct CompletionRequest {
        pub model: String,
        pub prompt: String,
        #[serde(default)]
        pub stream: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_tokens: Option<u32>,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct CompletionChoice {
        #[serde(default)]
        pub index: u32,
        #[serde(default)]
        pub text: String,
        #[serde(default)]
        pub finish_reason: Option<String>,
    }

    /// A whole completion, or one streamed chunk of it (same shape).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct CompletionResponse {
        #[serde(default)]
        pub id: String,
        #[serde(default)]
        pub model: String,
        #[serde(default)]
        pub choices: Vec<CompletionChoice>,
        #[serde(default)]
        pub usage: Option<Usage>,
    }

    /// `POST /v1/embeddings`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct EmbeddingsRequest {
        pub model: String,
        /// A string or a list of strings.
        pub input: Value,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Embedding {
        #[serde(default)]
        pub index: u32,
        pub embedding: Vec<f32>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct EmbeddingsResponse {
        pub data: Vec<Embedding>,
        #[serde(default)]
        pub model: String,
    }
}

/// Ollama's API shapes.
pub mod ollama {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct Message {
        pub role: String,
        #[serde(default)]
        pub content: String,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    impl Message {
        pub fn user(text: impl Into<String>) -> Self {
            Self {
                role: "user".into(),
                content: text.into(),
                extra: Map::new(),
            }
        }
    }

    /// `POST /api/chat`.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct ChatRequest {
        pub model: String,
        pub messages: Vec<Message>,
        pub stream: bool,
        /// `num_predict`, `temperature`, ... as Ollama takes them.
        #[serde(skip_serializing_if = "Map::is_empty", default)]
        pub options: Map<String, Value>,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    /// A whole chat answer, or one line of a streamed one (same shape).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct ChatResponse {
        #[serde(default)]
        pub model: String,
        #[serde(default)]
        pub message: Option<Message>,
        #[serde(default)]
        pub done: bool,
        #[serde(default)]
        pub done_reason: Option<String>,
        #[serde(default)]
        pub prompt_eval_count: Option<u32>,
        #[serde(default)]
        pub eval_count: Option<u32>,
    }

    impl ChatResponse {
        pub fn text(&self) -> &str {
            self.message.as_ref().map_or("", |m| m.content.as_str())
        }
    }

    /// `POST /api/generate`.
    #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
    pub struct GenerateRequest {
        pub model: String,
        pub prompt: String,
        pub stream: bool,
        #[serde(skip_serializing_if = "Map::is_empty", default)]
        pub options: Map<String, Value>,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    /// A whole answer, or one line of a streamed one (same shape).
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct GenerateResponse {
        #[serde(default)]
        pub model: String,
        #[serde(default)]
        pub response: String,
        #[serde(default)]
        pub done: bool,
        #[serde(default)]
        pub done_reason: Option<String>,
        #[serde(default)]
        pub prompt_eval_count: Option<u32>,
        #[serde(default)]
        pub eval_count: Option<u32>,
    }

    /// `POST /api/embed`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct EmbedRequest {
        pub model: String,
        /// A string or a list of strings.
        pub input: Value,
        #[serde(flatten)]
        pub extra: Map<String, Value>,
    }

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct EmbedResponse {
        #[serde(default)]
        pub model: String,
        pub embeddings: Vec<Vec<f32>>,
    }
}

impl crate::Client {
    /// Sends `req` and reads its whole answer.
    pub async fn complete<E: Endpoint>(&self, req: E) -> crate::Result<E::Answer> {
        self.call_whole(req, None).await
    }

    /// Sends `req` as a stream and returns its chunks as they come.
    pub async fn stream<E: Endpoint>(&self, req: E) -> crate::Result<crate::Chunks<E::Chunk>> {
        self.call_stream(req, None).await
    }

    /// Calls that keep a conversation on one node while it is healthy.
    pub fn session(&self, key: impl Into<String>) -> Session<'_> {
        Session {
            client: self,
            key: key.into(),
        }
    }

    async fn call_whole<E: Endpoint>(
        &self,
        mut req: E,
        session: Option<&str>,
    ) -> crate::Result<E::Answer> {
        req.set_stream(false);
        let model = req.model().to_owned();
        let resp = self.send(typed_request(&req, session)?).await?;
        resp.json(&model).await
    }

    async fn call_stream<E: Endpoint>(
        &self,
        mut req: E,
        session: Option<&str>,
    ) -> crate::Result<crate::Chunks<E::Chunk>> {
        req.set_stream(true);
        let model = req.model().to_owned();
        let resp = self.send(typed_request(&req, session)?).await?;
        resp.chunks(&model, E::framing())
    }
}

/// A client's calls in one session (see [`crate::Request::session`]).
#[derive(Debug)]
pub struct Session<'a> {
    client: &'a crate::Client,
    key: String,
}

impl Session<'_> {
    pub async fn complete<E: Endpoint>(&self, req: E) -> crate::Result<E::Answer> {
        self.client.call_whole(req, Some(&self.key)).await
    }

    pub async fn stream<E: Endpoint>(&self, req: E) -> crate::Result<crate::Chunks<E::Chunk>> {
        self.client.call_stream(req, Some(&self.key)).await
    }
}

fn typed_request<E: Endpoint>(req: &E, session: Option<&str>) -> crate::Result<crate::Request> {
    let body = serde_json::to_vec(req).map_err(|e| crate::Error::InvalidRequest(e.to_string()))?;
    let mut r = crate::Request::json(E::PATH, body.into())?;
    r.session = session.map(str::to_owned);
    Ok(r)
}
