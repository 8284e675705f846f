//! Deterministic cluster fixtures shared by the allocation test and the
//! benchmarks (included with `#[path]` from `benches/`).

#![allow(dead_code, unreachable_pub)]

use pair_scheduler::Scheduler;
use pair_scheduler::pair_core::{
    ApiFlavor, ClusterSnapshot, EngineKind, EngineSnapshot, GpuDevice, Liveness, ModelEntry,
    ModelName, ModelPerf, NodeId, NodeSnapshot, Pressure, PromptChain, RequestProfile, SessionKey,
    Workload,
};

pub const MODEL: &str = "llama3.1:8b";
const OTHERS: [&str; 2] = ["qwen2.5:7b", "mistral:7b"];

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A varied `n`-node cluster: mixed speeds, slots, loads, warm and cold
/// copies, a few suspect or dead nodes, and one node in five without
/// [`MODEL`] (it holds other models only).
pub fn cluster(n: usize, seed: u64) -> ClusterSnapshot {
    let mut s = seed;
    let nodes = (0..n)
        .map(|i| {
            let mut r = || splitmix(&mut s);
            let mut node = NodeSnapshot::new(
                NodeId::from_u128(u128::from(r()) << 64 | i as u128),
                format!("node-{i}"),
            );
            node.liveness = match r() % 20 {
                0 => Liveness::Suspect,
                1 => Liveness::Dead,
                _ => Liveness::Alive,
            };
            node.rtt_us = (r() % 3_000) as u32;
            node.pressure = Pressure::new((r() % 4) as u8).unwrap_or_default();
            node.reported_at_ms = 1_000;
            let running = (r() % 4) as u32;
            let queued = (r() % 3) as u32;
            node.workload = Workload {
                running,
                queued,
                prefill_tokens: u64::from(running + queued) * (r() % 800),
                decode_tokens: u64::from(running + queued) * (r() % 400),
            };
            let perf = ModelPerf {
                prefill_tps: 200.0 + (r() % 8_000) as f32,
                decode_tps: 10.0 + (r() % 150) as f32,
                load_ms: 500 + (r() % 4_000) as u32,
                overhead_ms: 10 + (r() % 40) as u32,
                batch_exponent: None,
            };
            let mut names: Vec<&str> = OTHERS.to_vec();
            if i % 5 != 4 {
                names.push(MODEL);
            }
            node.engines.push(EngineSnapshot {
                kind: EngineKind::Ollama,
                healthy: true,
                silent: false,
                continues_chat: None,
                slots: 1 + (r() % 4) as u16,
                models: names
                    .into_iter()
                    .map(|name| ModelEntry {
                        name: ModelName::new(name).expect("fixture names are valid"),
                        size_bytes: Some(4_000_000_000 + r() % 2_000_000_000),
                        loaded: r() % 3 != 0,
                        perf: (r() % 2 == 0).then_some(perf),
                        learned: false,
                    })
                    .collect(),
            });
            node.base_perf = (r() % 2 == 0).then_some(perf);
            node.gpus.push(GpuDevice {
                index: 0,
                name: "gpu".into(),
                utilisation_pct: (r() % 100) as u8,
                vram_used_bytes: r() % 20_000_000_000,
                vram_total_bytes: 24_000_000_000,
            });
            node
        })
        .collect();
    ClusterSnapshot::new(1, 1_000, nodes)
}

/// A typical chat request for [`MODEL`], with a session key.
pub fn request() -> RequestProfile {
    let mut r = RequestProfile::new(MODEL, ApiFlavor::OpenAi);
    r.streaming = true;
    r.prompt_tokens = 800;
    r.max_output_tokens = 256;
    r.session = Some(SessionKey(7));
    r
}

/// A coding agent's prompt of about `tokens` tokens as the proxy would cut
/// it from the body's bytes (64-token blocks: a 20k-token prompt is 313);
/// `variant` changes everything after the first half.
pub fn agent_chain(tokens: usize, variant: u8) -> PromptChain {
    let mut bytes = vec![b's'; tokens * 2];
    bytes.extend(std::iter::repeat_n(b'a' + variant, tokens * 2));
    let mut b = pair_scheduler::pair_core::ChainBuilder::new();
    b.bytes(&bytes);
    b.finish()
}

/// Records, on every node of `cluster`, a different share of `chain` (none
/// to all of it) and another conversation beside it, so lookups meet hits,
/// partial hits and misses; and fills each node's host tier with three
/// more conversations of `chain`'s size that ran there (sharing its first
/// half, as sub-agents share a system prompt), so lookups scan it too.
pub fn populate(scheduler: &mut Scheduler, cluster: &ClusterSnapshot, chain: &PromptChain) {
    let other = agent_chain(chain.tokens() as usize, 9);
    let ran: Vec<PromptChain> = (10..13)
        .map(|v| agent_chain(chain.tokens() as usize, v))
        .collect();
    for (i, node) in cluster.nodes().iter().enumerate() {
        for c in &ran {
            scheduler.note_routed(cluster, node.id, c, 800);
            scheduler.note_cached(node.id, c, 0, 850);
        }
        let blocks = chain.blocks();
        let keep = blocks.len() * (i % 5) / 4;
        let share = PromptChain::from_blocks(blocks[..keep].to_vec());
        scheduler.note_routed(cluster, node.id, &other, 900);
        scheduler.note_routed(cluster, node.id, &share, 900 + i as u64);
    }
}

/// The `i`-th of a stream of requests joining a cluster queue: three
/// lanes, work spread over 0-20 s, a quarter of it batch.
pub fn waiting(i: u64) -> pair_scheduler::Waiting {
    pair_scheduler::Waiting {
        lane: (i % 3) as u32,
        arrived_ms: i * 7,
        work_ms: ((i * 7_919) % 20_000) as u32,
        priority: if i.is_multiple_of(4) {
            pair_scheduler::Priority::Batch
        } else {
            pair_scheduler::Priority::Interactive
        },
    }
}
