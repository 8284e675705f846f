//! Where this node sent the conversations that entered at it: the
//! bindings its report carries, so a later turn that enters at another node
//! (another app, a client that failed over) still finds the node that holds
//! the conversation's prompt cache, without a shared store. And the prompts
//! it sent, so every router's prefix index learns what each engine holds,
//! whichever node routed there.

use std::collections::VecDeque;
use std::sync::Mutex;

use pair_core::prompt::MAX_ROUTED;
use pair_core::{Binding, NodeId, PromptChain, Routed, SessionKey};

/// Bindings a report carries at most (the most recent ones).
pub const REPORTED: usize = 64;
/// A binding older than this is dropped: the engine's prompt cache has
/// long been reused by then.
pub const KEPT_FOR_MS: u64 = 10 * 60 * 1000;

/// A prompt stays in the reports this long after it was routed: long
/// enough for every peer to see it in a report or two at the slowest
/// report interval, short enough that a report stays small.
pub const ROUTED_FOR_MS: u64 = 3_000;

/// The most recent bindings made here, newest first, and the prompts sent,
/// oldest first.
#[derive(Debug, Default)]
pub struct Bindings {
    recent: Mutex<VecDeque<Binding>>,
    routed: Mutex<Routes>,
}

#[derive(Debug, Default)]
struct Routes {
    /// Oldest first.
    recent: VecDeque<Routed>,
    seq: u64,
}

impl Bindings {
    /// `session`'s latest turn went to `node` at `now_ms`.
    pub fn bind(&self, session: SessionKey, node: NodeId, now_ms: u64) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|b| b.session != session);
        recent.push_front(Binding {
            session,
            node,
            at_ms: now_ms,
        });
        recent.truncate(REPORTED);
    }

    /// A request whose prompt is `prefix` went to `node` at `now_ms`. An
    /// earlier prompt to the same node that this one extends (the same
    /// conversation's previous turn) gives way to it.
    pub fn route(&self, node: NodeId, prefix: &PromptChain, now_ms: u64) {
        if prefix.is_empty() {
            return;
        }
        let mut routes = self.routed.lock().unwrap_or_else(|p| p.into_inner());
        routes
            .recent
            .retain(|r| r.node != node || prefix.common_blocks(r.prefix.blocks()) < r.prefix.len());
        routes.seq += 1;
        let seq = routes.seq;
        routes.recent.push_back(Routed {
            seq,
            node,
            at_ms: now_ms,
            prefix: prefix.clone(),
        });
        while routes.recent.len() > MAX_ROUTED {
            routes.recent.pop_front();
        }
    }

    /// The prompts the report carries: those routed within
    /// [`ROUTED_FOR_MS`], oldest first.
    pub fn routed(&self, now_ms: u64) -> Vec<Routed> {
        let mut routes = self.routed.lock().unwrap_or_else(|p| p.into_inner());
        while routes
            .recent
            .front()
            .is_some_and(|r| now_ms.saturating_sub(r.at_ms) > ROUTED_FOR_MS)
        {
            routes.recent.pop_front();
        }
        routes.recent.iter().cloned().collect()
    }

    /// What the report carries: the bindings made within
    /// [`KEPT_FOR_MS`], newest first.
    pub fn reported(&self, now_ms: u64) -> Vec<Binding> {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        while recent
            .back()
            .is_some_and(|b| now_ms.saturating_sub(b.at_ms) > KEPT_FOR_MS)
        {
            recent.pop_back();
        }
        recent.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u128) -> NodeId {
        NodeId::from_u128(n)
    }

    #[test]
    fn the_newest_binding_of_a_session_wins_and_old_ones_go() {
        let b = Bindings::default();
        b.bind(SessionKey(1), node(1), 0);
        b.bind(SessionKey(2), node(2), 10);
        b.bind(SessionKey(1), node(3), 20);
        let r = b.reported(20);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].session, r[0].node), (SessionKey(1), node(3)));
        assert_eq!(r[1].session, SessionKey(2));
        assert!(b.reported(30 + KEPT_FOR_MS).is_empty());
        for s in 0..(REPORTED as u64 + 10) {
            b.bind(SessionKey(s), node(1), 40 + KEPT_FOR_MS);
        }
        assert_eq!(b.reported(40 + KEPT_FOR_MS).len(), REPORTED);
    }

    #[test]
    fn a_later_turn_replaces_its_earlier_one_and_old_prompts_go() {
        let chain = |segments: &[u64]| {
            let mut c = pair_core::ChainBuilder::new();
            for s in segments {
                c.segment(*s, 1_000);
            }
            c.finish()
        };
        let b = Bindings::default();
        b.route(node(1), &chain(&[1, 2]), 0);
        b.route(node(1), &chain(&[1, 3]), 10);
        // The same conversation's next turn, on the same node: one entry.
        b.route(node(1), &chain(&[1, 2, 4]), 20);
        // On another node, the earlier turn is still news.
        b.route(node(2), &chain(&[1, 3]), 30);
        b.route(node(1), &pair_core::PromptChain::EMPTY, 40);
        let r = b.routed(40);
        let seen: Vec<(u64, usize)> = r.iter().map(|r| (r.seq, r.prefix.len())).collect();
        assert_eq!(seen, vec![(2, 2), (3, 3), (4, 2)]);
        assert_eq!(b.routed(31 + ROUTED_FOR_MS).len(), 0);
        for k in 0..(MAX_ROUTED as u64 + 5) {
            b.route(node(3), &chain(&[k + 100]), 50 + ROUTED_FOR_MS);
        }
        assert_eq!(b.routed(50 + ROUTED_FOR_MS).len(), MAX_ROUTED);
    }
}
