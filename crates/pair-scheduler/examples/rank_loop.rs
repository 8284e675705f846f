//! Ranks one synthetic cluster in a loop: a driver for instruction counts
//! (`valgrind --tool=callgrind`), which stay meaningful on a loaded machine
//! where wall-clock benchmarks do not. See docs/benchmarks/pair-scheduler.md.
//!
//! Usage: `rank_loop <policy> <nodes> <iterations> [prefix]`; with
//! `prefix`, the request carries a 20k-token prompt (313 blocks) looked up
//! in a populated prefix index.

#[path = "../tests/common/mod.rs"]
mod common;

use std::error::Error;
use std::hint::black_box;
use std::time::Instant;

use pair_scheduler::{Policy, Ranking, Reservations, Scheduler};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: rank_loop <policy> <nodes> <iterations> [prefix]";
    let policy: Policy = args.next().ok_or(usage)?.parse()?;
    let nodes: usize = args.next().ok_or(usage)?.parse()?;
    let iterations: u32 = args.next().ok_or(usage)?.parse()?;
    let prefix = match args.next().as_deref() {
        None => false,
        Some("prefix") => true,
        Some(_) => return Err(usage.into()),
    };

    let cluster = common::cluster(nodes.max(1), 42);
    let mut request = common::request();
    if prefix {
        request.prefix = common::agent_chain(20_000, 0);
        request.prompt_tokens = request.prefix.tokens();
    }
    let mut reservations = Reservations::new();
    for (i, node) in cluster.nodes().iter().enumerate().step_by(3) {
        reservations.reserve(node.id, &request, 1_000 + i as u64);
    }
    let mut scheduler = Scheduler::with_policy(policy);
    if prefix {
        common::populate(&mut scheduler, &cluster, &request.prefix);
    }
    if let Some(session) = request.session {
        scheduler.bind_session(session, cluster.nodes()[cluster.len() / 2].id, 1_000);
    }
    let mut ranking = Ranking::with_capacity(cluster.len());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let started = Instant::now();
    for _ in 0..iterations {
        scheduler.rank_into(
            &mut ranking,
            black_box(&cluster),
            black_box(&request),
            &reservations,
            1_100,
            &mut rng,
        );
        black_box(ranking.first());
    }
    let per = started.elapsed() / iterations.max(1);
    println!("{policy} over {nodes} nodes: {per:?} per rank (wall clock)");
    Ok(())
}
