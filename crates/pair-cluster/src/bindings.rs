//! Where this node sent the conversations that entered at it: the
//! bindings its report carries, so a later turn that enters at another node
//! (another app, a client that failed over) still finds the node that holds
//! the conversation's prompt cache, without a shared store.

use std::collections::VecDeque;
use std::sync::Mutex;

use pair_core::{Binding, NodeId, SessionKey};

/// Bindings a report carries at most (the most recent ones).
pub const REPORTED: usize = 64;
/// A binding older than this is dropped: the engine's prompt cache has
/// long been reused by then.
pub const KEPT_FOR_MS: u64 = 10 * 60 * 1000;

/// The most recent bindings made here, newest first.
#[derive(Debug, Default)]
pub struct Bindings {
    recent: Mutex<VecDeque<Binding>>,
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
}
