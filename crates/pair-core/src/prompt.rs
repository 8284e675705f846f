//! A prompt as an engine's KV cache sees it: a chain of blocks, each named
//! by a hash of everything from the prompt's start to the block's end.
//!
//! Because a block's hash covers its whole prefix, two prompts share their
//! first `k` blocks exactly when their `k`-th hashes are equal, so the
//! longest common prefix of two chains (or of a chain and a cache that holds
//! whole prefixes) is found by binary search instead of a walk. This is the
//! one representation the emulated engines, the simulator and the
//! scheduler's prefix index share; no prompt text is ever kept, only hashes
//! and token offsets.
//!
//! Two ways to build one:
//! - from the prompt's bytes ([`ChainBuilder::bytes`]), cut every
//!   [`BLOCK_BYTES`] (about [`BLOCK_TOKENS`] tokens at four bytes a token),
//!   as the proxy and the emulated engines do with a request body's
//!   system prompt, tools and messages;
//! - from named segments of known length ([`ChainBuilder::segment`]), as
//!   the simulator does: "the shared 20k-token system prompt", "this
//!   sub-agent's task", "turn 3's tool result".

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Tokens in a block cut from bytes.
pub const BLOCK_TOKENS: u32 = 64;
/// Bytes in a block cut from bytes: four bytes of text per token, the
/// estimate [`crate::RequestProfile::estimate_tokens_from_bytes`] uses.
pub const BLOCK_BYTES: usize = BLOCK_TOKENS as usize * 4;
/// Blocks a chain holds at most (about 262k tokens from bytes): a longer
/// prompt's tail is not named, so it is never counted as cached.
pub const MAX_BLOCKS: usize = 4096;

/// One block: the hash of the prompt up to its end, and the prompt's length
/// in tokens at its end (so a match of `k` blocks caches `chain[k-1].end`
/// tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Block {
    pub hash: u64,
    pub end: u32,
}

/// A prompt's chain of blocks; cheap to clone (shared).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PromptChain(Option<Arc<[Block]>>);

impl PromptChain {
    /// The chain of a request whose prompt is not known (embeddings, a body
    /// that was not scanned): nothing can be cached for it.
    pub const EMPTY: Self = Self(None);

    pub fn from_blocks(blocks: Vec<Block>) -> Self {
        if blocks.is_empty() {
            Self(None)
        } else {
            Self(Some(blocks.into()))
        }
    }

    pub fn blocks(&self) -> &[Block] {
        self.0.as_deref().unwrap_or(&[])
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn len(&self) -> usize {
        self.blocks().len()
    }

    /// Tokens the chain names (the end of its last block).
    pub fn tokens(&self) -> u32 {
        self.blocks().last().map_or(0, |b| b.end)
    }

    /// Tokens at the end of the first `blocks` blocks.
    pub fn tokens_at(&self, blocks: usize) -> u32 {
        match blocks {
            0 => 0,
            k => self
                .blocks()
                .get(k - 1)
                .map_or_else(|| self.tokens(), |b| b.end),
        }
    }

    /// How many leading blocks of this chain `held` holds, where
    /// `held(i, block)` says whether the prefix ending at block `i` is
    /// held: the largest `k` with `held(k - 1, chain[k-1])`, found by binary
    /// search. `held` must be monotone along the chain (holding a block
    /// implies holding every block before it), as a cache of whole prefixes
    /// is.
    pub fn matched_blocks(&self, mut held: impl FnMut(usize, &Block) -> bool) -> usize {
        let blocks = self.blocks();
        // Invariant: blocks[..lo] held; blocks[hi..] not.
        let (mut lo, mut hi) = (0usize, blocks.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if held(mid, &blocks[mid]) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Blocks the two chains share from their start.
    pub fn common_blocks(&self, other: &[Block]) -> usize {
        self.matched_blocks(|i, b| other.get(i) == Some(b))
    }

    /// Tokens of this chain's prefix that `other` holds (whole blocks).
    pub fn common_tokens(&self, other: &[Block]) -> u32 {
        self.tokens_at(self.common_blocks(other))
    }
}

impl Serialize for PromptChain {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.blocks().serialize(s)
    }
}

impl<'de> Deserialize<'de> for PromptChain {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut blocks = Vec::<Block>::deserialize(d)?;
        blocks.truncate(MAX_BLOCKS);
        Ok(Self::from_blocks(blocks))
    }
}

/// The top-level fields of a request body that carry its prompt, in the
/// order an engine's template puts them into its context: the system
/// prompt (Anthropic's `system`, the Responses API's `instructions`), the
/// tools, then the turns (chat `messages`, generate's `prompt`, the
/// Responses API's `input`). A chain is built from their bytes as the
/// client wrote them, in this order, by the proxy and the edge SDK alike.
pub const PROMPT_FIELDS: [&[&str]; 3] = [
    &["system", "instructions"],
    &["tools"],
    &["messages", "prompt", "input"],
];

/// Which part of [`PROMPT_FIELDS`] a top-level key names, if any.
pub fn prompt_part(key: &[u8]) -> Option<usize> {
    PROMPT_FIELDS
        .iter()
        .position(|names| names.iter().any(|n| n.as_bytes() == key))
}

/// A prompt a node sent to `node` (itself or a peer) at `at_ms`: that
/// node's engine now holds it. `seq` counts up from the reporter's start,
/// so a router applies each one once ([`crate::NodeSnapshot::boot`] tells
/// a restart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routed {
    pub seq: u64,
    pub node: crate::NodeId,
    pub at_ms: u64,
    pub prefix: PromptChain,
}

/// Prompts a report carries at most.
pub const MAX_ROUTED: usize = 32;

/// The wire form of a report's routed prompts. Prompts of one workload
/// share long prefixes (an agent's system prompt and tools, a growing
/// conversation), so each entry names the earlier entry it shares most
/// with and how many blocks (`base`), and carries only the blocks after
/// them (`tail`, `[hash, end]` pairs). A peer's malformed entry (a base
/// that is not earlier, or longer than it) is dropped, not trusted.
pub mod routed_wire {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::{Block, MAX_BLOCKS, MAX_ROUTED, PromptChain, Routed};
    use crate::NodeId;

    #[derive(Serialize, Deserialize)]
    struct Entry {
        seq: u64,
        node: NodeId,
        at_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<(usize, usize)>,
        tail: Vec<(u64, u32)>,
    }

    pub fn serialize<S: Serializer>(routed: &[Routed], s: S) -> Result<S::Ok, S::Error> {
        let routed = &routed[..routed.len().min(MAX_ROUTED)];
        let entries: Vec<Entry> = routed
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let base = routed[..i]
                    .iter()
                    .enumerate()
                    .map(|(j, earlier)| (j, shared_blocks(&r.prefix, &earlier.prefix)))
                    .filter(|&(_, k)| k > 0)
                    .max_by_key(|&(j, k)| (k, std::cmp::Reverse(j)));
                let shared = base.map_or(0, |(_, k)| k);
                Entry {
                    seq: r.seq,
                    node: r.node,
                    at_ms: r.at_ms,
                    base,
                    tail: r.prefix.blocks()[shared..]
                        .iter()
                        .map(|b| (b.hash, b.end))
                        .collect(),
                }
            })
            .collect();
        entries.serialize(s)
    }

    /// Blocks two chains share from their start: the binary search, checked
    /// (a chain decoded from a peer need not have hashes that each cover
    /// their prefix; a wrong base would change it on the next hop).
    fn shared_blocks(a: &PromptChain, b: &PromptChain) -> usize {
        let k = a.common_blocks(b.blocks());
        let (a, b) = (a.blocks(), b.blocks());
        if a[..k] == b[..k] {
            k
        } else {
            a.iter().zip(b).take_while(|(x, y)| x == y).count()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Routed>, D::Error> {
        let entries = Vec::<Entry>::deserialize(d)?;
        // Indexed by entry, kept or not, so a base names the same entry it
        // named when it was written.
        let mut chains: Vec<Option<PromptChain>> = Vec::with_capacity(entries.len());
        let mut out = Vec::new();
        for (i, e) in entries.into_iter().enumerate().take(MAX_ROUTED) {
            let mut blocks: Vec<Block> = match e.base {
                None => Vec::new(),
                Some((j, k)) => match chains.get(j).filter(|_| j < i).and_then(Option::as_ref) {
                    Some(base) if k <= base.len() => base.blocks()[..k].to_vec(),
                    _ => {
                        chains.push(None);
                        continue;
                    }
                },
            };
            blocks.extend(e.tail.iter().map(|&(hash, end)| Block { hash, end }));
            blocks.truncate(MAX_BLOCKS);
            let prefix = PromptChain::from_blocks(blocks);
            chains.push(Some(prefix.clone()));
            out.push(Routed {
                seq: e.seq,
                node: e.node,
                at_ms: e.at_ms,
                prefix,
            });
        }
        Ok(out)
    }
}

/// Builds a [`PromptChain`] from bytes, segments, or both in turn.
#[derive(Clone)]
pub struct ChainBuilder {
    hasher: xxhash_rust::xxh3::Xxh3,
    /// Bytes fed since the last block boundary.
    partial: usize,
    /// Bytes in a block cut from bytes ([`BLOCK_BYTES`] unless set).
    block_bytes: usize,
    /// Tokens at the last block boundary.
    end: u32,
    blocks: Vec<Block>,
}

impl std::fmt::Debug for ChainBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainBuilder")
            .field("blocks", &self.blocks.len())
            .field("tokens", &self.tokens())
            .finish()
    }
}

impl Default for ChainBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainBuilder {
    pub fn new() -> Self {
        Self::with_block_tokens(BLOCK_TOKENS)
    }

    /// A builder that cuts a block every `tokens` tokens of bytes (at least
    /// one): an engine's own view of its cache is finer than the routers'
    /// (llama.cpp reuses a prefix to the token; the emulated engine, to its
    /// blocks). Chains of different block sizes share no block.
    pub fn with_block_tokens(tokens: u32) -> Self {
        Self {
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            block_bytes: tokens.max(1) as usize * 4,
            partial: 0,
            end: 0,
            blocks: Vec::new(),
        }
    }

    fn full(&self) -> bool {
        self.blocks.len() >= MAX_BLOCKS
    }

    /// Feeds prompt bytes: a block is cut every [`BLOCK_BYTES`] (or the
    /// builder's own block size).
    pub fn bytes(&mut self, mut bytes: &[u8]) -> &mut Self {
        while !bytes.is_empty() && !self.full() {
            let take = (self.block_bytes - self.partial).min(bytes.len());
            self.hasher.update(&bytes[..take]);
            self.partial += take;
            bytes = &bytes[take..];
            if self.partial == self.block_bytes {
                let tokens = u32::try_from(self.block_bytes / 4).unwrap_or(BLOCK_TOKENS);
                self.cut(tokens);
            }
        }
        self
    }

    /// Ends a run of bytes: the bytes since the last cut become a block of
    /// their own (so a prompt's tail counts), as they would at the prompt's
    /// end. Segments and bytes after it continue the chain.
    pub fn flush(&mut self) -> &mut Self {
        if self.partial > 0 && !self.full() {
            let tokens = u32::try_from(self.partial.div_ceil(4)).unwrap_or(BLOCK_TOKENS);
            self.cut(tokens);
        }
        self
    }

    /// Appends one block of `tokens` tokens whose content is named by `id`
    /// (the simulator's way: a system prompt, a task, a tool result). Bytes
    /// fed before it are flushed first.
    pub fn segment(&mut self, id: u64, tokens: u32) -> &mut Self {
        self.flush();
        if !self.full() && tokens > 0 {
            self.hasher.update(&id.to_le_bytes());
            self.hasher.update(&tokens.to_le_bytes());
            self.cut(tokens);
        }
        self
    }

    fn cut(&mut self, tokens: u32) {
        self.end = self.end.saturating_add(tokens);
        self.blocks.push(Block {
            hash: self.hasher.digest(),
            end: self.end,
        });
        self.partial = 0;
    }

    /// Tokens named so far, the partial block included.
    pub fn tokens(&self) -> u32 {
        self.end
            .saturating_add(u32::try_from(self.partial.div_ceil(4)).unwrap_or(u32::MAX))
    }

    /// The chain, its trailing partial block included.
    pub fn finish(mut self) -> PromptChain {
        self.flush();
        PromptChain::from_blocks(self.blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn of(bytes: &[u8]) -> PromptChain {
        let mut b = ChainBuilder::new();
        b.bytes(bytes);
        b.finish()
    }

    #[test]
    fn a_longer_conversation_shares_the_earlier_turns_blocks() {
        let system = vec![b's'; 20 * BLOCK_BYTES + 17];
        let mut turn1 = system.clone();
        turn1.extend_from_slice(&[b'a'; 3 * BLOCK_BYTES]);
        let mut turn2 = turn1.clone();
        turn2.extend_from_slice(&[b'b'; 5 * BLOCK_BYTES]);
        let (c1, c2) = (of(&turn1), of(&turn2));
        // Every whole block of turn 1 is a block of turn 2; its partial
        // tail block is not.
        assert_eq!(c1.len(), 24);
        assert_eq!(c2.common_blocks(c1.blocks()), 23);
        assert_eq!(c2.common_tokens(c1.blocks()), 23 * BLOCK_TOKENS);
        assert_eq!(c1.tokens(), (turn1.len() as u32).div_ceil(4));
        // Another task after the same system prompt shares the prompt.
        let mut other = system.clone();
        other.extend_from_slice(&[b'z'; BLOCK_BYTES]);
        assert_eq!(of(&other).common_blocks(c1.blocks()), 20);
    }

    #[test]
    fn finer_blocks_find_a_longer_common_prefix() {
        let prompt = vec![b'p'; 1_505 * 4];
        let mut longer = prompt.clone();
        longer.extend_from_slice(&[b'n'; 63 * 4]);
        let common = |tokens| {
            let chain = |bytes: &[u8]| {
                let mut b = ChainBuilder::with_block_tokens(tokens);
                b.bytes(bytes);
                b.finish()
            };
            chain(&longer).common_tokens(chain(&prompt).blocks())
        };
        assert_eq!(common(BLOCK_TOKENS), 1_472);
        assert_eq!(common(16), 1_504);
        assert_eq!(
            ChainBuilder::with_block_tokens(BLOCK_TOKENS).finish(),
            PromptChain::EMPTY
        );
    }

    #[test]
    fn segments_chain_like_bytes() {
        let mut a = ChainBuilder::new();
        a.segment(1, 20_000).segment(2, 500);
        let a = a.finish();
        let mut b = ChainBuilder::new();
        b.segment(1, 20_000).segment(3, 500);
        let b = b.finish();
        assert_eq!(a.tokens(), 20_500);
        assert_eq!(a.common_tokens(b.blocks()), 20_000);
        assert_eq!(a.common_tokens(a.blocks()), 20_500);
        assert_eq!(PromptChain::EMPTY.common_tokens(a.blocks()), 0);
        // The same id at another place in the chain is another block.
        let mut c = ChainBuilder::new();
        c.segment(2, 500);
        assert_eq!(c.finish().common_blocks(a.blocks()), 0);
    }

    #[test]
    fn chains_are_capped_and_survive_serde() {
        let long = of(&vec![7u8; (MAX_BLOCKS + 10) * BLOCK_BYTES]);
        assert_eq!(long.len(), MAX_BLOCKS);
        let json = serde_json::to_string(&of(b"hello world")).unwrap();
        let back: PromptChain = serde_json::from_str(&json).unwrap();
        assert_eq!(back, of(b"hello world"));
        assert_eq!(serde_json::to_string(&PromptChain::EMPTY).unwrap(), "[]");
    }

    #[test]
    fn routed_prompts_share_their_prefixes_on_the_wire() {
        let chain = |task: u64, turns: u64| {
            let mut b = ChainBuilder::new();
            b.segment(1, 20_000).segment(task, 500);
            for t in 0..turns {
                b.segment(100 * task + t, 1_000);
            }
            b.finish()
        };
        let node = crate::NodeId::from_u128(9);
        let routed: Vec<Routed> = [(2, 3), (3, 1), (2, 4), (4, 0)]
            .iter()
            .enumerate()
            .map(|(i, &(task, turns))| Routed {
                seq: i as u64 + 1,
                node,
                at_ms: 1_000 + i as u64,
                prefix: chain(task, turns),
            })
            .collect();
        let mut snap = crate::NodeSnapshot::new(node, "n");
        snap.routed = routed.clone();
        let json = serde_json::to_value(&snap).unwrap();
        let wire = &json["routed"];
        // The first carries its whole chain; the others only what is new.
        assert_eq!(wire[0]["tail"].as_array().unwrap().len(), 5);
        assert_eq!(wire[1]["base"], serde_json::json!([0, 1]));
        assert_eq!(wire[2]["base"], serde_json::json!([0, 5]));
        assert_eq!(wire[2]["tail"].as_array().unwrap().len(), 1);
        let back: crate::NodeSnapshot = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.routed, routed);
        // A base that points forward, or past its entry, drops that entry
        // (and whatever builds on it); the rest stand.
        let mut bad = json.clone();
        bad["routed"][1]["base"] = serde_json::json!([3, 1]);
        bad["routed"][2]["base"] = serde_json::json!([0, 99]);
        let back: crate::NodeSnapshot = serde_json::from_value(bad).unwrap();
        assert_eq!(back.routed.len(), 2);
        assert_eq!(back.routed[0], routed[0]);
        assert_eq!(back.routed[1], routed[3]);
        // Chains whose hashes do not cover their prefixes (a peer's, made
        // up) still survive the trip unchanged.
        let odd = |first: u64| {
            PromptChain::from_blocks(vec![
                Block {
                    hash: first,
                    end: 64,
                },
                Block { hash: 5, end: 128 },
            ])
        };
        let mut snap2 = crate::NodeSnapshot::new(node, "n");
        snap2.routed = [odd(1), odd(2)]
            .into_iter()
            .enumerate()
            .map(|(i, prefix)| Routed {
                seq: i as u64,
                node,
                at_ms: 0,
                prefix,
            })
            .collect();
        let back: crate::NodeSnapshot =
            serde_json::from_value(serde_json::to_value(&snap2).unwrap()).unwrap();
        assert_eq!(back.routed, snap2.routed);
        // Without routed prompts, nothing is written.
        let quiet = serde_json::to_value(crate::NodeSnapshot::new(node, "n")).unwrap();
        assert!(quiet.get("routed").is_none());
    }

    proptest! {
        /// The binary search finds the same common prefix as a walk.
        #[test]
        fn common_prefix_is_the_walk(
            shared in 0usize..3000,
            a in 0usize..3000,
            b in 0usize..3000,
        ) {
            let mut x = vec![1u8; shared];
            let mut y = x.clone();
            x.extend(std::iter::repeat_n(2u8, a));
            y.extend(std::iter::repeat_n(3u8, b));
            let (cx, cy) = (of(&x), of(&y));
            let walk = cx.blocks().iter().zip(cy.blocks()).take_while(|(p, q)| p == q).count();
            prop_assert_eq!(cx.common_blocks(cy.blocks()), walk);
            prop_assert!(cx.common_tokens(cy.blocks()) as usize * 4 <= shared + 3);
        }
    }
}
