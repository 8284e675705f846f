//! The cluster queue: where a request waits when every node that could
//! take it has its slots full (late binding), instead of in one engine's
//! own first-come queue, so it goes to whichever node frees a slot first.
//!
//! Order is shortest predicted job first, with aging, in one key: each
//! request is due at `arrival + AGING × predicted work` (plus
//! [`BATCH_DELAY_MS`] for batch work), and the earliest due goes first. A
//! short request so passes a long one, but nothing that arrives after a
//! request's due time passes it: no request waits more than
//! [`AGING`] times its own predicted work because of shorter ones, and
//! batch work waits at most [`BATCH_DELAY_MS`] more for interactive work
//! (it never starves).
//!
//! Batch work also leaves interactive work room: while interactive
//! requests were seen in the last [`INTERACTIVE_WINDOW_MS`], batch work
//! does not take the cluster's last free slot ([`batch_may_take`]), so a
//! chat question on serial engines finds a slot instead of waiting behind
//! a long batch answer. Batch work keeps a share (every slot but one); on
//! a cluster of one slot, it takes it once it has waited its delay.
//!
//! Or interactive work cuts batch work ([`preempt`]): where a router can
//! continue an answer from its text so far, an interactive request
//! predicted to wait for a slot takes a running batch job's, and the batch
//! job waits again as a continuation, in its old place. Each job is cut at
//! most [`MAX_CUTS`] times, so batch work still ends.
//!
//! Requests wait in lanes (one per model, or whatever set of nodes can take
//! them, as the embedder numbers them); a node that frees a slot takes the
//! earliest due request among the lanes it serves. Plain data: no clock, no
//! I/O; after warm-up (as many requests waiting as ever before) pushing and
//! popping allocate nothing.

pub use pair_core::Priority;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// How far a request may be passed by shorter ones: it is due at its
/// arrival plus this many times its predicted work.
pub const AGING: u64 = 2;

/// How long batch work yields to interactive work at most.
pub const BATCH_DELAY_MS: u64 = 30_000;

/// How long interactive work counts as present after its last request,
/// for [`batch_may_take`].
pub const INTERACTIVE_WINDOW_MS: u64 = 60_000;

/// Whether a batch request may take a slot now, with `free_slots` of the
/// `slots` that could serve it free: not the last free one while
/// interactive work was seen `interactive_seen_ms_ago`, within
/// [`INTERACTIVE_WINDOW_MS`]; where there is one slot in all, once it has
/// waited [`BATCH_DELAY_MS`].
pub fn batch_may_take(
    free_slots: u32,
    slots: u32,
    interactive_seen_ms_ago: Option<u64>,
    waited_ms: u64,
) -> bool {
    let interactive = interactive_seen_ms_ago.is_some_and(|ago| ago <= INTERACTIVE_WINDOW_MS);
    free_slots >= 2 || !interactive || (slots <= 1 && waited_ms >= BATCH_DELAY_MS)
}

/// How long interactive work may be predicted to wait for a slot before it
/// cuts batch work ([`preempt`]): a shorter wait costs less than the batch
/// prefill a cut throws away.
pub const PREEMPT_WAIT_MS: u32 = 250;

/// How many times one batch job may be cut: after that it runs to its end,
/// so cutting never starves batch work.
pub const MAX_CUTS: u32 = 4;

/// A batch job holding a slot, as a candidate for interactive work to cut
/// ([`preempt`]). A cut job continues later from the text it has (its
/// prompt and its partial answer become the continuation's prompt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cuttable {
    /// The work a cut throws away: its continuation prefills again what
    /// the job prefilled and generated.
    pub sunk_ms: u32,
    /// Its predicted work left.
    pub left_ms: u32,
    /// Times it was cut before.
    pub cuts: u32,
}

/// Which running batch job an interactive request cuts for its slot (an
/// index into `running`), where `wait_ms` is its predicted wait for a slot
/// otherwise: none while that wait is at most [`PREEMPT_WAIT_MS`]; else,
/// of the jobs cut fewer than [`MAX_CUTS`] times that will not end within
/// [`PREEMPT_WAIT_MS`] anyway, the one whose cut throws away the least work,
/// then the one with the most work left, then the first.
pub fn preempt(wait_ms: u32, running: &[Cuttable]) -> Option<usize> {
    if wait_ms <= PREEMPT_WAIT_MS {
        return None;
    }
    running
        .iter()
        .enumerate()
        .filter(|(_, c)| c.cuts < MAX_CUTS && c.left_ms > PREEMPT_WAIT_MS)
        .min_by_key(|&(i, c)| (c.sunk_ms, Reverse(c.left_ms), i))
        .map(|(i, _)| i)
}

/// The order a [`ClusterQueue`] serves in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Order {
    /// First come, first served.
    Fifo,
    /// Shortest predicted job first, with aging.
    #[default]
    ShortestFirst,
    /// Shortest first, batch work after interactive work.
    Priorities,
}

/// A request joining the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Which lane it waits in (the nodes that can take it).
    pub lane: u32,
    pub arrived_ms: u64,
    /// Its predicted work where it would run: the prompt tokens not cached
    /// prefilled, and the expected answer decoded.
    pub work_ms: u32,
    pub priority: Priority,
}

/// A place in the queue, to take a request out before its turn (its
/// client left, its wait ran out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ticket {
    slot: u32,
    generation: u32,
}

/// Heap entry: due time, arrival order, slot and its generation.
type Entry = Reverse<(u64, u64, u32, u32)>;

#[derive(Clone, Debug, Default)]
struct Slot<T> {
    generation: u32,
    held: Option<(Waiting, T)>,
}

/// Requests waiting for a slot anywhere in the cluster, each with the
/// caller's `T` (what it needs to dispatch the request).
#[derive(Clone, Debug)]
pub struct ClusterQueue<T> {
    order: Order,
    /// Two heaps a lane (interactive, then batch: lane `l`'s at `2l` and
    /// `2l + 1`); entries of requests taken out stay until popped.
    lanes: Vec<BinaryHeap<Entry>>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    arrivals: u64,
    len: usize,
}

impl<T> ClusterQueue<T> {
    pub fn new(order: Order) -> Self {
        Self {
            order,
            lanes: Vec::new(),
            slots: Vec::new(),
            free: Vec::new(),
            arrivals: 0,
            len: 0,
        }
    }

    pub fn order(&self) -> Order {
        self.order
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// When `w` is due: the key the queue serves in.
    pub fn due_ms(&self, w: &Waiting) -> u64 {
        match self.order {
            Order::Fifo => w.arrived_ms,
            Order::ShortestFirst => w.arrived_ms + AGING * u64::from(w.work_ms),
            Order::Priorities => {
                let delay = match w.priority {
                    Priority::Interactive => 0,
                    Priority::Batch => BATCH_DELAY_MS,
                };
                w.arrived_ms + AGING * u64::from(w.work_ms) + delay
            }
        }
    }

    /// Adds a request.
    pub fn push(&mut self, w: Waiting, item: T) -> Ticket {
        let due = self.due_ms(&w);
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    held: None,
                });
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        let s = &mut self.slots[slot as usize];
        s.held = Some((w, item));
        let generation = s.generation;
        let lane = heap_of(w.lane, w.priority);
        if self.lanes.len() <= lane {
            self.lanes.resize_with(lane + 1, BinaryHeap::new);
        }
        self.arrivals += 1;
        self.lanes[lane].push(Reverse((due, self.arrivals, slot, generation)));
        self.len += 1;
        Ticket { slot, generation }
    }

    /// Takes a request out before its turn; `None` if it already left.
    pub fn remove(&mut self, ticket: Ticket) -> Option<(Waiting, T)> {
        let s = self.slots.get_mut(ticket.slot as usize)?;
        if s.generation != ticket.generation {
            return None;
        }
        let out = s.held.take()?;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(ticket.slot);
        self.len -= 1;
        Some(out)
    }

    /// The next request among `lanes` (those a node with a free slot
    /// serves), earliest due first; `None` if none waits there.
    pub fn pop_first(&mut self, lanes: &[u32]) -> Option<(Waiting, T)> {
        self.pop_among(lanes, &[Priority::Interactive, Priority::Batch])
    }

    /// [`ClusterQueue::pop_first`] among interactive requests only (a slot
    /// batch work may not take, [`batch_may_take`]).
    pub fn pop_interactive(&mut self, lanes: &[u32]) -> Option<(Waiting, T)> {
        self.pop_among(lanes, &[Priority::Interactive])
    }

    /// When the first request among `lanes` that a request of `class` waits
    /// behind is due: any for batch work, interactive ones for interactive
    /// work (which batch work never holds up). `None`: none waits there.
    pub fn first_due(&mut self, lanes: &[u32], class: Priority) -> Option<u64> {
        let classes: &[Priority] = match class {
            Priority::Interactive => &[Priority::Interactive],
            Priority::Batch => &[Priority::Interactive, Priority::Batch],
        };
        self.first_among(lanes, classes).map(|(due, _, _)| due)
    }

    fn pop_among(&mut self, lanes: &[u32], classes: &[Priority]) -> Option<(Waiting, T)> {
        let (_, _, lane) = self.first_among(lanes, classes)?;
        let Reverse((_, _, slot, generation)) = self.lanes[lane].pop()?;
        self.remove(Ticket { slot, generation })
    }

    /// The earliest due live entry among `lanes` and `classes`: its due
    /// time, arrival number and heap.
    fn first_among(&mut self, lanes: &[u32], classes: &[Priority]) -> Option<(u64, u64, usize)> {
        let mut best: Option<(u64, u64, usize)> = None;
        for &lane in lanes {
            for &class in classes {
                let heap = heap_of(lane, class);
                let Some((due, seq)) = self.head(heap) else {
                    continue;
                };
                if best.is_none_or(|(d, s, _)| (due, seq) < (d, s)) {
                    best = Some((due, seq, heap));
                }
            }
        }
        best
    }

    /// The lane's earliest live entry, dropping those taken out.
    fn head(&mut self, lane: usize) -> Option<(u64, u64)> {
        let heap = self.lanes.get_mut(lane)?;
        while let Some(&Reverse((due, seq, slot, generation))) = heap.peek() {
            if self.slots[slot as usize].generation == generation {
                return Some((due, seq));
            }
            heap.pop();
        }
        None
    }

    /// The request `ticket` names, while it waits.
    pub fn get(&self, ticket: Ticket) -> Option<&(Waiting, T)> {
        let s = self.slots.get(ticket.slot as usize)?;
        (s.generation == ticket.generation)
            .then_some(s.held.as_ref())
            .flatten()
    }
}

/// The heap of `lane`'s requests of `class`.
fn heap_of(lane: u32, class: Priority) -> usize {
    lane as usize * 2 + class as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(arrived_ms: u64, work_ms: u32, priority: Priority) -> Waiting {
        Waiting {
            lane: 0,
            arrived_ms,
            work_ms,
            priority,
        }
    }

    fn drain(q: &mut ClusterQueue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop_first(&[0]).map(|(_, t)| t)).collect()
    }

    #[test]
    fn a_short_request_passes_long_ones_until_they_are_due() {
        let mut q = ClusterQueue::new(Order::ShortestFirst);
        q.push(w(0, 20_000, Priority::Interactive), "long");
        q.push(w(100, 200, Priority::Interactive), "short");
        assert_eq!(drain(&mut q), ["short", "long"]);
        // A short request arriving after the long one is due does not pass.
        q.push(w(0, 1_000, Priority::Interactive), "waited");
        q.push(w(4_001, 10, Priority::Interactive), "late");
        assert_eq!(drain(&mut q), ["waited", "late"]);
        let mut fifo = ClusterQueue::new(Order::Fifo);
        fifo.push(w(0, 20_000, Priority::Interactive), "long");
        fifo.push(w(100, 200, Priority::Interactive), "short");
        assert_eq!(drain(&mut fifo), ["long", "short"]);
    }

    #[test]
    fn batch_yields_to_interactive_work_for_a_bounded_time() {
        let mut q = ClusterQueue::new(Order::Priorities);
        q.push(w(0, 100, Priority::Batch), "batch");
        q.push(w(10, 5_000, Priority::Interactive), "chat");
        assert_eq!(drain(&mut q), ["chat", "batch"]);
        q.push(w(0, 100, Priority::Batch), "batch");
        q.push(
            w(BATCH_DELAY_MS + 1_000, 10, Priority::Interactive),
            "later chat",
        );
        assert_eq!(drain(&mut q), ["batch", "later chat"]);
        // Without priorities, batch is just shorter.
        let mut q = ClusterQueue::new(Order::ShortestFirst);
        q.push(w(0, 100, Priority::Batch), "batch");
        q.push(w(10, 5_000, Priority::Interactive), "chat");
        assert_eq!(drain(&mut q), ["batch", "chat"]);
    }

    #[test]
    fn a_node_takes_only_from_its_lanes_and_removed_requests_are_skipped() {
        let mut q = ClusterQueue::new(Order::ShortestFirst);
        let a = q.push(
            Waiting {
                lane: 1,
                ..w(0, 10, Priority::Interactive)
            },
            "a",
        );
        q.push(
            Waiting {
                lane: 2,
                ..w(0, 20, Priority::Interactive)
            },
            "b",
        );
        q.push(
            Waiting {
                lane: 1,
                ..w(0, 30, Priority::Interactive)
            },
            "c",
        );
        assert_eq!(q.len(), 3);
        assert_eq!(q.remove(a).map(|(_, t)| t), Some("a"));
        assert_eq!(q.remove(a), None, "once");
        assert_eq!(q.pop_first(&[0]), None);
        assert_eq!(q.pop_first(&[1, 2]).map(|(_, t)| t), Some("b"));
        assert_eq!(q.pop_first(&[1]).map(|(_, t)| t), Some("c"));
        assert!(q.is_empty());
        // The slot is reused; the old ticket does not name the new request.
        let d = q.push(w(0, 1, Priority::Interactive), "d");
        assert_eq!(q.get(a), None);
        assert_eq!(q.get(d).map(|(_, t)| *t), Some("d"));
    }

    #[test]
    fn batch_work_leaves_interactive_work_the_last_slot() {
        assert!(batch_may_take(2, 3, Some(0), 0));
        assert!(!batch_may_take(1, 3, Some(0), 0));
        assert!(
            !batch_may_take(1, 3, Some(0), 10 * BATCH_DELAY_MS),
            "it keeps 2 of 3"
        );
        assert!(
            batch_may_take(1, 3, Some(INTERACTIVE_WINDOW_MS + 1), 0),
            "no chat lately"
        );
        assert!(batch_may_take(1, 3, None, 0));
        assert!(!batch_may_take(1, 1, Some(0), 0));
        assert!(
            batch_may_take(1, 1, Some(0), BATCH_DELAY_MS),
            "one slot: it waits its delay"
        );
        let mut q = ClusterQueue::new(Order::Priorities);
        q.push(w(0, 10, Priority::Batch), "batch");
        assert_eq!(q.pop_interactive(&[0]), None);
        assert_eq!(
            q.first_due(&[0], Priority::Interactive),
            None,
            "batch holds no chat up"
        );
        assert_eq!(
            q.first_due(&[0], Priority::Batch),
            Some(20 + BATCH_DELAY_MS)
        );
        q.push(w(5, 10_000, Priority::Interactive), "chat");
        assert_eq!(q.pop_interactive(&[0]).map(|(_, t)| t), Some("chat"));
        assert_eq!(q.pop_first(&[0]).map(|(_, t)| t), Some("batch"));
    }

    #[test]
    fn interactive_work_cuts_the_batch_job_that_loses_least() {
        let job = |sunk_ms, left_ms, cuts| Cuttable {
            sunk_ms,
            left_ms,
            cuts,
        };
        // Prefilling for 300 ms loses less than 2,000 tokens decoded from.
        let running = [job(1_600, 4_000, 0), job(300, 6_000, 0), job(300, 9_000, 0)];
        assert_eq!(preempt(2_000, &running), Some(2), "then the most left");
        assert_eq!(
            preempt(PREEMPT_WAIT_MS, &running),
            None,
            "a short wait cuts nothing"
        );
        let worn = [job(300, 6_000, MAX_CUTS), job(1_600, 4_000, 0)];
        assert_eq!(preempt(2_000, &worn), Some(1), "cut often enough");
        let ending = [job(10, PREEMPT_WAIT_MS, 0), job(1_600, 4_000, MAX_CUTS)];
        assert_eq!(preempt(2_000, &ending), None, "one ends soon, one is spent");
        assert_eq!(preempt(u32::MAX, &[]), None);
    }

    #[test]
    fn priorities_parse_as_the_ecosystem_names_them() {
        for s in ["interactive", "HIGH", "normal", "Critical", "standard"] {
            assert_eq!(Priority::parse(s), Some(Priority::Interactive), "{s}");
        }
        for s in ["batch", "low", " Sheddable "] {
            assert_eq!(Priority::parse(s), Some(Priority::Batch), "{s}");
        }
        assert_eq!(Priority::parse("urgent"), None);
    }
}
