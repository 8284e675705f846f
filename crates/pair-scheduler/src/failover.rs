//! The failover rules as a state machine with no I/O: which candidate a
//! request goes to next, which answers end it, and when it gives up.
//!
//! The shell that performs the attempts (a node's pipeline, the edge SDK)
//! asks [`Failover::next_step`] where to send the request, reports how each
//! attempt went with [`Failover::report`], and does what the answer says;
//! it never decides a retry itself. The rules:
//!
//! - A transport failure (refused or reset connection, no route to the
//!   node), a missed first-byte deadline, a body that fails before its first
//!   byte, and the statuses 404 (from a node that advertised the model), 408,
//!   429 and 5xx move the request to the next candidate.
//! - Any other 4xx (400, 401, 422, ...) is the client's own fault: it goes
//!   back as it is, and nothing is retried.
//! - A 2xx or 3xx head is not yet a commitment: the request is committed to
//!   that node when the first body byte arrives (an engine that dies between
//!   head and body is still retried), and from then on never resent.
//! - At most [`FailoverConfig::max_dispatches`] candidates are tried.
//! - When every candidate failed, the request ends with the proxy's own
//!   error ([`GiveUp`]), or with the last upstream answer when the plan asks
//!   for it ([`FailoverConfig::pass_last_answer`]).

use std::time::Duration;

use pair_core::{NodeId, RetryAdvice};

/// Dispatches per request, including the one that answers.
pub const MAX_DISPATCHES: usize = 5;

/// How a request's failover behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// Candidates tried at most (the first included).
    pub max_dispatches: usize,
    /// How long an attempt may take to its first body byte.
    pub first_byte: Duration,
    /// When the last possible attempt fails with an upstream answer, that
    /// answer goes back to the client instead of the proxy's own error
    /// (a node running a relayed request answers its origin this way, so
    /// the origin sees the engine's status).
    pub pass_last_answer: bool,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            max_dispatches: MAX_DISPATCHES,
            first_byte: Duration::from_secs(120),
            pass_last_answer: false,
        }
    }
}

/// How one attempt went, as the shell saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The answer's head arrived; no body byte yet.
    Head { status: u16 },
    /// The first body byte arrived (or the body ended empty): the request
    /// is the client's from here.
    FirstByte,
    /// Nothing usable came back: the connection failed, the node could not
    /// be reached, or the body failed before its first byte. `class` is a
    /// short stable label (`connect`, `transport`, `no-link`, `body`);
    /// `advice` is the failure's own retry advice (an attempt that cannot
    /// succeed anywhere stops the request).
    Failed {
        class: &'static str,
        advice: RetryAdvice,
    },
    /// The first-byte deadline passed.
    TimedOut,
}

/// What the shell does after [`Failover::report`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Hand this answer to the client, as it stands; no resend after this.
    Commit,
    /// Read on to the first body byte (within the same deadline), then
    /// report again.
    AwaitFirstByte,
    /// This attempt is over: ask [`Failover::next_step`].
    Next,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the request to `node`, expecting its first body byte within
    /// `first_byte`.
    Dispatch { node: NodeId, first_byte: Duration },
    /// Stop: nothing was committed.
    GiveUp(GiveUp),
}

/// Why a request ended without an answer to pass on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// No node was eligible at all.
    NoCandidate,
    /// Every attempt failed; `timed_out`: at least one by its deadline.
    Exhausted { timed_out: bool },
}

/// One failed attempt, for receipts, job records and error bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedAttempt {
    pub node: NodeId,
    pub outcome: FailedOutcome,
}

/// How an attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailedOutcome {
    Status(u16),
    Failed(&'static str),
    TimedOut,
}

impl FailedOutcome {
    /// The label receipts and error bodies show: the status (`503`) or the
    /// transport class (`connect`, `first-byte-timeout`).
    pub fn label(&self) -> std::borrow::Cow<'static, str> {
        match self {
            FailedOutcome::Status(s) => s.to_string().into(),
            FailedOutcome::Failed(class) => (*class).into(),
            FailedOutcome::TimedOut => "first-byte-timeout".into(),
        }
    }
}

/// Where the current attempt stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between attempts (or before the first).
    Idle,
    /// An attempt is out to this node.
    Out(NodeId),
    /// Its head was a success: waiting for the first body byte.
    AwaitingByte(NodeId),
    /// Done: an answer was committed, or the request gave up.
    Done,
}

/// One request's failover.
#[derive(Clone, Debug)]
pub struct Failover {
    cfg: FailoverConfig,
    candidates: Vec<NodeId>,
    /// Next candidate to try.
    cursor: usize,
    dispatched: usize,
    phase: Phase,
    failed: Vec<FailedAttempt>,
    timed_out: bool,
    /// A failure said no other node would do better.
    stopped: bool,
}

impl Failover {
    /// A failover over `candidates`, best first (the scheduler's ranking).
    pub fn new(candidates: impl IntoIterator<Item = NodeId>, cfg: FailoverConfig) -> Self {
        Self {
            cfg,
            candidates: candidates.into_iter().take(cfg.max_dispatches).collect(),
            cursor: 0,
            dispatched: 0,
            phase: Phase::Idle,
            failed: Vec::new(),
            timed_out: false,
            stopped: false,
        }
    }

    /// Where the request goes next, or why it stops.
    pub fn next_step(&mut self) -> Step {
        debug_assert!(
            matches!(self.phase, Phase::Idle),
            "next_step() while an attempt is out"
        );
        if self.phase == Phase::Done {
            return Step::GiveUp(self.give_up_reason());
        }
        if self.stopped
            || self.dispatched >= self.cfg.max_dispatches
            || self.cursor >= self.candidates.len()
        {
            self.phase = Phase::Done;
            return Step::GiveUp(self.give_up_reason());
        }
        let node = self.candidates[self.cursor];
        self.cursor += 1;
        self.dispatched += 1;
        self.phase = Phase::Out(node);
        Step::Dispatch {
            node,
            first_byte: self.cfg.first_byte,
        }
    }

    fn give_up_reason(&self) -> GiveUp {
        if self.candidates.is_empty() {
            GiveUp::NoCandidate
        } else {
            GiveUp::Exhausted {
                timed_out: self.timed_out,
            }
        }
    }

    /// Whether another attempt could still be made after the current one.
    fn more_to_try(&self) -> bool {
        self.dispatched < self.cfg.max_dispatches && self.cursor < self.candidates.len()
    }

    /// How the attempt out now went; what to do about it.
    pub fn report(&mut self, outcome: Outcome) -> Decision {
        let node = match self.phase {
            Phase::Out(n) | Phase::AwaitingByte(n) => n,
            Phase::Idle | Phase::Done => {
                debug_assert!(false, "report() with no attempt out");
                return Decision::Next;
            }
        };
        let failed = match (self.phase, outcome) {
            (Phase::Out(_), Outcome::Head { status }) => {
                match RetryAdvice::for_status(status, true) {
                    None => {
                        self.phase = Phase::AwaitingByte(node);
                        return Decision::AwaitFirstByte;
                    }
                    Some(RetryAdvice::BeforeFirstByte)
                        if !self.cfg.pass_last_answer || self.more_to_try() =>
                    {
                        FailedOutcome::Status(status)
                    }
                    // The client's own error (or the last answer, passed
                    // on): it goes back as it is.
                    Some(_) => {
                        self.phase = Phase::Done;
                        return Decision::Commit;
                    }
                }
            }
            (_, Outcome::FirstByte) => {
                self.phase = Phase::Done;
                return Decision::Commit;
            }
            (_, Outcome::Failed { class, advice }) => {
                self.stopped |= !advice.may_retry();
                FailedOutcome::Failed(class)
            }
            (_, Outcome::TimedOut) => {
                self.timed_out = true;
                FailedOutcome::TimedOut
            }
            (_, Outcome::Head { .. }) => {
                debug_assert!(false, "a second head for one attempt");
                FailedOutcome::Failed("transport")
            }
        };
        self.failed.push(FailedAttempt {
            node,
            outcome: failed,
        });
        self.phase = Phase::Idle;
        Decision::Next
    }

    /// The attempts that failed so far, in order.
    pub fn failed(&self) -> &[FailedAttempt] {
        &self.failed
    }

    /// Dispatches made so far (the committed one included).
    pub fn dispatched(&self) -> usize {
        self.dispatched
    }

    /// Whether an attempt missed its deadline.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u128) -> NodeId {
        NodeId::from_u128(i)
    }

    fn dispatch(f: &mut Failover) -> NodeId {
        match f.next_step() {
            Step::Dispatch { node, .. } => node,
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    #[test]
    fn a_success_commits_at_its_first_byte() {
        let mut f = Failover::new([n(1), n(2)], FailoverConfig::default());
        assert_eq!(dispatch(&mut f), n(1));
        assert_eq!(
            f.report(Outcome::Head { status: 200 }),
            Decision::AwaitFirstByte
        );
        assert_eq!(f.report(Outcome::FirstByte), Decision::Commit);
        assert_eq!(f.dispatched(), 1);
        assert!(f.failed().is_empty());
    }

    #[test]
    fn retryable_failures_move_on_and_client_errors_stop() {
        let mut f = Failover::new([n(1), n(2), n(3), n(4)], FailoverConfig::default());
        assert_eq!(dispatch(&mut f), n(1));
        assert_eq!(f.report(Outcome::Head { status: 503 }), Decision::Next);
        assert_eq!(dispatch(&mut f), n(2));
        assert_eq!(
            f.report(Outcome::Head { status: 200 }),
            Decision::AwaitFirstByte
        );
        assert_eq!(
            f.report(Outcome::Failed {
                class: "body",
                advice: RetryAdvice::BeforeFirstByte
            }),
            Decision::Next
        );
        assert_eq!(dispatch(&mut f), n(3));
        assert_eq!(f.report(Outcome::Head { status: 422 }), Decision::Commit);
        let labels: Vec<_> = f.failed().iter().map(|a| a.outcome.label()).collect();
        assert_eq!(labels, ["503", "body"]);
    }

    #[test]
    fn all_failing_gives_up_naming_a_timeout() {
        let mut f = Failover::new([n(1), n(2)], FailoverConfig::default());
        dispatch(&mut f);
        f.report(Outcome::TimedOut);
        dispatch(&mut f);
        f.report(Outcome::Failed {
            class: "connect",
            advice: RetryAdvice::BeforeFirstByte,
        });
        assert_eq!(
            f.next_step(),
            Step::GiveUp(GiveUp::Exhausted { timed_out: true })
        );
        assert_eq!(
            Failover::new([], FailoverConfig::default()).next_step(),
            Step::GiveUp(GiveUp::NoCandidate)
        );
    }

    #[test]
    fn a_failure_no_node_can_fix_stops_the_request() {
        let mut f = Failover::new([n(1), n(2)], FailoverConfig::default());
        dispatch(&mut f);
        f.report(Outcome::Failed {
            class: "bad-request",
            advice: RetryAdvice::Never,
        });
        assert_eq!(
            f.next_step(),
            Step::GiveUp(GiveUp::Exhausted { timed_out: false })
        );
        assert_eq!(f.dispatched(), 1);
    }

    #[test]
    fn the_last_answer_is_passed_on_when_the_plan_asks() {
        let cfg = FailoverConfig {
            pass_last_answer: true,
            ..FailoverConfig::default()
        };
        let mut f = Failover::new([n(1), n(2)], cfg);
        dispatch(&mut f);
        assert_eq!(f.report(Outcome::Head { status: 503 }), Decision::Next);
        dispatch(&mut f);
        assert_eq!(f.report(Outcome::Head { status: 503 }), Decision::Commit);
    }
}
