//! Learns how many requests an engine runs at once, per model, from the
//! requests themselves: when a request's first token arrives while others
//! on the same node and model are still streaming, the engine runs at least
//! that many at once. Ollama does not report its parallelism, so without
//! this every Ollama node is priced as one slot and queues are predicted
//! where a slot is free.
//!
//! The figure is a lower bound that only rises: overlap proves slots, a
//! quiet period proves nothing. Times are one node's own clock (the node
//! learns its own engines and advertises the result in its report).

use std::collections::{BTreeMap, VecDeque};

use pair_core::NodeId;

/// One request's streaming interval on an engine, ms on the node's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Streamed {
    pub first_token_ms: u64,
    pub end_ms: u64,
}

#[derive(Clone, Debug, Default)]
struct Learned {
    recent: VecDeque<Streamed>,
    slots: u16,
}

/// Slots learned per (node, model), each from its most recent requests.
#[derive(Clone, Debug, Default)]
pub struct SlotLearner {
    table: BTreeMap<(NodeId, String), Learned>,
}

impl SlotLearner {
    /// Requests kept per (node, model) to find overlaps among.
    pub const WINDOW: usize = 64;
    /// Another request counts as running at a first token only if it ends
    /// at least this long after it: the proxy sees an engine's output a
    /// little late, and a one-slot engine's next request may start the
    /// moment the last token of the previous one was sent.
    pub const MARGIN_MS: u64 = 50;
    /// No engine is taken for more than this.
    pub const MAX_SLOTS: u16 = 256;

    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one finished request in; returns the slots learned so far.
    pub fn observe(&mut self, node: NodeId, model: &str, s: Streamed) -> u16 {
        let l = self.table.entry((node, model.to_owned())).or_default();
        // A request that streamed for less than the margin (or did not
        // stream: its first byte was its last) shows no overlap.
        if s.end_ms < s.first_token_ms + Self::MARGIN_MS {
            return l.slots.max(1);
        }
        if l.recent.len() == Self::WINDOW {
            l.recent.pop_front();
        }
        l.recent.push_back(s);
        // The new interval can only raise the overlap at its own first
        // token or at the first tokens it spans.
        // Running at `t`: streaming by then and still a margin later (the
        // request whose first token `t` is among them). Each holds a slot
        // at `t`, so the count never exceeds the engine's slots.
        let at = |t: u64| {
            l.recent
                .iter()
                .filter(|o| o.first_token_ms <= t && o.end_ms >= t + Self::MARGIN_MS)
                .count()
        };
        let mut most = at(s.first_token_ms);
        for o in &l.recent {
            if o.first_token_ms >= s.first_token_ms && o.first_token_ms <= s.end_ms {
                most = most.max(at(o.first_token_ms));
            }
        }
        let most = u16::try_from(most)
            .unwrap_or(u16::MAX)
            .clamp(1, Self::MAX_SLOTS);
        l.slots = l.slots.max(most);
        l.slots
    }

    /// Slots learned for `model` on `node`, if any request was seen.
    pub fn slots(&self, node: NodeId, model: &str) -> Option<u16> {
        self.table
            .get(&(node, model.to_owned()))
            .map(|l| l.slots.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NODE: NodeId = NodeId::from_u128(7);

    fn s(first: u64, end: u64) -> Streamed {
        Streamed {
            first_token_ms: first,
            end_ms: end,
        }
    }

    #[test]
    fn back_to_back_requests_prove_one_slot_overlapping_ones_more() {
        let mut l = SlotLearner::new();
        assert_eq!(l.slots(NODE, "m"), None);
        // Answers that were not streamed say nothing either way.
        l.observe(NODE, "m", s(500, 500));
        l.observe(NODE, "m", s(500, 500));
        assert_eq!(l.slots(NODE, "m"), Some(1));
        // A one-slot engine: each starts as the previous ends (the proxy
        // sees the end a few ms late).
        for i in 0..10 {
            l.observe(NODE, "m", s(i * 1000 + 5, i * 1000 + 1000 + 20));
        }
        assert_eq!(l.slots(NODE, "m"), Some(1));
        // Two streams at once, then three.
        l.observe(NODE, "m", s(20_000, 30_000));
        l.observe(NODE, "m", s(21_000, 25_000));
        assert_eq!(l.slots(NODE, "m"), Some(2));
        // Observed out of order: the longest-running one finishes last.
        l.observe(NODE, "m", s(22_000, 23_000));
        assert_eq!(l.slots(NODE, "m"), Some(3));
        // A quiet spell proves nothing: the figure stays.
        for i in 0..100 {
            l.observe(NODE, "m", s(100_000 + i * 1000, 100_000 + i * 1000 + 500));
        }
        assert_eq!(l.slots(NODE, "m"), Some(3));
        assert_eq!(l.slots(NODE, "other"), None);
        assert_eq!(l.slots(NodeId::from_u128(8), "m"), None);
    }

    /// Requests served FIFO by an engine with `slots` slots: each starts
    /// (first token) when it arrives and a slot is free, and holds the slot
    /// for its length.
    fn served(slots: usize, jobs: &[(u64, u64, u64)]) -> Vec<Streamed> {
        let mut free_at = vec![0u64; slots];
        let mut out = Vec::new();
        let mut t = 0;
        for &(gap, prefill, decode) in jobs {
            t += gap;
            let (i, &free) = free_at.iter().enumerate().min_by_key(|(_, f)| **f).unwrap();
            let start = t.max(free);
            let first = start + prefill;
            let end = first + decode;
            free_at[i] = end;
            out.push(s(first, end));
        }
        out
    }

    proptest! {
        /// Whatever the traffic and the order in which requests finish,
        /// the learned figure never exceeds the engine's real slots.
        #[test]
        fn never_more_than_the_engine_has(
            slots in 1usize..6,
            jobs in prop::collection::vec((0u64..3000, 1u64..500, 1u64..5000), 1..80),
            shuffle in any::<u64>(),
        ) {
            let mut done = served(slots, &jobs);
            // Finish order: by end, ties broken arbitrarily.
            done.sort_by_key(|d| (d.end_ms, d.first_token_ms ^ shuffle));
            let mut l = SlotLearner::new();
            for d in &done {
                l.observe(NODE, "m", *d);
            }
            prop_assert!(l.slots(NODE, "m").unwrap() as usize <= slots);
        }

        /// Saturated by simultaneous long requests, every slot is found.
        #[test]
        fn a_saturated_engine_shows_all_its_slots(slots in 1usize..8, extra in 0usize..4) {
            let jobs: Vec<_> = (0..slots + extra).map(|_| (0, 10, 10_000)).collect();
            let mut done = served(slots, &jobs);
            done.sort_by_key(|d| d.end_ms);
            let mut l = SlotLearner::new();
            for d in &done {
                l.observe(NODE, "m", *d);
            }
            prop_assert_eq!(l.slots(NODE, "m").unwrap() as usize, slots);
        }
    }
}
