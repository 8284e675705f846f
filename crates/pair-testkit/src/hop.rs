//! A fake hop for the failover driver ([`pair_scheduler::drive`]): an
//! [`Exchange`] whose nodes do as scripted ([`Does`]) on tokio's clock
//! (paused in a test, so back-offs and stall allowances pass at once).
//! A node's pipeline and the edge SDK each end requests driven on it, to
//! test what their callers get.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use pair_core::NodeId;
use pair_scheduler::drive::{self, Classified, Driven, Exchange, Timer};
use pair_scheduler::{Failover, Step, Target};
use tokio::time::{Instant, Sleep};

/// What a node does with each attempt; `E` is the shell's own error.
#[derive(Debug)]
pub enum Does<E = Refused> {
    /// Its connection is refused (the error made from [`Refused`]).
    Refuses,
    /// The attempt fails with this error, classified as the shell
    /// classifies it.
    Fails(fn() -> E),
    /// It answers this status, with an engine's error body.
    Answers(u16),
    /// Nothing at all.
    Hangs,
}

/// A refused connection: the class `connect`, not transient (the node is
/// not tried again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

impl Classified for Refused {
    fn class(&self) -> &'static str {
        "connect"
    }
    fn transient(&self) -> bool {
        false
    }
}

/// An answer that was not committed, kept in case it is the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kept {
    pub node: NodeId,
    pub status: u16,
    /// `{"error":"the engine said STATUS"}`.
    pub body: String,
}

/// A hop whose nodes, offered best first, do as scripted.
#[derive(Debug)]
pub struct FakeHop<E = Refused> {
    t0: Instant,
    nodes: Vec<(NodeId, Does<E>)>,
    owners_down: bool,
    sent: Mutex<Vec<NodeId>>,
}

impl<E> FakeHop<E> {
    /// A hop over `nodes` for a request that arrived at `t0`.
    pub fn new(t0: Instant, nodes: Vec<(NodeId, Does<E>)>) -> Self {
        Self {
            t0,
            nodes,
            owners_down: false,
            sent: Mutex::new(Vec::new()),
        }
    }

    /// The same hop with the model's owners all down for now: none is
    /// offered.
    pub fn owners_down(mut self) -> Self {
        self.owners_down = true;
        self
    }

    /// The nodes an attempt went to, in order.
    pub fn sent(&self) -> Vec<NodeId> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl<E: Classified + From<Refused>> FakeHop<E> {
    /// Runs `failover` to its end on this hop, with a tokio timer on the
    /// request's clock.
    pub async fn run(&self, failover: &mut Failover) -> Driven<(NodeId, u16), Kept> {
        let clock = std::pin::pin!(Clock {
            sleep: Box::pin(tokio::time::sleep_until(self.t0)),
            t0: self.t0,
        });
        drive::drive(self, failover, clock).await
    }
}

impl<E: Classified + From<Refused>> Exchange for FakeHop<E> {
    type Head = (NodeId, u16);
    type Answer = (NodeId, u16);
    type Kept = Kept;
    type Ticket = ();
    type Error = E;

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
    ) -> (Step, Option<()>) {
        let targets = self.candidates();
        (decide(&targets, self.owners_down), Some(()))
    }

    fn candidates(&self) -> Vec<Target> {
        if self.owners_down {
            return Vec::new();
        }
        self.nodes
            .iter()
            .map(|(node, _)| Target {
                node: *node,
                predicted: None,
            })
            .collect()
    }

    async fn send(&self, node: NodeId, _: Option<()>) -> Result<(NodeId, u16), E> {
        if let Ok(mut sent) = self.sent.lock() {
            sent.push(node);
        }
        let does = self.nodes.iter().find(|(n, _)| *n == node).map(|(_, d)| d);
        match does {
            Some(Does::Answers(status)) => Ok((node, *status)),
            Some(Does::Fails(error)) => Err(error()),
            Some(Does::Hangs) => std::future::pending().await,
            Some(Does::Refuses) | None => Err(E::from(Refused)),
        }
    }

    fn status(&self, _: NodeId, head: &(NodeId, u16)) -> (u16, Option<Duration>) {
        (head.1, None)
    }

    async fn first_byte(&self, _: &mut (NodeId, u16)) -> Result<(), E> {
        Ok(())
    }

    fn commit(&self, _: NodeId, head: (NodeId, u16)) -> (NodeId, u16) {
        head
    }

    async fn keep(&self, node: NodeId, head: (NodeId, u16)) -> Option<Kept> {
        Some(Kept {
            node,
            status: head.1,
            body: format!(r#"{{"error":"the engine said {}"}}"#, head.1),
        })
    }

    fn last_progress(&self, _: NodeId) -> Option<Duration> {
        None
    }
}

/// The driver's timer: a tokio sleep on the request's clock.
struct Clock {
    sleep: Pin<Box<Sleep>>,
    t0: Instant,
}

impl Future for Clock {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }
}

impl Timer for Clock {
    fn rearm(mut self: Pin<&mut Self>, at: Duration) {
        let at = self.t0 + at;
        self.sleep.as_mut().reset(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_scheduler::{FailoverConfig, GiveUp};

    fn node(i: u128) -> NodeId {
        NodeId::from_u128(i)
    }

    #[tokio::test(start_paused = true)]
    async fn nodes_do_as_scripted() {
        let hop: FakeHop = FakeHop::new(
            Instant::now(),
            vec![
                (node(1), Does::Refuses),
                (node(2), Does::Answers(502)),
                (node(3), Does::Answers(200)),
            ],
        );
        let mut failover = Failover::new(FailoverConfig::default());
        let Driven::Committed { node: n, answer } = hop.run(&mut failover).await else {
            panic!("the third node answers");
        };
        assert_eq!((n, answer), (node(3), (node(3), 200)));
        assert_eq!(hop.sent(), [node(1), node(2), node(3)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_node_is_cut_and_the_last_answer_kept() {
        let hop: FakeHop = FakeHop::new(
            Instant::now(),
            vec![(node(1), Does::Answers(503)), (node(2), Does::Hangs)],
        );
        let mut failover = Failover::new(FailoverConfig {
            patience: Duration::from_secs(5),
            ..FailoverConfig::default()
        });
        let Driven::GaveUp { kept, .. } = hop.run(&mut failover).await else {
            panic!("nothing answers well");
        };
        let kept = kept.expect("the 503 is kept");
        assert_eq!((kept.node, kept.status), (node(1), 503));
        assert_eq!(kept.body, r#"{"error":"the engine said 503"}"#);
    }

    #[tokio::test(start_paused = true)]
    async fn owners_down_offer_no_candidate() {
        let hop: FakeHop =
            FakeHop::new(Instant::now(), vec![(node(1), Does::Answers(200))]).owners_down();
        let mut failover = Failover::new(FailoverConfig {
            patience: Duration::from_secs(1),
            ..FailoverConfig::default()
        });
        let Driven::GaveUp { why, kept } = hop.run(&mut failover).await else {
            panic!("no node is offered");
        };
        assert_eq!((why, kept), (GiveUp::OwnersGone, None));
        assert!(hop.sent().is_empty());
    }
}
