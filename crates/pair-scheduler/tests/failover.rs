//! Properties of the failover rules over random answer sequences and
//! clocks: never more than the dispatch cap, never a dispatch after a
//! commit (no resend after the first byte), a client error ends the
//! request at once, a node is tried again only after it refused for now,
//! untried candidates go first and in ranking order, no wait runs past the
//! request's patience, and the request ends committed or given up; with a
//! deadline, no attempt or wait starts past it and a request that reaches
//! it gives up saying so.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::time::Duration;

use pair_scheduler::pair_core::{NodeId, RetryAdvice};
use pair_scheduler::{Decision, Failover, FailoverConfig, GiveUp, Outcome, Step, Target};
use proptest::prelude::*;

/// What a node does with one attempt.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// A head with this status (and a `Retry-After` in ms); for 2xx/3xx,
    /// then its first byte (`true`) or a cut.
    Status(u16, Option<u16>, bool),
    /// A transport failure; `true`: refused for now.
    Fails(&'static str, bool),
    Stalls,
}

fn answer() -> impl Strategy<Value = Answer> {
    let status = prop_oneof![
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
    ];
    prop_oneof![
        (status, proptest::option::of(0u16..5_000), any::<bool>())
            .prop_map(|(s, r, b)| Answer::Status(s, r, b)),
        (
            prop_oneof![Just("connect"), Just("transport"), Just("no-link")],
            any::<bool>()
        )
            .prop_map(|(c, t)| Answer::Fails(c, t)),
        Just(Answer::Stalls),
    ]
}

fn is_client_error(s: u16) -> bool {
    (400..500).contains(&s) && !matches!(s, 404 | 408 | 429)
}

fn refuses_for_now(a: Answer) -> bool {
    matches!(a, Answer::Status(429 | 503, _, _) | Answer::Fails(_, true))
}

/// How a request ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Committed { node: usize, status: u16 },
    GaveUp(GiveUp),
}

/// Runs the failover against `answers[node]` (each attempt on a node takes
/// its next answer; past the end, the last one again) with the first
/// `present` nodes as candidates, as a shell would, checking the
/// invariants on the way; returns how it ended and the nodes dispatched to.
fn drive(answers: &[Vec<Answer>], present: usize, cfg: FailoverConfig) -> (End, Vec<usize>) {
    let targets: Vec<Target> = (0..present)
        .map(|i| Target {
            node: NodeId::from_u128(i as u128),
            predicted: None,
        })
        .collect();
    let mut f = Failover::new(cfg);
    let mut now = Duration::ZERO;
    let mut sent = Vec::new();
    let mut taken = vec![0usize; answers.len()];
    loop {
        let node = match f.next_step(now, &targets) {
            Step::Dispatch {
                node, stall_after, ..
            } => {
                assert_eq!(stall_after, cfg.stall_floor);
                node
            }
            Step::Wait(d) => {
                assert!(d > Duration::ZERO || now <= cfg.patience);
                now += d;
                assert!(now <= cfg.patience, "waited past the patience");
                assert!(
                    cfg.deadline.is_none_or(|dl| now <= dl),
                    "waited past the deadline"
                );
                continue;
            }
            Step::GiveUp(why) => {
                if cfg.deadline.is_some_and(|dl| now >= dl) {
                    assert_eq!(why, GiveUp::Deadline, "gave up at the deadline");
                }
                return (End::GaveUp(why), sent);
            }
        };
        assert!(now <= cfg.patience, "dispatched past the patience");
        assert!(
            cfg.deadline.is_none_or(|dl| now < dl),
            "dispatched at or past the deadline"
        );
        // An attempt takes 10 ms; one the deadline comes during is cut
        // there by the shell.
        if let Some(dl) = cfg.deadline
            && now + Duration::from_millis(10) > dl
        {
            sent.push(targets.iter().position(|t| t.node == node).unwrap());
            now = dl;
            assert_eq!(f.report(now, Outcome::PastDeadline), Decision::Next);
            continue;
        }
        let i = targets.iter().position(|t| t.node == node).unwrap();
        sent.push(i);
        let a = answers[i][taken[i].min(answers[i].len() - 1)];
        taken[i] += 1;
        let d = match a {
            Answer::Status(status, retry, body_ok) => {
                let retry_after = retry.map(|ms| Duration::from_millis(u64::from(ms)));
                match f.report(
                    now,
                    Outcome::Head {
                        status,
                        retry_after,
                    },
                ) {
                    Decision::AwaitFirstByte => {
                        if body_ok {
                            assert_eq!(f.report(now, Outcome::FirstByte), Decision::Commit);
                            return (End::Committed { node: i, status }, sent);
                        }
                        f.report(
                            now,
                            Outcome::Failed {
                                class: "body",
                                advice: RetryAdvice::BeforeFirstByte,
                                transient: false,
                            },
                        )
                    }
                    Decision::Commit => return (End::Committed { node: i, status }, sent),
                    d => d,
                }
            }
            Answer::Fails(class, transient) => f.report(
                now,
                Outcome::Failed {
                    class,
                    advice: RetryAdvice::BeforeFirstByte,
                    transient,
                },
            ),
            Answer::Stalls => f.report(now, Outcome::Stalled),
        };
        assert_eq!(d, Decision::Next);
        assert_eq!(
            f.failed().len(),
            sent.len(),
            "every failed attempt is logged"
        );
        now += Duration::from_millis(10);
    }
}

proptest! {
    #[test]
    fn the_rules_hold_for_any_answers(
        answers in proptest::collection::vec(proptest::collection::vec(answer(), 1..4), 0..7),
        patience_ms in 100u64..20_000,
    ) {
        let cfg = FailoverConfig {
            patience: Duration::from_millis(patience_ms),
            ..FailoverConfig::default()
        };
        let (end, sent) = drive(&answers, answers.len(), cfg);
        prop_assert!(sent.len() <= cfg.max_dispatches);
        // Untried candidates first, in ranking order: the first dispatches
        // are 0, 1, 2, ... as far as they go.
        let distinct = answers.len().min(sent.len());
        let firsts: Vec<usize> = sent.iter().copied().take(distinct).collect();
        prop_assert_eq!(firsts, (0..distinct).collect::<Vec<_>>());
        // A node goes again only after it refused for now.
        for (k, &node) in sent.iter().enumerate() {
            if let Some(prev) = sent[..k].iter().rposition(|&n| n == node) {
                let attempts_on_node = sent[..=prev].iter().filter(|&&n| n == node).count();
                let a = answers[node][(attempts_on_node - 1).min(answers[node].len() - 1)];
                prop_assert!(refuses_for_now(a), "node {node} retried after {a:?}");
            }
        }
        match end {
            End::Committed { node, status } => {
                prop_assert_eq!(sent.last().copied(), Some(node), "committed to the last dispatch");
                prop_assert!((200..400).contains(&status) || is_client_error(status));
            }
            End::GaveUp(why) => {
                if answers.is_empty() {
                    prop_assert_eq!(why, GiveUp::NoCandidate);
                } else {
                    prop_assert!(matches!(why, GiveUp::Exhausted { .. }), "gave up: {:?}", why);
                }
            }
        }
    }

    /// A deadline bounds every step: nothing starts past it, and a request
    /// that reaches it ends saying so (checked in `drive`).
    #[test]
    fn the_deadline_bounds_every_step(
        answers in proptest::collection::vec(proptest::collection::vec(answer(), 1..4), 1..7),
        deadline_ms in 0u64..200,
    ) {
        let cfg = FailoverConfig {
            deadline: Some(Duration::from_millis(deadline_ms)),
            ..FailoverConfig::default()
        };
        let (end, sent) = drive(&answers, answers.len(), cfg);
        prop_assert!(sent.len() <= cfg.max_dispatches);
        if deadline_ms == 0 {
            prop_assert_eq!(end, End::GaveUp(GiveUp::Deadline));
            prop_assert!(sent.is_empty());
        }
    }

    /// A client error from the first node ends the request at once.
    #[test]
    fn a_client_error_is_never_retried(
        status in prop_oneof![Just(400u16), Just(401), Just(403), Just(413), Just(422)],
        rest in proptest::collection::vec(proptest::collection::vec(answer(), 1..3), 0..5),
    ) {
        let mut answers = vec![vec![Answer::Status(status, None, true)]];
        answers.extend(rest);
        let (end, sent) = drive(&answers, answers.len(), FailoverConfig::default());
        prop_assert_eq!(end, End::Committed { node: 0, status });
        prop_assert_eq!(sent.len(), 1);
    }

    /// The only owner refusing for now is tried again until it answers, as
    /// long as the cap and the patience allow.
    #[test]
    fn a_busy_only_owner_is_ridden_out(refusals in 1usize..6) {
        let mut seq = vec![Answer::Status(503, None, false); refusals];
        seq.push(Answer::Status(200, None, true));
        let (end, sent) = drive(&[seq], 1, FailoverConfig::default());
        if refusals < FailoverConfig::default().max_dispatches {
            prop_assert_eq!(end, End::Committed { node: 0, status: 200 });
            prop_assert_eq!(sent.len(), refusals + 1);
        } else {
            prop_assert!(matches!(end, End::GaveUp(GiveUp::Exhausted { .. })), "ended: {:?}", end);
            prop_assert_eq!(sent.len(), FailoverConfig::default().max_dispatches);
        }
    }
}
