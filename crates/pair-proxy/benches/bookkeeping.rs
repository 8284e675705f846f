//! What a request's end-of-answer bookkeeping costs (the load counters,
//! the route's three histograms, the request counter, the job record) on
//! one thread, and on two threads doing it at the same time as two event
//! loops do: the difference is the cost of the state both write (locks
//! and counters whose cache lines move between the cores). Back to back,
//! so an upper bound of that cost. Numbers and the command live in
//! docs/benchmarks/proxy.md ("Eighth round").

#![allow(missing_docs, clippy::unwrap_used)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pair_core::{ApiFlavor, JobId, JobRecord, JobStatus, NodeId};
use pair_proxy::jobs::JobLog;
use pair_proxy::load::LocalLoad;
use pair_proxy::metrics::Metrics;

const ROUTE: &str = "/v1/chat/completions";

fn record(n: u64) -> JobRecord {
    JobRecord {
        id: JobId::from_uuid(uuid::Uuid::from_u128(u128::from(n))),
        model: "bench".into(),
        flavor: ApiFlavor::OpenAi,
        route: ROUTE.into(),
        streaming: false,
        origin: NodeId::from_u128(1),
        ran_on: Some(NodeId::from_u128(1)),
        attempts: 1,
        status: JobStatus::Completed,
        http_status: Some(200),
        created_at_ms: 1,
        ttft_ms: Some(1),
        duration_ms: Some(2),
        prompt_tokens: Some(10),
        output_tokens: Some(5),
        error: None,
    }
}

struct Shared {
    metrics: Metrics,
    jobs: JobLog,
    load: Arc<LocalLoad>,
}

/// One request's bookkeeping, as the executor and its watcher do it.
fn one(s: &Shared, n: u64) {
    let guard = s.load.begin(10, 20);
    let route = s.metrics.route_at(s.metrics.route_slot(ROUTE).unwrap());
    route.ttft.observe(0.001);
    route.duration.observe(0.002);
    route.attempts.observe(1.0);
    s.metrics.count_request(ROUTE, 200, "node");
    drop(guard);
    s.jobs.record(record(n));
}

fn bookkeeping(c: &mut Criterion) {
    let mut group = c.benchmark_group("bookkeeping");
    for threads in [1u64, 2] {
        group.bench_function(
            BenchmarkId::new("per-request", format!("{threads}-threads")),
            |b| {
                b.iter_custom(|iters| {
                    let shared = Arc::new(Shared {
                        metrics: Metrics::new(),
                        jobs: JobLog::in_memory(),
                        load: LocalLoad::new(),
                    });
                    let start = Arc::new(Barrier::new(usize::try_from(threads).unwrap()));
                    let workers: Vec<_> = (0..threads)
                        .map(|t| {
                            let (shared, start) = (Arc::clone(&shared), Arc::clone(&start));
                            std::thread::spawn(move || {
                                start.wait();
                                let t0 = Instant::now();
                                for i in 0..iters {
                                    one(&shared, i * 2 + t);
                                }
                                t0.elapsed()
                            })
                        })
                        .collect();
                    // Each thread did `iters` requests: the time per request is
                    // the slower thread's.
                    workers
                        .into_iter()
                        .map(|w| w.join().unwrap())
                        .max()
                        .unwrap_or(Duration::ZERO)
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bookkeeping);
criterion_main!(benches);
