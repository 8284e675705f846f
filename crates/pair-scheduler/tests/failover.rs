//! Properties of the failover rules over random answer sequences: never
//! more than the dispatch cap, never a dispatch after a commit (no resend
//! after the first byte), a client error ends the request at once, each
//! candidate is tried at most once and in ranking order, and the request
//! ends with the last upstream answer or the proxy's own error.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use pair_scheduler::pair_core::{NodeId, RetryAdvice};
use pair_scheduler::{Decision, Failover, FailoverConfig, GiveUp, Outcome, Step};
use proptest::prelude::*;

/// What a node does with one attempt.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// A head with this status; for 2xx/3xx, then its first byte or a cut.
    Status(u16, bool),
    Fails(&'static str),
    Hangs,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        (
            prop_oneof![
                Just(200u16),
                Just(204),
                Just(301),
                Just(400),
                Just(401),
                Just(404),
                Just(408),
                Just(422),
                Just(429),
                Just(500),
                Just(502),
                Just(503)
            ],
            any::<bool>()
        )
            .prop_map(|(s, b)| Answer::Status(s, b)),
        prop_oneof![Just("connect"), Just("transport"), Just("no-link")].prop_map(Answer::Fails),
        Just(Answer::Hangs),
    ]
}

/// How a request ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Committed to this attempt's answer (its index), with this status.
    Committed {
        attempt: usize,
        status: u16,
    },
    GaveUp(GiveUp),
}

fn is_client_error(s: u16) -> bool {
    (400..500).contains(&s) && !matches!(s, 404 | 408 | 429)
}

/// Runs the failover against `answers` (one per candidate), as a shell
/// would, checking the invariants on the way.
fn drive(answers: &[Answer], cfg: FailoverConfig) -> (End, Vec<NodeId>) {
    let nodes: Vec<NodeId> = (0..answers.len() as u128).map(NodeId::from_u128).collect();
    let mut f = Failover::new(nodes.iter().copied(), cfg);
    let mut sent = Vec::new();
    loop {
        let node = match f.next_step() {
            Step::Dispatch { node, first_byte } => {
                assert_eq!(first_byte, cfg.first_byte);
                node
            }
            Step::GiveUp(why) => return (End::GaveUp(why), sent),
        };
        sent.push(node);
        let i = nodes.iter().position(|n| *n == node).unwrap();
        let attempt = sent.len() - 1;
        let d = match answers[i] {
            Answer::Status(status, body_ok) => match f.report(Outcome::Head { status }) {
                Decision::AwaitFirstByte => {
                    if body_ok {
                        assert_eq!(f.report(Outcome::FirstByte), Decision::Commit);
                        return (End::Committed { attempt, status }, sent);
                    }
                    f.report(Outcome::Failed {
                        class: "body",
                        advice: RetryAdvice::BeforeFirstByte,
                    })
                }
                Decision::Commit => return (End::Committed { attempt, status }, sent),
                d => d,
            },
            Answer::Fails(class) => f.report(Outcome::Failed {
                class,
                advice: RetryAdvice::BeforeFirstByte,
            }),
            Answer::Hangs => f.report(Outcome::TimedOut),
        };
        assert_eq!(d, Decision::Next);
        assert_eq!(
            f.failed().len(),
            sent.len(),
            "every failed attempt is logged"
        );
    }
}

proptest! {
    #[test]
    fn the_rules_hold_for_any_answers(
        answers in proptest::collection::vec(answer(), 0..9),
        pass_last in any::<bool>(),
    ) {
        let cfg = FailoverConfig { pass_last_answer: pass_last, ..FailoverConfig::default() };
        let (end, sent) = drive(&answers, cfg);
        // Never over the cap; each candidate at most once, in ranking order.
        prop_assert!(sent.len() <= cfg.max_dispatches);
        let want: Vec<NodeId> = (0..sent.len() as u128).map(NodeId::from_u128).collect();
        prop_assert_eq!(&sent, &want);
        match end {
            End::Committed { attempt, status } => {
                // Committed to the last dispatch: nothing after it.
                prop_assert_eq!(attempt + 1, sent.len());
                let retryable = !(200..400).contains(&status) && !is_client_error(status);
                if retryable {
                    // Only the last possible answer is passed on, and only
                    // when the plan asks.
                    prop_assert!(pass_last);
                    prop_assert_eq!(sent.len(), answers.len().min(cfg.max_dispatches));
                }
                // Every earlier attempt failed in a way that is retried.
                for a in &answers[..attempt] {
                    let retried = match *a {
                        Answer::Status(s, ok) => !(is_client_error(s) || (200..400).contains(&s) && ok),
                        Answer::Fails(_) | Answer::Hangs => true,
                    };
                    prop_assert!(retried, "{a:?} was retried");
                }
            }
            End::GaveUp(why) => {
                if answers.is_empty() {
                    prop_assert_eq!(why, GiveUp::NoCandidate);
                } else {
                    prop_assert_eq!(sent.len(), answers.len().min(cfg.max_dispatches));
                    let hung = answers.iter().take(sent.len()).any(|a| matches!(a, Answer::Hangs));
                    prop_assert_eq!(why, GiveUp::Exhausted { timed_out: hung });
                    // No client error or success ever gave up.
                    for a in answers.iter().take(sent.len()) {
                        if let Answer::Status(s, ok) = *a {
                            prop_assert!(!is_client_error(s));
                            prop_assert!(!((200..400).contains(&s) && ok));
                        }
                    }
                }
            }
        }
    }

    /// A client error from the first node ends the request at once.
    #[test]
    fn a_client_error_is_never_retried(
        status in prop_oneof![Just(400u16), Just(401), Just(403), Just(413), Just(422)],
        rest in proptest::collection::vec(answer(), 0..5),
    ) {
        let mut answers = vec![Answer::Status(status, true)];
        answers.extend(rest);
        let (end, sent) = drive(&answers, FailoverConfig::default());
        prop_assert_eq!(end, End::Committed { attempt: 0, status });
        prop_assert_eq!(sent.len(), 1);
    }
}
