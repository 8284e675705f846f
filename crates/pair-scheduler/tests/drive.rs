//! Properties of the failover driver itself ([`pair_scheduler::drive`]),
//! run against a fake hop with scripted answers on virtual time (tokio's
//! paused clock): any script of refusals, 5xx, cuts, hangs and slow but
//! progressing nodes ends with exactly one outcome, within a bound; never
//! more sends than the dispatch cap; a first byte read is committed and
//! nothing is sent after it; a client error is committed as it is; a hung
//! node is cut at its stall allowance, a slow one that shows progress is
//! not; with a deadline, no send starts past it and the request ends by
//! it.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pair_scheduler::drive::{Classified, Driven, Exchange, Timer, drive};
use pair_scheduler::pair_core::NodeId;
use pair_scheduler::{Failover, FailoverConfig, GiveUp, Step, Target};
use proptest::prelude::*;
use tokio::time::Instant;

/// What a node does with one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Script {
    /// The connection fails; `true`: refused for now.
    Refused(bool),
    /// A head with this status (a `Retry-After` in seconds).
    Status(u16, Option<u8>),
    /// A 200 head; then its first byte, a cut, or nothing at all.
    Ok(Body),
    /// Nothing at all, and no progress: a hung node.
    Hangs,
    /// A 200 head after this many seconds, showing progress all along
    /// (a cold load or a queue the node reports).
    Slow(u8),
    /// A 200 head after this many seconds, nothing shown meanwhile (an
    /// engine queued behind work pair did not route, a slow disk).
    Quiet(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    First,
    Cut,
    Silent,
}

fn script() -> impl Strategy<Value = Script> {
    let status = prop_oneof![
        Just(400u16),
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
        any::<bool>().prop_map(Script::Refused),
        (status, proptest::option::of(0u8..4)).prop_map(|(s, r)| Script::Status(s, r)),
        prop_oneof![Just(Body::First), Just(Body::Cut), Just(Body::Silent)].prop_map(Script::Ok),
        Just(Script::Hangs),
        (1u8..60).prop_map(Script::Slow),
        (1u8..120).prop_map(Script::Quiet),
    ]
}

struct FakeError(bool);

impl Classified for FakeError {
    fn class(&self) -> &'static str {
        if self.0 { "reset" } else { "connect" }
    }
    fn transient(&self) -> bool {
        self.0
    }
}

/// What happened, for the checks.
#[derive(Default, Debug)]
struct Log {
    /// Each send: when (since arrival), to which node, what it did.
    sends: Vec<(Duration, usize, Script)>,
    /// Attempts whose first byte was read.
    first_bytes: Vec<usize>,
    stalled: Vec<(Duration, usize)>,
    /// Attempts waited on with nowhere else to go: when, which node.
    alone: Vec<(Duration, usize)>,
    /// The node out now, and until when it shows progress.
    progressing: Option<(usize, Duration)>,
}

struct Fake {
    t0: Instant,
    nodes: usize,
    /// One more node joins at this time (since the request's arrival).
    joins_at: Option<Duration>,
    script: Vec<Script>,
    log: RefCell<Log>,
}

struct Head {
    node: usize,
    status: u16,
    retry_after: Option<Duration>,
    body: Body,
}

fn id(i: usize) -> NodeId {
    NodeId::from_u128(i as u128 + 1)
}

fn index(node: NodeId) -> usize {
    usize::try_from(node.as_uuid().as_u128()).unwrap() - 1
}

impl Exchange for Fake {
    type Head = Head;
    type Answer = (usize, u16);
    type Kept = u16;
    type Ticket = usize;
    type Error = FakeError;

    fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()> {
        tokio::time::sleep_until(self.t0 + at)
    }

    fn choose(
        &self,
        _first: bool,
        decide: &mut dyn FnMut(&[Target], bool) -> Step,
    ) -> (Step, Option<usize>) {
        let targets = self.targets();
        let step = decide(&targets, false);
        let ticket = match step {
            Step::Dispatch { node, .. } => Some(index(node)),
            _ => None,
        };
        (step, ticket)
    }

    async fn send(&self, node: NodeId, ticket: Option<usize>) -> Result<Head, FakeError> {
        let i = index(node);
        assert_eq!(ticket, Some(i), "the ticket is the chosen node's");
        let k = self.log.borrow().sends.len();
        let s = self
            .script
            .get(k)
            .copied()
            .unwrap_or(Script::Ok(Body::First));
        self.log.borrow_mut().sends.push((self.now(), i, s));
        let head = |status, retry_after: Option<u8>, body| Head {
            node: i,
            status,
            retry_after: retry_after.map(|s| Duration::from_secs(u64::from(s))),
            body,
        };
        match s {
            Script::Refused(t) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Err(FakeError(t))
            }
            Script::Status(status, ra) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(head(status, ra, Body::First))
            }
            Script::Ok(body) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(head(200, None, body))
            }
            Script::Hangs => std::future::pending().await,
            Script::Slow(secs) => {
                let took = Duration::from_secs(u64::from(secs));
                self.log.borrow_mut().progressing = Some((i, self.now() + took));
                tokio::time::sleep(took).await;
                Ok(head(200, None, Body::First))
            }
            Script::Quiet(secs) => {
                tokio::time::sleep(Duration::from_secs(u64::from(secs))).await;
                Ok(head(200, None, Body::First))
            }
        }
    }

    fn status(&self, _node: NodeId, head: &Head) -> (u16, Option<Duration>) {
        (head.status, head.retry_after)
    }

    async fn first_byte(&self, head: &mut Head) -> Result<(), FakeError> {
        match head.body {
            Body::First => {
                self.log.borrow_mut().first_bytes.push(head.node);
                Ok(())
            }
            Body::Cut => Err(FakeError(false)),
            Body::Silent => std::future::pending().await,
        }
    }

    fn commit(&self, node: NodeId, head: Head) -> (usize, u16) {
        (index(node), head.status)
    }

    async fn keep(&self, _node: NodeId, head: Head) -> Option<u16> {
        Some(head.status)
    }

    fn last_progress(&self, node: NodeId) -> Option<Duration> {
        let log = self.log.borrow();
        match log.progressing {
            Some((i, until)) if i == index(node) => Some(self.now().min(until)),
            _ => None,
        }
    }

    fn candidates(&self) -> Vec<Target> {
        self.targets()
    }

    fn stalled(&self, node: NodeId) {
        let now = self.now();
        self.log.borrow_mut().stalled.push((now, index(node)));
    }

    fn waiting_alone(&self, node: NodeId) {
        let now = self.now();
        self.log.borrow_mut().alone.push((now, index(node)));
    }
}

impl Fake {
    fn targets(&self) -> Vec<Target> {
        let joined = self.joins_at.is_some_and(|at| self.now() >= at);
        (0..self.nodes + usize::from(joined))
            .map(|i| Target {
                node: id(i),
                predicted: None,
            })
            .collect()
    }
}

/// A tokio timer on the request's clock.
struct Lent {
    t0: Instant,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Future for Lent {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }
}

impl Timer for Lent {
    fn rearm(mut self: Pin<&mut Self>, at: Duration) {
        let at = self.t0 + at;
        self.sleep.as_mut().reset(at);
    }
}

fn is_client_error(s: u16) -> bool {
    (400..500).contains(&s) && !matches!(s, 404 | 408 | 429)
}

fn run(
    script: Vec<Script>,
    nodes: usize,
    cfg: FailoverConfig,
) -> (Driven<(usize, u16), u16>, Log, Duration, usize) {
    run_joining(script, nodes, None, cfg)
}

/// [`run`], with one more node joining at `joins_at`.
fn run_joining(
    script: Vec<Script>,
    nodes: usize,
    joins_at: Option<Duration>,
    cfg: FailoverConfig,
) -> (Driven<(usize, u16), u16>, Log, Duration, usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let t0 = Instant::now();
        let fake = Fake {
            t0,
            nodes,
            joins_at,
            script,
            log: RefCell::default(),
        };
        let mut failover = Failover::new(cfg);
        let mut timer = Lent {
            t0,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        };
        // Bounded: a driver that never ends fails here, on virtual time.
        let end = tokio::time::timeout(
            Duration::from_secs(3_600),
            drive(&fake, &mut failover, Pin::new(&mut timer)),
        )
        .await
        .expect("the driver ends");
        let took = t0.elapsed();
        (end, fake.log.into_inner(), took, failover.dispatched())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_script_ends_once_with_no_resend_after_a_byte(
        script in proptest::collection::vec(script(), 0..8),
        nodes in 1usize..4,
        deadline_s in proptest::option::of(1u64..90),
    ) {
        let cfg = FailoverConfig {
            stall_floor: Duration::from_secs(5),
            patience: Duration::from_secs(30),
            deadline: deadline_s.map(Duration::from_secs),
            silent_wait: Duration::from_secs(100),
            ..FailoverConfig::default()
        };
        let (end, log, took, dispatched) = run(script, nodes, cfg);
        prop_assert!(log.sends.len() <= cfg.max_dispatches);
        prop_assert_eq!(log.sends.len(), dispatched);
        // The request ends within its patience, one stall allowance, and
        // the longest a scripted node took, or its silent bound (a silent
        // node with no other to go to is waited for), or by its deadline.
        let bound = (cfg.patience + cfg.stall_floor + Duration::from_secs(120))
            .max(cfg.silent_wait + Duration::from_secs(1));
        prop_assert!(took <= bound, "took {took:?}");
        if let Some(d) = cfg.deadline {
            prop_assert!(took <= d, "past the deadline: {took:?}");
            prop_assert!(log.sends.iter().all(|(at, _, _)| *at < d), "sent past the deadline");
        }
        // A first byte read is committed, and nothing is sent after it.
        prop_assert!(log.first_bytes.len() <= 1);
        if let Some(&n) = log.first_bytes.first() {
            prop_assert_eq!(log.sends.last().map(|s| s.1), Some(n));
            let committed = matches!(end, Driven::Committed { answer: (i, 200), .. } if i == n);
            prop_assert!(committed, "{:?}", end);
        }
        // A client error is committed as it is, and is the last send.
        if let Some(k) = log.sends.iter().position(|(_, _, s)| matches!(s, Script::Status(c, _) if is_client_error(*c))) {
            prop_assert_eq!(k, log.sends.len() - 1);
            let committed = matches!(end, Driven::Committed { answer: (_, c), .. } if is_client_error(c));
            prop_assert!(committed, "{:?}", end);
        }
        // Every stall is a hung or silent node cut at its allowance: a
        // slow node that shows progress never is. One waited on with
        // nowhere else to go is cut only at the silent bound.
        let silent_bound = cfg.deadline.unwrap_or(cfg.silent_wait);
        for &(at, node) in &log.stalled {
            let (sent_at, n, s) = *log.sends.iter().rev().find(|(t, n, _)| *t <= at && *n == node).unwrap();
            prop_assert_eq!(n, node);
            prop_assert!(matches!(s, Script::Hangs | Script::Ok(Body::Silent) | Script::Quiet(_)), "{s:?} cut as stalled");
            prop_assert!(at >= sent_at + cfg.stall_floor, "cut early: {at:?} after {sent_at:?}");
            if log.alone.iter().any(|&(t, n)| n == node && t >= sent_at && t <= at) {
                prop_assert!(at >= silent_bound, "waited alone, then cut early at {at:?}");
            }
        }
        // An attempt is waited on alone only where no other node is left:
        // every other node was tried, or dispatches are used up.
        for &(at, node) in &log.alone {
            let tried: std::collections::BTreeSet<usize> =
                log.sends.iter().filter(|(t, _, _)| *t <= at).map(|s| s.1).collect();
            prop_assert!(
                tried.len() == nodes || log.sends.len() >= cfg.max_dispatches,
                "waited on {node} alone at {at:?} with untried nodes: {tried:?}"
            );
        }
        match end {
            Driven::Committed { node, answer } => {
                prop_assert_eq!(Some(answer.0), log.sends.last().map(|s| s.1));
                prop_assert_eq!(node, id(answer.0));
            }
            Driven::GaveUp { why, kept } => {
                if cfg.deadline.is_some_and(|d| took >= d) {
                    prop_assert_eq!(why, GiveUp::Deadline);
                }
                // The answer kept is the last status a node gave.
                let last_status = log.sends.iter().rev().find_map(|(_, _, s)| match s {
                    Script::Status(c, _) => Some(*c),
                    _ => None,
                });
                prop_assert_eq!(kept, last_status);
            }
        }
    }
}

#[test]
fn a_slow_node_that_shows_progress_is_waited_for_past_its_allowance() {
    let cfg = FailoverConfig {
        stall_floor: Duration::from_secs(5),
        patience: Duration::from_secs(30),
        ..FailoverConfig::default()
    };
    let (end, log, took, _) = run(vec![Script::Slow(130)], 2, cfg);
    assert!(
        matches!(
            end,
            Driven::Committed {
                answer: (0, 200),
                ..
            }
        ),
        "{end:?}"
    );
    assert!(log.stalled.is_empty());
    assert!(took >= Duration::from_secs(130));
}

/// The only owner's head after 130 s, nothing from it meanwhile: waited
/// for (said once), and the answer taken; with a second owner, the
/// request moves there at the stall allowance.
#[test]
fn a_silent_only_owner_is_waited_for_and_left_only_for_another() {
    let cfg = FailoverConfig {
        stall_floor: Duration::from_secs(10),
        patience: Duration::from_secs(10),
        ..FailoverConfig::default()
    };
    let (end, log, took, _) = run(vec![Script::Quiet(130)], 1, cfg);
    assert!(
        matches!(
            end,
            Driven::Committed {
                answer: (0, 200),
                ..
            }
        ),
        "{end:?}"
    );
    assert!(log.stalled.is_empty());
    assert_eq!(log.alone, vec![(Duration::from_secs(10), 0)]);
    assert!(took >= Duration::from_secs(130), "{took:?}");
    let (end, log, took, _) = run(vec![Script::Quiet(130)], 2, cfg);
    assert!(
        matches!(
            end,
            Driven::Committed {
                answer: (1, 200),
                ..
            }
        ),
        "{end:?}"
    );
    assert_eq!(log.stalled, vec![(Duration::from_secs(10), 0)]);
    assert!(log.alone.is_empty());
    assert!(took < Duration::from_secs(11), "{took:?}");
    // Past the silent bound (here the client's deadline), it ends.
    let (end, _, took, _) = run(
        vec![Script::Quiet(130)],
        1,
        FailoverConfig {
            deadline: Some(Duration::from_secs(60)),
            ..cfg
        },
    );
    assert!(
        matches!(
            end,
            Driven::GaveUp {
                why: GiveUp::Deadline,
                ..
            }
        ),
        "{end:?}"
    );
    assert_eq!(took, Duration::from_secs(60));
}

/// An owner that appears while the request waits on a silent only owner
/// takes it (nothing went to the client yet): within a second of joining.
#[test]
fn an_owner_that_appears_while_the_only_one_is_silent_takes_the_request() {
    let cfg = FailoverConfig {
        stall_floor: Duration::from_secs(10),
        patience: Duration::from_secs(10),
        ..FailoverConfig::default()
    };
    let joins = Duration::from_secs(40);
    let (end, log, took, _) = run_joining(vec![Script::Quiet(130)], 1, Some(joins), cfg);
    assert!(
        matches!(
            end,
            Driven::Committed {
                answer: (1, 200),
                ..
            }
        ),
        "{end:?}"
    );
    assert_eq!(log.alone, vec![(Duration::from_secs(10), 0)]);
    assert_eq!(log.stalled.len(), 1);
    let (cut, node) = log.stalled[0];
    assert_eq!(node, 0);
    assert!(
        cut >= joins && cut <= joins + Duration::from_secs(1),
        "left at {cut:?}"
    );
    assert!(took < joins + Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_hung_node_is_left_at_its_allowance_for_the_next() {
    let cfg = FailoverConfig {
        stall_floor: Duration::from_secs(5),
        ..FailoverConfig::default()
    };
    let (end, log, took, _) = run(vec![Script::Hangs], 2, cfg);
    assert!(
        matches!(
            end,
            Driven::Committed {
                answer: (1, 200),
                ..
            }
        ),
        "{end:?}"
    );
    assert_eq!(log.stalled, vec![(Duration::from_secs(5), 0)]);
    assert!(took < Duration::from_secs(6), "{took:?}");
}
