//! Late binding (`--queue`): while every node that could take a request has
//! its slots full, the request waits at the node that took it, in the
//! order of the scheduler's [`ClusterQueue`] (shortest predicted job first
//! with aging; batch after interactive), instead of in one engine's own
//! first-come queue; it goes when a node has room, to the node predicted to
//! finish it soonest then. Its place is a slot counted like any other: the
//! request is ranked again when woken, and reserves the node it goes to;
//! from when it is let go until it is counted there, it holds a claim on
//! one of the free slots the views show, so the next in line does not
//! take the same one.
//!
//! A request is woken when a slot may have freed (an answer on this node
//! drained, a fresh cluster view published), and looks again every
//! [`RECHECK`] in any case; it waits until its `x-pair-deadline`, or
//! [`DEFAULT_WAIT`], and then gets a 503 with `Retry-After`.
//!
//! With preemption ([`Queue::preempt`]), interactive work that would wait
//! cuts a running batch answer instead (`crate::preempt`), and batch
//! work no longer leaves interactive work the last free slot.

use std::sync::Mutex;
use std::time::Duration;

use pair_core::Priority;
use pair_scheduler::{Candidate, ClusterQueue, Order, Ticket, Waiting, batch_may_take};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How often a waiting request looks again unwoken (a peer's slot frees
/// between its reports).
pub const RECHECK: Duration = Duration::from_millis(250);

/// How long a request waits for a slot without `x-pair-deadline`.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(120);

/// How long a woken request keeps its place while it comes to look again
/// (it does within microseconds; past this it is taken as gone).
const WOKEN_HOLD: Duration = Duration::from_secs(1);

/// Late binding's setting (`--queue`): the order requests wait in, and
/// whether interactive work cuts batch work for its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queue {
    pub order: Order,
    /// Interactive work predicted to wait for a slot cuts a running batch
    /// answer that can move ([`pair_scheduler::preempt`]).
    pub preempt: bool,
}

impl Queue {
    /// Priorities, and interactive work cuts batch work (`--queue
    /// preempt`).
    pub const PREEMPT: Queue = Queue {
        order: Order::Priorities,
        preempt: true,
    };
}

impl From<Order> for Queue {
    fn from(order: Order) -> Self {
        Self {
            order,
            preempt: false,
        }
    }
}

/// The node's waiting requests.
#[derive(Debug)]
pub struct WaitRoom {
    order: Option<Order>,
    preempt: bool,
    inner: Mutex<Inner>,
    /// The batch answers this node routed that may be cut (with
    /// preemption only).
    pub(crate) legs: std::sync::Arc<crate::preempt::Legs>,
}

#[derive(Debug)]
struct Inner {
    queue: ClusterQueue<oneshot::Sender<()>>,
    /// Lane `i` waits for model `lanes[i]`.
    lanes: Vec<String>,
    interactive_at: Option<Instant>,
    t0: Instant,
    /// Requests woken for a freed slot that have not looked again yet:
    /// they are out of the queue but still ahead of those behind them, so
    /// that a later request's own recheck does not take their slot.
    woken: Vec<Woken>,
    /// Requests let go that are not yet counted on the node they go to:
    /// each holds one of the free slots the views still show.
    going: Vec<(Claim, Instant)>,
    /// Claims made: the last one's number.
    claims: u64,
}

/// A request let go for a free slot, until it is counted where it goes
/// (`WaitRoom::counted`); past `WOKEN_HOLD` it is taken as gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    lane: u32,
    /// Told apart from every other claim of this node.
    seq: u64,
}

/// A request woken for a slot, until it looks again.
#[derive(Debug)]
struct Woken {
    lane: u32,
    arrived_ms: u64,
    priority: Priority,
    due: u64,
    at: Instant,
}

/// What a request does now.
#[derive(Debug)]
pub enum Admit<'a> {
    /// A slot is free for it (or the node does not queue): it holds
    /// the slot until it is counted where it goes.
    Go(Option<Claim>),
    /// It waits for `woken` (or [`RECHECK`]) in its `place`.
    Wait {
        woken: oneshot::Receiver<()>,
        place: Place<'a>,
        /// No candidate has a free slot (rather than requests ahead of it
        /// taking the free ones).
        full: bool,
    },
}

/// A waiting request's place in the queue: it leaves the queue when this
/// drops (woken, looking again, given up, or its client gone), so a
/// request no one waits for never holds up those behind it.
#[derive(Debug)]
pub struct Place<'a> {
    room: &'a WaitRoom,
    ticket: Ticket,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Ok(mut inner) = self.room.inner.lock() {
            inner.queue.remove(self.ticket);
        }
    }
}

impl WaitRoom {
    /// `None`: requests never wait here (each is committed to a node at
    /// once).
    pub fn new(queue: Option<Queue>) -> Self {
        let order = queue.map(|q| q.order);
        Self {
            order,
            preempt: queue.is_some_and(|q| q.preempt),
            inner: Mutex::new(Inner {
                queue: ClusterQueue::new(order.unwrap_or_default()),
                lanes: Vec::new(),
                interactive_at: None,
                t0: Instant::now(),
                woken: Vec::new(),
                going: Vec::new(),
                claims: 0,
            }),
            legs: std::sync::Arc::default(),
        }
    }

    pub fn order(&self) -> Option<Order> {
        self.order
    }

    /// Whether interactive work cuts batch work for its slot.
    pub fn preempts(&self) -> bool {
        self.preempt
    }

    /// Whether a request for `model` of `priority`, that arrived at
    /// `arrived` with `work_ms` of its own work predicted, goes now given
    /// its ranked `candidates`, or waits. It goes when a candidate has a
    /// free slot it may take and no request it waits behind is due before
    /// it; a policy that predicts nothing never waits.
    pub fn admit(
        &self,
        model: &str,
        priority: Priority,
        arrived: Instant,
        candidates: &[Candidate],
    ) -> Admit<'_> {
        self.admit_as(model, priority, arrived, candidates, false)
    }

    /// [`WaitRoom::admit`] for a batch answer just cut for interactive
    /// work: it waits in its old place whatever is free, so the request
    /// that cut it takes the slot it gave up, and looks again when woken.
    pub(crate) fn requeue(
        &self,
        model: &str,
        priority: Priority,
        arrived: Instant,
        candidates: &[Candidate],
    ) -> Admit<'_> {
        self.admit_as(model, priority, arrived, candidates, true)
    }

    fn admit_as(
        &self,
        model: &str,
        priority: Priority,
        arrived: Instant,
        candidates: &[Candidate],
        yielded: bool,
    ) -> Admit<'_> {
        let Some(order) = self.order else {
            return Admit::Go(None);
        };
        let mut free = 0u32;
        let mut slots = 0u32;
        let mut work_ms = 0u32;
        for (i, c) in candidates.iter().enumerate() {
            let Some(p) = c.score.prediction() else {
                return Admit::Go(None);
            };
            if i == 0 {
                work_ms = p.work_ms();
            }
            free += p.slots.saturating_sub(p.jobs_ahead);
            slots += p.slots;
        }
        if candidates.is_empty() {
            return Admit::Go(None);
        }
        let Ok(mut inner) = self.inner.lock() else {
            return Admit::Go(None);
        };
        let now = Instant::now();
        let seen_ago = inner
            .interactive_at
            .map(|t| millis(now.saturating_duration_since(t)));
        if priority == Priority::Interactive {
            inner.interactive_at = Some(now);
        }
        let lane = inner.lane(model);
        // Slots others were let go for, not counted yet, are not free.
        inner
            .going
            .retain(|(_, at)| now.saturating_duration_since(*at) < WOKEN_HOLD);
        let free = free.saturating_sub(
            u32::try_from(inner.going.iter().filter(|(c, _)| c.lane == lane).count())
                .unwrap_or(u32::MAX),
        );
        let waiting = Waiting {
            lane,
            arrived_ms: millis(arrived.saturating_duration_since(inner.t0)),
            work_ms,
            priority,
        };
        let due = inner.queue.due_ms(&waiting);
        // This request looking again ends its own hold; another's still
        // woken with an earlier due is ahead of it, as the queue's are.
        inner
            .woken
            .retain(|k| now.saturating_duration_since(k.at) < WOKEN_HOLD);
        if let Some(i) = inner.woken.iter().position(|k| {
            k.lane == lane && k.arrived_ms == waiting.arrived_ms && k.priority == priority
        }) {
            inner.woken.swap_remove(i);
        }
        let held = inner.woken.iter().any(|k| {
            k.lane == lane
                && k.due < due
                && (priority == Priority::Batch || k.priority == Priority::Interactive)
        });
        let ahead = held
            || inner
                .queue
                .first_due(&[lane], priority)
                .is_some_and(|first| first < due);
        // With preemption, interactive work cuts batch work instead of
        // batch work leaving it a slot.
        let may = free > 0
            && (order != Order::Priorities
                || self.preempt
                || priority == Priority::Interactive
                || batch_may_take(free, slots, seen_ago, millis(arrived.elapsed())));
        if may && !ahead && !yielded {
            return Admit::Go(Some(inner.claim(lane, now)));
        }
        let (tx, woken) = oneshot::channel();
        let ticket = inner.queue.push(waiting, tx);
        drop(inner);
        if may && !yielded {
            // A slot is free for the ones ahead: the first of them takes it.
            self.wake_lane(lane);
        }
        Admit::Wait {
            woken,
            place: Place { room: self, ticket },
            full: free == 0,
        }
    }

    /// Holds a slot of `model`'s for a request that cut batch work for
    /// it: the waiting requests (the cut answer's continuation among them)
    /// see one slot fewer free until it is counted where it goes
    /// ([`WaitRoom::counted`]), so none of them is let into the slot it
    /// freed first. `None` without a queue.
    pub(crate) fn hold(&self, model: &str) -> Option<Claim> {
        self.order?;
        let mut inner = self.inner.lock().ok()?;
        let lane = inner.lane(model);
        Some(inner.claim(lane, Instant::now()))
    }

    /// The request let go with `claim` is counted where it goes (or gave
    /// up): the slot it held is no longer free in any view, and more may
    /// be, so the next in line looks. Once per claim: later calls do
    /// nothing.
    pub(crate) fn counted(&self, claim: Claim) {
        let held = self.inner.lock().is_ok_and(|mut inner| {
            let before = inner.going.len();
            inner.going.retain(|(c, _)| *c != claim);
            inner.going.len() < before
        });
        if held {
            self.wake();
        }
    }

    /// A slot may have freed: each model's first waiting request looks
    /// again (interactive first with priorities).
    pub fn wake(&self) {
        if self.order.is_none() {
            return;
        }
        let lanes = match self.inner.lock() {
            Ok(inner) if !inner.queue.is_empty() => inner.lanes.len(),
            _ => return,
        };
        for lane in 0..lanes {
            self.wake_lane(u32::try_from(lane).unwrap_or(u32::MAX));
        }
    }

    fn wake_lane(&self, lane: u32) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let first = self.order == Some(Order::Priorities);
        loop {
            let next = match first
                .then(|| inner.queue.pop_interactive(&[lane]))
                .flatten()
            {
                Some(w) => Some(w),
                None => inner.queue.pop_first(&[lane]),
            };
            let Some((w, tx)) = next else {
                return;
            };
            // A request whose client left is skipped.
            if tx.send(()).is_ok() {
                let due = inner.queue.due_ms(&w);
                inner.woken.push(Woken {
                    lane: w.lane,
                    arrived_ms: w.arrived_ms,
                    priority: w.priority,
                    due,
                    at: Instant::now(),
                });
                return;
            }
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.queue.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// A slot of `lane` held from `now` until the request it is for is
    /// counted ([`WaitRoom::counted`]) or [`WOKEN_HOLD`] passes.
    fn claim(&mut self, lane: u32, now: Instant) -> Claim {
        self.claims += 1;
        let claim = Claim {
            lane,
            seq: self.claims,
        };
        self.going.push((claim, now));
        claim
    }

    fn lane(&mut self, model: &str) -> u32 {
        let i = match self.lanes.iter().position(|m| m == model) {
            Some(i) => i,
            None => {
                self.lanes.push(model.to_owned());
                self.lanes.len() - 1
            }
        };
        u32::try_from(i).unwrap_or(u32::MAX)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
