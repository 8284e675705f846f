//! Pure, embeddable request ranking: cluster snapshot and request profile in,
//! ordered candidates with score breakdowns out.
//!
//! No tokio, no clock, no I/O and no RNG of its own: time (`now_ms`) and
//! randomness (any [`rand_core::RngCore`]) come in as arguments, so the same
//! code routes live requests in `pair-node`, replays virtual clusters in
//! `pair-sim`, and can be dropped into another router.
//!
//! The answer is a [`Ranking`]: every eligible node (routable, with a healthy
//! engine that speaks the request's API and holds the model), in the order a
//! failover loop should try them, each with the [`Score`] that put it there.
//! A candidate's `Display` is a route receipt, e.g.
//! `predicted-latency: predicted ttft 122ms = queue 0 + prefill 100 + ...`.
//!
//! Prompt caches are seen without engine hooks: the scheduler keeps a
//! [`PrefixIndex`], per node, of the prompt prefixes (block hashes of a
//! [`pair_core::PromptChain`]) it sent there, corrected by the cached
//! token counts the engines report, and `predicted-latency` prices only
//! the prompt tokens a node lacks (`prefill 100 (20000 cached)`). A
//! conversation so stays where its context is for as long as that is
//! soonest, with or without a session.
//!
//! Answers are planned at their learned length ([`AnswerLengths`], per
//! model and client shape), not at the request's `max_tokens`: what a
//! node's queue holds, what a reservation counts, and how long a whole
//! answer takes. A client that waits for the whole answer (not streaming,
//! or an agent whose tool call comes last) is ranked by when its answer
//! ends; a streaming chat by its first token.
//!
//! # Embedding it in another router
//!
//! ```
//! use pair_scheduler::pair_core::{
//!     ApiFlavor, ClusterSnapshot, EngineKind, EngineSnapshot, ModelEntry, ModelName, ModelPerf,
//!     NodeId, NodeSnapshot, RequestProfile, SessionKey,
//! };
//! use pair_scheduler::{Policy, Ranking, Reservations, Scheduler};
//!
//! // 1. Describe the cluster as your router sees it (here: two nodes).
//! let node = |id: u128, name: &str, slots: u16, decode_tps: f32| {
//!     let mut n = NodeSnapshot::new(NodeId::from_u128(id), name);
//!     n.engines.push(EngineSnapshot {
//!         kind: EngineKind::Ollama,
//!         healthy: true,
//!         silent: false,
//!         continues_chat: None,
//!         slots,
//!         models: vec![ModelEntry {
//!             name: ModelName::new("llama3.1:8b").unwrap(),
//!             size_bytes: Some(4_900_000_000),
//!             loaded: true,
//!             perf: Some(ModelPerf { decode_tps, ..ModelPerf::FALLBACK }),
//!             learned: false,
//!         }],
//!     });
//!     n
//! };
//! let cluster = ClusterSnapshot::new(
//!     1,
//!     1_000,
//!     vec![node(1, "rtx-4090", 4, 130.0), node(2, "laptop", 1, 20.0)],
//! );
//!
//! // 2. One scheduler value and one reservation table for the router's life.
//! let mut scheduler = Scheduler::with_policy(Policy::PredictedLatency);
//! let mut reservations = Reservations::new();
//! let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7); // any rand_core RNG
//! # use rand_chacha::rand_core::SeedableRng;
//!
//! // 3. Per request: rank, reserve the node you dispatch to, walk on failure.
//! let mut request = RequestProfile::new("llama3.1:8b", ApiFlavor::OpenAi);
//! request.prompt_tokens = 600;
//! request.max_output_tokens = 200;
//! // The prompt as engines' caches see it: hashes of its blocks, no text.
//! let mut chain = pair_scheduler::pair_core::ChainBuilder::new();
//! chain.bytes(&[b'x'; 2_400]); // the system prompt, tools, messages
//! request.prefix = chain.finish();
//! // Plan for the answer this kind of request gives, not its limit
//! // (learned below; 256 tokens within the limit until then).
//! scheduler.expect_answer(&mut request);
//! let mut ranking = Ranking::new(); // reuse it: warmed, ranking allocates nothing
//! let now_ms = 1_010;
//! scheduler.rank_into(&mut ranking, &cluster, &request, &reservations, now_ms, &mut rng);
//!
//! let mut served_by = None;
//! for candidate in &ranking {
//!     println!("trying {}: {candidate}", candidate.node); // the route receipt
//!     let reservation = reservations.reserve(candidate.node, &request, now_ms);
//!     // Dispatched: the node's engine will hold this prompt.
//!     scheduler.note_routed(&cluster, candidate.node, &request.prefix, now_ms);
//!     let ok = true; // ... send the request to candidate.node here ...
//!     reservations.release(reservation, now_ms); // finished (or failed): stop counting it
//!     if ok {
//!         served_by = Some(candidate.node);
//!         break;
//!     }
//! }
//! assert_eq!(served_by, Some(NodeId::from_u128(1)), "the 4090 wins");
//! let receipt = ranking.first().map(ToString::to_string).unwrap_or_default();
//! assert!(receipt.starts_with("predicted-latency: predicted total "), "{receipt}");
//!
//! // When the answer ends, teach its length to its model and client shape.
//! scheduler.note_answer(pair_scheduler::AnswerKey::of(&request), 180);
//! assert_eq!(scheduler.expect_answer(&mut request).mean, 180);
//!
//! // When the answer's usage arrives, correct the index with what the
//! // engine found cached (OpenAI `prompt_tokens_details.cached_tokens`,
//! // llama.cpp `timings.cache_n`, Ollama's prompt less `prompt_eval_count`).
//! let fast = NodeId::from_u128(1);
//! scheduler.note_cached(fast, &request.prefix, 0, now_ms + 900);
//! // The next turn re-sends the prompt: the 4090 holds it, and prices
//! // only the rest.
//! scheduler.note_routed(&cluster, fast, &request.prefix, now_ms + 1_000);
//! assert_eq!(scheduler.prefix().cached_tokens(fast, &request.prefix), 600);
//!
//! // 4. Multi-turn chats: tell the scheduler where a session landed, and
//! //    its next turns go back there unless another node is predicted
//! //    clearly sooner (a tie-break: the cache is priced already).
//! request.session = Some(SessionKey(0xC0FFEE));
//! if let (Some(session), Some(node)) = (request.session, served_by) {
//!     scheduler.bind_session(session, node, now_ms);
//! }
//!
//! // 5. When a fresher snapshot is published, stop adding the reservations
//! //    its workload reports already cover, credit finished requests a
//! //    report still counts (taken off it), and forget lost ones.
//! reservations.sync(&cluster);
//! reservations.expire(now_ms);
//!
//! // 6. A router that runs on a node reads that node's workload live,
//! //    fresher than any report: set it before each ranking, counting
//! //    every request the router sent there (it replaces the report and
//! //    that node's reservations).
//! let live = pair_scheduler::pair_core::Workload { running: 1, ..Default::default() };
//! reservations.set_live(Some((NodeId::from_u128(1), live)));
//! ```

mod affinity;
pub mod answer;
mod batching;
pub mod drive;
mod error;
pub mod failover;
mod learner;
mod matcher;
mod policy;
pub mod predict;
pub mod prefix;
pub mod prior;
pub mod queue;
mod ranking;
mod reservations;
mod scheduler;
mod slots;

pub use pair_core;

pub use affinity::{AffinityConfig, TIE_MARGIN_MS, TIE_MARGIN_PCT};
pub use answer::{AnswerKey, AnswerLengths, Expected};
pub use batching::{BatchFit, BatchLearner, Decoded, learned_perf};
pub use error::SchedulerError;
pub use failover::{
    Decision, FailedAttempt, FailedOutcome, Failover, FailoverConfig, GiveUp, MAX_DISPATCHES,
    Outcome, Step, Target,
};
pub use learner::{LearnedRates, Observation, PerfLearner};
pub use policy::Policy;
pub use prefix::PrefixIndex;
pub use queue::{
    ClusterQueue, Cuttable, Order, Priority, Ticket, Waiting, batch_may_take, preempt,
};
pub use ranking::{Candidate, Metric, Prediction, Ranking, RateSource, Reason, Score};
pub use reservations::{ReservationId, Reservations, Reserved};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use slots::{SlotLearner, Streamed};
