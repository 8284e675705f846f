//! Reservations: requests this router has dispatched but that no workload
//! report shows yet. They count on their target at once, so a burst of
//! requests spreads over the cluster instead of piling onto the node that
//! looked idle in the last report.

use std::collections::VecDeque;

use pair_core::{ClusterSnapshot, NodeId, RequestProfile, Workload};

/// Handle for one reservation, returned by [`Reservations::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReservationId {
    node: NodeId,
    seq: u64,
    /// Its number among this router's reservations on `node`.
    wire: u64,
}

impl ReservationId {
    /// The node the request was dispatched to.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Its number among this router's reservations on its node (from 0,
    /// per process), sent with the request so the node's reports can say
    /// they counted it ([`pair_core::Admitted`]).
    pub fn wire_seq(&self) -> u64 {
        self.wire
    }
}

/// Work reserved on one node and not yet covered by its workload report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reserved {
    pub jobs: u32,
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
}

#[derive(Clone, Copy, Debug)]
struct Reservation {
    seq: u64,
    /// [`ReservationId::wire_seq`].
    wire: u64,
    at_ms: u64,
    prefill: u32,
    decode: u32,
}

/// One node's reservations, oldest first, with running totals so ranking
/// never walks them.
#[derive(Clone, Debug)]
pub(crate) struct NodeReservations {
    pub(crate) node: NodeId,
    /// Dispatched after the node's last report: ranking adds them.
    items: VecDeque<Reservation>,
    totals: Reserved,
    /// Dispatched before the node's last report, which counts them, and
    /// still running (in dispatch order).
    covered: VecDeque<Reservation>,
    /// Finished after the node's last report, which still counts them:
    /// ranking takes them off the report. `at_ms` is when each finished.
    credits: VecDeque<Reservation>,
    credit_totals: Reserved,
    /// Finished before any report seen here covered them, with when each
    /// finished: a report made between its dispatch and its finish (one
    /// that arrives after the finish) counts it, and then it is credited.
    finished: VecDeque<(Reservation, u64)>,
    /// The newest report applied that said which of this router's
    /// reservations it counted ([`NodeReservations::covered_by`]): `items`
    /// are exactly what it did not count.
    admitted_by: Option<u64>,
    /// The newest report applied that also said which of those had ended:
    /// `credits` are then exactly what it counts and has finished here,
    /// whatever the clocks say.
    ends_by: Option<u64>,
    /// The router names itself to the nodes ([`Reservations::set_origin`]):
    /// a report covers only what it says it counted, so what was reserved
    /// after the last report applied is uncovered, whatever the clocks say.
    named: bool,
}

impl NodeReservations {
    fn new(node: NodeId, named: bool) -> Self {
        Self {
            node,
            items: VecDeque::new(),
            totals: Reserved::default(),
            covered: VecDeque::new(),
            credits: VecDeque::new(),
            credit_totals: Reserved::default(),
            finished: VecDeque::new(),
            admitted_by: None,
            ends_by: None,
            named,
        }
    }

    fn is_empty(&self) -> bool {
        self.items.is_empty()
            && self.covered.is_empty()
            && self.credits.is_empty()
            && self.finished.is_empty()
    }

    /// A report made at `reported_ms`: the reservations it covers move to
    /// `covered`, the credits it makes stale go.
    fn covered_by(&mut self, reported_ms: u64, coverage: Coverage) {
        let newest = |by: Option<u64>| Some(by.map_or(reported_ms, |s| s.max(reported_ms)));
        self.admitted_by = match coverage {
            Coverage::Admitted(_) => newest(self.admitted_by),
            Coverage::Time => None,
        };
        self.ends_by = match coverage {
            Coverage::Admitted(Some(a)) if a.ended.is_some() => newest(self.ends_by),
            _ => None,
        };
        let saw = |r: &Reservation| match coverage {
            Coverage::Admitted(Some(a)) => a.counts(r.wire),
            Coverage::Admitted(None) => false,
            Coverage::Time => r.at_ms <= reported_ms,
        };
        // What the report says of a request it counts: still running
        // (`Some(false)`), ended (`Some(true)`), or nothing.
        let ended = |r: &Reservation| match coverage {
            Coverage::Admitted(Some(a)) if a.counts(r.wire) => a.ended(r.wire),
            _ => None,
        };
        // Requests arrive out of order: every one the report counts is
        // covered, not only those before the first it does not.
        let mut i = 0;
        while i < self.items.len() {
            let r = self.items[i];
            if !saw(&r) {
                if matches!(coverage, Coverage::Time) {
                    break;
                }
                i += 1;
                continue;
            }
            self.take(&r);
            self.items.remove(i);
            if ended(&r) == Some(true) {
                // Counted and gone again: nothing of it is left to count.
                continue;
            }
            if self.covered.len() >= Reservations::MAX_PER_NODE {
                self.covered.pop_front();
            }
            let at = self.covered.partition_point(|c| c.seq < r.seq);
            self.covered.insert(at, r);
        }
        if self.ends_by.is_some() {
            // The report says which have ended: those are gone from its
            // workload, the rest it still counts.
            self.covered.retain(|r| ended(r) != Some(true));
            let mut credits = std::mem::take(&mut self.credits);
            credits.retain(|c| match ended(c) {
                Some(still) => !still,
                None => c.at_ms > reported_ms,
            });
            self.credit_totals = Reserved::default();
            for c in &credits {
                add(&mut self.credit_totals, c);
            }
            self.credits = credits;
        } else {
            self.drop_credits_while(|c| c.at_ms <= reported_ms);
        }
        // Finished requests this report saw running are credited; those it
        // was made after are gone from it; older reports never saw them.
        let mut waiting = std::mem::take(&mut self.finished);
        waiting.retain(|&(r, finished_ms)| match ended(&r) {
            Some(false) => {
                self.credit(r, finished_ms);
                false
            }
            Some(true) => false,
            None if finished_ms <= reported_ms => false,
            None if saw(&r) => {
                self.credit(r, finished_ms);
                false
            }
            None => true,
        });
        self.finished = waiting;
    }

    /// A reservation no report had covered finished at `now_ms`.
    fn finish_uncovered(&mut self, r: Reservation, now_ms: u64) {
        if self.finished.len() >= Reservations::MAX_PER_NODE {
            self.finished.pop_front();
        }
        self.finished.push_back((r, now_ms));
    }

    fn drop_credits_while(&mut self, stale: impl FnMut(&Reservation) -> bool) {
        pop_while(&mut self.credits, &mut self.credit_totals, stale);
    }

    /// A covered reservation finished at `now_ms`: credited until a report
    /// made after it.
    fn credit(&mut self, mut r: Reservation, now_ms: u64) {
        // Kept in time order even if the caller's clock steps back.
        r.at_ms = self.credits.back().map_or(now_ms, |c| c.at_ms.max(now_ms));
        if self.credits.len() >= Reservations::MAX_PER_NODE
            && let Some(oldest) = self.credits.pop_front()
        {
            sub(&mut self.credit_totals, &oldest);
        }
        add(&mut self.credit_totals, &r);
        self.credits.push_back(r);
    }

    /// Work a report made at `reported_at_ms` still counts that has
    /// finished since (what ranking takes off the report): where that
    /// report (or a newer one) said which of this router's requests had
    /// ended, exactly the credits; otherwise those finished after it was
    /// made.
    pub(crate) fn credited(&self, reported_at_ms: u64) -> Reserved {
        if self.ends_by.is_some_and(|s| reported_at_ms <= s) {
            return self.credit_totals;
        }
        newer_than(&self.credits, self.credit_totals, reported_at_ms)
    }

    /// `workload` as reported at `reported_at_ms`, less what has finished
    /// since (queued jobs first, then running ones; never below zero).
    pub(crate) fn less_credited(&self, workload: Workload, reported_at_ms: u64) -> Workload {
        let c = self.credited(reported_at_ms);
        if c.jobs == 0 {
            return workload;
        }
        let from_queue = c.jobs.min(workload.queued);
        Workload {
            queued: workload.queued - from_queue,
            running: workload.running.saturating_sub(c.jobs - from_queue),
            prefill_tokens: workload.prefill_tokens.saturating_sub(c.prefill_tokens),
            decode_tokens: workload.decode_tokens.saturating_sub(c.decode_tokens),
        }
    }

    fn newest_at(&self) -> Option<u64> {
        self.items.back().map(|r| r.at_ms)
    }

    fn push(&mut self, r: Reservation) {
        add(&mut self.totals, &r);
        self.items.push_back(r);
    }

    fn take(&mut self, r: &Reservation) {
        sub(&mut self.totals, r);
    }

    fn pop_front_while(&mut self, covered: impl FnMut(&Reservation) -> bool) {
        pop_while(&mut self.items, &mut self.totals, covered);
    }

    /// Reservations a report made at `reported_at_ms` does not count: where
    /// [`Reservations::sync`] applied that report (or a newer one) and it
    /// said which it counted, exactly those it did not (what a newer report
    /// did not count, an older one did not either); otherwise those
    /// dispatched after it was made. O(1) when the report was synced.
    pub(crate) fn uncovered(&self, reported_at_ms: u64) -> Reserved {
        // Named and not synced since these were reserved (the entry is new:
        // ranking's snapshot was applied before it), none is covered.
        let unsynced = self.named && self.admitted_by.is_none();
        if unsynced || self.admitted_by.is_some_and(|s| reported_at_ms <= s) {
            return self.totals;
        }
        newer_than(&self.items, self.totals, reported_at_ms)
    }
}

/// Which of this router's reservations a report counts.
#[derive(Clone, Copy, Debug)]
enum Coverage {
    /// Those it names (`None`: none of them).
    Admitted(Option<pair_core::Admitted>),
    /// Those dispatched before it was made (a router that does not name
    /// itself, or reports that say nothing of what they counted).
    Time,
}

/// Drops the front of a time-ordered list while `stale` says so, keeping
/// its totals.
fn pop_while(
    list: &mut VecDeque<Reservation>,
    totals: &mut Reserved,
    mut stale: impl FnMut(&Reservation) -> bool,
) {
    while let Some(front) = list.front().copied() {
        if !stale(&front) {
            break;
        }
        sub(totals, &front);
        list.pop_front();
    }
}

/// The part of a time-ordered list (whose sum is `totals`) later than
/// `t`: the totals when all of it is, without a walk.
fn newer_than(list: &VecDeque<Reservation>, totals: Reserved, t: u64) -> Reserved {
    match (list.front(), list.back()) {
        (Some(oldest), _) if oldest.at_ms > t => totals,
        (_, Some(newest)) if newest.at_ms > t => {
            let mut out = Reserved::default();
            for r in list.iter().filter(|r| r.at_ms > t) {
                add(&mut out, r);
            }
            out
        }
        _ => Reserved::default(),
    }
}

fn add(t: &mut Reserved, r: &Reservation) {
    t.jobs = t.jobs.saturating_add(1);
    t.prefill_tokens += u64::from(r.prefill);
    t.decode_tokens += u64::from(r.decode);
}

fn sub(t: &mut Reserved, r: &Reservation) {
    t.jobs = t.jobs.saturating_sub(1);
    t.prefill_tokens = t.prefill_tokens.saturating_sub(u64::from(r.prefill));
    t.decode_tokens = t.decode_tokens.saturating_sub(u64::from(r.decode));
}

/// Every outstanding reservation, per node, sorted by node id.
///
/// Memory is bounded: at most [`Reservations::MAX_PER_NODE`] per node (the
/// oldest go first), at most [`Reservations::MAX_NODES`] nodes, and nothing
/// older than the time-to-live survives [`Reservations::expire`].
#[derive(Clone, Debug)]
pub struct Reservations {
    nodes: Vec<NodeReservations>,
    next_seq: u64,
    /// Per node, the number its next reservation gets
    /// ([`ReservationId::wire_seq`]); kept when the node has none left.
    wire: std::collections::BTreeMap<NodeId, u64>,
    ttl_ms: u64,
    live: Option<(NodeId, Workload)>,
    /// This router, as the nodes it relays to name it in their reports
    /// ([`pair_core::NodeSnapshot::admitted`]): its id and boot.
    origin: Option<(NodeId, u64)>,
}

impl Default for Reservations {
    fn default() -> Self {
        Self::new()
    }
}

impl Reservations {
    /// More reservations than this on one node means releases are being
    /// lost; the oldest are dropped.
    pub const MAX_PER_NODE: usize = 1024;
    pub const MAX_NODES: usize = 4096;
    /// A dispatched request neither released nor reported within this long
    /// is forgotten (a lost release must not weigh on a node forever).
    pub const DEFAULT_TTL_MS: u64 = 10 * 60 * 1000;

    pub fn new() -> Self {
        Self::with_ttl(Self::DEFAULT_TTL_MS)
    }

    pub fn with_ttl(ttl_ms: u64) -> Self {
        Self {
            nodes: Vec::new(),
            next_seq: 0,
            wire: std::collections::BTreeMap::new(),
            ttl_ms,
            live: None,
            origin: None,
        }
    }

    /// Names this router as the nodes it relays to name it: a report that
    /// says which of its reservations it counted covers exactly those
    /// ([`Reservations::sync`]). The shell sends each reservation's
    /// sequence number with its request ([`ReservationId::wire_seq`]).
    pub fn set_origin(&mut self, id: NodeId, boot: u64) {
        self.origin = Some((id, boot));
    }

    /// The workload of a node this router reads live rather than from
    /// reports: its own, when the router runs on a node. Ranking takes it
    /// in place of that node's reported workload (which is up to one report
    /// interval old) and counts none of the node's reservations on top, so
    /// `workload` must already include every request this router
    /// dispatched there. Set it before each ranking; `None` goes back to
    /// reports alone.
    pub fn set_live(&mut self, live: Option<(NodeId, Workload)>) {
        self.live = live;
    }

    /// The live workload set by [`Reservations::set_live`], if any.
    pub fn live(&self) -> Option<(NodeId, Workload)> {
        self.live
    }

    /// Counts `profile` on `node` from `now_ms` until it is released or a
    /// workload report made at or after `now_ms` covers it.
    pub fn reserve(
        &mut self,
        node: NodeId,
        profile: &RequestProfile,
        now_ms: u64,
    ) -> ReservationId {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.wire.len() >= Self::MAX_NODES && !self.wire.contains_key(&node) {
            self.wire.pop_first();
        }
        let next = self.wire.entry(node).or_insert(0);
        let wire = *next;
        *next += 1;
        let i = match self.nodes.binary_search_by_key(&node, |n| n.node) {
            Ok(i) => i,
            Err(_) => {
                if self.nodes.len() >= Self::MAX_NODES {
                    self.evict_stalest_node();
                }
                let i = self.nodes.partition_point(|n| n.node < node);
                self.nodes
                    .insert(i, NodeReservations::new(node, self.origin.is_some()));
                i
            }
        };
        let ttl = self.ttl_ms;
        let entry = &mut self.nodes[i];
        // Lost releases must not pile up: forget this node's expired
        // reservations, and its oldest one when the list is full.
        entry.pop_front_while(|r| now_ms.saturating_sub(r.at_ms) > ttl);
        if entry.items.len() >= Self::MAX_PER_NODE
            && let Some(oldest) = entry.items.pop_front()
        {
            entry.take(&oldest);
        }
        // Keep each list in time order even if the caller's clock steps back:
        // a reservation then simply counts a little longer.
        let at_ms = entry.newest_at().map_or(now_ms, |t| t.max(now_ms));
        entry.push(Reservation {
            seq,
            wire,
            at_ms,
            prefill: profile.prompt_tokens,
            decode: profile.answer_tokens(),
        });
        ReservationId { node, seq, wire }
    }

    /// The request finished (or failed) at `now_ms`; returns whether it
    /// was still counted. A report made while it ran (seen by `sync` before
    /// or after this) counts it: it is credited, ranking takes it off that
    /// node's reported workload until a report made after `now_ms`.
    pub fn release(&mut self, id: ReservationId, now_ms: u64) -> bool {
        let Ok(i) = self.nodes.binary_search_by_key(&id.node, |n| n.node) else {
            return false;
        };
        let entry = &mut self.nodes[i];
        if let Ok(j) = entry.items.binary_search_by_key(&id.seq, |r| r.seq) {
            if let Some(r) = entry.items.remove(j) {
                entry.take(&r);
                entry.finish_uncovered(r, now_ms);
            }
        } else if let Ok(j) = entry.covered.binary_search_by_key(&id.seq, |r| r.seq) {
            if let Some(r) = entry.covered.remove(j) {
                entry.credit(r, now_ms);
            }
        } else {
            return false;
        }
        if entry.is_empty() {
            self.nodes.remove(i);
        }
        true
    }

    /// Takes in a new snapshot: reservations a node's workload report
    /// covers (made at or after them) stop being added to it; finished
    /// requests the report counts (made while they ran) are credited, and
    /// credits for requests that finished before it go. Call it whenever a
    /// new snapshot is published: ranking adds reservations correctly
    /// without it (only slower), but credits come only from the reports it
    /// has seen.
    pub fn sync(&mut self, cluster: &ClusterSnapshot) {
        let origin = self.origin;
        for entry in &mut self.nodes {
            if let Some(node) = cluster.node(entry.node) {
                // A router that names itself is covered only by what the
                // node says it counted: a report made while a request was
                // on its way does not count it, whatever the clocks say.
                let coverage = match origin {
                    Some((id, boot)) => Coverage::Admitted(
                        node.admitted
                            .iter()
                            .find(|a| a.from == id && a.boot == boot)
                            .copied(),
                    ),
                    None => Coverage::Time,
                };
                entry.covered_by(node.reported_at_ms, coverage);
            }
        }
        self.nodes.retain(|n| !n.is_empty());
    }

    /// Forgets reservations and credits older than the time-to-live.
    pub fn expire(&mut self, now_ms: u64) {
        let ttl = self.ttl_ms;
        let old = |r: &Reservation| now_ms.saturating_sub(r.at_ms) > ttl;
        for entry in &mut self.nodes {
            entry.pop_front_while(old);
            while entry.covered.front().is_some_and(old) {
                entry.covered.pop_front();
            }
            entry.drop_credits_while(old);
            entry.finished.retain(|(r, _)| !old(r));
        }
        self.nodes.retain(|n| !n.is_empty());
    }

    /// Work on `node` that a report made at `reported_at_ms` still counts
    /// but that has finished since.
    pub fn credited(&self, node: NodeId, reported_at_ms: u64) -> Reserved {
        self.of(node, |n| n.credited(reported_at_ms))
    }

    /// `f` of `node`'s lists; nothing if it has none.
    fn of(&self, node: NodeId, f: impl FnOnce(&NodeReservations) -> Reserved) -> Reserved {
        self.nodes
            .binary_search_by_key(&node, |n| n.node)
            .map_or_else(|_| Reserved::default(), |i| f(&self.nodes[i]))
    }

    /// Work reserved on `node` that a report made at `reported_at_ms` does
    /// not show yet.
    pub fn on_node(&self, node: NodeId, reported_at_ms: u64) -> Reserved {
        self.of(node, |n| n.uncovered(reported_at_ms))
    }

    /// Outstanding reservations over all nodes (reported or not).
    pub fn len(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| n.items.len() + n.covered.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Per-node lists sorted by node id, for a merge walk beside the
    /// (equally sorted) cluster snapshot.
    pub(crate) fn sorted(&self) -> &[NodeReservations] {
        &self.nodes
    }

    fn evict_stalest_node(&mut self) {
        if let Some((i, _)) = self
            .nodes
            .iter()
            .enumerate()
            .min_by_key(|(_, n)| (n.newest_at(), n.node))
        {
            self.nodes.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::{Admitted, ApiFlavor, NodeSnapshot};

    fn profile(prompt: u32, out: u32) -> RequestProfile {
        let mut p = RequestProfile::new("m", ApiFlavor::Ollama);
        p.prompt_tokens = prompt;
        p.max_output_tokens = out;
        p
    }

    fn id(n: u128) -> NodeId {
        NodeId::from_u128(n)
    }

    #[test]
    fn reserve_counts_at_once_and_release_undoes_it() {
        let mut r = Reservations::new();
        let a = r.reserve(id(1), &profile(100, 10), 5);
        let b = r.reserve(id(1), &profile(50, 20), 6);
        r.reserve(id(2), &profile(1, 1), 6);
        assert_eq!(
            r.on_node(id(1), 0),
            Reserved {
                jobs: 2,
                prefill_tokens: 150,
                decode_tokens: 30
            }
        );
        assert!(r.release(a, 7));
        assert!(!r.release(a, 7), "second release is a no-op");
        assert_eq!(r.on_node(id(1), 0).jobs, 1);
        assert!(r.release(b, 7));
        assert_eq!(r.on_node(id(1), 0), Reserved::default());
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_fresher_report_covers_older_reservations() {
        let mut r = Reservations::new();
        r.reserve(id(1), &profile(10, 10), 100);
        r.reserve(id(1), &profile(20, 20), 200);
        // Without sync the uncovered view is already right.
        assert_eq!(r.on_node(id(1), 99).jobs, 2);
        assert_eq!(r.on_node(id(1), 100).jobs, 1);
        assert_eq!(r.on_node(id(1), 150).prefill_tokens, 20);
        assert_eq!(r.on_node(id(1), 200).jobs, 0);

        // A report at 150 covers the first: it is no longer added (but
        // still outstanding: the report counts it while it runs).
        let mut n = NodeSnapshot::new(id(1), "a");
        n.reported_at_ms = 150;
        r.sync(&ClusterSnapshot::new(1, 150, vec![n.clone()]));
        assert_eq!(r.len(), 2);
        assert_eq!(r.on_node(id(1), 0).prefill_tokens, 20);
        n.reported_at_ms = 200;
        r.sync(&ClusterSnapshot::new(2, 200, vec![n.clone()]));
        assert_eq!(r.on_node(id(1), 0), Reserved::default());
        assert_eq!(r.credited(id(1), 200), Reserved::default());
    }

    #[test]
    fn a_covered_request_that_finishes_is_credited_until_a_newer_report() {
        let mut r = Reservations::new();
        let a = r.reserve(id(1), &profile(10, 10), 100);
        let b = r.reserve(id(1), &profile(20, 20), 120);
        let mut n = NodeSnapshot::new(id(1), "a");
        n.reported_at_ms = 150;
        r.sync(&ClusterSnapshot::new(1, 150, vec![n.clone()]));
        // `a` finishes at 160: the report made at 150 still counts it.
        assert!(r.release(a, 160));
        let c = r.credited(id(1), 150);
        assert_eq!((c.jobs, c.prefill_tokens, c.decode_tokens), (1, 10, 10));
        assert_eq!(
            r.credited(id(1), 160),
            Reserved::default(),
            "a report after it"
        );
        let mut w = n.workload;
        w.running = 2;
        w.decode_tokens = 25;
        let less = r.sorted()[0].less_credited(w, 150);
        assert_eq!((less.running, less.queued, less.decode_tokens), (1, 0, 15));
        // The next report (made after 160) no longer counts it: the credit goes.
        n.reported_at_ms = 170;
        r.sync(&ClusterSnapshot::new(2, 170, vec![n.clone()]));
        assert_eq!(r.credited(id(1), 0), Reserved::default());
        assert_eq!(r.len(), 1);
        // A reservation released before any report covered it is simply gone.
        let d = r.reserve(id(1), &profile(5, 5), 180);
        assert!(r.release(d, 190));
        assert_eq!(r.credited(id(1), 170), Reserved::default());
        assert!(r.release(b, 200));
        n.reported_at_ms = 210;
        r.sync(&ClusterSnapshot::new(3, 210, vec![n]));
        assert!(r.is_empty());
    }

    /// The report made while the request ran arrives only after it has
    /// finished (reports travel once per gossip interval): it is credited
    /// then, and a report older than the dispatch never is.
    #[test]
    fn a_report_arriving_after_the_finish_is_credited_too() {
        let mut r = Reservations::new();
        let a = r.reserve(id(1), &profile(10, 10), 100);
        assert!(r.release(a, 160));
        assert_eq!(r.len(), 0);
        let mut n = NodeSnapshot::new(id(1), "a");
        n.reported_at_ms = 90;
        r.sync(&ClusterSnapshot::new(1, 90, vec![n.clone()]));
        assert_eq!(r.credited(id(1), 90), Reserved::default(), "made before it");
        n.reported_at_ms = 150;
        r.sync(&ClusterSnapshot::new(2, 150, vec![n.clone()]));
        assert_eq!(r.credited(id(1), 150).jobs, 1, "made while it ran");
        n.reported_at_ms = 170;
        r.sync(&ClusterSnapshot::new(3, 170, vec![n]));
        assert_eq!(r.credited(id(1), 150), Reserved::default());
        assert!(r.is_empty());
    }

    /// A report that says which of this router's requests it counts and
    /// which of those have ended decides what is credited, on any clock:
    /// here the peer's clock is ahead of the router's (its reports look
    /// made after the router saw the answers end), then behind.
    #[test]
    fn a_report_that_says_what_ended_credits_exactly_that_on_any_clock() {
        let (me, boot) = (id(9), 4);
        for skew in [1_000i64, 0, -1_000] {
            let mut r = Reservations::new();
            r.set_origin(me, boot);
            let report = |at: i64, admitted: Admitted| {
                let mut n = NodeSnapshot::new(id(1), "a");
                n.reported_at_ms = u64::try_from(at + skew).unwrap();
                n.admitted = vec![admitted];
                ClusterSnapshot::new(1, n.reported_at_ms, vec![n])
            };
            let a = r.reserve(id(1), &profile(10, 10), 5_000);
            let b = r.reserve(id(1), &profile(20, 20), 5_001);
            // Both counted, both running.
            let mut seen = Admitted::first(me, boot, a.wire_seq());
            seen.admit(b.wire_seq());
            r.sync(&report(5_010, seen));
            let at = |t: i64| u64::try_from(t + skew).unwrap();
            assert_eq!(r.on_node(id(1), at(5_010)), Reserved::default());
            // `a` ends here; the report still counts it.
            assert!(r.release(a, 5_020));
            assert_eq!(r.credited(id(1), at(5_010)).jobs, 1, "skew {skew}");
            // A newer report still counts `a` running (its end had not
            // reached the node's workload): still credited.
            r.sync(&report(5_030, seen));
            assert_eq!(r.credited(id(1), at(5_030)).jobs, 1, "skew {skew}");
            // The next one says `a` ended: nothing is credited, `b` is
            // still counted by the report and not added again.
            seen.end(a.wire_seq());
            r.sync(&report(5_040, seen));
            assert_eq!(r.credited(id(1), at(5_040)), Reserved::default());
            assert_eq!(r.on_node(id(1), at(5_040)), Reserved::default());
            // `b` ends at the node before the router hears it: the report
            // no longer counts it, so its release credits nothing.
            seen.end(b.wire_seq());
            r.sync(&report(5_050, seen));
            assert!(!r.release(b, 5_060), "already gone");
            assert_eq!(r.credited(id(1), at(5_050)), Reserved::default());
            assert!(r.is_empty(), "skew {skew}");
            // Released before any report covered it, then reported counted
            // and running: credited, whatever the clocks say.
            let c = r.reserve(id(1), &profile(5, 5), 5_070);
            assert!(r.release(c, 5_080));
            seen.admit(c.wire_seq());
            r.sync(&report(5_090, seen));
            assert_eq!(r.credited(id(1), at(5_090)).jobs, 1, "skew {skew}");
            seen.end(c.wire_seq());
            r.sync(&report(5_100, seen));
            assert_eq!(r.credited(id(1), at(5_100)), Reserved::default());
            assert!(r.is_empty(), "skew {skew}");
        }
    }

    /// A router that names itself counts a reservation on a node it had
    /// none on until a report names it, however far ahead the node's clock
    /// runs (its reports would look made after the dispatch).
    #[test]
    fn a_named_routers_new_reservation_counts_whatever_the_clocks_say() {
        let mut r = Reservations::new();
        r.set_origin(id(9), 4);
        let ahead = 100_000;
        let a = r.reserve(id(1), &profile(10, 10), 100);
        assert_eq!(r.on_node(id(1), ahead).jobs, 1, "no report applied yet");
        let mut n = NodeSnapshot::new(id(1), "a");
        n.reported_at_ms = ahead;
        r.sync(&ClusterSnapshot::new(1, ahead, vec![n.clone()]));
        assert_eq!(
            r.on_node(id(1), ahead).jobs,
            1,
            "the report did not name it"
        );
        n.admitted = vec![Admitted::first(id(9), 4, a.wire_seq())];
        n.reported_at_ms = ahead + 10;
        r.sync(&ClusterSnapshot::new(2, ahead + 10, vec![n]));
        assert_eq!(r.on_node(id(1), ahead + 10).jobs, 0, "named: covered");
        // Without a name, a reservation made before a report's time is
        // taken as counted by it.
        let mut t = Reservations::new();
        t.reserve(id(1), &profile(10, 10), 100);
        assert_eq!(t.on_node(id(1), ahead).jobs, 0);
    }

    /// A peer that names this router's reservations but says nothing of
    /// their ends (a node from before `ended`): a finished request is
    /// credited while the reports were made before it finished, by time,
    /// as without names.
    #[test]
    fn a_report_silent_on_ends_credits_by_time() {
        let (me, boot) = (id(9), 4);
        let mut r = Reservations::new();
        r.set_origin(me, boot);
        let a = r.reserve(id(1), &profile(10, 10), 100);
        let mut seen = Admitted::first(me, boot, a.wire_seq());
        seen.ended = None;
        let report = |at: u64| {
            let mut n = NodeSnapshot::new(id(1), "a");
            n.reported_at_ms = at;
            n.admitted = vec![seen];
            ClusterSnapshot::new(1, at, vec![n])
        };
        r.sync(&report(150));
        assert!(r.release(a, 160));
        assert_eq!(r.credited(id(1), 150).jobs, 1);
        r.sync(&report(170));
        assert_eq!(r.credited(id(1), 170), Reserved::default());
        assert!(r.is_empty());
    }

    #[test]
    fn memory_is_bounded_per_node_and_by_age() {
        let mut r = Reservations::with_ttl(10_000);
        for t in 0..(Reservations::MAX_PER_NODE as u64 + 10) {
            r.reserve(id(1), &profile(1, 1), t);
        }
        assert_eq!(r.len(), Reservations::MAX_PER_NODE);
        let held = r.on_node(id(1), 0);
        assert_eq!(held.jobs as usize, Reservations::MAX_PER_NODE);
        assert_eq!(held.prefill_tokens, Reservations::MAX_PER_NODE as u64);
        // The oldest went first: the report at t=9 covers none of what is left.
        assert_eq!(
            r.on_node(id(1), 9).jobs as usize,
            Reservations::MAX_PER_NODE
        );

        // Held: t = 10..=1033. Expiring at 10_500 keeps t >= 500.
        r.expire(10_500);
        assert_eq!(r.len(), 1033 - 500 + 1);
        // A new reservation also sheds its node's expired ones.
        r.reserve(id(1), &profile(1, 1), 20_000);
        assert_eq!(r.len(), 1);
        r.expire(1_000_000);
        assert!(r.is_empty());
    }

    #[test]
    fn node_count_is_bounded() {
        let mut r = Reservations::new();
        for n in 0..(Reservations::MAX_NODES as u128 + 5) {
            r.reserve(id(n), &profile(1, 1), n as u64);
        }
        assert_eq!(r.sorted().len(), Reservations::MAX_NODES);
        // The stalest nodes went first.
        assert_eq!(r.on_node(id(0), 0).jobs, 0);
        assert_eq!(
            r.on_node(id(Reservations::MAX_NODES as u128 + 4), 0).jobs,
            1
        );
        assert!(r.sorted().windows(2).all(|w| w[0].node < w[1].node));
    }

    #[test]
    fn backwards_clock_keeps_lists_ordered() {
        let mut r = Reservations::new();
        r.reserve(id(1), &profile(1, 1), 500);
        let late = r.reserve(id(1), &profile(2, 2), 100);
        assert_eq!(r.on_node(id(1), 499).jobs, 2);
        assert!(r.release(late, 300));
    }
}
