//! Session affinity as a tie-break: a conversation's turn goes back to the
//! node it ran on when no other node is predicted clearly sooner.
//!
//! The KV cache a conversation left on its node is priced by the
//! prediction itself (the prefix index: staying prefills the new tokens,
//! moving the whole context), so the binding no longer has to outweigh a
//! faster node; it only settles near-ties, where staying costs nothing
//! and keeps whatever the index does not know about.

use std::collections::BTreeMap;

use pair_core::{ClusterSnapshot, NodeId, SessionKey};
use serde::{Deserialize, Serialize};

use crate::SchedulerError;

/// The tie margin: a session's home goes first unless another node is
/// predicted more than this many ms sooner...
pub const TIE_MARGIN_MS: u32 = 100;
/// ...and more than this many percent sooner. Small on purpose: prediction
/// noise, not a price for the cache, which the prediction already counts.
pub const TIE_MARGIN_PCT: u8 = 10;

/// When a session may leave its node, and how much the table remembers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AffinityConfig {
    /// Another node must be predicted more than this many ms sooner...
    /// (the tie margin; default [`TIE_MARGIN_MS`])
    pub min_gain_ms: u32,
    /// ...and more than this many percent sooner, for the session to move
    /// (default [`TIE_MARGIN_PCT`]).
    pub min_gain_pct: u8,
    /// Sessions remembered; the least recently used is forgotten first.
    pub capacity: usize,
    /// A session idle this long is forgotten (its KV cache is gone anyway).
    pub idle_ttl_ms: u64,
}

impl Default for AffinityConfig {
    fn default() -> Self {
        Self {
            min_gain_ms: TIE_MARGIN_MS,
            min_gain_pct: TIE_MARGIN_PCT,
            capacity: 4096,
            idle_ttl_ms: 30 * 60 * 1000,
        }
    }
}

impl AffinityConfig {
    pub fn new(
        min_gain_ms: u32,
        min_gain_pct: u8,
        capacity: usize,
        idle_ttl_ms: u64,
    ) -> Result<Self, SchedulerError> {
        if min_gain_pct > 100 {
            return Err(SchedulerError::BadAffinity {
                reason: "min_gain_pct must be at most 100",
            });
        }
        if capacity == 0 {
            return Err(SchedulerError::BadAffinity {
                reason: "capacity must be at least 1",
            });
        }
        Ok(Self {
            min_gain_ms,
            min_gain_pct,
            capacity,
            idle_ttl_ms,
        })
    }

    /// Whether a node predicted at `other_ms` beats the session's node at
    /// `sticky_ms` by enough to move the session.
    pub fn should_move(&self, sticky_ms: u32, other_ms: u32) -> bool {
        let gain = sticky_ms.saturating_sub(other_ms);
        gain > self.min_gain_ms
            && u64::from(gain) * 100 > u64::from(sticky_ms) * u64::from(self.min_gain_pct)
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    node: NodeId,
    last_ms: u64,
}

/// Session -> node, bounded by [`AffinityConfig::capacity`].
#[derive(Clone, Debug)]
pub(crate) struct AffinityTable {
    config: AffinityConfig,
    map: BTreeMap<SessionKey, Entry>,
}

impl AffinityTable {
    pub(crate) fn new(config: AffinityConfig) -> Self {
        Self {
            config,
            map: BTreeMap::new(),
        }
    }

    pub(crate) fn config(&self) -> &AffinityConfig {
        &self.config
    }

    pub(crate) fn get(&self, session: SessionKey, now_ms: u64) -> Option<NodeId> {
        self.map
            .get(&session)
            .filter(|e| now_ms.saturating_sub(e.last_ms) <= self.config.idle_ttl_ms)
            .map(|e| e.node)
    }

    /// Where `session` lives: the newest of this router's own binding and
    /// the bindings the nodes report, so a conversation whose turns enter
    /// at different nodes is followed to one place. A tie goes to the own
    /// binding, then to the lowest node id; every router that sees the
    /// same reports and has no newer binding of its own agrees.
    pub(crate) fn home(
        &self,
        session: SessionKey,
        cluster: &ClusterSnapshot,
        now_ms: u64,
    ) -> Option<NodeId> {
        let fresh = |at: u64| now_ms.saturating_sub(at) <= self.config.idle_ttl_ms;
        let own = self
            .map
            .get(&session)
            .filter(|e| fresh(e.last_ms))
            .map(|e| (e.last_ms, e.node));
        let reported = cluster
            .nodes()
            .iter()
            .flat_map(|n| n.bindings.iter())
            .filter(|b| b.session == session && fresh(b.at_ms))
            .max_by_key(|b| (b.at_ms, std::cmp::Reverse(b.node)))
            .map(|b| (b.at_ms, b.node));
        match (own, reported) {
            (Some(o), Some(r)) if r.0 > o.0 => Some(r.1),
            (Some(o), _) => Some(o.1),
            (None, r) => r.map(|r| r.1),
        }
    }

    pub(crate) fn bind(&mut self, session: SessionKey, node: NodeId, now_ms: u64) {
        if !self.map.contains_key(&session) && self.map.len() >= self.config.capacity {
            // Rare (only when full and a new session arrives), so a scan is fine.
            if let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(k, e)| (e.last_ms, **k))
                .map(|(k, _)| *k)
            {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(
            session,
            Entry {
                node,
                last_ms: now_ms,
            },
        );
    }

    pub(crate) fn forget(&mut self, session: SessionKey) -> bool {
        self.map.remove(&session).is_some()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused() {
        assert!(matches!(
            AffinityConfig::new(1, 101, 1, 1),
            Err(SchedulerError::BadAffinity { .. })
        ));
        assert!(AffinityConfig::new(1, 10, 0, 1).is_err());
        assert!(AffinityConfig::new(1, 10, 1, 1).is_ok());
    }

    #[test]
    fn moving_needs_both_absolute_and_relative_gain() {
        let c = AffinityConfig::new(500, 25, 8, 1_000).unwrap();
        assert!(
            !c.should_move(1_000, 600),
            "400 ms is under the absolute bar"
        );
        assert!(
            !c.should_move(10_000, 9_000),
            "10% is under the relative bar"
        );
        assert!(c.should_move(2_000, 1_000));
        assert!(!c.should_move(1_000, 2_000));
    }

    /// The default is a tie margin, no longer a gate: a node 300 ms and
    /// 30 % sooner takes the session (the old 500 ms / 25 % kept it).
    #[test]
    fn the_default_margin_only_settles_near_ties() {
        let c = AffinityConfig::default();
        assert_eq!(
            (c.min_gain_ms, c.min_gain_pct),
            (TIE_MARGIN_MS, TIE_MARGIN_PCT)
        );
        assert!(c.should_move(1_000, 700));
        assert!(!c.should_move(1_000, 950), "50 ms is a tie");
        assert!(!c.should_move(10_000, 9_200), "8 % is a tie");
        assert!(c.should_move(10_000, 8_800));
    }

    #[test]
    fn table_is_bounded_lru_and_expires() {
        let c = AffinityConfig::new(0, 0, 2, 100).unwrap();
        let mut t = AffinityTable::new(c);
        let n = |i| NodeId::from_u128(i);
        t.bind(SessionKey(1), n(1), 0);
        t.bind(SessionKey(2), n(2), 10);
        t.bind(SessionKey(1), n(1), 20); // refresh 1: 2 is now the oldest
        t.bind(SessionKey(3), n(3), 30);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(SessionKey(2), 30), None);
        assert_eq!(t.get(SessionKey(1), 30), Some(n(1)));
        assert_eq!(t.get(SessionKey(1), 121), None, "idle past the ttl");
        assert!(t.forget(SessionKey(3)));
        assert!(!t.forget(SessionKey(3)));
    }
}
