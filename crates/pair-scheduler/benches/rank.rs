//! Criterion benchmarks of `rank_into` for every policy over 8, 64 and 256
//! nodes (warm output buffer, reservations on a third of the nodes, a bound
//! session). Numbers and the command live in docs/benchmarks/pair-scheduler.md.

#![allow(missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pair_scheduler::{Policy, Ranking, Reservations, Scheduler};
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

criterion_group!(benches, rank);
criterion_main!(benches);
