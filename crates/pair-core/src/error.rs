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

/// One class of failure before an answer's first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureClass {
    /// The short, stable label receipts, job records, metrics and the
    /// cluster link carry.
    pub label: &'static str,
    /// Whether another node may take the request.
    pub moves_on: bool,
    /// Whether the node refused only for now (the same node may take the
    /// request again after a back-off).
    pub transient: bool,
    pub what: &'static str,
}

impl FailureClass {
    pub fn advice(&self) -> RetryAdvice {
        if self.moves_on {
            RetryAdvice::BeforeFirstByte
        } else {
            RetryAdvice::Never
        }
    }
}

/// Every class of failure before an answer's first byte, and whether it
/// moves the request on. The node's pipeline and the edge SDK label their
/// own failures from it; a node that gives up on a relayed request names
/// the class on the link, and the sender treats the attempt exactly as
/// its own. An engine's own error status (a 502 or 504 it sent) is not a
/// class: it is an answer, kept in case it is the last.
pub const FAILURE_CLASSES: &[FailureClass] = &[
    FailureClass {
        label: "connect",
        moves_on: true,
        transient: true,
        what: "the connection was refused: the process is down or restarting",
    },
    FailureClass {
        label: "connect-timeout",
        moves_on: true,
        transient: false,
        what: "no connection within its bound",
    },
    FailureClass {
        label: "reset",
        moves_on: true,
        transient: true,
        what: "the connection was reset or closed before the answer's head",
    },
    FailureClass {
        label: "transport",
        moves_on: true,
        transient: false,
        what: "another transport failure before the answer's head",
    },
    FailureClass {
        label: "tls-refused",
        moves_on: true,
        transient: false,
        what: "the node refused this certificate, or its own is not the one pinned",
    },
    FailureClass {
        label: "no-link",
        moves_on: true,
        transient: false,
        what: "no route to the node: not paired, or not reachable",
    },
    FailureClass {
        label: "body",
        moves_on: true,
        transient: false,
        what: "the answer's body failed before its first byte",
    },
    FailureClass {
        label: "first-byte-timeout",
        moves_on: true,
        transient: false,
        what: "the engine showed no progress within the attempt's allowance",
    },
    FailureClass {
        label: "owners-down",
        moves_on: true,
        transient: true,
        what: "the node's engines for the model were down and none came back in time",
    },
    FailureClass {
        label: "slots-full",
        moves_on: true,
        transient: false,
        what: "every slot of the node's engine was taken (its sender holds the request at the cluster for one)",
    },
    FailureClass {
        label: "preempted",
        moves_on: true,
        transient: false,
        what: "batch work cut before its first byte to give its slot to interactive work (its sender holds it at the cluster again)",
    },
    FailureClass {
        label: "bad-request",
        moves_on: false,
        transient: false,
        what: "the request cannot be sent as it is: no node would do better",
    },
    FailureClass {
        label: "deadline",
        moves_on: false,
        transient: false,
        what: "the client's x-pair-deadline passed",
    },
];

/// The class with this label.
pub fn failure_class(label: &str) -> Option<&'static FailureClass> {
    FAILURE_CLASSES.iter().find(|c| c.label == label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_class_is_listed_once() {
        for (i, c) in FAILURE_CLASSES.iter().enumerate() {
            assert!(
                FAILURE_CLASSES[..i].iter().all(|o| o.label != c.label),
                "{} twice",
                c.label
            );
            assert_eq!(failure_class(c.label), Some(c));
            assert!(!c.transient || c.moves_on, "{}", c.label);
            assert_eq!(c.advice().may_retry(), c.moves_on);
        }
        assert_eq!(failure_class("502"), None);
    }

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
