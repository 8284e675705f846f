//! The crate's one error type: bad names and settings handed in by callers.

/// Everything that can go wrong when configuring the scheduler. Ranking itself
/// cannot fail: an empty candidate list is an answer, not an error.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("unknown scheduling policy {input:?} (expected one of: {expected})")]
    UnknownPolicy {
        input: String,
        expected: &'static str,
    },
    #[error("invalid session affinity setting: {reason}")]
    BadAffinity { reason: &'static str },
}
