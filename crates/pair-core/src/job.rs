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
    /// The whole prompt, in the engine's tokens where it counted them.
    pub prompt_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    /// Short reason when it failed (an error class, never request text).
    pub error: Option<Cow<'static, str>>,
    /// The node that wrote this record: the origin, or the node that ran a
    /// relayed request (both record it, so a job survives either's crash).
    #[serde(default)]
    pub recorded_by: Option<NodeId>,
    /// What the engine reported of its own work on the job, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineTiming>,
    /// Of the prompt, the tokens the engine took from its prompt cache (its
    /// own count where it gives one, else the share the scheduler expected
    /// it to hold): only the rest was prefilled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// The name of the API key the request came with (the LAN face).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Where the answer moved after its first byte (a stream cut and
    /// continued on another node), in order; `ran_on` is where it began.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resumed: Vec<Resumption>,
    /// How long the request waited before its answer, and why, where it
    /// waited for a reason the client should see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited: Option<JobWait>,
}

/// A wait a job went through before its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobWait {
    /// From the start of the wait to the answer's first byte (or the
    /// request's end without one), ms.
    pub ms: u32,
    pub why: WaitReason,
}

/// Why a job waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitReason {
    /// Its node's engine showed no progress past the stall allowance, and
    /// no other node could take the request: it was waited for rather
    /// than cut.
    SilentOnlyOwner,
    /// Every node that could take it had its slots full: it waited at the
    /// cluster (late binding) for the first slot to free, in the cluster
    /// queue's order.
    ClusterQueue,
}

impl WaitReason {
    pub const ALL: [WaitReason; 2] = [WaitReason::SilentOnlyOwner, WaitReason::ClusterQueue];

    /// What the Jobs view says.
    pub fn describe(self) -> &'static str {
        match self {
            WaitReason::SilentOnlyOwner => "waited on a silent engine with no alternative",
            WaitReason::ClusterQueue => "waited at the cluster for a free slot",
        }
    }
}

/// A stream cut after its first byte and continued on another node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumption {
    /// The node that continued it.
    pub node: NodeId,
    /// Tokens the client had received when the answer moved.
    pub at_token: u32,
}

/// The engine's own account of a job (Ollama's `prompt_eval_duration` and
/// `eval_duration`, llama.cpp's `timings`): its clock, without the time the
/// job queued for a slot or crossed the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineTiming {
    /// Processing the prompt, ms.
    pub prompt_ms: Option<u32>,
    /// Generating the answer, ms.
    pub decode_ms: Option<u32>,
}

impl JobRecord {
    /// Whether this record of a job replaces `old`, another record of the
    /// same job: a job's record only moves forward (a terminal one is never
    /// replaced by one still running), and of two terminal records the
    /// origin's wins (it knows what its client got). Every node applying
    /// this to whatever records reach it, in any order, ends with the same
    /// record.
    pub fn supersedes(&self, old: &JobRecord) -> bool {
        self.precedence() > old.precedence()
    }

    /// The order [`JobRecord::supersedes`] follows: terminal over not, the
    /// origin's over the runner's, then a completed answer over a failed or
    /// cancelled one (a node that ran two attempts of one job recorded
    /// both), then the rest of the record, so that any two records of one
    /// job compare the same way on every node.
    fn precedence(&self) -> impl Ord + '_ {
        let status = match self.status {
            JobStatus::Queued => 0u8,
            JobStatus::Running => 1,
            JobStatus::Cancelled => 2,
            JobStatus::Failed => 3,
            JobStatus::Completed => 4,
        };
        (
            (
                self.status.is_terminal(),
                self.recorded_by == Some(self.origin),
                status,
                self.attempts,
            ),
            (
                self.http_status,
                self.duration_ms,
                self.ttft_ms,
                self.output_tokens,
                self.ran_on,
                self.error.as_deref(),
            ),
        )
    }
}

#[cfg(any(test, feature = "test-support"))]
impl JobRecord {
    /// The record tests build from (feature `test-support`): job `id`, a
    /// completed, streamed Ollama request of model `m` on `/route`, sent to, run on and
    /// recorded by node 1, HTTP 200, created at 0, nothing measured. A test
    /// changes what it is about with struct update syntax:
    /// `JobRecord { status: JobStatus::Failed, ..JobRecord::fixture(7) }`,
    /// so a new field is added here once, not in every crate's tests.
    pub fn fixture(id: u128) -> Self {
        let node = crate::NodeId::from_u128(1);
        JobRecord {
            id: crate::JobId::from_uuid(uuid::Uuid::from_u128(id)),
            model: "m".into(),
            flavor: ApiFlavor::Ollama,
            // Not a real route: a crate below the proxy names none.
            route: Cow::Borrowed("/route"),
            streaming: true,
            origin: node,
            ran_on: Some(node),
            attempts: 1,
            status: JobStatus::Completed,
            http_status: Some(200),
            created_at_ms: 0,
            ttft_ms: None,
            duration_ms: None,
            prompt_tokens: None,
            cached_tokens: None,
            output_tokens: None,
            error: None,
            recorded_by: Some(node),
            engine: None,
            key: None,
            resumed: Vec::new(),
            waited: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(status: JobStatus, by: u128) -> JobRecord {
        JobRecord {
            status,
            ran_on: Some(NodeId::from_u128(2)),
            recorded_by: Some(NodeId::from_u128(by)),
            ..JobRecord::fixture(1)
        }
    }

    #[test]
    fn records_only_move_forward_and_the_origin_s_wins() {
        let running = record(JobStatus::Running, 1);
        let runner_done = record(JobStatus::Completed, 2);
        let origin_failed = record(JobStatus::Failed, 1);
        assert!(runner_done.supersedes(&running));
        assert!(!running.supersedes(&runner_done), "never back to running");
        assert!(origin_failed.supersedes(&runner_done));
        assert!(!runner_done.supersedes(&origin_failed));
        assert!(!origin_failed.supersedes(&origin_failed));
        // Any order of arrival ends on the same record.
        let all = [running, runner_done, origin_failed.clone()];
        for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]] {
            let mut held = all[order[0]].clone();
            for &i in &order[1..] {
                if all[i].supersedes(&held) {
                    held = all[i].clone();
                }
            }
            assert_eq!(held, origin_failed, "{order:?}");
        }
    }

    #[test]
    fn terminal_states() {
        assert!(JobStatus::Completed.is_terminal());
        assert!(JobStatus::Failed.is_terminal());
        assert!(!JobStatus::Running.is_terminal());
    }
}
