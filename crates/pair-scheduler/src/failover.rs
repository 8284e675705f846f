//! The failover rules as a state machine with no I/O: where a request goes
//! next, which answers end it, how long to wait before trying again, and
//! when to give up. Time comes in as an argument (how long since the
//! request arrived).
//!
//! The shell that performs the attempts (a node's pipeline, the edge SDK)
//! asks [`Failover::next_step`] what to do, passing the request's current
//! candidates (they change as nodes come and go), reports how each attempt
//! went with [`Failover::report`], and does what the answer says; it never
//! decides a retry itself. The rules:
//!
//! - A transport failure (refused or reset connection, no route to the
//!   node), a stalled attempt, a body that fails before its first byte, and
//!   the statuses 404 (from a node that advertised the model), 408, 429
//!   and 5xx move the request to the next candidate.
//! - Any other 4xx (400, 401, 422, ...) is the client's own fault: it goes
//!   back as it is, and nothing is retried.
//! - A 2xx or 3xx head is not yet a commitment: the request is committed
//!   when the first byte goes to the client, and from then on never resent.
//! - When every candidate has been tried, one that refused only for now
//!   (503, 429, a refused or reset connection) is tried again, after a
//!   back-off that honours its `Retry-After`: a single-owner cluster rides
//!   out a busy engine.
//! - When the candidates vanish in the middle of the retries (every owner
//!   unhealthy or gone), the request waits for one to come back.
//! - No retry or wait starts after the request's patience has run out (a
//!   candidate never tried still is: a stalled attempt alone can use up the
//!   patience), and at most [`FailoverConfig::max_dispatches`] attempts are
//!   made.
//! - A request with a deadline (the client's own bound) starts no attempt
//!   and no wait past it; an attempt still out at the deadline is cut by
//!   the shell ([`Outcome::PastDeadline`]), and the request gives up
//!   ([`GiveUp::Deadline`]).
//! - An attempt is cut when its node makes no progress for its stall
//!   allowance: [`FailoverConfig::stall_floor`], or a multiple of the
//!   scheduler's predicted time to first byte when that is longer (a queue
//!   or a cold load is waited for; a hung engine is not), but only when
//!   there is somewhere else to go ([`Failover::elsewhere`]). The only
//!   owner, or the last one not yet failed, is waited for: up to the
//!   client's deadline, else [`FailoverConfig::silent_wait`]. Slow is an
//!   answer; cut, it is none.

use std::time::Duration;

use pair_core::{NodeId, RetryAdvice};

/// Dispatches per request, including the one that answers.
pub const MAX_DISPATCHES: usize = 5;

/// How a request's failover behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverConfig {
    /// Attempts at most, the first included.
    pub max_dispatches: usize,
    /// The shortest stall allowance: how long a node may show no progress
    /// before its attempt is cut.
    pub stall_floor: Duration,
    /// The stall allowance is at least this many times the node's predicted
    /// time to first byte (queue, load and prefill).
    pub prediction_factor: u32,
    /// How long after its arrival a request may still start an attempt or
    /// wait for one (back-offs, owners coming back).
    pub patience: Duration,
    /// First back-off before trying a node that refused again; doubles per
    /// refusal up to [`FailoverConfig::backoff_max`].
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// How often to look again when no owner of the model is left.
    pub owner_poll: Duration,
    /// The client's bound on the whole request (since its arrival), when
    /// it set one: past it, nothing more is tried.
    pub deadline: Option<Duration>,
    /// How long after its arrival a request with nowhere else to go still
    /// waits on a node that shows no progress (the client's deadline, when
    /// it set one, comes first).
    pub silent_wait: Duration,
    /// Whether the request has somewhere to go when its attempt here is
    /// cut. `None`: judged from its candidates (the request is routed
    /// here). `Some(_)`: what the node that relayed it said (it tries the
    /// other nodes; this node tries only itself).
    pub elsewhere: Option<bool>,
}

/// How long a request waits on its only owner while the owner shows no
/// progress, by default: an engine's cold load of a 70B model from a slow
/// disk, or a queue of work pair did not route, takes minutes.
pub const SILENT_WAIT: Duration = Duration::from_secs(600);

impl Default for FailoverConfig {
    fn default() -> Self {
        Self {
            max_dispatches: MAX_DISPATCHES,
            stall_floor: Duration::from_secs(20),
            prediction_factor: 3,
            patience: Duration::from_secs(120),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(5),
            owner_poll: Duration::from_millis(250),
            deadline: None,
            silent_wait: SILENT_WAIT,
            elsewhere: None,
        }
    }
}

/// A node the request may go to now, best first, with the scheduler's
/// predicted time to its first byte when it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: NodeId,
    pub predicted: Option<Duration>,
}

/// How one attempt went, as the shell saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The answer's head arrived; nothing went to the client yet.
    /// `retry_after`: the answer's `Retry-After`, when it has one.
    Head {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// The first byte of the answer went to the client: the request is the
    /// client's from here.
    FirstByte,
    /// Nothing usable came back: the connection failed, the node could not
    /// be reached, or the body failed before the first byte went out.
    /// `class` is a short stable label (`connect`, `transport`, `no-link`,
    /// `body`); `advice` the failure's own retry advice (one that no node
    /// could fix stops the request); `transient`: the node refused for now
    /// (a refused or reset connection) and may take it again soon.
    Failed {
        class: &'static str,
        advice: RetryAdvice,
        transient: bool,
    },
    /// The node made no progress within the attempt's stall allowance.
    Stalled,
    /// The request's deadline came while the attempt was out (no sign
    /// that the node is at fault).
    PastDeadline,
}

/// What the shell does after [`Failover::report`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Hand this answer to the client, as it stands; no resend after this.
    Commit,
    /// Read on until the first byte can go to the client (within the same
    /// stall allowance), then report again.
    AwaitFirstByte,
    /// This attempt is over: ask [`Failover::next_step`].
    Next,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send the request to `node`; cut the attempt if the node shows no
    /// progress for `stall_after` (and there is somewhere else to go).
    /// `alone`: no other candidate is left if this attempt fails (a relayed
    /// attempt tells its node so, which then waits on a silent engine).
    Dispatch {
        node: NodeId,
        stall_after: Duration,
        alone: bool,
    },
    /// Wait this long (a back-off, or for an owner to come back), then ask
    /// again.
    Wait(Duration),
    /// Stop: nothing was committed.
    GiveUp(GiveUp),
}

/// Why a request ended without an answer committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// No node was eligible when the request arrived.
    NoCandidate,
    /// Every attempt failed; `stalled`: at least one by its stall allowance.
    Exhausted { stalled: bool },
    /// Every owner left in the middle of the retries and none came back
    /// within the request's patience.
    OwnersGone,
    /// The client's deadline passed before an answer was committed.
    Deadline,
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
    Stalled,
}

impl FailedOutcome {
    /// The label receipts and error bodies show: the status (`503`) or the
    /// transport class (`connect`, `first-byte-timeout` for a stall).
    pub fn label(&self) -> std::borrow::Cow<'static, str> {
        match self {
            FailedOutcome::Status(s) => s.to_string().into(),
            FailedOutcome::Failed(class) => (*class).into(),
            FailedOutcome::Stalled => "first-byte-timeout".into(),
        }
    }
}

/// What one node did with the request so far.
#[derive(Clone, Copy, Debug)]
struct Tried {
    node: NodeId,
    /// Refusals for now (503, 429, refused or reset connections) in a row.
    refusals: u32,
    /// When the node may be tried again (since the request's arrival);
    /// `None`: not again.
    again_at: Option<Duration>,
}

/// Where the current attempt stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Between attempts (or before the first).
    Idle,
    /// An attempt is out to this node.
    Out(NodeId),
    /// Its head was a success: waiting for the first byte.
    AwaitingByte(NodeId),
    /// Done: an answer was committed, or the request gave up.
    Done,
}

/// One request's failover.
#[derive(Clone, Debug)]
pub struct Failover {
    cfg: FailoverConfig,
    tried: Vec<Tried>,
    dispatched: usize,
    phase: Phase,
    failed: Vec<FailedAttempt>,
    stalled: bool,
    /// A failure said no other node would do better.
    stopped: bool,
    /// The candidates vanished after an attempt: waiting for an owner.
    owners_gone: bool,
    /// Why it gave up, once it did.
    gave_up: Option<GiveUp>,
}

impl Failover {
    pub fn new(cfg: FailoverConfig) -> Self {
        Self {
            cfg,
            tried: Vec::new(),
            dispatched: 0,
            phase: Phase::Idle,
            failed: Vec::new(),
            stalled: false,
            stopped: false,
            owners_gone: false,
            gave_up: None,
        }
    }

    /// What to do next, `now` after the request arrived, with the request's
    /// current `targets` (best first).
    pub fn next_step(&mut self, now: Duration, targets: &[Target]) -> Step {
        debug_assert!(
            matches!(self.phase, Phase::Idle | Phase::Done),
            "next_step() while an attempt is out"
        );
        if let Some(why) = self.gave_up {
            return Step::GiveUp(why);
        }
        if self.cfg.deadline.is_some_and(|d| now >= d) {
            return self.give_up(GiveUp::Deadline);
        }
        if self.stopped || self.dispatched >= self.cfg.max_dispatches {
            return self.give_up(self.exhausted());
        }
        if targets.is_empty() {
            if self.dispatched == 0 && !self.owners_gone {
                return self.give_up(GiveUp::NoCandidate);
            }
            // Owners went away mid-retries: wait for one to come back.
            self.owners_gone = true;
            return match self.wait_until(now, now + self.cfg.owner_poll) {
                Some(step) => step,
                None => self.give_up(GiveUp::OwnersGone),
            };
        }
        if let Some(t) = targets
            .iter()
            .find(|t| !self.tried.iter().any(|x| x.node == t.node))
        {
            return self.dispatch(*t, targets);
        }
        // Every present candidate has been tried: the one that refused only
        // for now and may be tried soonest, after its back-off.
        let again = targets
            .iter()
            .filter_map(|t| {
                let x = self.tried.iter().find(|x| x.node == t.node)?;
                Some((x.again_at?, *t))
            })
            .min_by_key(|(at, _)| *at);
        match again {
            None => self.give_up(self.exhausted()),
            // A retry due before the patience ran out, found after it (the
            // attempt that failed last ran past it), does not start.
            Some(_) if now > self.cfg.patience => self.give_up(self.exhausted()),
            Some((at, t)) if at <= now => self.dispatch(t, targets),
            Some((at, _)) => match self.wait_until(now, at) {
                Some(step) => step,
                None => self.give_up(self.exhausted()),
            },
        }
    }

    fn exhausted(&self) -> GiveUp {
        GiveUp::Exhausted {
            stalled: self.stalled,
        }
    }

    fn give_up(&mut self, why: GiveUp) -> Step {
        self.phase = Phase::Done;
        self.gave_up = Some(why);
        Step::GiveUp(why)
    }

    /// A wait until `at`, or `None` when that is past the request's
    /// patience; a wait past the deadline ends at the deadline (where the
    /// request gives up).
    fn wait_until(&self, now: Duration, at: Duration) -> Option<Step> {
        if let Some(d) = self.cfg.deadline
            && at > d
        {
            return Some(Step::Wait(d.saturating_sub(now)));
        }
        (at <= self.cfg.patience).then(|| Step::Wait(at.saturating_sub(now)))
    }

    fn dispatch(&mut self, t: Target, targets: &[Target]) -> Step {
        self.dispatched += 1;
        self.phase = Phase::Out(t.node);
        if !self.tried.iter().any(|x| x.node == t.node) {
            self.tried.push(Tried {
                node: t.node,
                refusals: 0,
                again_at: None,
            });
        }
        let predicted = t
            .predicted
            .map(|p| p.saturating_mul(self.cfg.prediction_factor))
            .unwrap_or_default();
        Step::Dispatch {
            node: t.node,
            stall_after: self.cfg.stall_floor.max(predicted),
            alone: !self.elsewhere(t.node, targets),
        }
    }

    /// Whether cutting `node`'s attempt would leave the request somewhere
    /// to go, given its candidates now: another one not yet tried (or
    /// that refused only for now), within the dispatches left; for a
    /// relayed request, what its origin said. Where there is none, a
    /// silent attempt is waited for rather than cut.
    pub fn elsewhere(&self, node: NodeId, targets: &[Target]) -> bool {
        if let Some(told) = self.cfg.elsewhere {
            return told;
        }
        if self.stopped || self.dispatched >= self.cfg.max_dispatches {
            return false;
        }
        targets.iter().any(|t| {
            t.node != node
                && self
                    .tried
                    .iter()
                    .find(|x| x.node == t.node)
                    .is_none_or(|x| x.again_at.is_some())
        })
    }

    /// Until when (since the request's arrival) an attempt with nowhere
    /// else to go is waited on while its node shows no progress.
    pub fn silent_bound(&self) -> Duration {
        self.cfg.deadline.unwrap_or(self.cfg.silent_wait)
    }

    /// How the attempt out now went, `now` after the request arrived; what
    /// to do about it.
    pub fn report(&mut self, now: Duration, outcome: Outcome) -> Decision {
        let node = match self.phase {
            Phase::Out(n) | Phase::AwaitingByte(n) => n,
            Phase::Idle | Phase::Done => {
                debug_assert!(false, "report() with no attempt out");
                return Decision::Next;
            }
        };
        let (failed, refusal, retry_after) = match (self.phase, outcome) {
            (_, Outcome::FirstByte) => {
                self.phase = Phase::Done;
                return Decision::Commit;
            }
            (_, Outcome::PastDeadline) => {
                self.phase = Phase::Done;
                self.gave_up = Some(GiveUp::Deadline);
                return Decision::Next;
            }
            (
                Phase::Out(_),
                Outcome::Head {
                    status,
                    retry_after,
                },
            ) => {
                match RetryAdvice::for_status(status, true) {
                    None => {
                        self.phase = Phase::AwaitingByte(node);
                        return Decision::AwaitFirstByte;
                    }
                    Some(RetryAdvice::BeforeFirstByte) => (
                        FailedOutcome::Status(status),
                        matches!(status, 429 | 503),
                        retry_after,
                    ),
                    // The client's own error: it goes back as it is.
                    Some(_) => {
                        self.phase = Phase::Done;
                        return Decision::Commit;
                    }
                }
            }
            (
                _,
                Outcome::Failed {
                    class,
                    advice,
                    transient,
                },
            ) => {
                self.stopped |= !advice.may_retry();
                (FailedOutcome::Failed(class), transient, None)
            }
            (_, Outcome::Stalled) => {
                self.stalled = true;
                (FailedOutcome::Stalled, false, None)
            }
            (_, Outcome::Head { .. }) => {
                debug_assert!(false, "a second head for one attempt");
                (FailedOutcome::Failed("transport"), false, None)
            }
        };
        let backoff = self.backoff_after(node, refusal);
        if let Some(x) = self.tried.iter_mut().find(|x| x.node == node) {
            if refusal {
                x.refusals += 1;
                // Saturating: a peer's `Retry-After` can be any number.
                x.again_at = Some(now.saturating_add(backoff.max(retry_after.unwrap_or_default())));
            } else {
                x.again_at = None;
            }
        }
        self.failed.push(FailedAttempt {
            node,
            outcome: failed,
        });
        self.phase = Phase::Idle;
        Decision::Next
    }

    /// The back-off before `node` is tried again after one more refusal.
    fn backoff_after(&self, node: NodeId, refusal: bool) -> Duration {
        if !refusal {
            return Duration::ZERO;
        }
        let before = self
            .tried
            .iter()
            .find(|x| x.node == node)
            .map_or(0, |x| x.refusals);
        self.cfg
            .backoff_base
            .saturating_mul(1 << before.min(16))
            .min(self.cfg.backoff_max)
    }

    /// The attempts that failed so far, in order.
    pub fn failed(&self) -> &[FailedAttempt] {
        &self.failed
    }

    /// Says the model has owners, all of them down for now (an unhealthy
    /// engine, a node out of routing): with no candidate, the request waits
    /// for one to come back (until its patience) instead of giving up as
    /// [`GiveUp::NoCandidate`].
    pub fn owners_down(&mut self) {
        self.owners_gone = true;
    }

    /// The client's deadline, since the request's arrival, when it set one.
    pub fn deadline(&self) -> Option<Duration> {
        self.cfg.deadline
    }

    /// Dispatches made so far (the committed one included).
    pub fn dispatched(&self) -> usize {
        self.dispatched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u128) -> NodeId {
        NodeId::from_u128(i)
    }

    fn t(i: u128) -> Target {
        Target {
            node: n(i),
            predicted: None,
        }
    }

    fn dispatch(f: &mut Failover, now: Duration, targets: &[Target]) -> NodeId {
        match f.next_step(now, targets) {
            Step::Dispatch { node, .. } => node,
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    const ZERO: Duration = Duration::ZERO;

    fn head(status: u16) -> Outcome {
        Outcome::Head {
            status,
            retry_after: None,
        }
    }

    fn failed(class: &'static str) -> Outcome {
        Outcome::Failed {
            class,
            advice: RetryAdvice::BeforeFirstByte,
            transient: false,
        }
    }

    #[test]
    fn a_success_commits_at_its_first_byte() {
        let mut f = Failover::new(FailoverConfig::default());
        assert_eq!(dispatch(&mut f, ZERO, &[t(1), t(2)]), n(1));
        assert_eq!(f.report(ZERO, head(200)), Decision::AwaitFirstByte);
        assert_eq!(f.report(ZERO, Outcome::FirstByte), Decision::Commit);
        assert_eq!(f.dispatched(), 1);
        assert!(f.failed().is_empty());
    }

    #[test]
    fn retryable_failures_move_on_and_client_errors_stop() {
        let mut f = Failover::new(FailoverConfig::default());
        let all = [t(1), t(2), t(3), t(4)];
        assert_eq!(dispatch(&mut f, ZERO, &all), n(1));
        assert_eq!(f.report(ZERO, head(500)), Decision::Next);
        assert_eq!(dispatch(&mut f, ZERO, &all), n(2));
        assert_eq!(f.report(ZERO, head(200)), Decision::AwaitFirstByte);
        assert_eq!(f.report(ZERO, failed("body")), Decision::Next);
        assert_eq!(dispatch(&mut f, ZERO, &all), n(3));
        assert_eq!(f.report(ZERO, head(422)), Decision::Commit);
        let labels: Vec<_> = f.failed().iter().map(|a| a.outcome.label()).collect();
        assert_eq!(labels, ["500", "body"]);
    }

    #[test]
    fn all_failing_gives_up_naming_a_stall() {
        let mut f = Failover::new(FailoverConfig::default());
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        f.report(ZERO, Outcome::Stalled);
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        f.report(ZERO, failed("transport"));
        assert_eq!(
            f.next_step(ZERO, &[t(1), t(2)]),
            Step::GiveUp(GiveUp::Exhausted { stalled: true })
        );
        let mut none = Failover::new(FailoverConfig::default());
        assert_eq!(none.next_step(ZERO, &[]), Step::GiveUp(GiveUp::NoCandidate));
    }

    #[test]
    fn owners_that_are_all_down_are_waited_for_until_patience() {
        let cfg = FailoverConfig {
            patience: Duration::from_secs(1),
            ..FailoverConfig::default()
        };
        let mut f = Failover::new(cfg);
        f.owners_down();
        assert_eq!(f.next_step(ZERO, &[]), Step::Wait(cfg.owner_poll));
        // One comes back.
        assert!(matches!(
            f.next_step(cfg.owner_poll, &[t(1)]),
            Step::Dispatch { .. }
        ));
        let mut g = Failover::new(cfg);
        g.owners_down();
        assert_eq!(
            g.next_step(Duration::from_secs(1), &[]),
            Step::GiveUp(GiveUp::OwnersGone)
        );
    }

    #[test]
    fn a_failure_no_node_can_fix_stops_the_request() {
        let mut f = Failover::new(FailoverConfig::default());
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        f.report(
            ZERO,
            Outcome::Failed {
                class: "bad-request",
                advice: RetryAdvice::Never,
                transient: false,
            },
        );
        assert_eq!(
            f.next_step(ZERO, &[t(1), t(2)]),
            Step::GiveUp(GiveUp::Exhausted { stalled: false })
        );
        assert_eq!(f.dispatched(), 1);
    }

    #[test]
    fn the_only_owner_is_tried_again_after_backing_off_as_it_asks() {
        let mut f = Failover::new(FailoverConfig::default());
        let only = [t(1)];
        assert_eq!(dispatch(&mut f, ZERO, &only), n(1));
        f.report(ZERO, head(503));
        // 200 ms back-off, then the same node.
        assert_eq!(
            f.next_step(ZERO, &only),
            Step::Wait(Duration::from_millis(200))
        );
        let at = Duration::from_millis(200);
        assert_eq!(dispatch(&mut f, at, &only), n(1));
        // A Retry-After longer than the back-off is honoured.
        f.report(
            at,
            Outcome::Head {
                status: 429,
                retry_after: Some(Duration::from_secs(2)),
            },
        );
        assert_eq!(f.next_step(at, &only), Step::Wait(Duration::from_secs(2)));
        // A refused connection is for now too; a 500 is not.
        let at = at + Duration::from_secs(2);
        dispatch(&mut f, at, &only);
        f.report(
            at,
            Outcome::Failed {
                class: "connect",
                advice: RetryAdvice::BeforeFirstByte,
                transient: true,
            },
        );
        let at = at + Duration::from_secs(1);
        dispatch(&mut f, at, &only);
        f.report(at, head(500));
        assert_eq!(
            f.next_step(at, &only),
            Step::GiveUp(GiveUp::Exhausted { stalled: false })
        );
        assert_eq!(f.dispatched(), 4);
    }

    #[test]
    fn no_wait_runs_past_the_request_s_patience() {
        let cfg = FailoverConfig {
            patience: Duration::from_secs(1),
            ..FailoverConfig::default()
        };
        let mut f = Failover::new(cfg);
        dispatch(&mut f, ZERO, &[t(1)]);
        f.report(
            ZERO,
            Outcome::Head {
                status: 503,
                retry_after: Some(Duration::from_secs(30)),
            },
        );
        assert_eq!(
            f.next_step(ZERO, &[t(1)]),
            Step::GiveUp(GiveUp::Exhausted { stalled: false })
        );
    }

    /// An attempt that fails after the patience has run out leaves a
    /// candidate never tried to be tried, but no retry of one that was,
    /// even one already due.
    #[test]
    fn no_retry_starts_once_a_failed_attempt_ran_past_the_patience() {
        let cfg = FailoverConfig {
            patience: Duration::from_millis(200),
            ..FailoverConfig::default()
        };
        let refused = || Outcome::Failed {
            class: "connect",
            advice: RetryAdvice::BeforeFirstByte,
            transient: true,
        };
        let late = Duration::from_millis(250);
        let mut f = Failover::new(cfg);
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        f.report(late, refused());
        assert!(matches!(
            f.next_step(late, &[t(1), t(2)]),
            Step::Dispatch { node, .. } if node == t(2).node
        ));
        // Both refused for now; node 1's back-off is over by the time node
        // 2 refuses, and so is the patience.
        let later = late + cfg.backoff_max;
        f.report(later, refused());
        assert_eq!(
            f.next_step(later, &[t(1), t(2)]),
            Step::GiveUp(GiveUp::Exhausted { stalled: false })
        );
    }

    #[test]
    fn any_retry_after_a_peer_sends_is_a_bounded_wait() {
        let mut f = Failover::new(FailoverConfig::default());
        let now = Duration::from_secs(1);
        dispatch(&mut f, now, &[t(1)]);
        f.report(
            now,
            Outcome::Head {
                status: 429,
                retry_after: Some(Duration::MAX),
            },
        );
        assert_eq!(
            f.next_step(now, &[t(1)]),
            Step::GiveUp(GiveUp::Exhausted { stalled: false })
        );
    }

    #[test]
    fn owners_that_leave_mid_retries_are_waited_for() {
        let mut f = Failover::new(FailoverConfig::default());
        dispatch(&mut f, ZERO, &[t(1)]);
        f.report(ZERO, failed("transport"));
        // The owner left the routing set.
        assert_eq!(
            f.next_step(ZERO, &[]),
            Step::Wait(Duration::from_millis(250))
        );
        // It came back (a new process: try it again).
        let at = Duration::from_millis(250);
        assert_eq!(
            f.next_step(at, &[t(2)]),
            Step::Dispatch {
                node: n(2),
                stall_after: FailoverConfig::default().stall_floor,
                alone: true,
            }
        );
        f.report(at, head(200));
        assert_eq!(f.report(at, Outcome::FirstByte), Decision::Commit);
        // Nobody comes back within the patience: 503 says so.
        let cfg = FailoverConfig {
            patience: Duration::from_millis(300),
            ..FailoverConfig::default()
        };
        let mut f = Failover::new(cfg);
        dispatch(&mut f, ZERO, &[t(1)]);
        f.report(ZERO, failed("transport"));
        assert!(matches!(f.next_step(ZERO, &[]), Step::Wait(_)));
        assert_eq!(
            f.next_step(Duration::from_millis(250), &[]),
            Step::GiveUp(GiveUp::OwnersGone)
        );
    }

    #[test]
    fn the_deadline_ends_the_request_saying_so() {
        let cfg = FailoverConfig {
            deadline: Some(Duration::from_millis(500)),
            ..FailoverConfig::default()
        };
        // Cut at the deadline while out: given up, the node not blamed.
        let mut f = Failover::new(cfg);
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        assert_eq!(
            f.report(Duration::from_millis(500), Outcome::PastDeadline),
            Decision::Next
        );
        assert!(f.failed().is_empty());
        assert_eq!(
            f.next_step(Duration::from_millis(500), &[t(1), t(2)]),
            Step::GiveUp(GiveUp::Deadline)
        );
        // A back-off that would run past it ends at it.
        let mut f = Failover::new(cfg);
        dispatch(&mut f, ZERO, &[t(1)]);
        f.report(Duration::from_millis(400), head(503));
        let Step::Wait(d) = f.next_step(Duration::from_millis(400), &[t(1)]) else {
            panic!("expected a wait")
        };
        assert!(d <= Duration::from_millis(100), "{d:?}");
        assert_eq!(
            f.next_step(Duration::from_millis(500), &[t(1)]),
            Step::GiveUp(GiveUp::Deadline)
        );
    }

    #[test]
    fn a_slow_prediction_widens_the_stall_allowance() {
        let mut f = Failover::new(FailoverConfig::default());
        let cold = Target {
            node: n(1),
            predicted: Some(Duration::from_secs(130)),
        };
        assert_eq!(
            f.next_step(ZERO, &[cold]),
            Step::Dispatch {
                node: n(1),
                stall_after: Duration::from_secs(390),
                alone: true,
            }
        );
    }

    /// A silent attempt is cut only where the request has somewhere to
    /// go: a candidate not yet tried (or that refused only for now),
    /// dispatches left, or, relayed, what its origin said.
    #[test]
    fn only_a_request_with_somewhere_to_go_may_leave_its_node() {
        let mut f = Failover::new(FailoverConfig::default());
        let Step::Dispatch { alone, .. } = f.next_step(ZERO, &[t(1), t(2)]) else {
            panic!("expected a dispatch")
        };
        assert!(!alone);
        assert!(f.elsewhere(n(1), &[t(1), t(2)]));
        // The other owner left: the only owner is waited on.
        assert!(!f.elsewhere(n(1), &[t(1)]));
        // One appeared: the request may move there.
        assert!(f.elsewhere(n(1), &[t(1), t(3)]));
        // An owner that already failed the request is not somewhere to go;
        // one that refused only for now is.
        f.report(ZERO, failed("transport"));
        let Step::Dispatch { node, alone, .. } = f.next_step(ZERO, &[t(1), t(2)]) else {
            panic!("expected a dispatch")
        };
        assert_eq!((node, alone), (n(2), true));
        assert!(!f.elsewhere(n(2), &[t(1), t(2)]));
        let mut f = Failover::new(FailoverConfig::default());
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        f.report(ZERO, head(503));
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        assert!(f.elsewhere(n(2), &[t(1), t(2)]), "1 may be tried again");
        // No dispatches left.
        let mut f = Failover::new(FailoverConfig {
            max_dispatches: 1,
            ..FailoverConfig::default()
        });
        dispatch(&mut f, ZERO, &[t(1), t(2)]);
        assert!(!f.elsewhere(n(1), &[t(1), t(2)]));
        // Relayed: the origin's word, whatever the candidates here.
        for told in [true, false] {
            let mut f = Failover::new(FailoverConfig {
                elsewhere: Some(told),
                max_dispatches: 1,
                ..FailoverConfig::default()
            });
            dispatch(&mut f, ZERO, &[t(1)]);
            assert_eq!(f.elsewhere(n(1), &[t(1)]), told);
        }
        // The bound of the wait: the client's deadline, else the default.
        assert_eq!(
            Failover::new(FailoverConfig::default()).silent_bound(),
            SILENT_WAIT
        );
        let d = Duration::from_secs(30);
        assert_eq!(
            Failover::new(FailoverConfig {
                deadline: Some(d),
                ..FailoverConfig::default()
            })
            .silent_bound(),
            d
        );
    }
}
