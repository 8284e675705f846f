//! The prefix index end to end: a conversation stays where its context is
//! cached without any session header, a node holds as many contexts as it
//! has slots (and what its host tier saved), and the index stays bounded and exact under any sequence of
//! records and corrections.

// Strategy helpers outside `#[test]` functions unwrap values they just built.
#![allow(clippy::unwrap_used)]

use pair_scheduler::pair_core::{
    ApiFlavor, ChainBuilder, ClusterSnapshot, EngineKind, EngineSnapshot, ModelEntry, ModelName,
    ModelPerf, NodeId, NodeSnapshot, PromptChain, RequestProfile, Workload,
};
use pair_scheduler::prefix::{
    DEFAULT_CONTEXT_PER_SLOT, DEFAULT_HOST_TOKENS, MAX_BLOCKS_PER_NODE, MAX_NODES,
    MAX_SLOTS_PER_NODE,
};
use pair_scheduler::{Policy, PrefixIndex, Reservations, Scheduler};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

const FAST: ModelPerf = ModelPerf {
    prefill_tps: 4_000.0,
    decode_tps: 80.0,
    load_ms: 2_000,
    overhead_ms: 20,
    batch_exponent: None,
};
/// Half as fast at everything.
const SLOW: ModelPerf = ModelPerf {
    prefill_tps: 2_000.0,
    decode_tps: 40.0,
    load_ms: 2_000,
    overhead_ms: 20,
    batch_exponent: None,
};

fn node(n: u128, perf: ModelPerf) -> NodeSnapshot {
    let mut s = NodeSnapshot::new(NodeId::from_u128(n), format!("n{n}"));
    s.engines.push(EngineSnapshot {
        kind: EngineKind::Ollama,
        healthy: true,
        silent: false,
        continues_chat: None,
        slots: 1,
        models: vec![ModelEntry {
            name: ModelName::new("qwen2.5-coder").unwrap(),
            size_bytes: Some(4_000_000_000),
            loaded: true,
            perf: Some(perf),
            learned: false,
        }],
    });
    s
}

/// Turn `turn` (from 1) of a conversation with a 2k-token opening context
/// that grows by `growth` tokens each turn (the previous answer, a tool
/// result, the next question).
fn turn_chain(turn: u32, growth: u32) -> PromptChain {
    let mut b = ChainBuilder::new();
    b.segment(1, 2_000);
    for t in 1..turn {
        b.segment(100 + u64::from(t), growth);
    }
    b.finish()
}

/// Routes 10 turns of one conversation (no session header), recording each
/// dispatch in the index; the fast node is busy for the first turn only
/// when `fast_busy_first`. Returns where each turn went.
fn converse(fast_busy_first: bool, streaming: bool, growth: u32) -> Vec<NodeId> {
    let idle = ClusterSnapshot::new(1, 0, vec![node(1, FAST), node(2, SLOW)]);
    let mut busy_fast = node(1, FAST);
    busy_fast.workload = Workload {
        running: 1,
        decode_tokens: 2_000,
        ..Workload::default()
    };
    let busy = ClusterSnapshot::new(1, 0, vec![busy_fast, node(2, SLOW)]);
    let mut s = Scheduler::with_policy(Policy::PredictedLatency);
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut served = Vec::new();
    for turn in 1..=10u32 {
        let cluster = if turn == 1 && fast_busy_first {
            &busy
        } else {
            &idle
        };
        let mut r = RequestProfile::new("qwen2.5-coder", ApiFlavor::OpenAi);
        r.streaming = streaming;
        r.max_output_tokens = 300;
        r.prefix = turn_chain(turn, growth);
        r.prompt_tokens = r.prefix.tokens();
        let now = u64::from(turn) * 10_000;
        let ranked = s.rank(cluster, &r, &Reservations::new(), now, &mut rng);
        let first = ranked.first().unwrap();
        served.push(first.node);
        s.note_routed(cluster, first.node, &r.prefix, now);
    }
    served
}

/// Whether at least 90 % of the turns after the first stayed on the
/// first turn's node.
fn stayed(served: &[NodeId]) -> bool {
    let home = served[0];
    let kept = served[1..].iter().filter(|n| **n == home).count();
    kept * 10 >= (served.len() - 1) * 9
}

/// The guard: in a two-node cluster, one node twice as fast, a 10-turn
/// streamed conversation (a coding agent's) stays on the node that holds
/// its context for at least 90 % of its later turns, on the index alone
/// (no session header), even when that node is the slower one; with
/// contexts growing by 400 tokens a turn or by 2k.
#[test]
fn a_conversation_stays_where_its_context_is_cached_without_a_session() {
    for growth in [400, 2_000] {
        for fast_busy_first in [false, true] {
            let served = converse(fast_busy_first, true, growth);
            let want = NodeId::from_u128(if fast_busy_first { 2 } else { 1 });
            assert_eq!(served[0], want, "the first turn goes where it is soonest");
            assert!(
                stayed(&served),
                "growth {growth}, fast busy first {fast_busy_first}: {served:?}"
            );
        }
    }
}

/// Whole answers are priced alike: on the faster node they stay; on a
/// node that decodes half as fast, a 300-token answer costs seconds more
/// than prefilling the context again, so the conversation moves once, to
/// the faster node, and stays there.
#[test]
fn a_whole_answer_conversation_moves_once_when_decoding_outweighs_the_cache() {
    let served = converse(false, false, 400);
    assert!(stayed(&served), "{served:?}");
    let served = converse(true, false, 400);
    let (slow, fast) = (NodeId::from_u128(2), NodeId::from_u128(1));
    assert_eq!(served[0], slow);
    assert!(served[1..].iter().all(|n| *n == fast), "{served:?}");
}

/// Without the index the same conversation leaves the slower node at once:
/// the guard above holds because of the cache pricing, not by accident.
#[test]
fn without_the_index_the_slower_home_is_left() {
    let idle = ClusterSnapshot::new(1, 0, vec![node(1, FAST), node(2, SLOW)]);
    let mut s = Scheduler::with_policy(Policy::PredictedLatency);
    let mut r = RequestProfile::new("qwen2.5-coder", ApiFlavor::OpenAi);
    r.streaming = true;
    r.prefix = turn_chain(2, 400);
    r.prompt_tokens = r.prefix.tokens();
    let ranked = s.rank(
        &idle,
        &r,
        &Reservations::new(),
        0,
        &mut ChaCha8Rng::seed_from_u64(3),
    );
    assert_eq!(ranked.first().unwrap().node, NodeId::from_u128(1));
    // With turn 1 recorded on the slow node, turn 2 stays there.
    s.note_routed(&idle, NodeId::from_u128(2), &turn_chain(1, 400), 0);
    let ranked = s.rank(
        &idle,
        &r,
        &Reservations::new(),
        0,
        &mut ChaCha8Rng::seed_from_u64(3),
    );
    let first = ranked.first().unwrap();
    assert_eq!(first.node, NodeId::from_u128(2), "{first}");
    assert!(first.to_string().contains("(2000 cached)"), "{first}");
}

/// A node with one engine of `slots` slots.
fn slotted(n: u128, slots: u16) -> NodeSnapshot {
    let mut s = node(n, FAST);
    s.engines[0].slots = slots;
    s
}

/// The scheduler sizes a node from the snapshot when it routes there: a
/// 2-slot node that served conversations A, B and C holds B and C in its
/// slots, however small they are, and A in its host tier only; a system
/// prompt two conversations running at once share is found in either
/// slot.
#[test]
fn a_two_slot_node_holds_the_last_two_conversations() {
    let cluster = ClusterSnapshot::new(1, 0, vec![slotted(1, 2)]);
    let id = NodeId::from_u128(1);
    let conversation = |system: u64, c: u64| {
        let mut b = ChainBuilder::new();
        b.segment(system, 2_000).segment(10 + c, 300);
        b.finish()
    };
    let mut s = Scheduler::with_policy(Policy::PredictedLatency);
    for c in 0..3u64 {
        let chain = conversation(c, c);
        s.note_routed(&cluster, id, &chain, c * 1_000);
        s.note_cached(id, &chain, 0, c * 1_000 + 500);
    }
    let ix = s.prefix();
    assert_eq!(ix.slots(id), 2);
    assert_eq!(ix.cached_tokens(id, &conversation(0, 0)), 2_300);
    let mut s0 = Scheduler::with_policy(Policy::PredictedLatency);
    *s0.prefix_mut() = PrefixIndex::new().with_host_tokens(0);
    for c in 0..3u64 {
        let chain = conversation(c, c);
        s0.note_routed(&cluster, id, &chain, c * 1_000);
        s0.note_cached(id, &chain, 0, c * 1_000 + 500);
    }
    assert_eq!(s0.prefix().cached_tokens(id, &conversation(0, 0)), 0);
    assert_eq!(ix.cached_tokens(id, &conversation(1, 1)), 2_300);
    assert_eq!(ix.cached_tokens(id, &conversation(2, 2)), 2_300);
    // X and Y run at once, so each has a slot; whichever slot Z then
    // takes, the system prompt is cached, and the other conversation
    // stays.
    let (x, y, z) = (conversation(9, 1), conversation(9, 2), conversation(9, 3));
    s.note_routed(&cluster, id, &x, 5_000);
    s.note_routed(&cluster, id, &y, 5_100);
    s.note_cached(id, &x, 0, 6_000);
    s.note_cached(id, &y, 0, 6_100);
    assert_eq!(s.prefix().cached_tokens(id, &z), 2_000);
    s.note_routed(&cluster, id, &z, 7_000);
    s.note_cached(id, &z, 2_000, 8_000);
    let ix = s.prefix();
    assert_eq!(ix.cached_tokens(id, &z), 2_300);
    assert_eq!(ix.cached_tokens(id, &x), 2_000, "z took the older slot");
    assert_eq!(ix.cached_tokens(id, &y), 2_300);
}

/// A chain in one of a few families sharing their first blocks, with
/// uneven block sizes.
fn chain(family: u64, len: usize) -> PromptChain {
    let mut b = ChainBuilder::new();
    for i in 0..len {
        let owner = if i < 3 { 0 } else { family + 1 };
        b.segment(owner << 32 | i as u64, 50 + (i as u32 * 37) % 400);
    }
    b.finish()
}

#[derive(Clone, Debug)]
enum Op {
    Record(u8, u64, usize),
    Correct(u8, u64, usize, u32),
    Capacity(u8, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 0u64..5, 1usize..60).prop_map(|(n, f, l)| Op::Record(n, f, l)),
        2 => (0u8..6, 0u64..5, 1usize..60, 0u32..20_000).prop_map(|(n, f, l, c)| Op::Correct(n, f, l, c)),
        1 => (0u8..6, 0u64..200_000).prop_map(|(n, c)| Op::Capacity(n, c)),
    ]
}

/// Tokens a slot of `id` keeps at most.
fn context_of(ix: &PrefixIndex, id: NodeId) -> u64 {
    ix.capacity(id).unwrap_or(0) / (ix.slots(id).max(1) as u64)
}

fn check(ix: &PrefixIndex, max_nodes: usize, max_blocks: usize) -> Result<(), TestCaseError> {
    prop_assert!(ix.nodes() <= max_nodes);
    for n in 0..6u8 {
        let id = NodeId::from_u128(u128::from(n));
        prop_assert!(ix.blocks(id) <= max_blocks);
        prop_assert!(ix.slots(id) <= MAX_SLOTS_PER_NODE);
        prop_assert!(context_of(ix, id) <= u64::from(DEFAULT_CONTEXT_PER_SLOT));
        for held in ix.contexts(id) {
            prop_assert!(u64::from(held.tokens()) <= context_of(ix, id));
        }
        if let Some(cap) = ix.capacity(id) {
            prop_assert!(
                ix.held_tokens(id) <= cap + DEFAULT_HOST_TOKENS,
                "{} > {}",
                ix.held_tokens(id),
                cap
            );
        }
        // A lookup finds at most the longest prefix any one context holds
        // (less while the slot holding it is busy and another is free).
        for family in 0..5 {
            let c = chain(family, 60);
            prop_assert!(ix.cached_tokens(id, &c) <= best(ix, id, &c));
        }
    }
    Ok(())
}

/// The longest prefix of `c` any one of `id`'s contexts holds (its slots'
/// and its host tier's).
fn best(ix: &PrefixIndex, id: NodeId, c: &PromptChain) -> u32 {
    ix.contexts(id)
        .map(|h| c.common_tokens(h.blocks()))
        .max()
        .unwrap_or(0)
}

/// Whether the node's slots can hold `c` whole.
fn fits(ix: &PrefixIndex, id: NodeId, c: &PromptChain, max_blocks: usize) -> bool {
    u64::from(c.tokens()) <= context_of(ix, id) && c.len() <= max_blocks
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under any sequence of records, corrections and resizings the index
    /// stays within its caps, slots and capacities, a lookup is the best
    /// slot's common prefix, and the prompt last corrected is held whole.
    #[test]
    fn the_index_stays_bounded_and_exact(
        ops in prop::collection::vec(op(), 0..80),
        tight in any::<bool>(),
    ) {
        let (max_nodes, max_blocks) = if tight { (3, 40) } else { (MAX_NODES, MAX_BLOCKS_PER_NODE) };
        let mut ix = if tight { PrefixIndex::with_limits(3, 40) } else { PrefixIndex::new() };
        for (at, op) in ops.into_iter().enumerate() {
            let at = at as u64 * 1_000;
            let id = |n: u8| NodeId::from_u128(u128::from(n));
            match op {
                Op::Record(n, f, l) => ix.record(id(n), &chain(f, l), at),
                Op::Correct(n, f, l, cached) => {
                    let c = chain(f, l);
                    ix.correct(id(n), &c, cached, at);
                    if fits(&ix, id(n), &c, max_blocks) && !ix.distrusted(id(n)) {
                        prop_assert_eq!(ix.cached_tokens(id(n), &c), c.tokens());
                    }
                }
                Op::Capacity(n, cap) => ix.set_capacity(id(n), cap),
            }
            check(&ix, max_nodes, max_blocks)?;
        }
    }

    /// Requests that each report before the next is dispatched (no slot
    /// busy when one arrives): after a report of `cached` tokens, no
    /// context but the prompt's own (its slot's, and its saved copy) is
    /// believed to hold more of it; without a host tier a lookup is the longest prefix any one slot
    /// holds and a node never holds more contexts than it has slots, and
    /// with one a lookup is at most the longest any context holds.
    #[test]
    fn a_report_leaves_no_other_slot_claiming_what_it_missed(
        runs in prop::collection::vec((0u64..5, 1usize..60, 0u32..20_000), 0..60),
        slots in 1u64..5,
        host in any::<bool>(),
    ) {
        let mut ix = PrefixIndex::new().with_host_tokens(if host { DEFAULT_HOST_TOKENS } else { 0 });
        let id = NodeId::from_u128(1);
        ix.set_capacity(id, slots * u64::from(DEFAULT_CONTEXT_PER_SLOT));
        for (at, (f, l, cached)) in runs.into_iter().enumerate() {
            let c = chain(f, l);
            let at = at as u64 * 1_000;
            ix.record(id, &c, at);
            ix.correct(id, &c, cached, at + 500);
            let k = c.blocks().iter().take_while(|b| b.end <= cached).count();
            let claiming = |copy: bool| {
                ix.contexts(id)
                    .filter(|h| c.common_blocks(h.blocks()) > k && (h.blocks() == c.blocks()) == copy)
                    .count()
            };
            prop_assert_eq!(claiming(false), 0, "contexts other than the prompt claim more than the report");
            // The slot that ran it, and its saved copy.
            prop_assert!(claiming(true) <= 1 + usize::from(host));
            prop_assert!(host || ix.contexts(id).count() <= slots as usize);
            if !ix.distrusted(id) {
                prop_assert_eq!(ix.cached_tokens(id, &c), c.tokens());
                for family in 0..5 {
                    let o = chain(family, 60);
                    if host {
                        prop_assert!(ix.cached_tokens(id, &o) <= best(&ix, id, &o));
                    } else {
                        prop_assert_eq!(ix.cached_tokens(id, &o), best(&ix, id, &o));
                    }
                }
            }
        }
    }
}

/// A flood of distinct long chains on many nodes of the most slots stays
/// within the hard caps at their real sizes.
#[test]
fn a_flood_stays_within_the_hard_caps() {
    let mut ix = PrefixIndex::new();
    for n in 0..(MAX_NODES as u128 + 5) {
        ix.set_capacity(NodeId::from_u128(n), u64::MAX);
        for f in 0..(MAX_SLOTS_PER_NODE as u64 + 4) {
            let mut b = ChainBuilder::new();
            for i in 0..600u64 {
                b.segment(f << 32 | i, 64);
            }
            ix.record(NodeId::from_u128(n), &b.finish(), n as u64);
        }
        let id = NodeId::from_u128(n);
        assert!(ix.blocks(id) <= MAX_BLOCKS_PER_NODE);
        assert_eq!(ix.contexts(id).count(), MAX_SLOTS_PER_NODE);
    }
    assert_eq!(ix.nodes(), MAX_NODES);
    assert_eq!(ix.blocks(NodeId::from_u128(0)), 0, "the oldest node went");
    // Each slot keeps its context's 512 blocks (32k tokens), all slots
    // together the cap.
    assert_eq!(
        ix.blocks(NodeId::from_u128(MAX_NODES as u128 + 4)),
        MAX_BLOCKS_PER_NODE
    );
}
