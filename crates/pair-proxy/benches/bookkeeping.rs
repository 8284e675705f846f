//! What a request's end-of-answer bookkeeping costs (the load counters,
//! the route's three histograms, the request counter, the job record),
//! and its ranking, on one event loop and on two event loops doing it at
//! the same time: the difference is the cost of the state both write
//! (locks and counters whose cache lines move between the cores). Back to
//! back, so an upper bound of that cost. The figures and the command are
//! in BENCHMARKS.md.

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

// The allocator the node runs with: a job record is allocated on one loop
// and may be freed on another.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pair_core::{ApiFlavor, JobRecord, RequestProfile};
use pair_http::Timeouts;
use pair_jobs::JobLog;
use pair_proxy::state::{NodeIdentity, ProxyConfig, ProxyState};
use pair_runtime::runtime::EventLoops;
use pair_scheduler::SchedulerConfig;

#[path = "../../pair-scheduler/tests/common/mod.rs"]
mod common;

const ROUTE: &str = "/v1/chat/completions";

fn record(n: u64) -> JobRecord {
    JobRecord {
        model: "bench".into(),
        flavor: ApiFlavor::OpenAi,
        route: ROUTE.into(),
        streaming: false,
        created_at_ms: 1,
        ttft_ms: Some(1),
        duration_ms: Some(2),
        prompt_tokens: Some(10),
        output_tokens: Some(5),
        ..JobRecord::fixture(u128::from(n))
    }
}

struct Shared {
    /// A node of an 8-node cluster: its load counters, metrics, job log
    /// (in memory: what the loops pay; a node's log also has a writer
    /// thread, gathering the records and writing them out, whose CPU is not
    /// counted here) and scheduler.
    state: Arc<ProxyState>,
    request: RequestProfile,
}

fn shared() -> Shared {
    let cluster = common::cluster(8, 42);
    let state = ProxyState::new(
        ProxyConfig {
            node: NodeIdentity {
                id: cluster.nodes()[0].id,
                name: "bench".into(),
            },
            scheduler: SchedulerConfig::default(),
            timeouts: Timeouts::default(),
            resume: pair_proxy::resume::ResumePolicy::default(),
            body_cap: 1024,
            engines: Vec::new(),
            loops: EventLoops::single(),
            gate: pair_proxy::gate::FaceGate::default(),
            max_connections: 1024,
            deadlines: pair_http::conns::ClientDeadlines::default(),
            body_budget: 64 << 20,
            http_stack: pair_http::HttpStack::default(),
            peers: pair_cluster::Peers::new(),
            load: pair_cluster::LocalLoad::new(),
            bindings: Arc::default(),
            queue: None,
        },
        Arc::new(JobLog::in_memory()),
    );
    state.publish(cluster);
    Shared {
        state,
        request: common::request(),
    }
}

/// One request's bookkeeping, as the executor and its watcher do it.
fn all(s: &Shared, n: u64) {
    let guard = s.state.load.begin(10, 20);
    histograms(s, n);
    request_counter(s, n);
    drop(guard);
    job_record(s, n);
}

fn load_counters(s: &Shared, _: u64) {
    drop(s.state.load.begin(10, 20));
}

fn histograms(s: &Shared, _: u64) {
    let m = &s.state.metrics;
    let route = m.route_at(m.route_slot(ROUTE).unwrap());
    route.ttft.observe(0.001);
    route.duration.observe(0.002);
    route.attempts.observe(1.0);
}

fn request_counter(s: &Shared, _: u64) {
    s.state.metrics.count_request(ROUTE, 200, "node");
}

fn job_record(s: &Shared, n: u64) {
    s.state.jobs.record(record(n));
}

/// Not bookkeeping, but the other state a request shared: the scheduler.
fn rank(s: &Shared, _: u64) {
    let cluster = s.state.cluster();
    black_box(s.state.rank(&cluster, &s.request, 1_100));
}

/// Some of a request's bookkeeping, for request `n`.
type Part = fn(&Shared, u64);

/// The whole, then each part alone.
const PARTS: [(&str, Part); 6] = [
    ("per-request", all),
    ("load-counters", load_counters),
    ("histograms", histograms),
    ("request-counter", request_counter),
    ("job-record", job_record),
    ("rank", rank),
];

fn bookkeeping(c: &mut Criterion) {
    let mut group = c.benchmark_group("bookkeeping");
    for (part, one) in PARTS {
        for threads in [1u64, 2] {
            group.bench_function(BenchmarkId::new(part, format!("{threads}-threads")), |b| {
                b.iter_custom(|iters| {
                    let shared = Arc::new(shared());
                    let n = usize::try_from(threads).unwrap();
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        // Each worker on an event loop of its own, as a
                        // node's requests are: loop 0 is this thread.
                        let loops = EventLoops::start(n).unwrap();
                        let start = Arc::new(Barrier::new(n));
                        let workers: Vec<_> = (0..threads)
                            .map(|t| {
                                let (shared, start) = (Arc::clone(&shared), Arc::clone(&start));
                                loops.spawn_on(usize::try_from(t).unwrap(), async move {
                                    start.wait();
                                    let t0 = Instant::now();
                                    for i in 0..iters {
                                        one(&shared, i * 2 + t);
                                    }
                                    t0.elapsed()
                                })
                            })
                            .collect();
                        // Each worker did `iters` requests: the time per
                        // request is the slower one's.
                        let mut slowest = Duration::ZERO;
                        for w in workers {
                            slowest = slowest.max(w.await.unwrap());
                        }
                        loops.shutdown(Duration::from_secs(5)).await;
                        slowest
                    })
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bookkeeping);
criterion_main!(benches);
