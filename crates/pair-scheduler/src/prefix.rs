//! An approximate per-node prefix index: which prompt prefixes each node's
//! engine still holds in its KV cache, learned from what was routed there
//! and corrected by what the engines report, so a prediction prices only
//! the prompt tokens a node must prefill (SGLang's cache-aware router keeps
//! an approximate radix tree per worker; this keeps hashes of whole
//! prefixes, the blocks of [`PromptChain`]).
//!
//! Each node's cache is a set of blocks with an LRU order. Holding a block
//! means holding its whole prefix, so the set is kept closed under
//! prefixes: a block is never held without every earlier block of its
//! chain. That is what lets [`PrefixIndex::cached_tokens`] binary-search a
//! chain (O(log n) hash-set probes, no allocation) instead of walking it.
//! Three rules keep it closed:
//! - touching a chain stamps its blocks tail first, so a block is always
//!   more recent than every block after it, and LRU eviction takes a
//!   chain's tail before its head;
//! - a block is forgotten with everything that extends it (a correction
//!   that says a prefix is gone says its extensions are gone too);
//! - nothing else removes blocks.
//!
//! Capacity is the engine's, in tokens. pair-core cannot tell a pooled
//! engine (vLLM, SGLang: shared prefix blocks under the KV size) from a
//! slot engine (llama.cpp, Ollama, LM Studio: one context per slot), since
//! both report as OpenAI-compatible, so every engine is modelled as a slot
//! engine: `slots x` [`DEFAULT_CONTEXT_PER_SLOT`] tokens, shared prefixes
//! counted once (an LRU pool over the slots' total). The model is not part
//! of the key: the chain should name it if one node serves several models
//! from one prompt.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use pair_core::{Block, ClusterSnapshot, NodeId, NodeSnapshot, PromptChain};

/// Tokens of context assumed per engine slot when the engine does not say:
/// a coding agent's ~20k-token prompts only run on engines given at least
/// that much, and 32k is the setting such engines are commonly given.
pub const DEFAULT_CONTEXT_PER_SLOT: u32 = 32_768;

/// Blocks remembered per node at most, whatever its capacity (about 512k
/// tokens of 64-token blocks; about 100 bytes each with the LRU order and
/// the prefix links, so under 1 MiB per node).
pub const MAX_BLOCKS_PER_NODE: usize = 8_192;

/// Nodes remembered at most; the node touched least recently is forgotten
/// first.
pub const MAX_NODES: usize = 64;

/// Dispatches per node whose predicted cached tokens are kept, to compare
/// with what the engine reports when the answer ends.
pub const DISPATCHES_REMEMBERED: usize = 32;

/// Reports in a row finding under half the predicted cached tokens after
/// which a node is believed to keep no cache (caching off, or a context
/// too small for its prompts); one report finding half or more restores it.
pub const MISSES_TO_DISTRUST: u8 = 3;

/// Block hashes are already uniform (xxh3 of the prefix), so the hash set
/// uses them as they are.
#[derive(Clone, Copy, Default)]
struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed; this keeps any other use correct.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockSet<V> = HashMap<u64, V, BuildHasherDefault<Identity>>;

#[derive(Clone, Copy, Debug)]
struct Held {
    /// Position in the node's LRU order (higher: more recent).
    stamp: u64,
    tokens: u32,
    /// The block before it in its chain (none for a chain's first block).
    parent: Option<u64>,
}

/// One node's cache as believed.
#[derive(Clone, Debug)]
struct NodeCache {
    capacity_tokens: u64,
    held_tokens: u64,
    /// When a chain was last recorded or corrected here (node LRU).
    touched_ms: u64,
    blocks: BlockSet<Held>,
    /// stamp -> block: the eviction order. Hash-map order never decides.
    by_age: BTreeMap<u64, u64>,
    /// (parent, child) links, so a forgotten prefix takes its extensions.
    children: BTreeSet<(u64, u64)>,
    /// (last block's hash, cached tokens predicted) of recent dispatches,
    /// a ring: `next` is the oldest.
    dispatched: [(u64, u32); DISPATCHES_REMEMBERED],
    next: usize,
    /// Reports in a row that found under half the prediction.
    misses: u8,
}

impl NodeCache {
    fn new(capacity_tokens: u64, now_ms: u64) -> Self {
        Self {
            capacity_tokens,
            held_tokens: 0,
            touched_ms: now_ms,
            blocks: BlockSet::default(),
            by_age: BTreeMap::new(),
            children: BTreeSet::new(),
            dispatched: [(0, 0); DISPATCHES_REMEMBERED],
            next: 0,
            misses: 0,
        }
    }

    fn distrusted(&self) -> bool {
        self.misses >= MISSES_TO_DISTRUST
    }

    fn remember_dispatch(&mut self, tail: u64, predicted: u32) {
        self.dispatched[self.next] = (tail, predicted);
        self.next = (self.next + 1) % DISPATCHES_REMEMBERED;
    }

    /// What was predicted cached when the chain ending in `tail` was last
    /// dispatched here, if that is recent enough to be remembered.
    fn predicted_at_dispatch(&self, tail: u64) -> Option<u32> {
        (1..=DISPATCHES_REMEMBERED)
            .map(|back| {
                self.dispatched[(self.next + DISPATCHES_REMEMBERED - back) % DISPATCHES_REMEMBERED]
            })
            .find(|(hash, _)| *hash == tail)
            .map(|(_, predicted)| predicted)
    }

    fn matched(&self, chain: &PromptChain) -> usize {
        chain.matched_blocks(|_, b| self.blocks.contains_key(&b.hash))
    }

    /// Stamps `blocks` tail first (see the module's rules) from `clock`.
    fn touch(&mut self, blocks: &[Block], clock: &mut u64) {
        for i in (0..blocks.len()).rev() {
            let b = blocks[i];
            let (parent, start) = match i.checked_sub(1).map(|p| blocks[p]) {
                Some(p) => (Some(p.hash), p.end),
                None => (None, 0),
            };
            *clock += 1;
            let stamp = *clock;
            match self.blocks.get_mut(&b.hash) {
                Some(h) => {
                    self.by_age.remove(&h.stamp);
                    h.stamp = stamp;
                }
                None => {
                    let tokens = b.end.saturating_sub(start);
                    self.blocks.insert(
                        b.hash,
                        Held {
                            stamp,
                            tokens,
                            parent,
                        },
                    );
                    self.held_tokens += u64::from(tokens);
                    if let Some(p) = parent {
                        self.children.insert((p, b.hash));
                    }
                }
            }
            self.by_age.insert(stamp, b.hash);
        }
    }

    /// Evicts least recently used blocks until within capacity and the
    /// hard cap. The oldest block is always a leaf (its extensions are
    /// older still, so already gone), which keeps the set prefix-closed.
    fn evict(&mut self, max_blocks: usize) {
        while self.held_tokens > self.capacity_tokens || self.blocks.len() > max_blocks {
            let Some((_, hash)) = self.by_age.pop_first() else {
                break;
            };
            self.drop_one(hash);
        }
    }

    fn drop_one(&mut self, hash: u64) {
        if let Some(h) = self.blocks.remove(&hash) {
            self.held_tokens -= u64::from(h.tokens);
            if let Some(p) = h.parent {
                self.children.remove(&(p, hash));
            }
        }
    }

    /// Forgets `root` and every block that extends it.
    fn forget_from(&mut self, root: u64, stack: &mut Vec<u64>) {
        stack.clear();
        stack.push(root);
        while let Some(hash) = stack.pop() {
            let kids = self.children.range((hash, 0)..=(hash, u64::MAX));
            stack.extend(kids.map(|&(_, c)| c));
            if let Some(h) = self.blocks.get(&hash) {
                self.by_age.remove(&h.stamp);
            }
            self.drop_one(hash);
        }
    }
}

/// Which prompt prefixes each node holds, as far as this router can tell.
/// Plain data, deterministic: the same calls give the same answers.
#[derive(Clone, Debug)]
pub struct PrefixIndex {
    nodes: BTreeMap<NodeId, NodeCache>,
    /// LRU stamps, shared by all nodes (only their order within a node
    /// matters).
    clock: u64,
    max_nodes: usize,
    max_blocks: usize,
    stack: Vec<u64>,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl PrefixIndex {
    /// An empty index with the hard caps [`MAX_NODES`] and
    /// [`MAX_BLOCKS_PER_NODE`].
    pub fn new() -> Self {
        Self::with_limits(MAX_NODES, MAX_BLOCKS_PER_NODE)
    }

    /// An empty index with tighter caps (clamped to the constants, at
    /// least 1): for tests and small embedders.
    pub fn with_limits(max_nodes: usize, max_blocks_per_node: usize) -> Self {
        Self {
            nodes: BTreeMap::new(),
            clock: 0,
            max_nodes: max_nodes.clamp(1, MAX_NODES),
            max_blocks: max_blocks_per_node.clamp(1, MAX_BLOCKS_PER_NODE),
            stack: Vec::new(),
        }
    }

    /// The KV capacity in tokens a node's engines are modelled with:
    /// its healthy engines' slots times [`DEFAULT_CONTEXT_PER_SLOT`].
    pub fn capacity_of(node: &NodeSnapshot) -> u64 {
        u64::from(node.slots()) * u64::from(DEFAULT_CONTEXT_PER_SLOT)
    }

    /// Tokens of `chain`'s prefix believed held on `node` (whole blocks).
    /// Allocation-free; O(log blocks) probes.
    pub fn cached_tokens(&self, node: NodeId, chain: &PromptChain) -> u32 {
        if chain.is_empty() {
            return 0;
        }
        self.nodes
            .get(&node)
            .filter(|c| !c.distrusted())
            .map_or(0, |c| chain.tokens_at(c.matched(chain)))
    }

    /// Whether `node`'s recent reports found so much less cached than
    /// predicted ([`MISSES_TO_DISTRUST`] in a row) that its lookups answer 0.
    pub fn distrusted(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(NodeCache::distrusted)
    }

    /// Whether `node` is believed to hold the prefix that ends in the block
    /// hashed `hash`.
    pub fn holds(&self, node: NodeId, hash: u64) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|c| c.blocks.contains_key(&hash))
    }

    /// Call after dispatching a request with `chain` to `node`: the engine
    /// will hold the whole prompt once it has prefilled it.
    pub fn record(&mut self, node: NodeId, chain: &PromptChain, now_ms: u64) {
        if chain.is_empty() {
            return;
        }
        let (max_blocks, mut clock) = (self.max_blocks, self.clock);
        let cache = self.cache_mut(node, now_ms);
        let predicted = chain.tokens_at(cache.matched(chain));
        if let Some(tail) = chain.blocks().last() {
            cache.remember_dispatch(tail.hash, predicted);
        }
        cache.touch(chain.blocks(), &mut clock);
        cache.evict(max_blocks);
        self.clock = clock;
    }

    /// Call when the engine that ran `chain` on `node` said how many of its
    /// prompt tokens it found cached (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`, llama.cpp's
    /// `timings.cache_n`, Ollama's prompt tokens less `prompt_eval_count`).
    ///
    /// - The engine lacked the blocks past `cached_tokens` when the request
    ///   arrived, so it lacked every other prompt through them too: those
    ///   are forgotten (the engine evicted them, or never had them).
    /// - The chain itself is held whole, the blocks up to `cached_tokens`
    ///   included: the engine has just prefilled the rest. (Forgetting it
    ///   would unlearn every conversation's first turn, which finds
    ///   nothing cached by nature.)
    /// - The report is compared with what was predicted cached when the
    ///   chain was dispatched ([`PrefixIndex::record`]): under half of it
    ///   [`MISSES_TO_DISTRUST`] times in a row and the node is believed to
    ///   keep nothing ([`PrefixIndex::distrusted`]), until a report finds
    ///   half or more of a prediction again.
    pub fn correct(&mut self, node: NodeId, chain: &PromptChain, cached_tokens: u32, now_ms: u64) {
        let blocks = chain.blocks();
        let Some(tail) = blocks.last() else {
            return;
        };
        let k = blocks.partition_point(|b| b.end <= cached_tokens);
        let (max_blocks, mut clock) = (self.max_blocks, self.clock);
        let mut stack = std::mem::take(&mut self.stack);
        let cache = self.cache_mut(node, now_ms);
        match cache.predicted_at_dispatch(tail.hash) {
            Some(predicted)
                if predicted > 0 && u64::from(cached_tokens) * 2 < u64::from(predicted) =>
            {
                cache.misses = cache.misses.saturating_add(1);
            }
            Some(predicted) if predicted > 0 => cache.misses = 0,
            _ => {}
        }
        if let Some(first_gone) = blocks.get(k) {
            cache.forget_from(first_gone.hash, &mut stack);
        }
        cache.touch(blocks, &mut clock);
        cache.evict(max_blocks);
        self.clock = clock;
        self.stack = stack;
    }

    /// Sets `node`'s capacity in tokens, evicting what no longer fits
    /// (a node recorded before it is sized holds one default slot:
    /// [`DEFAULT_CONTEXT_PER_SLOT`]).
    pub fn set_capacity(&mut self, node: NodeId, capacity_tokens: u64) {
        let max_blocks = self.max_blocks;
        let c = self.cache_mut(node, 0);
        c.capacity_tokens = capacity_tokens;
        c.evict(max_blocks);
    }

    /// Sets every indexed node's capacity from `cluster`
    /// ([`PrefixIndex::capacity_of`]); call it when a snapshot is published.
    pub fn sync(&mut self, cluster: &ClusterSnapshot) {
        let max_blocks = self.max_blocks;
        for (id, cache) in &mut self.nodes {
            if let Some(n) = cluster.node(*id) {
                cache.capacity_tokens = Self::capacity_of(n);
                cache.evict(max_blocks);
            }
        }
    }

    /// Forgets a node (it left, or its engine restarted); returns whether it
    /// was indexed.
    pub fn forget(&mut self, node: NodeId) -> bool {
        self.nodes.remove(&node).is_some()
    }

    /// Nodes indexed.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Blocks held on `node`.
    pub fn blocks(&self, node: NodeId) -> usize {
        self.nodes.get(&node).map_or(0, |c| c.blocks.len())
    }

    /// Tokens held on `node` (each block once).
    pub fn held_tokens(&self, node: NodeId) -> u64 {
        self.nodes.get(&node).map_or(0, |c| c.held_tokens)
    }

    /// `node`'s capacity in tokens, if indexed.
    pub fn capacity(&self, node: NodeId) -> Option<u64> {
        self.nodes.get(&node).map(|c| c.capacity_tokens)
    }

    /// The node's cache, made (with the capacity of one default slot until
    /// told otherwise) when new, forgetting the least recently touched node
    /// when full.
    fn cache_mut(&mut self, node: NodeId, now_ms: u64) -> &mut NodeCache {
        if !self.nodes.contains_key(&node) && self.nodes.len() >= self.max_nodes {
            // Rare (a new node when full), so a scan is fine.
            if let Some(oldest) = self
                .nodes
                .iter()
                .min_by_key(|(id, c)| (c.touched_ms, **id))
                .map(|(id, _)| *id)
            {
                self.nodes.remove(&oldest);
            }
        }
        let cache = self
            .nodes
            .entry(node)
            .or_insert_with(|| NodeCache::new(u64::from(DEFAULT_CONTEXT_PER_SLOT), now_ms));
        cache.touched_ms = cache.touched_ms.max(now_ms);
        cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::ChainBuilder;

    fn id(n: u128) -> NodeId {
        NodeId::from_u128(n)
    }

    /// A chain of segments `(id, tokens)`.
    fn chain(segments: &[(u64, u32)]) -> PromptChain {
        let mut b = ChainBuilder::new();
        for &(s, t) in segments {
            b.segment(s, t);
        }
        b.finish()
    }

    #[test]
    fn a_recorded_chain_is_cached_and_its_extensions_share_its_prefix() {
        let mut ix = PrefixIndex::new();
        let turn1 = chain(&[(1, 20_000), (2, 500)]);
        let turn2 = chain(&[(1, 20_000), (2, 500), (3, 700)]);
        let other = chain(&[(1, 20_000), (9, 300)]);
        assert_eq!(ix.cached_tokens(id(1), &turn1), 0);
        ix.record(id(1), &turn1, 10);
        assert_eq!(ix.cached_tokens(id(1), &turn1), 20_500);
        assert_eq!(ix.cached_tokens(id(1), &turn2), 20_500);
        assert_eq!(ix.cached_tokens(id(1), &other), 20_000);
        assert_eq!(ix.cached_tokens(id(2), &turn1), 0, "another node");
        assert_eq!(ix.cached_tokens(id(1), &PromptChain::EMPTY), 0);
        assert_eq!((ix.blocks(id(1)), ix.held_tokens(id(1))), (2, 20_500));
    }

    #[test]
    fn lru_takes_the_oldest_tail_first_and_keeps_shared_heads() {
        let mut ix = PrefixIndex::new();
        let a = chain(&[(1, 10_000), (2, 10_000)]);
        let b = chain(&[(1, 10_000), (3, 10_000)]);
        ix.record(id(1), &a, 1);
        ix.set_capacity(id(1), 25_000);
        ix.record(id(1), &b, 2);
        // 30k would be held (the shared head once): a's tail, the oldest
        // block, goes.
        assert_eq!(ix.held_tokens(id(1)), 20_000);
        assert_eq!(ix.cached_tokens(id(1), &a), 10_000);
        assert_eq!(ix.cached_tokens(id(1), &b), 20_000);
        // A chain longer than the whole cache keeps its head.
        ix.set_capacity(id(1), 15_000);
        assert_eq!(ix.cached_tokens(id(1), &b), 10_000);
        assert!(ix.holds(id(1), a.blocks()[0].hash));
    }

    #[test]
    fn corrections_forget_other_prompts_past_the_report_and_keep_the_one_run() {
        let mut ix = PrefixIndex::new();
        ix.set_capacity(id(1), 1 << 20);
        let long = chain(&[(1, 1_000), (2, 1_000), (3, 1_000), (4, 1_000)]);
        let short = chain(&[(1, 1_000), (2, 1_000), (5, 1_000)]);
        ix.record(id(1), &long, 1);
        ix.record(id(1), &short, 2);
        // The engine found only the first block of `short` cached: it had
        // lost block 2, and so `long`'s blocks 3 and 4, which extend it.
        // `short` itself it holds now, whole: it has just prefilled it.
        ix.correct(id(1), &short, 1_500, 3);
        assert_eq!(ix.cached_tokens(id(1), &short), 3_000);
        assert_eq!(ix.cached_tokens(id(1), &long), 2_000);
        assert_eq!(ix.blocks(id(1)), 3);
        assert!(!ix.holds(id(1), long.blocks()[3].hash));
        // A report from a node that knew more than the index adds it.
        ix.correct(id(2), &long, 3_000, 4);
        assert_eq!(ix.cached_tokens(id(2), &long), 4_000);
        assert_eq!(ix.held_tokens(id(2)), 4_000);
    }

    #[test]
    fn a_first_turn_finding_nothing_cached_is_still_remembered() {
        let mut ix = PrefixIndex::new();
        let turn1 = chain(&[(1, 20_000), (2, 300)]);
        ix.record(id(1), &turn1, 1);
        ix.correct(id(1), &turn1, 0, 2);
        assert_eq!(ix.cached_tokens(id(1), &turn1), 20_300);
        assert!(!ix.distrusted(id(1)));
    }

    #[test]
    fn a_node_that_keeps_missing_predicted_hits_is_distrusted_until_one_lands() {
        let mut ix = PrefixIndex::new();
        let system = chain(&[(1, 20_000)]);
        ix.record(id(1), &system, 0);
        for turn in 1..=u64::from(MISSES_TO_DISTRUST) {
            assert!(!ix.distrusted(id(1)), "turn {turn}");
            let c = chain(&[(1, 20_000), (turn + 10, 300)]);
            ix.record(id(1), &c, turn);
            // Predicted 20,000 cached; the engine (caching off) found none.
            ix.correct(id(1), &c, 0, turn);
        }
        assert!(ix.distrusted(id(1)));
        assert_eq!(ix.cached_tokens(id(1), &system), 0);
        // A report finding most of a prediction restores it.
        let c = chain(&[(1, 20_000), (99, 300)]);
        ix.record(id(1), &c, 9);
        ix.correct(id(1), &c, 20_000, 9);
        assert!(!ix.distrusted(id(1)));
        assert_eq!(ix.cached_tokens(id(1), &c), 20_300);
        // A report for a dispatch not remembered changes no trust.
        ix.correct(id(1), &chain(&[(7, 100)]), 0, 10);
        assert!(!ix.distrusted(id(1)));
    }

    #[test]
    fn capacity_follows_the_snapshot_and_nodes_are_capped() {
        let mut ix = PrefixIndex::with_limits(2, 4);
        let c = chain(&[(1, 100), (2, 100), (3, 100), (4, 100), (5, 100), (6, 100)]);
        ix.record(id(1), &c, 1);
        assert_eq!(ix.blocks(id(1)), 4, "the per-node block cap");
        assert_eq!(ix.cached_tokens(id(1), &c), 400);
        ix.record(id(2), &c, 2);
        ix.record(id(3), &c, 3);
        assert_eq!(ix.nodes(), 2);
        assert_eq!(ix.blocks(id(1)), 0, "the least recently touched node went");
        let mut n = NodeSnapshot::new(id(2), "n");
        n.engines.push(pair_core::EngineSnapshot {
            kind: pair_core::EngineKind::Ollama,
            healthy: true,
            silent: false,
            continues_chat: None,
            slots: 4,
            models: Vec::new(),
        });
        assert_eq!(PrefixIndex::capacity_of(&n), 4 * 32_768);
        ix.sync(&ClusterSnapshot::new(1, 0, vec![n]));
        assert_eq!(ix.capacity(id(2)), Some(4 * 32_768));
        assert_eq!(ix.capacity(id(3)), Some(32_768), "not in the snapshot");
        assert!(ix.forget(id(2)));
        assert!(!ix.forget(id(2)));
    }
}
