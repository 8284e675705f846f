//! An approximate per-node prefix index: which prompt prefixes each node's
//! engine still holds in its KV cache, learned from what was routed there
//! and corrected by what the engines report, so a prediction prices only
//! the prompt tokens a node must prefill (SGLang's cache-aware router keeps
//! an approximate radix tree per worker; this keeps the prompts themselves,
//! as [`PromptChain`]s of prefix hashes).
//!
//! Each node is modelled as the engines pair routes to keep their cache
//! (llama.cpp server, Ollama, LM Studio; docs/engine-figures.md §5): per
//! SLOT. A slot holds the context of the last request it served, up to
//! [`DEFAULT_CONTEXT_PER_SLOT`] tokens; a new request takes the slot whose
//! context shares the longest prefix with its prompt, else the least
//! recently used one, and that slot's context becomes the new prompt. A
//! 4-slot engine therefore holds 4 contexts however small they are, and a
//! conversation whose slot was taken by another is no longer cached even
//! if the engine's memory could have held both (an LRU pool over the
//! slots' total, the earlier model, believed it still was, and kept
//! routing later turns to a node that had to prefill them again).
//!
//! A lookup is the longest common prefix over the slots a request could
//! take now (see below): a binary search per slot
//! ([`PromptChain::common_blocks`]), no allocation. The
//! node's slot count is its healthy engines' slots from the snapshot
//! ([`NodeSnapshot::slots`]), at most [`MAX_SLOTS_PER_NODE`]: pooled
//! engines (vLLM, SGLang) report many slots and are approximated by that
//! many contexts, since pair-core cannot tell them apart from slot engines
//! (both report as OpenAI-compatible). Which engine of a node serves a
//! request is not known either, so a node's slots are modelled as one
//! engine's. The model is not part of the key: the chain should name it if
//! one node serves several models from one prompt.
//!
//! Beside its slots, each node keeps a HOST tier, as llama.cpp server does
//! by default (its host-memory prompt cache, `--cache-ram`, which LM Studio
//! keeps too, where idle slots' contexts are saved): every prompt a report
//! says ran on the node is saved there, newest last, up to
//! [`DEFAULT_HOST_TOKENS`] (a prompt another one extends is kept once), and
//! a lookup also finds a saved prompt sharing at least a quarter of itself
//! with the request (llama.cpp's rule for a restore, which costs a copy,
//! not a prefill, so its tokens count as cached). Only reported prompts
//! are saved: a request withdrawn before its engine ran it leaves nothing.
//!
//! An engine gives a request a FREE slot, so a slot is taken as busy from
//! its request's dispatch ([`PrefixIndex::record`]) to its report
//! ([`PrefixIndex::correct`]), or for [`BUSY_FORGOTTEN_MS`] when no report
//! comes; a request dispatched meanwhile takes another slot, as on the
//! engine (with every slot busy it queues, and is placed as if all were
//! free). A lookup likewise counts only free slots while one is free: five
//! sub-agents sent at once to a 4-slot engine each prefill their shared
//! system prompt in a slot of their own, however many slots will hold it
//! once they have; a busy slot whose whole context the prompt extends is
//! free for it (its conversation's previous turn has ended: the prompt
//! carries the answer). Corrections from the engines' reports repair what
//! the model gets wrong.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use pair_core::{ClusterSnapshot, NodeId, NodeSnapshot, PromptChain};

/// Tokens of context assumed per engine slot when the engine does not say:
/// a coding agent's ~20k-token prompts only run on engines given at least
/// that much, and 32k is the setting such engines are commonly given. A
/// slot keeps the first this many tokens of a longer prompt.
pub const DEFAULT_CONTEXT_PER_SLOT: u32 = 32_768;

/// Slots (contexts) modelled per node at most, whatever the snapshot says:
/// engines that report more are pooled ones (vLLM, SGLang), whose cache
/// that many recent contexts approximates well, and a lookup scans every
/// slot.
pub const MAX_SLOTS_PER_NODE: usize = 64;

/// Blocks kept per node at most, over all its slots: every slot full of a
/// 32k-token prompt cut from bytes (64-token blocks), 16 bytes a block, so
/// at most 512 KiB per node. Past it the least recently used slots are
/// forgotten first.
pub const MAX_BLOCKS_PER_NODE: usize =
    MAX_SLOTS_PER_NODE * (DEFAULT_CONTEXT_PER_SLOT / pair_core::prompt::BLOCK_TOKENS) as usize;

/// Tokens of saved contexts a node's host tier keeps at most: llama.cpp
/// server's default `--cache-ram` (8,192 MiB) at an 8B model's f16 KV
/// (128 KiB a token). Engines do not report it.
pub const DEFAULT_HOST_TOKENS: u64 = 65_536;

/// A saved context is restored only if it shares at least this share of
/// itself with the prompt (llama.cpp's rule).
const HOST_MIN_KEEP: f64 = 0.25;

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

/// How long a slot is taken as busy with a request whose report never
/// came (it failed, or its engine says nothing of its cache): longer than
/// a request usually runs (a 20k-token prompt prefilled and a long answer
/// decoded on a slow node take about a minute).
pub const BUSY_FORGOTTEN_MS: u64 = 120_000;

/// One slot as believed: the context it holds, when it was last given a
/// request (an LRU stamp; 0: never), and since when it runs one, if it
/// does (ms).
#[derive(Clone, Debug, Default)]
struct Slot {
    held: PromptChain,
    stamp: u64,
    busy_since_ms: Option<u64>,
}

impl Slot {
    fn busy(&self, now_ms: u64) -> bool {
        self.busy_since_ms
            .is_some_and(|since| now_ms < since.saturating_add(BUSY_FORGOTTEN_MS))
    }

    /// Whether a request sharing `common` blocks with this slot's context
    /// may take it at `now_ms`: it is free, or busy with a prompt the
    /// request extends whole (a conversation's previous turn: the request
    /// carries its answer, so it has ended, reported or not; a peer's
    /// dispatch, say, is never reported here).
    fn free_for(&self, common: usize, now_ms: u64) -> bool {
        !self.busy(now_ms) || (common > 0 && common == self.held.len())
    }
}

/// A recent dispatch: the last block's hash of its chain, the cached tokens
/// predicted for it, and the stamp it was recorded at.
#[derive(Clone, Copy, Debug, Default)]
struct Dispatch {
    tail: u64,
    predicted: u32,
    stamp: u64,
}

/// One node's cache as believed.
#[derive(Clone, Debug)]
struct NodeCache {
    /// Never empty: a node has at least one slot.
    slots: Vec<Slot>,
    /// Saved contexts, oldest first, and their tokens in all.
    host: VecDeque<PromptChain>,
    host_held: u64,
    /// Tokens a slot keeps at most.
    context_tokens: u32,
    /// When a chain was last recorded or corrected here (node LRU).
    touched_ms: u64,
    /// Recent dispatches, a ring: `next` is the oldest.
    dispatched: [Dispatch; DISPATCHES_REMEMBERED],
    next: usize,
    /// Reports in a row that found under half the prediction.
    misses: u8,
}

impl NodeCache {
    fn new(now_ms: u64) -> Self {
        Self {
            slots: vec![Slot::default()],
            host: VecDeque::new(),
            host_held: 0,
            context_tokens: DEFAULT_CONTEXT_PER_SLOT,
            touched_ms: now_ms,
            dispatched: [Dispatch::default(); DISPATCHES_REMEMBERED],
            next: 0,
            misses: 0,
        }
    }

    fn distrusted(&self) -> bool {
        self.misses >= MISSES_TO_DISTRUST
    }

    fn remember_dispatch(&mut self, d: Dispatch) {
        self.dispatched[self.next] = d;
        self.next = (self.next + 1) % DISPATCHES_REMEMBERED;
    }

    /// The latest remembered dispatch of the chain ending in `tail`.
    fn dispatch_of(&self, tail: u64) -> Option<Dispatch> {
        (1..=DISPATCHES_REMEMBERED)
            .map(|back| {
                self.dispatched[(self.next + DISPATCHES_REMEMBERED - back) % DISPATCHES_REMEMBERED]
            })
            .find(|d| d.stamp > 0 && d.tail == tail)
    }

    /// Blocks of `chain` held by the best slot a request for it may take
    /// at `now_ms`: of the free slots, or of all when none is (it queues
    /// for the first to end, and slots that busy mostly share what it
    /// shares with them: a system prompt). A busy slot is of no use while
    /// another is free: the engine gives the request a free one and
    /// prefills the rest there. Allocation-free.
    fn matched(&self, chain: &PromptChain, now_ms: u64) -> usize {
        let (mut best_free, mut best_any, mut any_free) = (0, 0, false);
        for s in &self.slots {
            let common = chain.common_blocks(s.held.blocks());
            best_any = best_any.max(common);
            if s.free_for(common, now_ms) {
                any_free = true;
                best_free = best_free.max(common);
                if best_free == chain.len() {
                    break;
                }
            }
        }
        let slots = if any_free { best_free } else { best_any };
        slots.max(self.restorable(chain))
    }

    /// Blocks of `chain` the saved context a request for it would restore
    /// holds: the most any saved context sharing at least
    /// [`HOST_MIN_KEEP`] of itself shares. Allocation-free.
    fn restorable(&self, chain: &PromptChain) -> usize {
        let first = chain.blocks().first();
        self.host
            .iter()
            // Most saved prompts share nothing: one compare says so.
            .filter(|saved| saved.blocks().first() == first)
            .map(|saved| (chain.common_blocks(saved.blocks()), saved.tokens()))
            .filter(|&(common, tokens)| {
                common > 0
                    && f64::from(chain.tokens_at(common)) >= HOST_MIN_KEEP * f64::from(tokens)
            })
            .map(|(common, _)| common)
            .max()
            .unwrap_or(0)
    }

    /// Saves `chain` in the host tier (see the module docs):
    /// not if a saved context holds it whole; saved contexts it holds whole
    /// go; then the oldest until the rest fit `capacity` tokens.
    fn save(&mut self, chain: PromptChain, capacity: u64) {
        let tokens = u64::from(chain.tokens());
        if chain.is_empty() || tokens > capacity {
            return;
        }
        let within = |a: &PromptChain, b: &PromptChain| a.common_blocks(b.blocks()) == a.len();
        if self.host.iter().any(|e| within(&chain, e)) {
            return;
        }
        let mut freed = 0;
        self.host.retain(|e| {
            let obsolete = within(e, &chain);
            if obsolete {
                freed += u64::from(e.tokens());
            }
            !obsolete
        });
        self.host_held -= freed;
        self.host_held += tokens;
        self.host.push_back(chain);
        while self.host_held > capacity {
            let Some(oldest) = self.host.pop_front() else {
                break;
            };
            self.host_held -= u64::from(oldest.tokens());
        }
    }

    /// Blocks held over the slots and the host tier.
    fn total_blocks(&self) -> usize {
        self.slots.iter().map(|s| s.held.len()).sum::<usize>()
            + self.host.iter().map(PromptChain::len).sum::<usize>()
    }

    /// The slot a request for `chain` takes at `now_ms`: among the free
    /// slots (all of them when none is), the longest common prefix, then
    /// the least recently used, then the lowest index (the engines' rule,
    /// as `pair-emulator`'s `CacheKind::Slots` keeps it; with nothing
    /// shared, that is the least recently used slot).
    fn choose(&self, chain: &PromptChain, now_ms: u64) -> usize {
        let free = |s: &Slot| s.free_for(chain.common_blocks(s.held.blocks()), now_ms);
        let any_free = self.slots.iter().any(free);
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !any_free || free(s))
            .max_by_key(|&(i, s)| {
                (
                    chain.common_blocks(s.held.blocks()),
                    Reverse(s.stamp),
                    Reverse(i),
                )
            })
            .map_or(0, |(i, _)| i)
    }

    /// `chain` as a slot keeps it: its blocks within the slot's context and
    /// the node's block cap (a copy only when that cuts it).
    fn fit(&self, chain: &PromptChain, max_blocks: usize) -> PromptChain {
        let context = self.context_tokens;
        let keep = chain.matched_blocks(|i, b| b.end <= context && i < max_blocks);
        cut(chain, keep)
    }

    /// Forgets the oldest saved contexts, then least recently used slots'
    /// contexts, until the node holds at most `max_blocks` blocks (each
    /// context alone fits: [`Self::fit`]).
    fn enforce_cap(&mut self, max_blocks: usize) {
        let mut total = self.total_blocks();
        while total > max_blocks {
            let Some(oldest) = self.host.pop_front() else {
                break;
            };
            total -= oldest.len();
            self.host_held -= u64::from(oldest.tokens());
        }
        while total > max_blocks {
            let Some(oldest) = self
                .slots
                .iter_mut()
                .filter(|s| !s.held.is_empty())
                .min_by_key(|s| s.stamp)
            else {
                break;
            };
            total -= oldest.held.len();
            oldest.held = PromptChain::EMPTY;
        }
    }

    /// Models `slots` slots of `context_tokens` each: fewer keep the most
    /// recently used, more start empty, and contexts are cut to fit.
    fn resize(&mut self, slots: usize, context_tokens: u32, max_blocks: usize) {
        let slots = slots.clamp(1, MAX_SLOTS_PER_NODE);
        while self.slots.len() > slots {
            let oldest = self
                .slots
                .iter()
                .enumerate()
                .min_by_key(|&(i, s)| (s.stamp, i))
                .map_or(0, |(i, _)| i);
            self.slots.remove(oldest);
        }
        self.slots.resize_with(slots, Slot::default);
        if context_tokens != self.context_tokens {
            self.context_tokens = context_tokens;
            for i in 0..self.slots.len() {
                let held = self.fit(&self.slots[i].held, max_blocks);
                self.slots[i].held = held;
            }
            for i in 0..self.host.len() {
                let saved = self.fit(&self.host[i], max_blocks);
                self.host_held -= u64::from(self.host[i].tokens() - saved.tokens());
                self.host[i] = saved;
            }
            self.host.retain(|saved| !saved.is_empty());
        }
        self.enforce_cap(max_blocks);
    }
}

/// The first `keep` blocks of `chain` (the chain itself, shared, when that
/// is all of it).
fn cut(chain: &PromptChain, keep: usize) -> PromptChain {
    if keep >= chain.len() {
        chain.clone()
    } else {
        PromptChain::from_blocks(chain.blocks()[..keep].to_vec())
    }
}

/// Slots and tokens a slot for a capacity in tokens: whole default slots,
/// or one smaller slot (see [`PrefixIndex::set_capacity`]).
fn shape(capacity_tokens: u64) -> (usize, u32) {
    let per_slot = u64::from(DEFAULT_CONTEXT_PER_SLOT);
    let slots = usize::try_from(capacity_tokens / per_slot).unwrap_or(MAX_SLOTS_PER_NODE);
    let context = u32::try_from(capacity_tokens.min(per_slot)).unwrap_or(u32::MAX);
    (slots, context)
}

/// Which prompt prefixes each node holds, as far as this router can tell.
/// Plain data, deterministic: the same calls give the same answers.
#[derive(Clone, Debug)]
pub struct PrefixIndex {
    nodes: BTreeMap<NodeId, NodeCache>,
    /// Tokens a node's host tier keeps ([`DEFAULT_HOST_TOKENS`]; 0: none).
    host_tokens: u64,
    /// LRU stamps, shared by all nodes (only their order within a node
    /// matters); starts at 1 so 0 means "never".
    clock: u64,
    max_nodes: usize,
    max_blocks: usize,
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
            host_tokens: DEFAULT_HOST_TOKENS,
            clock: 0,
            max_nodes: max_nodes.clamp(1, MAX_NODES),
            max_blocks: max_blocks_per_node.clamp(1, MAX_BLOCKS_PER_NODE),
        }
    }

    /// The same index with a host tier of `tokens` a node (0: slots only,
    /// as an engine with `--cache-ram 0` or llama-cpp-python keeps).
    pub fn with_host_tokens(mut self, tokens: u64) -> Self {
        self.host_tokens = tokens;
        self
    }

    /// The KV capacity in tokens a node's engines are modelled with: its
    /// healthy engines' slots (at most [`MAX_SLOTS_PER_NODE`]) times
    /// [`DEFAULT_CONTEXT_PER_SLOT`]. [`PrefixIndex::set_capacity`] turns it
    /// back into slots.
    pub fn capacity_of(node: &NodeSnapshot) -> u64 {
        let slots = (node.slots() as usize).clamp(1, MAX_SLOTS_PER_NODE) as u64;
        slots * u64::from(DEFAULT_CONTEXT_PER_SLOT)
    }

    /// Tokens of `chain`'s prefix a request for it would find cached on
    /// `node` now, "now" being the last time the node was recorded or
    /// corrected: see [`PrefixIndex::cached_tokens_at`].
    pub fn cached_tokens(&self, node: NodeId, chain: &PromptChain) -> u32 {
        let now_ms = self.nodes.get(&node).map_or(0, |c| c.touched_ms);
        self.cached_tokens_at(node, chain, now_ms)
    }

    /// Tokens of `chain`'s prefix (whole blocks) held by the best of
    /// `node`'s slots a request for it may take at `now_ms`: the free
    /// slots (a busy slot holding the prompt's conversation counts as
    /// free: the prompt carries its answer), or all slots when every one
    /// is busy. Allocation-free; a binary search per slot.
    pub fn cached_tokens_at(&self, node: NodeId, chain: &PromptChain, now_ms: u64) -> u32 {
        if chain.is_empty() {
            return 0;
        }
        self.nodes
            .get(&node)
            .filter(|c| !c.distrusted())
            .map_or(0, |c| chain.tokens_at(c.matched(chain, now_ms)))
    }

    /// Whether `node`'s recent reports found so much less cached than
    /// predicted ([`MISSES_TO_DISTRUST`] in a row) that its lookups answer 0.
    pub fn distrusted(&self, node: NodeId) -> bool {
        self.nodes.get(&node).is_some_and(NodeCache::distrusted)
    }

    /// Whether one of `node`'s slots is believed to hold the prefix that
    /// ends in the block hashed `hash` (a scan: for inspection).
    pub fn holds(&self, node: NodeId, hash: u64) -> bool {
        self.nodes.get(&node).is_some_and(|c| {
            c.slots
                .iter()
                .map(|s| &s.held)
                .chain(&c.host)
                .any(|h| h.blocks().iter().any(|b| b.hash == hash))
        })
    }

    /// Call after dispatching a request with `chain` to `node`: it takes
    /// the slot sharing the longest prefix with `chain` (else the least
    /// recently used one), which will hold `chain` once the engine has
    /// prefilled it.
    pub fn record(&mut self, node: NodeId, chain: &PromptChain, now_ms: u64) {
        let Some(tail) = chain.blocks().last().map(|b| b.hash) else {
            return;
        };
        self.clock += 1;
        let (stamp, max_blocks) = (self.clock, self.max_blocks);
        let cache = self.cache_mut(node, now_ms);
        let predicted = chain.tokens_at(cache.matched(chain, now_ms));
        cache.remember_dispatch(Dispatch {
            tail,
            predicted,
            stamp,
        });
        let i = cache.choose(chain, now_ms);
        cache.slots[i] = Slot {
            held: cache.fit(chain, max_blocks),
            stamp,
            busy_since_ms: Some(now_ms),
        };
        cache.enforce_cap(max_blocks);
    }

    /// Call when the engine that ran `chain` on `node` said how many of its
    /// prompt tokens it found cached (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`, llama.cpp's
    /// `timings.cache_n`, Ollama's prompt tokens less `prompt_eval_count`).
    ///
    /// - The engine had no free slot sharing more than `cached_tokens` of
    ///   the prompt when the request arrived, so every slot believed to
    ///   have held more of it, idle, since then is cut back to what the
    ///   report found (its own context past that point is gone with it:
    ///   the slot served another prompt, or never had this one). Slots
    ///   given a request since this one's dispatch
    ///   ([`PrefixIndex::record`]), or still busy with an earlier one, are
    ///   left alone: the report says nothing of them.
    /// - The slot that served the request holds the prompt whole now (up
    ///   to a slot's context) and is free: the engine has just prefilled
    ///   the rest. (Forgetting it would unlearn every conversation's first
    ///   turn, which finds nothing cached by nature.) It is the slot its
    ///   dispatch took if that still runs it, else the one a new request
    ///   would take.
    /// - The report is compared with what was predicted cached when the
    ///   chain was dispatched: under half of it [`MISSES_TO_DISTRUST`]
    ///   times in a row and the node is believed to keep nothing
    ///   ([`PrefixIndex::distrusted`]), until a report finds half or more
    ///   of a prediction again.
    pub fn correct(&mut self, node: NodeId, chain: &PromptChain, cached_tokens: u32, now_ms: u64) {
        let blocks = chain.blocks();
        let Some(tail) = blocks.last().map(|b| b.hash) else {
            return;
        };
        let k = blocks.partition_point(|b| b.end <= cached_tokens);
        self.clock += 1;
        let (stamp, max_blocks, host) = (self.clock, self.max_blocks, self.host_tokens);
        let cache = self.cache_mut(node, now_ms);
        let dispatch = cache.dispatch_of(tail);
        match dispatch.map(|d| d.predicted) {
            Some(predicted)
                if predicted > 0 && u64::from(cached_tokens) * 2 < u64::from(predicted) =>
            {
                cache.misses = cache.misses.saturating_add(1);
            }
            Some(predicted) if predicted > 0 => cache.misses = 0,
            _ => {}
        }
        // Without a remembered dispatch every slot is taken as it was then.
        let dispatched_at = dispatch.map_or(u64::MAX, |d| d.stamp);
        let own = dispatch.and_then(|d| {
            cache
                .slots
                .iter()
                .position(|s| s.busy_since_ms.is_some() && s.stamp == d.stamp)
        });
        for (i, s) in cache.slots.iter_mut().enumerate() {
            let idle_since_dispatch = s.stamp < dispatched_at && !s.busy(now_ms);
            if Some(i) != own && idle_since_dispatch && chain.common_blocks(s.held.blocks()) > k {
                s.held = cut(&s.held, k);
            }
        }
        // Saved contexts claiming more were not there either.
        let mut freed = 0;
        for saved in &mut cache.host {
            if chain.common_blocks(saved.blocks()) > k {
                let before = saved.tokens();
                *saved = cut(saved, k);
                freed += u64::from(before - saved.tokens());
            }
        }
        cache.host_held -= freed;
        cache.host.retain(|saved| !saved.is_empty());
        let held = cache.fit(chain, max_blocks);
        let i = own.unwrap_or_else(|| cache.choose(&held, now_ms));
        let slot = &mut cache.slots[i];
        // A slot holding more than the prompt (a later request that
        // extends it) keeps it: that too is on the node.
        if Some(i) == own || held.common_blocks(slot.held.blocks()) < held.len() {
            slot.held = held.clone();
        }
        slot.stamp = stamp;
        slot.busy_since_ms = None;
        if host > 0 {
            cache.save(held, host);
        }
        cache.enforce_cap(max_blocks);
    }

    /// Sets `node`'s capacity in tokens: `capacity_tokens /`
    /// [`DEFAULT_CONTEXT_PER_SLOT`] slots (at least 1, at most
    /// [`MAX_SLOTS_PER_NODE`]) of [`DEFAULT_CONTEXT_PER_SLOT`] tokens, or one
    /// slot of `capacity_tokens` when that is less. Fewer slots keep the
    /// most recently used contexts. (A node recorded before it is sized
    /// has one default slot.)
    pub fn set_capacity(&mut self, node: NodeId, capacity_tokens: u64) {
        let (slots, context) = shape(capacity_tokens);
        let max_blocks = self.max_blocks;
        self.cache_mut(node, 0).resize(slots, context, max_blocks);
    }

    /// Sizes every indexed node from `cluster` ([`PrefixIndex::capacity_of`]);
    /// call it when a snapshot is published.
    pub fn sync(&mut self, cluster: &ClusterSnapshot) {
        let max_blocks = self.max_blocks;
        for (id, cache) in &mut self.nodes {
            if let Some(n) = cluster.node(*id) {
                let (slots, context) = shape(Self::capacity_of(n));
                cache.resize(slots, context, max_blocks);
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

    /// Slots modelled on `node` (0 if not indexed).
    pub fn slots(&self, node: NodeId) -> usize {
        self.nodes.get(&node).map_or(0, |c| c.slots.len())
    }

    /// The contexts `node` is believed to hold, empty ones left out: its
    /// slots', in slot order, then its host tier's, oldest first.
    pub fn contexts(&self, node: NodeId) -> impl Iterator<Item = &PromptChain> {
        self.nodes
            .get(&node)
            .into_iter()
            .flat_map(|c| c.slots.iter().map(|s| &s.held).chain(&c.host))
            .filter(|h| !h.is_empty())
    }

    /// Blocks held on `node`, over all its slots and its host tier (a
    /// prefix two contexts share counts twice, as the engine holds it
    /// twice).
    pub fn blocks(&self, node: NodeId) -> usize {
        self.nodes.get(&node).map_or(0, NodeCache::total_blocks)
    }

    /// Tokens held on `node`, over all its slots and its host tier
    /// (counted per context).
    pub fn held_tokens(&self, node: NodeId) -> u64 {
        self.nodes.get(&node).map_or(0, |c| {
            c.slots
                .iter()
                .map(|s| u64::from(s.held.tokens()))
                .sum::<u64>()
                + c.host_held
        })
    }

    /// `node`'s capacity in tokens (slots times a slot's context), if
    /// indexed.
    pub fn capacity(&self, node: NodeId) -> Option<u64> {
        self.nodes
            .get(&node)
            .map(|c| c.slots.len() as u64 * u64::from(c.context_tokens))
    }

    /// The node's cache, made (with one default slot until told otherwise)
    /// when new, forgetting the least recently touched node when full.
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
            .or_insert_with(|| NodeCache::new(now_ms));
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

    /// An index whose node 1 has `slots` default slots.
    fn with_slots(slots: u64) -> PrefixIndex {
        let mut ix = PrefixIndex::new();
        ix.set_capacity(id(1), slots * u64::from(DEFAULT_CONTEXT_PER_SLOT));
        ix
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
        assert_eq!(ix.slots(id(1)), 1, "one default slot until sized");
    }

    #[test]
    fn a_two_slot_node_that_served_three_conversations_holds_the_last_two() {
        let mut ix = with_slots(2).with_host_tokens(0);
        let (a, b, c) = (chain(&[(1, 300)]), chain(&[(2, 300)]), chain(&[(3, 300)]));
        ix.record(id(1), &a, 1);
        ix.record(id(1), &b, 2);
        ix.record(id(1), &c, 3);
        // However little they take, two slots hold two contexts: c took
        // the least recently used slot, a's.
        assert_eq!(ix.cached_tokens(id(1), &a), 0);
        assert_eq!(ix.cached_tokens(id(1), &b), 300);
        assert_eq!(ix.cached_tokens(id(1), &c), 300);
        assert_eq!(ix.held_tokens(id(1)), 600);
        // b's next turn takes b's slot (the longest common prefix), not
        // the least recently used one: c stays.
        let b2 = chain(&[(2, 300), (4, 100)]);
        ix.record(id(1), &b2, 4);
        assert_eq!(ix.cached_tokens(id(1), &c), 300);
        assert_eq!(ix.cached_tokens(id(1), &b2), 400);
        assert_eq!(ix.contexts(id(1)).count(), 2);
    }

    #[test]
    fn the_host_tier_keeps_what_ran_on_the_node_within_its_budget() {
        let mut ix = with_slots(2);
        let (a, b, c) = (chain(&[(1, 300)]), chain(&[(2, 300)]), chain(&[(3, 300)]));
        for (k, p) in [&a, &b, &c].into_iter().enumerate() {
            ix.record(id(1), p, k as u64 + 1);
            ix.correct(id(1), p, 0, k as u64 + 1);
        }
        // Two slots hold b and c; the host tier all three.
        for p in [&a, &b, &c] {
            assert_eq!(ix.cached_tokens(id(1), p), 300);
        }
        assert_eq!(ix.held_tokens(id(1)), 600 + 900);
        // A prompt extending a saved one replaces it there.
        let a2 = chain(&[(1, 300), (4, 50)]);
        ix.record(id(1), &a2, 10);
        ix.correct(id(1), &a2, 300, 11);
        assert_eq!(
            ix.contexts(id(1))
                .filter(|h| h.common_blocks(a.blocks()) == 1)
                .count(),
            2
        );
        assert_eq!(ix.held_tokens(id(1)), 650 + 950);
        // A saved prompt sharing under a quarter of itself does not count.
        let long = chain(&[(5, 100), (6, 900)]);
        ix.record(id(1), &long, 20);
        ix.correct(id(1), &long, 0, 21);
        for (k, p) in [&b, &c].into_iter().enumerate() {
            ix.record(id(1), p, 30 + k as u64);
            ix.correct(id(1), p, 300, 31 + k as u64);
        }
        assert_eq!(ix.cached_tokens(id(1), &chain(&[(5, 100), (7, 10)])), 0);
        // A request withdrawn before its report leaves nothing saved.
        let gone = chain(&[(8, 500)]);
        ix.record(id(1), &gone, 40);
        ix.record(id(1), &b, 41);
        ix.record(id(1), &c, 42);
        assert_eq!(ix.cached_tokens_at(id(1), &gone, 43), 0);
        // The budget keeps the newest: 65,536 tokens hold two 30k prompts.
        let mut ix = with_slots(1);
        let big = |s| chain(&[(s, 30_000)]);
        for (k, s) in (10..14).enumerate() {
            ix.record(id(1), &big(s), k as u64);
            ix.correct(id(1), &big(s), 0, k as u64);
        }
        assert_eq!(ix.cached_tokens(id(1), &big(10)), 0);
        assert_eq!(ix.cached_tokens(id(1), &big(11)), 0);
        assert_eq!(ix.cached_tokens(id(1), &big(12)), 30_000);
        assert!(ix.held_tokens(id(1)) <= DEFAULT_HOST_TOKENS + u64::from(DEFAULT_CONTEXT_PER_SLOT));
    }

    #[test]
    fn a_shared_system_prompt_is_found_in_any_slot_and_ties_take_the_oldest() {
        let mut ix = with_slots(2);
        let x = chain(&[(1, 20_000), (2, 500)]);
        let y = chain(&[(1, 20_000), (3, 500)]);
        let z = chain(&[(1, 20_000), (4, 500)]);
        ix.record(id(1), &x, 1);
        ix.record(id(1), &y, 2);
        assert_eq!(ix.cached_tokens(id(1), &z), 20_000);
        // z shares the system prompt with both: it takes the older, x's.
        ix.record(id(1), &z, 3);
        assert_eq!(ix.cached_tokens(id(1), &x), 20_000);
        assert_eq!(ix.cached_tokens(id(1), &y), 20_500);
        assert_eq!(ix.cached_tokens(id(1), &z), 20_500);
        // Never used slots are the least recently used, lowest first.
        let mut ix = with_slots(3);
        ix.record(id(1), &x, 1);
        ix.record(id(1), &chain(&[(7, 10)]), 2);
        assert_eq!(ix.cached_tokens(id(1), &x), 20_500);
    }

    #[test]
    fn a_slot_keeps_at_most_its_context() {
        let mut ix = with_slots(1);
        let long = chain(&[(1, 20_000), (2, 10_000), (3, 5_000)]);
        ix.record(id(1), &long, 1);
        assert_eq!(ix.cached_tokens(id(1), &long), 30_000);
        ix.set_capacity(id(1), 25_000);
        assert_eq!(ix.capacity(id(1)), Some(25_000));
        assert_eq!(ix.cached_tokens(id(1), &long), 20_000);
        assert!(ix.holds(id(1), long.blocks()[0].hash));
        assert!(!ix.holds(id(1), long.blocks()[1].hash));
        ix.set_capacity(id(1), 0);
        assert_eq!((ix.blocks(id(1)), ix.held_tokens(id(1))), (0, 0));
    }

    #[test]
    fn fewer_slots_keep_the_most_recent_contexts() {
        let mut ix = with_slots(3);
        let cs: Vec<PromptChain> = (1..=3).map(|i| chain(&[(i, 100)])).collect();
        for (t, c) in cs.iter().enumerate() {
            ix.record(id(1), c, t as u64);
        }
        ix.record(id(1), &cs[0], 9);
        ix.set_capacity(id(1), u64::from(DEFAULT_CONTEXT_PER_SLOT));
        assert_eq!(ix.slots(id(1)), 1);
        assert_eq!(ix.cached_tokens(id(1), &cs[0]), 100);
        assert_eq!(ix.cached_tokens(id(1), &cs[2]), 0);
        ix.set_capacity(id(1), u64::MAX);
        assert_eq!(ix.slots(id(1)), MAX_SLOTS_PER_NODE);
        assert_eq!(ix.cached_tokens(id(1), &cs[0]), 100, "growing keeps them");
    }

    #[test]
    fn a_short_report_cuts_the_idle_slots_that_claimed_more_and_keeps_the_one_run() {
        let mut ix = with_slots(3).with_host_tokens(0);
        let a = chain(&[(1, 1_000), (2, 1_000), (3, 1_000), (4, 1_000)]);
        let b = chain(&[(1, 1_000), (2, 1_000), (6, 1_000)]);
        let c = chain(&[(1, 1_000), (2, 1_000), (5, 1_000)]);
        // a and b run at once, so b takes a slot of its own.
        ix.record(id(1), &a, 1);
        ix.record(id(1), &b, 2);
        ix.correct(id(1), &a, 0, 3);
        ix.correct(id(1), &b, 0, 4);
        assert_eq!(ix.contexts(id(1)).count(), 2);
        // c shares two blocks with both: it takes the less recently used,
        // a's. The engine found only its first block cached: the idle slot
        // the index believes holds b held no second block either, nor
        // anything after it. c itself is held whole: it was just
        // prefilled.
        ix.record(id(1), &c, 5);
        ix.correct(id(1), &c, 1_500, 6);
        assert_eq!(ix.cached_tokens(id(1), &c), 3_000);
        assert_eq!(ix.cached_tokens(id(1), &b), 2_000, "c's slot");
        assert_eq!(ix.cached_tokens(id(1), &a), 2_000, "c's slot");
        assert_eq!(ix.blocks(id(1)), 4, "c's 3 and b's first");
        assert!(!ix.holds(id(1), b.blocks()[2].hash));
        // A report from a node that knew more than the index adds it.
        ix.correct(id(2), &a, 3_000, 7);
        assert_eq!(ix.cached_tokens(id(2), &a), 4_000);
        assert_eq!(ix.held_tokens(id(2)), 4_000);
    }

    #[test]
    fn a_busy_slot_is_not_given_a_request_nor_cut_by_another_report() {
        let mut ix = with_slots(2).with_host_tokens(0);
        let x = chain(&[(1, 2_000), (2, 300)]);
        let y = chain(&[(1, 2_000), (3, 300)]);
        let x2 = chain(&[(1, 2_000), (2, 300), (4, 100)]);
        ix.record(id(1), &x, 1);
        ix.correct(id(1), &x, 0, 2);
        ix.record(id(1), &x2, 3);
        // x2 runs in x's slot, so y takes the other, however much it
        // shares with x's; on the engine it finds nothing.
        ix.record(id(1), &y, 4);
        ix.correct(id(1), &y, 0, 5);
        assert_eq!(ix.cached_tokens(id(1), &x2), 2_400, "still x2's");
        assert_eq!(ix.cached_tokens(id(1), &y), 2_300);
        ix.correct(id(1), &x2, 2_300, 6);
        assert_eq!(ix.cached_tokens(id(1), &x2), 2_400);
        assert_eq!(ix.contexts(id(1)).count(), 2);
        // A slot whose request never reported is free again after a while:
        // y2 takes y's slot and never reports; z, sharing y's context,
        // takes the other slot (x2's) while y2 may still run, y2's after.
        let y2 = chain(&[(1, 2_000), (3, 300), (5, 10)]);
        let z = chain(&[(1, 2_000), (3, 300), (6, 10)]);
        ix.record(id(1), &y2, 7);
        let mut later = ix.clone();
        ix.record(id(1), &z, 8);
        assert_eq!(ix.cached_tokens(id(1), &x2), 2_000);
        later.record(id(1), &z, 7 + BUSY_FORGOTTEN_MS);
        assert_eq!(later.cached_tokens(id(1), &x2), 2_400);
        // y2's slot is z's now, and busy with it: a request for y2 would
        // take the free slot, x2's, which shares the system prompt only.
        assert_eq!(later.cached_tokens(id(1), &y2), 2_000);
        later.correct(id(1), &z, 2_300, 8 + BUSY_FORGOTTEN_MS);
        assert_eq!(later.cached_tokens(id(1), &y2), 2_300);
    }

    #[test]
    fn a_busy_slot_counts_only_for_its_own_conversation_or_when_all_are_busy() {
        let mut ix = with_slots(2);
        let a = chain(&[(1, 20_000), (2, 500)]);
        let b = chain(&[(1, 20_000), (3, 500)]);
        let a2 = chain(&[(1, 20_000), (2, 500), (4, 300)]);
        ix.record(id(1), &a, 1);
        // a still runs (or never reported): b would take the free, empty
        // slot and prefill its system prompt there.
        assert_eq!(ix.cached_tokens_at(id(1), &b, 2), 0);
        // a's next turn carries a's answer, so a has ended.
        assert_eq!(ix.cached_tokens_at(id(1), &a2, 2), 20_500);
        ix.record(id(1), &b, 2);
        // Both busy: a third prompt queues for whichever ends first.
        let c = chain(&[(1, 20_000), (5, 500)]);
        assert_eq!(ix.cached_tokens_at(id(1), &c, 3), 20_000);
        ix.correct(id(1), &b, 0, 4);
        assert_eq!(ix.cached_tokens_at(id(1), &c, 5), 20_000);
    }

    #[test]
    fn reports_say_nothing_of_slots_given_a_request_after_the_dispatch() {
        let mut ix = with_slots(2);
        let a = chain(&[(1, 20_000), (2, 500)]);
        let b = chain(&[(1, 20_000), (3, 500)]);
        ix.record(id(1), &a, 1);
        ix.record(id(1), &b, 2);
        // a ran where nothing was cached yet; b was dispatched after it,
        // so b's slot is not the one a's report is about.
        ix.correct(id(1), &a, 0, 3);
        assert_eq!(ix.cached_tokens(id(1), &a), 20_500);
        assert_eq!(ix.cached_tokens(id(1), &b), 20_500);
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
    fn capacity_follows_the_snapshot_and_nodes_and_blocks_are_capped() {
        let mut ix = PrefixIndex::with_limits(2, 4);
        let c = chain(&[(1, 100), (2, 100), (3, 100), (4, 100), (5, 100), (6, 100)]);
        ix.record(id(1), &c, 1);
        assert_eq!(ix.blocks(id(1)), 4, "the per-node block cap");
        assert_eq!(ix.cached_tokens(id(1), &c), 400);
        ix.record(id(2), &c, 2);
        ix.record(id(3), &c, 3);
        assert_eq!(ix.nodes(), 2);
        assert_eq!(ix.blocks(id(1)), 0, "the least recently touched node went");
        // Over the block cap across slots, the least recently used go.
        ix.set_capacity(id(3), 2 * u64::from(DEFAULT_CONTEXT_PER_SLOT));
        let d = chain(&[(8, 100), (9, 100)]);
        ix.record(id(3), &d, 4);
        assert_eq!(ix.blocks(id(3)), 2);
        assert_eq!(ix.cached_tokens(id(3), &d), 200);
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
        assert_eq!(ix.slots(id(2)), 4);
        assert_eq!(ix.capacity(id(3)), Some(2 * 32_768), "not in the snapshot");
        assert!(ix.forget(id(2)));
        assert!(!ix.forget(id(2)));
    }
}
