//! The `x-pair-*` header names, the only place they are spelled (tidy):
//! what a client asks of the node it calls, what a node and the one it
//! relays to tell each other, and the receipt every routed answer carries.

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
/// it under the same id as its origin. On an answer (the receipt): the
/// job that served it, as the job records and `pair-node jobs` name it.
pub const JOB_HEADER: HeaderName = HeaderName::from_static("x-pair-job");

/// On a relayed request: no other node is left to take it if this attempt
/// fails, so the node waits on an engine that shows no progress (up to
/// the request's silent bound) rather than give it up.
pub const ALONE_HEADER: HeaderName = HeaderName::from_static("x-pair-alone");

/// On a relayed request: its sender holds requests at the cluster while
/// slots are full (late binding), so the node takes it only into a free
/// slot of its engine, and otherwise refuses it at once (class
/// `slots-full`) for the sender to wait with. The node reads its engine
/// live; the sender's view of it may be a report old, so two nodes never
/// both count the same free slot. Its value is the request's priority
/// (`interactive` or `batch`): with preemption, the node may cut a batch
/// answer it runs to give interactive work the slot.
pub const FREE_SLOT_HEADER: HeaderName = HeaderName::from_static("x-pair-free-slot");

/// On a relayed request: a batch answer its sender continues if it is cut
/// (`--queue preempt`), so the node may cut its stream to give its slot
/// to interactive work, whoever sent that; its value is the answer's
/// length in tokens as the sender plans it.
pub const CUTTABLE_HEADER: HeaderName = HeaderName::from_static("x-pair-cuttable");

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

/// The receipt: `name (uuid)` of the node that served the answer.
pub const NODE_HEADER: HeaderName = HeaderName::from_static("x-pair-node");

/// The receipt: how many nodes were tried, the one that answered included.
pub const ATTEMPTS_HEADER: HeaderName = HeaderName::from_static("x-pair-attempts");

/// The receipt: the routing policy that chose the node.
pub const POLICY_HEADER: HeaderName = HeaderName::from_static("x-pair-policy");

/// The receipt, when the client sent [`EXPLAIN_HEADER`]: the scheduler's
/// reasoning for the node it chose.
pub const ROUTE_HEADER: HeaderName = HeaderName::from_static("x-pair-route");

/// The receipt, when an alias chose the model: the model that answered.
pub const MODEL_HEADER: HeaderName = HeaderName::from_static("x-pair-model");

/// On a translated answer: the translation it took (`ollama->openai`,
/// `anthropic->openai`, `responses->chat`).
pub const TRANSLATED_HEADER: HeaderName = HeaderName::from_static("x-pair-translated");

/// On a translated answer: the client's fields translation left out
/// (`context_management,output_config.effort`); they steer the vendor's
/// service, not the text.
pub const DROPPED_HEADER: HeaderName = HeaderName::from_static("x-pair-dropped");

/// On an answer a node made itself rather than pass on from an engine (a
/// relaying peer's own error): an origin does not hand it to its client as
/// the last answer.
pub const MADE_HEADER: HeaderName = HeaderName::from_static("x-pair-made");

/// The answer headers a browser page of an allowed origin may read
/// (`Access-Control-Expose-Headers`).
pub const EXPOSED: &str =
    "x-pair-node, x-pair-attempts, x-pair-job, x-pair-model, x-pair-dropped, retry-after";

#[cfg(test)]
mod tests {
    use super::*;

    /// What a page may read is the receipt's own names (and `retry-after`).
    #[test]
    fn the_exposed_names_are_the_answers_headers() {
        let answer = [
            NODE_HEADER,
            ATTEMPTS_HEADER,
            JOB_HEADER,
            MODEL_HEADER,
            DROPPED_HEADER,
            http::header::RETRY_AFTER,
        ];
        let exposed: Vec<&str> = EXPOSED.split(", ").collect();
        let names: Vec<&str> = answer.iter().map(HeaderName::as_str).collect();
        assert_eq!(exposed, names);
    }

    #[test]
    fn a_reservation_reads_back() {
        let v = reservation_value(7, 42);
        assert_eq!(parse_reservation(v.as_bytes()), Some((7, 42)));
        assert_eq!(parse_reservation(b"7"), None);
        assert_eq!(parse_reservation(b"a.1"), None);
    }
}
