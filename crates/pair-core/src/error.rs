//! Error classes shared by every crate, and the retry decision carried as data.

use serde::{Deserialize, Serialize};

/// Errors of the vocabulary itself (parsing ids, names, values).
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("invalid node id {input:?}")]
    BadNodeId {
        input: String,
        #[source]
        source: uuid::Error,
    },
    #[error("invalid model name {input:?}: {reason}")]
    BadModelName { input: String, reason: &'static str },
    #[error("invalid model alias {input:?}: {reason}")]
    BadAlias { input: String, reason: &'static str },
    #[error("unknown {what} {input:?} (expected one of: {expected})")]
    UnknownName {
        what: &'static str,
        input: String,
        expected: &'static str,
    },
}

/// Whether the operation that failed may be tried again, and where.
///
/// Every error that crosses a crate boundary on the request path says this,
/// so the failover executor (and the edge SDK) decide from data, never from
/// error text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryAdvice {
    /// Nothing reached the client: the same request may go to another node.
    BeforeFirstByte,
    /// The client's request is at fault (400, 422, ...): retrying anywhere
    /// gives the same answer.
    Never,
    /// Part of the answer has already been delivered; a resend would
    /// duplicate output. The stream must end with an error instead.
    Committed,
}

impl RetryAdvice {
    pub fn may_retry(self) -> bool {
        matches!(self, RetryAdvice::BeforeFirstByte)
    }

    /// The retry rule for an upstream HTTP status on an inference route,
    /// before any body byte was forwarded. `advertised` says whether the node
    /// claimed to hold the model (a 404 from an advertised owner is a stale
    /// inventory, not a client error).
    pub fn for_status(status: u16, advertised: bool) -> Option<RetryAdvice> {
        match status {
            200..=399 => None,
            404 if advertised => Some(RetryAdvice::BeforeFirstByte),
            408 | 429 | 500..=599 => Some(RetryAdvice::BeforeFirstByte),
            _ => Some(RetryAdvice::Never),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_rules_match_the_failover_contract() {
        assert_eq!(RetryAdvice::for_status(200, true), None);
        assert_eq!(
            RetryAdvice::for_status(404, true),
            Some(RetryAdvice::BeforeFirstByte)
        );
        assert_eq!(
            RetryAdvice::for_status(404, false),
            Some(RetryAdvice::Never)
        );
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(RetryAdvice::for_status(s, true).unwrap().may_retry(), "{s}");
        }
        for s in [400, 401, 403, 413, 422] {
            assert_eq!(
                RetryAdvice::for_status(s, true),
                Some(RetryAdvice::Never),
                "{s}"
            );
        }
    }
}
