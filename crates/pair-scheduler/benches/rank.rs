//! Criterion benchmarks of `rank_into` for every policy over 8, 64 and 256
//! nodes (warm output buffer, reservations on a third of the nodes, a bound
//! session), and of `predicted-latency` at 8 nodes with the prefix lookup
//! of a 20k-token prompt (313 blocks) against a populated index. Numbers
//! and the command live in docs/benchmarks/pair-scheduler.md.

#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pair_scheduler::{ClusterQueue, Order, Policy, Ranking, Reservations, Scheduler};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

fn rank(c: &mut Criterion) {
    let mut group = c.benchmark_group("rank");
    for n in [8usize, 64, 256] {
        let cluster = common::cluster(n, 42);
        let request = common::request();
        let mut reservations = Reservations::new();
        for (i, node) in cluster.nodes().iter().enumerate().step_by(3) {
            reservations.reserve(node.id, &request, 1_000 + i as u64);
        }
        for policy in Policy::ALL {
            let mut scheduler = Scheduler::with_policy(policy);
            if let Some(session) = request.session {
                scheduler.bind_session(session, cluster.nodes()[n / 2].id, 1_000);
            }
            let mut ranking = Ranking::with_capacity(n);
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            group.bench_with_input(BenchmarkId::new(policy.as_str(), n), &n, |b, _| {
                b.iter(|| {
                    scheduler.rank_into(
                        &mut ranking,
                        black_box(&cluster),
                        black_box(&request),
                        &reservations,
                        1_100,
                        &mut rng,
                    );
                    black_box(ranking.first().map(|c| c.node))
                });
            });
        }
    }
    group.finish();
}

fn rank_prefix(c: &mut Criterion) {
    let mut group = c.benchmark_group("rank_prefix");
    let n = 8;
    let cluster = common::cluster(n, 42);
    let mut request = common::request();
    request.prefix = common::agent_chain(20_000, 0);
    request.prompt_tokens = request.prefix.tokens();
    let mut reservations = Reservations::new();
    for (i, node) in cluster.nodes().iter().enumerate().step_by(3) {
        reservations.reserve(node.id, &request, 1_000 + i as u64);
    }
    let mut scheduler = Scheduler::with_policy(Policy::PredictedLatency);
    common::populate(&mut scheduler, &cluster, &request.prefix);
    if let Some(session) = request.session {
        scheduler.bind_session(session, cluster.nodes()[n / 2].id, 1_000);
    }
    let mut ranking = Ranking::with_capacity(n);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    group.bench_function(BenchmarkId::new("predicted-latency", n), |b| {
        b.iter(|| {
            scheduler.rank_into(
                &mut ranking,
                black_box(&cluster),
                black_box(&request),
                &reservations,
                1_100,
                &mut rng,
            );
            black_box(ranking.first().map(|c| c.node))
        });
    });
    let index = scheduler.prefix();
    let node = cluster.nodes()[3].id;
    group.bench_function("cached_tokens/313-blocks", |b| {
        b.iter(|| index.cached_tokens(black_box(node), black_box(&request.prefix)));
    });
    group.finish();
}

/// One request joining and one leaving a cluster queue of 1,000 waiting
/// over three lanes (the queue's own cost per request; target < 5 µs).
fn queue(c: &mut Criterion) {
    let mut group = c.benchmark_group("queue");
    let mut q = ClusterQueue::new(Order::Priorities);
    for i in 0..1_000 {
        q.push(common::waiting(i), i);
    }
    let mut i = 1_000u64;
    group.bench_function("push-pop/1000", |b| {
        b.iter(|| {
            i += 1;
            q.push(black_box(common::waiting(i)), i);
            black_box(q.pop_first(black_box(&[0, 1, 2])))
        });
    });
    group.finish();
}

criterion_group!(benches, rank, rank_prefix, queue);
criterion_main!(benches);
