//! Heap check: once its output buffer is warm, `rank_into` allocates nothing,
//! for every policy, with reservations, a pin, a bound session and a
//! populated prefix index looked up for a 20k-token prompt in play.
//!
//! Runs without libtest's harness (`harness = false`): the harness's own
//! threads allocate now and then, and dhat counts every thread.

mod common;

use pair_scheduler::{AnswerKey, ClusterQueue, Order, Policy, Ranking, Reservations, Scheduler};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const NAME: &str = "a_warmed_rank_into_allocates_nothing";

fn main() {
    if !pair_testkit::harness::wanted(NAME) {
        return;
    }
    a_warmed_rank_into_allocates_nothing();
    println!("test {NAME} ... ok");
    a_warmed_cluster_queue_allocates_nothing();
    println!("test a_warmed_cluster_queue_allocates_nothing ... ok");
}

/// A request joining and leaving a queue of 1,000 waiting, once the queue
/// has held that many, allocates nothing; nor does planning its answer.
fn a_warmed_cluster_queue_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let mut q = ClusterQueue::new(Order::Priorities);
    let mut scheduler = Scheduler::with_policy(Policy::PredictedLatency);
    let mut request = common::request();
    scheduler.note_answer(AnswerKey::of(&request), 120);
    for round in 0..2 {
        for i in 0..1_000 {
            q.push(common::waiting(i), i);
        }
        let before = dhat::HeapStats::get();
        for i in 1_000..3_000u64 {
            let t = q.push(common::waiting(i), i);
            if i % 5 == 0 {
                q.remove(t);
            } else {
                q.pop_first(&[0, 1, 2]);
            }
            scheduler.expect_answer(&mut request);
        }
        let after = dhat::HeapStats::get();
        while q.pop_first(&[0, 1, 2]).is_some() {}
        if round == 1 {
            dhat::assert_eq!(
                after.total_blocks,
                before.total_blocks,
                "the queue allocated once warmed"
            );
        }
    }
}

fn a_warmed_rank_into_allocates_nothing() {
    let _profiler = dhat::Profiler::builder().testing().build();

    let cluster = common::cluster(64, 11);
    let mut request = common::request();
    request.prefix = common::agent_chain(20_000, 0);
    request.prompt_tokens = request.prefix.tokens();
    request.pinned = Some(cluster.nodes()[3].id);
    let mut reservations = Reservations::new();
    for (i, node) in cluster.nodes().iter().enumerate().step_by(3) {
        reservations.reserve(node.id, &request, 1_000 + i as u64);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(5);

    for policy in Policy::ALL {
        let mut scheduler = Scheduler::with_policy(policy);
        common::populate(&mut scheduler, &cluster, &request.prefix);
        if let Some(session) = request.session {
            scheduler.bind_session(session, cluster.nodes()[10].id, 1_000);
        }
        let mut ranking = Ranking::new();
        scheduler.rank_into(
            &mut ranking,
            &cluster,
            &request,
            &reservations,
            1_100,
            &mut rng,
        );
        assert!(ranking.len() > 10, "the fixture must exercise real work");
        if policy == Policy::PredictedLatency {
            let cached = ranking
                .iter()
                .filter_map(|c| c.score.prediction())
                .filter(|p| p.cached_tokens > 0)
                .count();
            assert!(cached > 5, "the lookup must find cached prefixes");
        }

        let before = dhat::HeapStats::get();
        for now in 0..20 {
            scheduler.rank_into(
                &mut ranking,
                &cluster,
                &request,
                &reservations,
                1_100 + now,
                &mut rng,
            );
        }
        let after = dhat::HeapStats::get();
        dhat::assert_eq!(
            after.total_blocks,
            before.total_blocks,
            "{} allocated while ranking",
            policy
        );
    }
}
