//! What a request asks of the cluster, as the scheduler sees it.

use serde::{Deserialize, Serialize};

use crate::{ApiFlavor, NodeId};

/// Identifies a conversation for session affinity (a hash of whatever the
/// proxy uses: a header, or the first messages of the chat).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionKey(pub u64);

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
    /// Expected output tokens (the request's max, or a default; 0 for
    /// embeddings).
    pub max_output_tokens: u32,
    pub session: Option<SessionKey>,
    /// A node the user asked for by name; goes first when eligible.
    pub pinned: Option<NodeId>,
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
            session: None,
            pinned: None,
        }
    }

    /// A cheap prompt-token estimate from the size of the request body: about
    /// four bytes of English text per token, as BPE tokenizers give.
    pub fn estimate_tokens_from_bytes(body_bytes: usize) -> u32 {
        u32::try_from(body_bytes.div_ceil(4)).unwrap_or(u32::MAX)
    }
}
