//! The prompt cache of one engine, pure: which of a job's prompt tokens the
//! engine already holds as KV, so only the rest is prefilled.
//!
//! Two shapes, as the real engines keep them (docs/engine-figures.md §5):
//! - [`CacheKind::Slots`] (llama.cpp server, llama-cpp-python, LM Studio,
//!   Ollama): each slot keeps the context of the last job it served; a new
//!   job takes the free slot holding the longest common prefix (least
//!   recently used when none shares anything) and reuses that prefix.
//!   llama.cpp server (and LM Studio, which runs it) also keeps a
//!   [`HostCache`]: contexts a slot is about to lose are saved to host
//!   memory, and a job restores the saved one sharing more of its prompt
//!   than its slot does, at [`HOST_RESTORE_TOKENS_PER_S`].
//! - [`CacheKind::Pool`] (vLLM, SGLang): prefix blocks shared by all jobs,
//!   bounded by the KV memory, evicted least recently used; blocks pinned by
//!   running jobs are never evicted.
//!
//! Prompts are [`PromptChain`]s; the cache keeps hashes and token offsets,
//! never text. Time comes in as an argument.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, VecDeque};

use pair_core::{EngineKind, PromptChain};

use crate::HardwareProfile;

/// Context tokens an Ollama slot holds by default (`num_ctx`, FAQ: 4096;
/// §3 notes the env help text disagrees).
pub const OLLAMA_CONTEXT_TOKENS: u32 = 4096;
/// Context tokens a llama.cpp server slot may hold: a deployment choice
/// (`-c`); with `-np` auto the 4 slots share one unified KV, so one slot may
/// fill it. 32k is what coding agents are usually given (E, §5).
pub const LLAMA_CPP_CONTEXT_TOKENS: u32 = 32_768;
/// KV bytes per token of Llama 3.x 8B at f16 (2 × 32 layers × 8 KV heads ×
/// 128 dims × 2 bytes, §2): the default for [`CacheKind::pool`].
pub const KV_BYTES_PER_TOKEN_8B: u64 = 131_072;
/// Share of the GPU memory vLLM takes for weights and KV
/// (`--gpu-memory-utilization`, default 0.9, §5).
pub const VLLM_MEMORY_SHARE: f64 = 0.9;

/// The host-memory prompt cache's default budget in llama.cpp server
/// (`--cache-ram`, MiB; llama.cpp PR #16391), which LM Studio keeps.
pub const LLAMA_CPP_CACHE_RAM_MIB: u64 = 8192;
/// [`LLAMA_CPP_CACHE_RAM_MIB`] in tokens of an 8B model's f16 KV
/// ([`KV_BYTES_PER_TOKEN_8B`]): 65,536.
pub const LLAMA_CPP_HOST_TOKENS: u64 =
    LLAMA_CPP_CACHE_RAM_MIB * 1024 * 1024 / KV_BYTES_PER_TOKEN_8B;
/// Tokens a second a saved context is restored from host memory at: 4.6
/// GB/s (a 925 MiB save plus a 921 MiB restore logged at 417 ms, the slower
/// of two published logs; docs/engine-figures.md §5) at
/// [`KV_BYTES_PER_TOKEN_8B`].
pub const HOST_RESTORE_TOKENS_PER_S: f64 = 4.6e9 / KV_BYTES_PER_TOKEN_8B as f64;
/// A saved context is restored only when it shares at least this share of
/// itself with the prompt (llama.cpp: "don't trash large prompts").
const HOST_MIN_KEEP: f64 = 0.25;

/// What llama.cpp server does with idle slots when a job starts
/// (`--cache-idle-slots`, on by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IdleSlots {
    /// Left alone: a slot's context is saved only when a job is about to
    /// take the slot from it (builds before the option).
    #[default]
    Kept,
    /// Saved to the host cache and kept in the slot (separate KV per slot,
    /// `-np N`; llama.cpp PR #24190).
    Saved,
    /// Saved and cleared (the unified KV that `-np` auto turns on; PR
    /// #20993): a context an idle slot held lives on in the host cache only.
    Cleared,
}

/// llama.cpp server's host-memory prompt cache, as [`CacheKind::Slots`]
/// keeps it beside its slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostCache {
    /// Tokens of saved contexts kept at most (`--cache-ram` over the KV
    /// bytes a token); 0: no host cache (llama-cpp-python, `--cache-ram 0`).
    pub tokens: u64,
    /// What happens to idle slots when a job starts.
    pub idle: IdleSlots,
}

impl HostCache {
    /// No host cache.
    pub const OFF: Self = Self {
        tokens: 0,
        idle: IdleSlots::Kept,
    };
    /// llama.cpp server's default budget (`--cache-ram 8192` at an 8B
    /// model's KV) with a context per slot (`-np N`): idle slots saved,
    /// and kept.
    pub const LLAMA_CPP: Self = Self {
        tokens: LLAMA_CPP_HOST_TOKENS,
        idle: IdleSlots::Saved,
    };
    /// The same with `-np` auto (4 slots in one unified KV): idle slots
    /// saved and cleared.
    pub const LLAMA_CPP_UNIFIED: Self = Self {
        tokens: LLAMA_CPP_HOST_TOKENS,
        idle: IdleSlots::Cleared,
    };
}

/// How an engine keeps the KV of prompts it has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CacheKind {
    /// Nothing is kept: every prompt is prefilled whole.
    #[default]
    None,
    /// Each slot keeps its last context, up to `context_tokens`, and
    /// `host` keeps contexts the slots lost.
    Slots {
        context_tokens: u32,
        host: HostCache,
    },
    /// Prefix blocks shared across jobs, up to `capacity_tokens` in all.
    Pool { capacity_tokens: u64 },
}

impl CacheKind {
    /// What an engine of `kind` keeps by default. Every kind pair-core names
    /// keeps a context per slot; LM Studio and OpenAI-compatible engines
    /// (taken as llama.cpp server) also a host cache, Ollama's runner none
    /// (docs/engine-figures.md §5). llama-cpp-python is built with
    /// [`Self::slots`], a vLLM node with [`Self::pool`].
    pub fn for_engine(kind: EngineKind) -> Self {
        match kind {
            EngineKind::Ollama => Self::slots(OLLAMA_CONTEXT_TOKENS),
            EngineKind::LmStudio | EngineKind::OpenAiCompat => {
                Self::llama_cpp(LLAMA_CPP_CONTEXT_TOKENS)
            }
        }
    }

    /// A llama.cpp server with `context_tokens` a slot (`-np N`) and its
    /// default host cache ([`HostCache::LLAMA_CPP`]).
    pub const fn llama_cpp(context_tokens: u32) -> Self {
        Self::Slots {
            context_tokens,
            host: HostCache::LLAMA_CPP,
        }
    }

    /// Slots keeping `context_tokens` each and no host cache
    /// (llama-cpp-python, or llama.cpp server with `--cache-ram 0`).
    pub const fn slots(context_tokens: u32) -> Self {
        Self::Slots {
            context_tokens,
            host: HostCache::OFF,
        }
    }

    /// A vLLM / SGLang pool on `profile` next to `weights_bytes` of model:
    /// the engine's share of memory minus the weights, at
    /// `kv_bytes_per_token` (e.g. [`KV_BYTES_PER_TOKEN_8B`]).
    pub fn pool(profile: &HardwareProfile, weights_bytes: u64, kv_bytes_per_token: u64) -> Self {
        let usable = (profile.memory_bytes as f64 * VLLM_MEMORY_SHARE) as u64;
        Self::Pool {
            capacity_tokens: usable.saturating_sub(weights_bytes) / kv_bytes_per_token.max(1),
        }
    }
}

/// What a job got when it took a slot: hand it back to
/// [`PromptCache::prefilled`] and [`PromptCache::release`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The slot it took ([`CacheKind::Slots`] only).
    pub slot: Option<u32>,
    /// Prompt tokens already held: only the rest is prefilled.
    pub cached_tokens: u32,
    /// Tokens of a saved context restored from host memory into the slot
    /// (the whole saved context, at [`HOST_RESTORE_TOKENS_PER_S`]); 0 when
    /// nothing was restored.
    pub restored_tokens: u32,
    /// Leading blocks of its chain it pins in a pool.
    pinned: usize,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    busy: bool,
    model: usize,
    held: PromptChain,
    last_used_us: u64,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    tokens: u32,
    end: u32,
    last_used_us: u64,
    refs: u32,
}

/// Key of an unpinned block in eviction order: oldest first, and of equal
/// age the deepest first, so a prefix outlives its tails.
type LruKey = (u64, Reverse<u32>, usize, u64);

#[derive(Clone, Debug, Default)]
struct Pool {
    capacity: u64,
    held: u64,
    blocks: HashMap<(usize, u64), Entry>,
    lru: BTreeSet<LruKey>,
}

impl Pool {
    fn pin(&mut self, model: usize, hash: u64) {
        if let Some(e) = self.blocks.get_mut(&(model, hash)) {
            if e.refs == 0 {
                self.lru
                    .remove(&(e.last_used_us, Reverse(e.end), model, hash));
            }
            e.refs += 1;
        }
    }

    fn unpin(&mut self, now_us: u64, model: usize, hash: u64) {
        if let Some(e) = self.blocks.get_mut(&(model, hash)) {
            e.refs = e.refs.saturating_sub(1);
            e.last_used_us = e.last_used_us.max(now_us);
            if e.refs == 0 {
                self.lru
                    .insert((e.last_used_us, Reverse(e.end), model, hash));
            }
        }
    }

    fn evict_to_fit(&mut self) {
        while self.held > self.capacity {
            let Some((_, _, model, hash)) = self.lru.pop_first() else {
                // Everything left is pinned by running jobs.
                break;
            };
            if let Some(e) = self.blocks.remove(&(model, hash)) {
                self.held -= u64::from(e.tokens);
            }
        }
    }

    fn matched(&self, model: usize, chain: &PromptChain) -> usize {
        // A walk, not a binary search: eviction keeps prefixes but does not
        // promise it.
        chain
            .blocks()
            .iter()
            .take_while(|b| self.blocks.contains_key(&(model, b.hash)))
            .count()
    }
}

/// Saved contexts in host memory, oldest first (llama.cpp's
/// `server_prompt_cache`: a restored one leaves it, so the oldest is the
/// least recently used).
#[derive(Clone, Debug, Default)]
struct Host {
    capacity: u64,
    held: u64,
    saved: VecDeque<(usize, PromptChain)>,
}

impl Host {
    /// Saves `chain` of `model`: nothing if a saved context already holds
    /// it whole, or if it alone exceeds the budget; saved contexts it holds
    /// whole go; then the oldest go until the rest fit.
    fn save(&mut self, model: usize, chain: &PromptChain) {
        let tokens = u64::from(chain.tokens());
        if chain.is_empty() || tokens > self.capacity {
            return;
        }
        let holds = |m: usize, a: &PromptChain, b: &PromptChain| {
            m == model && a.common_blocks(b.blocks()) == a.len()
        };
        if self.saved.iter().any(|(m, e)| holds(*m, chain, e)) {
            return;
        }
        let mut freed = 0;
        self.saved.retain(|(m, e)| {
            let obsolete = holds(*m, e, chain);
            if obsolete {
                freed += u64::from(e.tokens());
            }
            !obsolete
        });
        self.held -= freed;
        self.saved.push_back((model, chain.clone()));
        self.held += tokens;
        while self.held > self.capacity {
            let Some((_, e)) = self.saved.pop_front() else {
                break;
            };
            self.held -= u64::from(e.tokens());
        }
    }

    /// The saved context a job of `model` restores instead of what its
    /// slot holds (`common` of the prompt's tokens shared, of `held`): one
    /// sharing at least [`HOST_MIN_KEEP`] of itself, and more than the slot
    /// both of itself and of the prompt; of those, the last to beat the
    /// best so far in saving order (llama.cpp's `server_prompt_cache::load`).
    /// Its index and the tokens it shares.
    fn better(
        &self,
        model: usize,
        chain: &PromptChain,
        common: u32,
        held: u32,
    ) -> Option<(usize, u32)> {
        let (mut keep_best, mut shared_best) = (ratio(common, held), common);
        let mut best = None;
        for (i, (m, e)) in self.saved.iter().enumerate() {
            if *m != model {
                continue;
            }
            let shared = chain.common_tokens(e.blocks());
            let keep = ratio(shared, e.tokens());
            if keep < HOST_MIN_KEEP {
                continue;
            }
            if keep_best < keep && shared_best < shared {
                (keep_best, shared_best) = (keep, shared);
                best = Some((i, shared));
            }
        }
        best
    }

    fn take(&mut self, i: usize) -> PromptChain {
        let (_, e) = self.saved.remove(i).unwrap_or_default();
        self.held -= u64::from(e.tokens());
        e
    }

    fn forget_model(&mut self, model: usize) {
        let mut freed = 0;
        self.saved.retain(|(m, e)| {
            if *m == model {
                freed += u64::from(e.tokens());
            }
            *m != model
        });
        self.held -= freed;
    }
}

/// `part / whole`, 0 for an empty whole.
fn ratio(part: u32, whole: u32) -> f64 {
    if whole == 0 {
        0.0
    } else {
        f64::from(part) / f64::from(whole)
    }
}

/// Where a job of a slot engine finds its prefix: the slot it takes, the
/// tokens of the prompt held there, whether that slot's context is saved
/// first, and the saved context it restores instead (index, tokens shared).
#[derive(Clone, Copy, Debug)]
struct SlotPlan {
    slot: usize,
    common: u32,
    save: bool,
    restore: Option<(usize, u32)>,
}

/// One engine's prompt cache. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct PromptCache {
    kind: CacheKind,
    slots: Vec<Slot>,
    pool: Pool,
    host: Host,
}

impl PromptCache {
    /// A cold cache of `kind` for an engine with `slots` slots.
    pub fn new(kind: CacheKind, slots: u32) -> Self {
        let (slots, capacity, host) = match kind {
            CacheKind::None => (0, 0, 0),
            CacheKind::Slots { host, .. } => (slots.max(1) as usize, 0, host.tokens),
            CacheKind::Pool { capacity_tokens } => (0, capacity_tokens, 0),
        };
        Self {
            kind,
            slots: vec![Slot::default(); slots],
            pool: Pool {
                capacity,
                ..Pool::default()
            },
            host: Host {
                capacity: host,
                ..Host::default()
            },
        }
    }

    pub fn kind(&self) -> CacheKind {
        self.kind
    }

    /// Prompt tokens of `chain` a job of `model` would find cached if it took
    /// a slot now, without taking one (a router's view of this engine).
    pub fn peek(&self, model: usize, chain: &PromptChain, prompt_tokens: u32) -> u32 {
        let held = match self.kind {
            CacheKind::None => 0,
            CacheKind::Slots { .. } => self
                .plan(model, chain)
                .map_or(0, |p| p.restore.map_or(p.common, |(_, shared)| shared)),
            CacheKind::Pool { .. } => chain.tokens_at(self.pool.matched(model, chain)),
        };
        Self::usable(held, prompt_tokens)
    }

    /// Tokens held in all (slots' contexts and the host cache's, or the
    /// pool's blocks).
    pub fn held_tokens(&self) -> u64 {
        match self.kind {
            CacheKind::None => 0,
            CacheKind::Slots { .. } => {
                self.slots
                    .iter()
                    .map(|s| u64::from(s.held.tokens()))
                    .sum::<u64>()
                    + self.host.held
            }
            CacheKind::Pool { .. } => self.pool.held,
        }
    }

    /// Tokens of contexts saved in the host cache.
    pub fn host_tokens(&self) -> u64 {
        self.host.held
    }

    /// Where a job of `model` for `chain` would find its prefix now (slot
    /// engines): the free slot [`Self::best_slot`] gives; when that slot
    /// is taken from a context it would keep under half of (or shares
    /// nothing with), llama.cpp saves that context and restores the saved
    /// one that serves the prompt better, if any.
    fn plan(&self, model: usize, chain: &PromptChain) -> Option<SlotPlan> {
        let (slot, common) = self.best_slot(model, chain)?;
        let held = self.slots[slot].held.tokens();
        let save = self.host.capacity > 0 && (common == 0 || common * 2 < held);
        let restore = if save {
            self.host.better(model, chain, common, held)
        } else {
            None
        };
        Some(SlotPlan {
            slot,
            common,
            save,
            restore,
        })
    }

    /// At least one prompt token is always prefilled: the engine needs the
    /// last position's logits to sample from.
    fn usable(held: u32, prompt_tokens: u32) -> u32 {
        held.min(prompt_tokens.saturating_sub(1))
    }

    /// The free slot to take: the longest common prefix, then the least
    /// recently used, then the lowest index (llama.cpp's and Ollama's rule;
    /// llama.cpp takes the LRU slot instead when the best match covers no
    /// more than `--slot-prompt-similarity` = 0.5 of the prompt, left out).
    fn best_slot(&self, model: usize, chain: &PromptChain) -> Option<(usize, u32)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .map(|(i, s)| {
                let common = if s.model == model {
                    chain.common_tokens(s.held.blocks())
                } else {
                    0
                };
                (i, common, s.last_used_us)
            })
            .max_by_key(|&(i, common, last)| (common, Reverse(last), Reverse(i)))
            .map(|(i, common, _)| (i, common))
    }

    /// A job of `model` with `prompt_tokens` (named by `chain`) takes a slot
    /// at `now_us`. The engine gives no more jobs than it has slots.
    pub fn acquire(
        &mut self,
        now_us: u64,
        model: usize,
        chain: &PromptChain,
        prompt_tokens: u32,
    ) -> Lease {
        match self.kind {
            CacheKind::None => Lease::default(),
            CacheKind::Slots { host, .. } => {
                let Some(plan) = self.plan(model, chain) else {
                    return Lease::default();
                };
                let i = plan.slot;
                if plan.save {
                    let slot = &self.slots[i];
                    self.host.save(slot.model, &slot.held);
                }
                let (mut cached, mut restored) = (plan.common, 0);
                if let Some((at, shared)) = plan.restore {
                    let saved = self.host.take(at);
                    restored = saved.tokens();
                    cached = shared;
                    self.slots[i].held = saved;
                    self.slots[i].model = model;
                }
                let slot = &mut self.slots[i];
                slot.busy = true;
                slot.last_used_us = now_us;
                if host.idle != IdleSlots::Kept && host.tokens > 0 {
                    for s in self
                        .slots
                        .iter_mut()
                        .filter(|s| !s.busy && !s.held.is_empty())
                    {
                        self.host.save(s.model, &s.held);
                        if host.idle == IdleSlots::Cleared {
                            s.held = PromptChain::EMPTY;
                        }
                    }
                }
                Lease {
                    slot: u32::try_from(i).ok(),
                    cached_tokens: Self::usable(cached, prompt_tokens),
                    restored_tokens: restored,
                    pinned: 0,
                }
            }
            CacheKind::Pool { .. } => {
                let k = self.pool.matched(model, chain);
                for b in &chain.blocks()[..k] {
                    self.pool.pin(model, b.hash);
                }
                Lease {
                    slot: None,
                    cached_tokens: Self::usable(chain.tokens_at(k), prompt_tokens),
                    restored_tokens: 0,
                    pinned: k,
                }
            }
        }
    }

    /// The job's prefill is done: a pool now holds (and the job pins) its
    /// whole chain, evicting unpinned blocks least recently used first.
    pub fn prefilled(&mut self, now_us: u64, model: usize, chain: &PromptChain, lease: &mut Lease) {
        if !matches!(self.kind, CacheKind::Pool { .. }) {
            return;
        }
        let blocks = chain.blocks();
        for (i, b) in blocks.iter().enumerate().skip(lease.pinned) {
            if self.pool.blocks.contains_key(&(model, b.hash)) {
                // Another job computed it meanwhile.
                self.pool.pin(model, b.hash);
                continue;
            }
            let start = if i == 0 { 0 } else { blocks[i - 1].end };
            let tokens = b.end.saturating_sub(start);
            self.pool.blocks.insert(
                (model, b.hash),
                Entry {
                    tokens,
                    end: b.end,
                    last_used_us: now_us,
                    refs: 1,
                },
            );
            self.pool.held += u64::from(tokens);
        }
        lease.pinned = blocks.len();
        self.pool.evict_to_fit();
    }

    /// The job leaves its slot at `now_us`: a slot keeps its context (the
    /// whole chain once prefilled, else the part it had cached), a pool
    /// unpins its blocks.
    pub fn release(
        &mut self,
        now_us: u64,
        model: usize,
        chain: &PromptChain,
        lease: &Lease,
        prefilled: bool,
    ) {
        match self.kind {
            CacheKind::None => {}
            CacheKind::Slots { context_tokens, .. } => {
                let Some(slot) = lease.slot.and_then(|i| self.slots.get_mut(i as usize)) else {
                    return;
                };
                let keep = if prefilled {
                    chain.matched_blocks(|_, b| b.end <= context_tokens)
                } else {
                    chain.matched_blocks(|_, b| b.end <= lease.cached_tokens)
                };
                slot.held = if keep == chain.len() {
                    chain.clone()
                } else {
                    PromptChain::from_blocks(chain.blocks()[..keep].to_vec())
                };
                slot.model = model;
                slot.busy = false;
                slot.last_used_us = now_us;
            }
            CacheKind::Pool { .. } => {
                for b in &chain.blocks()[..lease.pinned.min(chain.len())] {
                    self.pool.unpin(now_us, model, b.hash);
                }
                self.pool.evict_to_fit();
            }
        }
    }

    /// `model` left memory: its KV went with it.
    pub fn forget_model(&mut self, model: usize) {
        for s in &mut self.slots {
            if s.model == model && !s.busy {
                s.held = PromptChain::EMPTY;
            }
        }
        self.host.forget_model(model);
        let pool = &mut self.pool;
        let gone: Vec<LruKey> = pool.lru.iter().filter(|k| k.2 == model).copied().collect();
        for key in gone {
            pool.lru.remove(&key);
            if let Some(e) = pool.blocks.remove(&(key.2, key.3)) {
                pool.held -= u64::from(e.tokens);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use pair_core::ChainBuilder;
    use proptest::prelude::*;

    use super::*;

    /// A chain of named segments of the given lengths.
    fn chain(segments: &[(u64, u32)]) -> PromptChain {
        let mut b = ChainBuilder::new();
        for &(id, tokens) in segments {
            b.segment(id, tokens);
        }
        b.finish()
    }

    /// Runs one job to its end on `c`; returns its cached tokens.
    fn run(c: &mut PromptCache, now: u64, model: usize, p: &PromptChain) -> u32 {
        let mut lease = c.acquire(now, model, p, p.tokens());
        c.prefilled(now, model, p, &mut lease);
        c.release(now + 1, model, p, &lease, true);
        lease.cached_tokens
    }

    #[test]
    fn a_later_turn_on_the_same_slot_prefills_only_the_new_part() {
        let mut c = PromptCache::new(CacheKind::slots(100_000), 2);
        let turn1 = chain(&[(1, 20_000), (2, 300)]);
        let turn2 = chain(&[(1, 20_000), (2, 300), (3, 200), (4, 50)]);
        assert_eq!(run(&mut c, 10, 0, &turn1), 0);
        assert_eq!(run(&mut c, 20, 0, &turn2), 20_300);
        // The same prompt again still prefills its last token.
        assert_eq!(run(&mut c, 30, 0, &turn2), 20_549);
        // Another model shares nothing.
        assert_eq!(run(&mut c, 40, 1, &turn2), 0);
    }

    #[test]
    fn the_free_slot_with_the_longest_prefix_is_taken() {
        let mut c = PromptCache::new(CacheKind::slots(100_000), 3);
        let a = chain(&[(1, 1000), (2, 100)]);
        let b = chain(&[(1, 1000), (3, 500), (4, 10)]);
        let other = chain(&[(9, 10)]);
        // a and b run together, so each keeps a slot of its own.
        let la = c.acquire(10, 0, &a, a.tokens());
        let lb = c.acquire(10, 0, &b, b.tokens());
        c.release(20, 0, &a, &la, true);
        c.release(20, 0, &b, &lb, true);
        assert_eq!((la.slot, lb.slot, lb.cached_tokens), (Some(0), Some(1), 0));
        run(&mut c, 30, 0, &other);
        // b's continuation finds b's slot, not a's (shorter) nor the LRU one.
        let next = chain(&[(1, 1000), (3, 500), (4, 10), (5, 7)]);
        let lease = c.acquire(40, 0, &next, next.tokens());
        assert_eq!(lease.slot, Some(1));
        assert_eq!(lease.cached_tokens, 1510);
        // With b's slot busy, the next best is a's: the shared system prompt.
        let lease2 = c.acquire(41, 0, &next, next.tokens());
        assert_eq!((lease2.slot, lease2.cached_tokens), (Some(0), 1000));
        // Nothing shared: the last free one, whatever it holds.
        let lease3 = c.acquire(42, 0, &next, next.tokens());
        assert_eq!((lease3.slot, lease3.cached_tokens), (Some(2), 0));
        assert_eq!(c.peek(0, &next, next.tokens()), 0);
    }

    #[test]
    fn with_no_prefix_shared_the_least_recently_used_slot_is_taken() {
        let mut c = PromptCache::new(CacheKind::slots(100_000), 2);
        run(&mut c, 10, 0, &chain(&[(1, 100)]));
        run(&mut c, 20, 0, &chain(&[(2, 100)]));
        let lease = c.acquire(30, 0, &chain(&[(3, 5)]), 5);
        assert_eq!(lease.slot, Some(0));
    }

    #[test]
    fn a_slot_keeps_no_more_than_its_context() {
        let mut c = PromptCache::new(CacheKind::slots(4096), 1);
        let p = chain(&[(1, 3000), (2, 2000)]);
        run(&mut c, 10, 0, &p);
        assert_eq!(c.held_tokens(), 3000);
        assert_eq!(c.peek(0, &p, p.tokens()), 3000);
    }

    #[test]
    fn a_pool_shares_a_system_prompt_across_conversations() {
        let mut c = PromptCache::new(
            CacheKind::Pool {
                capacity_tokens: 1_000_000,
            },
            4,
        );
        let system = (1, 20_000);
        let a = chain(&[system, (2, 500)]);
        let b = chain(&[system, (3, 800)]);
        // Two jobs at once, then another conversation later.
        let mut la = c.acquire(0, 0, &a, a.tokens());
        c.prefilled(5, 0, &a, &mut la);
        let lb = c.acquire(6, 0, &b, b.tokens());
        assert_eq!(lb.cached_tokens, 20_000);
        c.release(10, 0, &a, &la, true);
        assert_eq!(c.held_tokens(), 20_500);
        assert_eq!(c.peek(0, &a, a.tokens()), 20_499);
    }

    #[test]
    fn a_slot_engine_shares_a_system_prompt_a_slot_holds() {
        let mut c = PromptCache::new(CacheKind::slots(32_768), 1);
        run(&mut c, 0, 0, &chain(&[(1, 20_000), (2, 500)]));
        assert_eq!(run(&mut c, 10, 0, &chain(&[(1, 20_000), (3, 800)])), 20_000);
    }

    #[test]
    fn a_full_pool_evicts_the_least_recently_used_but_never_a_pinned_block() {
        let mut c = PromptCache::new(
            CacheKind::Pool {
                capacity_tokens: 3000,
            },
            4,
        );
        let a = chain(&[(1, 1000), (2, 500)]);
        let b = chain(&[(3, 1000)]);
        run(&mut c, 10, 0, &a);
        run(&mut c, 20, 0, &b);
        assert_eq!(c.held_tokens(), 2500);
        // a is older: its tail goes, its head (still fitting) stays.
        let d = chain(&[(4, 1000)]);
        run(&mut c, 30, 0, &d);
        assert_eq!(c.held_tokens(), 3000);
        assert_eq!(c.peek(0, &b, 1001), 1000);
        assert_eq!(c.peek(0, &a, 1501), 1000);
        // A running job pins its blocks: a newcomer that overflows the pool
        // evicts only what is free.
        let mut lb = c.acquire(40, 0, &b, 1001);
        let e = chain(&[(5, 2500)]);
        run(&mut c, 50, 0, &e);
        assert_eq!(c.peek(0, &b, 1001), 1000);
        assert_eq!(c.peek(0, &d, 1001), 0);
        c.prefilled(60, 0, &b, &mut lb);
        c.release(70, 0, &b, &lb, true);
        assert!(c.held_tokens() <= 3000);
    }

    #[test]
    fn an_evicted_model_takes_its_cache_with_it() {
        for kind in [
            CacheKind::slots(10_000),
            CacheKind::Pool {
                capacity_tokens: 10_000,
            },
        ] {
            let mut c = PromptCache::new(kind, 2);
            let p = chain(&[(1, 1000)]);
            run(&mut c, 0, 0, &p);
            run(&mut c, 0, 1, &p);
            c.forget_model(0);
            assert_eq!(c.peek(0, &p, 2000), 0, "{kind:?}");
            assert_eq!(c.peek(1, &p, 2000), 1000, "{kind:?}");
        }
    }

    fn host(tokens: u64, idle: IdleSlots) -> CacheKind {
        CacheKind::Slots {
            context_tokens: 100_000,
            host: HostCache { tokens, idle },
        }
    }

    #[test]
    fn a_context_a_slot_lost_is_restored_from_host_memory() {
        // One slot, two conversations taking turns: without a host cache
        // each turn prefills its conversation again.
        let a1 = chain(&[(1, 5000), (2, 300)]);
        let b1 = chain(&[(3, 4000), (4, 200)]);
        let a2 = chain(&[(1, 5000), (2, 300), (5, 100)]);
        let mut plain = PromptCache::new(CacheKind::slots(100_000), 1);
        let mut c = PromptCache::new(host(1_000_000, IdleSlots::Kept), 1);
        for cache in [&mut plain, &mut c] {
            run(cache, 0, 0, &a1);
            run(cache, 10, 0, &b1);
        }
        assert_eq!(run(&mut plain, 20, 0, &a2), 0);
        assert_eq!(c.host_tokens(), 5300);
        assert_eq!(c.peek(0, &a2, a2.tokens()), 5300);
        let mut lease = c.acquire(20, 0, &a2, a2.tokens());
        assert_eq!((lease.cached_tokens, lease.restored_tokens), (5300, 5300));
        // b's context was saved in its turn; a's left the host for the slot.
        assert_eq!(c.host_tokens(), 4200);
        c.prefilled(21, 0, &a2, &mut lease);
        c.release(22, 0, &a2, &lease, true);
        // A slot kept on is not restored: nothing to copy.
        let a3 = chain(&[(1, 5000), (2, 300), (5, 100), (6, 50)]);
        let lease = c.acquire(30, 0, &a3, a3.tokens());
        assert_eq!((lease.cached_tokens, lease.restored_tokens), (5400, 0));
    }

    #[test]
    fn a_saved_context_must_keep_a_quarter_of_itself_and_beat_the_slot() {
        let mut c = PromptCache::new(host(1_000_000, IdleSlots::Kept), 1);
        // Saved: a long conversation sharing only a short head with the
        // next prompt (under a quarter of itself): not worth restoring.
        run(&mut c, 0, 0, &chain(&[(1, 1000), (2, 9000)]));
        run(&mut c, 10, 0, &chain(&[(7, 100)]));
        let p = chain(&[(1, 1000), (3, 50)]);
        assert_eq!(c.peek(0, &p, p.tokens()), 0);
        // Nor is the system prompt saved again on its own: the long one
        // holds it whole.
        run(&mut c, 20, 0, &chain(&[(1, 1000)]));
        run(&mut c, 30, 0, &chain(&[(8, 100)]));
        assert_eq!(c.peek(0, &p, p.tokens()), 0);
        // Saved alone, it is restored.
        let mut c = PromptCache::new(host(1_000_000, IdleSlots::Kept), 1);
        run(&mut c, 20, 0, &chain(&[(1, 1000)]));
        run(&mut c, 30, 0, &chain(&[(8, 100)]));
        let lease = c.acquire(40, 0, &p, p.tokens());
        assert_eq!((lease.cached_tokens, lease.restored_tokens), (1000, 1000));
    }

    #[test]
    fn idle_slots_are_saved_and_cleared_when_a_job_starts_with_a_unified_kv() {
        let mut c = PromptCache::new(host(1_000_000, IdleSlots::Cleared), 2);
        let a = chain(&[(1, 3000)]);
        let b = chain(&[(2, 2000)]);
        run(&mut c, 0, 0, &a);
        assert_eq!((c.held_tokens(), c.host_tokens()), (3000, 0));
        // b takes the other (least recently used) slot; a's idle slot goes
        // to host memory.
        let lb = c.acquire(10, 0, &b, b.tokens());
        assert_eq!(lb.slot, Some(1));
        assert_eq!((c.held_tokens(), c.host_tokens()), (3000, 3000));
        // a's next turn restores it into the free (cleared) slot.
        let a2 = chain(&[(1, 3000), (3, 10)]);
        let la = c.acquire(11, 0, &a2, a2.tokens());
        assert_eq!(
            (la.slot, la.cached_tokens, la.restored_tokens),
            (Some(0), 3000, 3000)
        );
        c.release(20, 0, &b, &lb, true);
    }

    #[test]
    fn the_host_budget_keeps_the_newest_contexts_and_no_prefix_twice() {
        let mut c = PromptCache::new(host(10_000, IdleSlots::Kept), 1);
        let head = chain(&[(1, 2000)]);
        let longer = chain(&[(1, 2000), (2, 2000)]);
        run(&mut c, 0, 0, &head);
        run(&mut c, 10, 0, &chain(&[(9, 100)]));
        assert_eq!(c.host_tokens(), 2000);
        run(&mut c, 20, 0, &longer);
        run(&mut c, 30, 0, &chain(&[(8, 100)]));
        // The longer context holds the head: the head's copy went.
        assert_eq!(c.host_tokens(), 4100);
        for i in 3..6 {
            run(&mut c, 40 + i, 0, &chain(&[(i, 3000)]));
        }
        // Saved in turn: 100, 4,000, 100, then 3,000 twice (the last
        // context is still in the slot): past 10,000, the two oldest went.
        assert!(c.host_tokens() <= 10_000, "{}", c.host_tokens());
        assert_eq!(c.peek(0, &longer, longer.tokens()), 0);
        // A context larger than the budget is never saved.
        let mut small = PromptCache::new(host(1000, IdleSlots::Kept), 1);
        run(&mut small, 0, 0, &chain(&[(1, 2000)]));
        run(&mut small, 10, 0, &chain(&[(2, 10)]));
        assert_eq!(small.host_tokens(), 0);
    }

    /// A prompt: a shared head, a branch, and a tail, from a small
    /// alphabet so prompts share prefixes often.
    fn arb_prompt() -> impl Strategy<Value = PromptChain> {
        (0u64..3, 1u32..400, 0u64..4, 1u32..400, 0u64..50, 0u32..300).prop_map(
            |(head, head_len, branch, branch_len, tail, tail_len)| {
                chain(&[
                    (head, head_len * 10),
                    (100 + head * 10 + branch, branch_len),
                    (1000 + tail, tail_len),
                ])
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// What a router peeks is what the next job gets; a hit never
        /// covers the whole prompt; an idle pool stays within its capacity.
        #[test]
        fn peek_is_what_a_job_gets_and_the_pool_stays_bounded(
            prompts in prop::collection::vec((arb_prompt(), 0usize..2), 1..40),
            shape in 0u8..5,
            slots in 1u32..4,
        ) {
            let kind = match shape {
                0 => CacheKind::Pool { capacity_tokens: 6_000 },
                1 => CacheKind::slots(3_000),
                _ => CacheKind::Slots {
                    context_tokens: 3_000,
                    host: HostCache {
                        tokens: 8_000,
                        idle: [IdleSlots::Kept, IdleSlots::Saved, IdleSlots::Cleared][usize::from(shape - 2)],
                    },
                },
            };
            let mut c = PromptCache::new(kind, slots);
            for (t, (p, model)) in prompts.iter().enumerate() {
                let now = t as u64 * 10;
                let prompt_tokens = p.tokens();
                let peeked = c.peek(*model, p, prompt_tokens);
                let mut lease = c.acquire(now, *model, p, prompt_tokens);
                prop_assert_eq!(lease.cached_tokens, peeked);
                prop_assert!(lease.cached_tokens < prompt_tokens.max(1));
                c.prefilled(now + 1, *model, p, &mut lease);
                c.release(now + 2, *model, p, &lease, true);
                if let CacheKind::Pool { capacity_tokens } = kind {
                    prop_assert!(c.held_tokens() <= capacity_tokens);
                }
                prop_assert!(c.host_tokens() <= 8_000);
                // The same prompt again finds all of it the cache kept.
                let kept = match kind {
                    CacheKind::Pool { capacity_tokens } => {
                        (u64::from(prompt_tokens) <= capacity_tokens).then_some(prompt_tokens)
                    }
                    CacheKind::Slots { context_tokens, .. } => {
                        Some(p.tokens_at(p.matched_blocks(|_, b| b.end <= context_tokens)))
                    }
                    CacheKind::None => Some(0),
                };
                if let Some(kept) = kept {
                    prop_assert_eq!(
                        c.peek(*model, p, prompt_tokens),
                        kept.min(prompt_tokens - 1)
                    );
                }
            }
        }
    }

    #[test]
    fn constructors_follow_the_engine() {
        assert_eq!(
            CacheKind::for_engine(EngineKind::Ollama),
            CacheKind::slots(4096)
        );
        assert_eq!(
            CacheKind::for_engine(EngineKind::LmStudio),
            CacheKind::Slots {
                context_tokens: 32_768,
                host: HostCache::LLAMA_CPP,
            }
        );
        assert_eq!(LLAMA_CPP_HOST_TOKENS, 65_536);
        // 24 GB × 0.9 − 4.9 GB of weights at 128 KiB a token.
        let CacheKind::Pool { capacity_tokens } = CacheKind::pool(
            &HardwareProfile::rtx4090(),
            4_900_000_000,
            KV_BYTES_PER_TOKEN_8B,
        ) else {
            panic!()
        };
        let expect = (HardwareProfile::rtx4090().memory_bytes as f64 * 0.9 - 4.9e9) / 131_072.0;
        assert!(
            (capacity_tokens as f64 - expect).abs() < 2.0,
            "{capacity_tokens}"
        );
        let mut none = PromptCache::new(CacheKind::None, 4);
        let p = chain(&[(1, 100)]);
        assert_eq!(run(&mut none, 0, 0, &p), 0);
        assert_eq!(run(&mut none, 1, 0, &p), 0);
    }
}
