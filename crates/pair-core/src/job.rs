//! Job records: what happened to one request. Never holds prompt or output
//! text, so they can be logged, shown and replicated to peers freely.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{ApiFlavor, JobId, NodeId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub model: String,
    pub flavor: ApiFlavor,
    /// HTTP route the client called, e.g. `/api/chat` (borrowed from the
    /// route table on the request path: no allocation per request).
    pub route: Cow<'static, str>,
    pub streaming: bool,
    /// The node whose face received the request ("sent to").
    pub origin: NodeId,
    /// The node that served it ("ran on"); `None` if none did.
    pub ran_on: Option<NodeId>,
    /// Dispatches made, including the one that succeeded.
    pub attempts: u8,
    pub status: JobStatus,
    /// Final HTTP status returned to the client.
    pub http_status: Option<u16>,
    pub created_at_ms: u64,
    /// Time to first response byte, ms.
    pub ttft_ms: Option<u32>,
    /// Whole request, ms.
    pub duration_ms: Option<u32>,
    pub prompt_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    /// Short reason when it failed (an error class, never request text).
    pub error: Option<Cow<'static, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states() {
        assert!(JobStatus::Completed.is_terminal());
        assert!(JobStatus::Failed.is_terminal());
        assert!(!JobStatus::Running.is_terminal());
    }
}
