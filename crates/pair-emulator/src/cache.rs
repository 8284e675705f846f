//! The prompt cache of one engine, pure: which of a job's prompt tokens the
//! engine already holds as KV, so only the rest is prefilled.
//!
//! Two shapes, as the real engines keep them (docs/engine-figures.md §5):
//! - [`CacheKind::Slots`] (llama.cpp server, llama-cpp-python, LM Studio,
//!   Ollama): each slot keeps the context of the last job it served; a new
//!   job takes the free slot holding the longest common prefix (least
//!   recently used when none shares anything) and reuses that prefix.
//! - [`CacheKind::Pool`] (vLLM, SGLang): prefix blocks shared by all jobs,
//!   bounded by the KV memory, evicted least recently used; blocks pinned by
//!   running jobs are never evicted.
//!
//! Prompts are [`PromptChain`]s; the cache keeps hashes and token offsets,
//! never text. Time comes in as an argument.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

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

/// How an engine keeps the KV of prompts it has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CacheKind {
    /// Nothing is kept: every prompt is prefilled whole.
    #[default]
    None,
    /// Each slot keeps its last context, up to `context_tokens`.
    Slots { context_tokens: u32 },
    /// Prefix blocks shared across jobs, up to `capacity_tokens` in all.
    Pool { capacity_tokens: u64 },
}

impl CacheKind {
    /// What an engine of `kind` keeps by default. Every kind pair-core names
    /// keeps a context per slot (OpenAI-compatible means llama.cpp server or
    /// llama-cpp-python here; a vLLM node is built with [`Self::pool`]).
    pub fn for_engine(kind: EngineKind) -> Self {
        let context_tokens = match kind {
            EngineKind::Ollama => OLLAMA_CONTEXT_TOKENS,
            EngineKind::LmStudio | EngineKind::OpenAiCompat => LLAMA_CPP_CONTEXT_TOKENS,
        };
        Self::Slots { context_tokens }
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

/// One engine's prompt cache. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct PromptCache {
    kind: CacheKind,
    slots: Vec<Slot>,
    pool: Pool,
}

impl PromptCache {
    /// A cold cache of `kind` for an engine with `slots` slots.
    pub fn new(kind: CacheKind, slots: u32) -> Self {
        let (slots, capacity) = match kind {
            CacheKind::None => (0, 0),
            CacheKind::Slots { .. } => (slots.max(1) as usize, 0),
            CacheKind::Pool { capacity_tokens } => (0, capacity_tokens),
        };
        Self {
            kind,
            slots: vec![Slot::default(); slots],
            pool: Pool {
                capacity,
                ..Pool::default()
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
            CacheKind::Slots { .. } => self.best_slot(model, chain).map_or(0, |(_, tokens)| tokens),
            CacheKind::Pool { .. } => chain.tokens_at(self.pool.matched(model, chain)),
        };
        Self::usable(held, prompt_tokens)
    }

    /// Tokens held in all (slots' contexts, or the pool's blocks).
    pub fn held_tokens(&self) -> u64 {
        match self.kind {
            CacheKind::None => 0,
            CacheKind::Slots { .. } => self.slots.iter().map(|s| u64::from(s.held.tokens())).sum(),
            CacheKind::Pool { .. } => self.pool.held,
        }
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
            CacheKind::Slots { .. } => {
                let Some((i, common)) = self.best_slot(model, chain) else {
                    return Lease::default();
                };
                let slot = &mut self.slots[i];
                slot.busy = true;
                slot.last_used_us = now_us;
                Lease {
                    slot: u32::try_from(i).ok(),
                    cached_tokens: Self::usable(common, prompt_tokens),
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
            CacheKind::Slots { context_tokens } => {
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
        let mut c = PromptCache::new(
            CacheKind::Slots {
                context_tokens: 100_000,
            },
            2,
        );
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
        let mut c = PromptCache::new(
            CacheKind::Slots {
                context_tokens: 100_000,
            },
            3,
        );
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
        let mut c = PromptCache::new(
            CacheKind::Slots {
                context_tokens: 100_000,
            },
            2,
        );
        run(&mut c, 10, 0, &chain(&[(1, 100)]));
        run(&mut c, 20, 0, &chain(&[(2, 100)]));
        let lease = c.acquire(30, 0, &chain(&[(3, 5)]), 5);
        assert_eq!(lease.slot, Some(0));
    }

    #[test]
    fn a_slot_keeps_no_more_than_its_context() {
        let mut c = PromptCache::new(
            CacheKind::Slots {
                context_tokens: 4096,
            },
            1,
        );
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
        let mut c = PromptCache::new(
            CacheKind::Slots {
                context_tokens: 32_768,
            },
            1,
        );
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
            CacheKind::Slots {
                context_tokens: 10_000,
            },
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
            pool in any::<bool>(),
            slots in 1u32..4,
        ) {
            let kind = if pool {
                CacheKind::Pool { capacity_tokens: 6_000 }
            } else {
                CacheKind::Slots { context_tokens: 3_000 }
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
                // The same prompt again finds all of it the cache kept.
                let kept = match kind {
                    CacheKind::Pool { capacity_tokens } => {
                        (u64::from(prompt_tokens) <= capacity_tokens).then_some(prompt_tokens)
                    }
                    CacheKind::Slots { context_tokens } => {
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
            CacheKind::Slots {
                context_tokens: 4096
            }
        );
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
