//! The `x-pair-*` request header names: what a client asks of the node it
//! calls, and what a node and the one it relays to tell each other.

use http::HeaderName;

/// Asks for a particular node (UUID or name); it goes first if eligible.
pub const PIN_HEADER: HeaderName = HeaderName::from_static("x-pair-node-pin");
/// Names a conversation for session affinity.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("x-pair-session");
/// Asks for the scheduler's reasoning in the receipt (`x-pair-route`).
pub const EXPLAIN_HEADER: HeaderName = HeaderName::from_static("x-pair-explain");

/// The client's bound on a request: `x-pair-deadline: SECONDS` (a
/// positive number, fractions allowed, at most a day).
pub const DEADLINE_HEADER: HeaderName = HeaderName::from_static("x-pair-deadline");

/// The request's class: `x-pair-priority: interactive | batch` (or
/// `high | normal | low`, `critical | standard | sheddable`).
pub const PRIORITY_HEADER: HeaderName = HeaderName::from_static("x-pair-priority");

/// On a relayed request: the job it is, so the node that runs it records
/// it under the same id as its origin.
pub const JOB_HEADER: HeaderName = HeaderName::from_static("x-pair-job");

/// On a relayed request: no other node is left to take it if this attempt
/// fails, so the node waits on an engine that shows no progress (up to
/// the request's silent bound) rather than give it up.
pub const ALONE_HEADER: HeaderName = HeaderName::from_static("x-pair-alone");

/// On a node's own error answer to a relayed request, when it gave up
/// before any answer from its engine: the failure's class
/// ([`pair_core::FAILURE_CLASSES`]), so the node (or edge client) that
/// sent it treats the attempt as it treats its own: moved on, or not, by
/// the class, never by guessing from the status.
pub const FAILED_HEADER: HeaderName = HeaderName::from_static("x-pair-failed");

/// On a relayed request: the sender's reservation for it, `EPOCH.SEQ`
/// (the sender's process, and the reservation's number among the sender's
/// reservations on this node: [`pair_core::Admitted`]). The node
/// that takes it says in its reports which it has counted
/// ([`pair_core::NodeSnapshot::admitted`]), so the sender stops adding the
/// reservation exactly when a report counts the request.
pub const RESERVATION_HEADER: HeaderName = HeaderName::from_static("x-pair-reservation");

/// [`RESERVATION_HEADER`]'s value.
pub fn reservation_value(epoch: u64, seq: u64) -> http::HeaderValue {
    http::HeaderValue::from_str(&format!("{epoch}.{seq}"))
        .unwrap_or(http::HeaderValue::from_static("0.0"))
}

/// [`RESERVATION_HEADER`]'s value read back: `(epoch, seq)`.
pub fn parse_reservation(v: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(v).ok()?;
    let (epoch, seq) = s.split_once('.')?;
    Some((epoch.parse().ok()?, seq.parse().ok()?))
}
