//! Throughput of the pure engine model: jobs pushed through per second, the
//! figure the simulator's "one million requests on 16 nodes" budget rests on.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pair_core::{ChainBuilder, PromptChain};
use pair_emulator::{CacheKind, EngineEvent, EngineModel, HardwareProfile, JobSpec, ModelSpec};

/// Runs `jobs` requests with Poisson-like spacing through one engine and
/// returns the number of events it produced. With a `cache`, prompts are
/// agent turns: a shared 2k-token system prompt, one of 16 conversations,
/// and that conversation's turn so far.
fn drive(profile: &HardwareProfile, jobs: u64, cache: CacheKind) -> usize {
    let models = [
        ModelSpec::guess("llama3.1:8b"),
        ModelSpec::guess("qwen2.5:3b"),
    ];
    let mut engine = EngineModel::new(profile, &models, None).with_cache(cache);
    let cached = cache != CacheKind::None;
    let _ = engine.preload(0);
    let mut events = Vec::with_capacity(64);
    let mut count = 0;
    let mut now = 0u64;
    // A cheap xorshift keeps the bench free of RNG crates and deterministic.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for id in 0..jobs {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        now += x % 400_000;
        let prompt = if cached {
            let conversation = (x >> 8) % 16;
            let mut b = ChainBuilder::new();
            b.segment(0, 2_000);
            for turn in 0..(x >> 12) % 8 {
                b.segment(conversation << 8 | turn, 300);
            }
            b.segment(x, 50);
            b.finish()
        } else {
            PromptChain::EMPTY
        };
        let job = JobSpec {
            id,
            model: usize::from(x.is_multiple_of(10)),
            prompt_tokens: if cached {
                prompt.tokens()
            } else {
                50 + (x % 900) as u32
            },
            output_tokens: 10 + ((x >> 20) % 300) as u32,
            prompt,
        };
        engine.advance(now, &mut events);
        count += events.len();
        events.clear();
        let _ = engine.submit(now, job);
    }
    while let Some(t) = engine.next_event_at() {
        engine.advance(t, &mut events);
        count += events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Finished(_)))
            .count();
        events.clear();
    }
    count
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_model");
    const JOBS: u64 = 10_000;
    g.throughput(Throughput::Elements(JOBS));
    for profile in [
        HardwareProfile::rtx4090(),
        HardwareProfile::cpu_smollm2_135m(),
    ] {
        g.bench_function(format!("{}_10k_jobs", profile.name), |b| {
            b.iter(|| black_box(drive(&profile, JOBS, CacheKind::None)))
        });
    }
    // The prompt cache's cost: slots (4 on the 4090) and a shared pool.
    let profile = HardwareProfile::rtx4090();
    for (name, cache) in [
        ("slots", CacheKind::slots(32_768)),
        (
            "pool",
            CacheKind::pool(
                &profile,
                4_900_000_000,
                pair_emulator::cache::KV_BYTES_PER_TOKEN_8B,
            ),
        ),
    ] {
        g.bench_function(format!("rtx4090_10k_jobs_cached_{name}"), |b| {
            b.iter(|| black_box(drive(&profile, JOBS, cache)))
        });
    }
    g.finish();

    // The simulator's budget: a million requests over 16 engines.
    let mut g = c.benchmark_group("engine_model_cluster");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1_000_000));
    let profile = HardwareProfile::rtx3060();
    g.bench_function("16_engines_1m_jobs", |b| {
        b.iter(|| {
            black_box(
                (0..16)
                    .map(|_| drive(&profile, 62_500, CacheKind::None))
                    .sum::<usize>(),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
