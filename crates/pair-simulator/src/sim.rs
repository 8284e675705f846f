//! The discrete-event cluster simulation: nodes running pair-emulator's
//! engine model, one router ranking with the real pair-scheduler, and the
//! information delays a real pair node lives with.
//!
//! What the router knows, and when:
//! - Each node samples GPU utilisation every `telemetry_interval` and keeps
//!   PAIR's EWMA pressure band; each node sends a workload report (jobs,
//!   tokens, loaded models, VRAM, pressure) every `report_interval`, which
//!   arrives `network_delay` later.
//! - The router republishes its `ClusterSnapshot` every `PUBLISH_INTERVAL`
//!   from the reports that have arrived (a real node swaps an `Arc` the same
//!   way), syncing its reservations against it.
//! - Dispatches are reserved at once and released when the answer ends.
//! - Speed is learned by pair-scheduler's `PerfLearner` from the durations
//!   the engine reports with each answer (Ollama's `prompt_eval_duration` and
//!   `eval_duration`), seeded from the hardware profile when the scenario
//!   says the node advertises one; how decoding slows with streams sharing
//!   the engine, by its `BatchLearner`, from when each answer streamed.
//!
//! Every request carries its prompt as a chain of segments; an engine
//! holding a prefix of it prefills only the rest. The scheduler ranks with
//! the chain (`RequestProfile::prefix`). Agent-loop sub-agents send their
//! next turn a tool time after each answer.
//!
//! Everything is seeded and ordered by (time, insertion sequence), so a run
//! is a pure function of the scenario, the policy and the seed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pair_core::{
    ApiFlavor, Block, ClusterSnapshot, EngineKind, EngineSnapshot, GpuDevice, Liveness, ModelEntry,
    ModelPerf, NodeId, NodeSnapshot, Pressure, PromptChain, RequestProfile, Workload,
};
use pair_emulator::cache::LLAMA_CPP_CONTEXT_TOKENS;
use pair_emulator::{CacheKind, EngineEvent, EngineModel, HardwareProfile, JobSpec, Residency};
use pair_scheduler::{
    AnswerKey, BatchLearner, ClusterQueue, Cuttable, Decoded, Observation, PerfLearner, Policy,
    Priority, Ranking, ReservationId, Reservations, Scheduler, Streamed, Waiting, batch_may_take,
    learned_perf, preempt,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::SimError;
use crate::metrics::{FanOut, Ideal, Jobs, Record, RunSummary, Turns, summarise};
use crate::pressure::{PairPressure, pair_pressure_seen};
use crate::scenario::{Entry, Micros, Routing, Scenario, SeedPerf, US_PER_MS};
use crate::workload::{AfterTurn, Demand, PlannedTurn, SourceState, stream_seed};

/// Every simulated engine's prompt cache, and the live twin's: a llama.cpp
/// server's with `-np 4` (32k context a slot, what coding agents are
/// given) and its default host-memory cache, the engine kind
/// pair-scheduler's prefix index assumes.
pub(crate) const ENGINE_CACHE: CacheKind = CacheKind::llama_cpp(LLAMA_CPP_CONTEXT_TOKENS);

/// How often the router republishes its cluster snapshot.
pub const PUBLISH_INTERVAL: Micros = 250 * US_PER_MS;

/// Nodes report in this many staggered phase groups per report interval.
pub const REPORT_GROUPS: usize = 4;

/// A finished run.
#[derive(Clone, Debug)]
pub struct RunOutput {
    pub policy: Policy,
    pub summary: RunSummary,
    /// Every measured TTFT, sorted (for CDF plots).
    pub ttft_sorted: Vec<Micros>,
    /// Events processed (for the bench's events/s figure).
    pub events: u64,
    /// Requests still held by an engine when the event queue ran dry; always
    /// 0 (every request completes exactly once), kept as evidence for tests.
    pub in_flight_at_end: usize,
    /// Batch jobs cut for interactive work (`queue = "preempt"`), each
    /// continued later.
    pub cuts: u64,
    /// Every measured agent job, in the order they finished.
    pub jobs: Vec<FanOut>,
}

/// The fixed part of a scenario's nodes, resolved once and shared by runs.
#[derive(Clone, Debug)]
pub struct Cluster {
    nodes: Vec<NodePlan>,
}

#[derive(Clone, Debug)]
struct NodePlan {
    id: NodeId,
    name: String,
    profile: HardwareProfile,
    engine: EngineModel,
    /// Scenario model index -> engine model index.
    local: Vec<Option<usize>>,
    /// Seed figures per engine model (None: the node advertises nothing).
    seed: Vec<Option<ModelPerf>>,
    base_perf: Option<ModelPerf>,
    rtt: Micros,
}

/// An agent job as one node would run it alone, seconds.
struct JobOnNode {
    /// The whole job, sub-tasks batched over the node's slots (`T_i`).
    whole: f64,
    /// Per sub-task: its part of `whole`, and its time run alone.
    tasks: Vec<TaskOnNode>,
}

struct TaskOnNode {
    batched: f64,
    alone: f64,
}

/// Whether a job can be shared out in `t` seconds: sub-task `j` (the
/// fraction `share[j]` of the job) goes to nodes that could run it alone in
/// `t`, and each node takes at most `t / T_i` of the job.
fn whole_job_fits(t: f64, nodes: &[JobOnNode], share: &[f64]) -> bool {
    const UNITS: f64 = 1e9;
    let (tasks, source, sink) = (share.len(), 0, 1);
    let task = |j: usize| 2 + j;
    let node = |i: usize| 2 + tasks + i;
    let mut caps: Vec<((usize, usize), i64)> = Vec::new();
    for (j, s) in share.iter().enumerate() {
        caps.push(((source, task(j)), (s * UNITS) as i64));
    }
    for (i, n) in nodes.iter().enumerate() {
        caps.push(((node(i), sink), (t / n.whole * UNITS).min(UNITS) as i64));
        for (j, task_on_node) in n.tasks.iter().enumerate() {
            if task_on_node.alone <= t {
                caps.push(((task(j), node(i)), UNITS as i64));
            }
        }
    }
    let vertices: Vec<usize> = (0..2 + tasks + nodes.len()).collect();
    let want: i64 = caps[..tasks].iter().map(|c| c.1).sum();
    let (_, flow, _) =
        pathfinding::directed::edmonds_karp::edmonds_karp_dense(&vertices, &source, &sink, caps);
    flow >= want
}

/// The ideals of a job from what each node would take over it, µs; the
/// capacity-weighted one no less than `floor` seconds.
fn solve_ideal(nodes: &[JobOnNode], floor: f64) -> Ideal {
    let speed: f64 = nodes.iter().map(|n| 1.0 / n.whole).sum();
    if speed <= 0.0 {
        return Ideal {
            capacity: f64::INFINITY,
            whole_tasks: f64::INFINITY,
            alone: f64::INFINITY,
        };
    }
    let tasks = nodes.first().map_or(0, |n| n.tasks.len());
    let capacity = (1.0 / speed).max(floor);
    let alone = nodes
        .iter()
        .map(|n| n.tasks.iter().map(|t| t.alone).fold(n.whole, f64::max))
        .fold(f64::INFINITY, f64::min);
    let share: Vec<f64> = (0..tasks)
        .map(|j| {
            nodes
                .iter()
                .map(|n| n.tasks[j].batched / n.whole)
                .sum::<f64>()
                / nodes.len() as f64
        })
        .collect();
    let longest_alone = (0..tasks)
        .map(|j| {
            nodes
                .iter()
                .map(|n| n.tasks[j].alone)
                .fold(f64::INFINITY, f64::min)
        })
        .fold(0.0, f64::max);
    let slowest_alone = nodes
        .iter()
        .flat_map(|n| n.tasks.iter().map(|t| t.alone))
        .fold(0.0, f64::max);
    let fits = |t: f64| whole_job_fits(t, nodes, &share);
    // Every sub-task runs alone somewhere in `lo`; in `hi` every node may
    // take every sub-task, which the capacity-weighted sharing fits.
    let (mut lo, mut hi) = (capacity.max(longest_alone), capacity.max(slowest_alone));
    if fits(lo) {
        hi = lo;
    }
    while hi - lo > 1e-4 * hi {
        let mid = 0.5 * (lo + hi);
        if fits(mid) { hi = mid } else { lo = mid }
    }
    Ideal {
        capacity: capacity * 1e6,
        whole_tasks: hi * 1e6,
        alone: alone * 1e6,
    }
}

impl Cluster {
    /// Resolves profiles and builds the engines in their starting state.
    pub fn build(scn: &Scenario) -> Result<Cluster, SimError> {
        let mut nodes = Vec::with_capacity(scn.nodes.len());
        for (i, n) in scn.nodes.iter().enumerate() {
            let profile = HardwareProfile::by_name(&n.profile).map_err(|_| SimError::Unknown {
                field: format!("nodes[{i}].profile (node {})", n.name),
                what: "hardware profile",
                name: n.profile.clone(),
            })?;
            let specs: Vec<pair_emulator::ModelSpec> = n
                .models
                .iter()
                .map(|&m| {
                    pair_emulator::ModelSpec::new(
                        scn.models[m].name.as_str(),
                        scn.models[m].size_bytes,
                    )
                })
                .collect();
            let mut engine =
                EngineModel::new(&profile, &specs, n.slots.map(u32::from)).with_cache(ENGINE_CACHE);
            let mut local = vec![None; scn.models.len()];
            for (k, &m) in n.models.iter().enumerate() {
                local[m] = Some(k);
            }
            for &m in &n.preloaded {
                if let Some(k) = local[m] {
                    engine.preload(k).map_err(|source| SimError::Engine {
                        node: n.name.clone(),
                        source,
                    })?;
                }
            }
            let seed = specs
                .iter()
                .map(|s| match n.seed_perf {
                    SeedPerf::Profile => Some(profile.rates(s.size_bytes).to_perf()),
                    SeedPerf::None => None,
                })
                .collect();
            let base_perf = match n.seed_perf {
                SeedPerf::Profile => Some(profile.rates(profile.reference_model_bytes).to_perf()),
                SeedPerf::None => None,
            };
            nodes.push(NodePlan {
                id: node_id(&n.name),
                name: n.name.clone(),
                profile,
                engine,
                local,
                seed,
                base_perf,
                rtt: n.rtt,
            });
        }
        let mut ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
        ids.sort();
        ids.dedup();
        if ids.len() != nodes.len() {
            return Err(SimError::invalid("nodes", "two node names hash to one id"));
        }
        Ok(Cluster { nodes })
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The ideal makespans of an agent job of `tasks`, µs.
    ///
    /// Capacity-weighted: each node that holds the job's models could run it
    /// alone in `T_i` (its sub-tasks' prefill at the profile's rate, their
    /// decode at its rate times the batching speedup of as many streams as
    /// it has slots, up to the job's size); together, in `1 / sum(1 /
    /// T_i)`.
    ///
    /// Whole-task: the same, with sub-tasks that cannot be split. A node
    /// can take a sub-task only if the makespan leaves it time to run it
    /// alone (at one stream's speed); within that, sub-tasks share the nodes
    /// as the capacity-weighted ideal shares the job (sub-task `j` is the
    /// fraction `c_j` of the job, node `i` runs `T / T_i` of it in `T`). The
    /// least `T` for which such a sharing exists (a flow of the whole job
    /// from sub-tasks to the nodes allowed them, found by bisection).
    pub fn ideal_makespan(&self, scn: &Scenario, tasks: &[Demand]) -> Ideal {
        let mut nodes: Vec<JobOnNode> = Vec::with_capacity(self.nodes.len());
        for plan in &self.nodes {
            if tasks
                .iter()
                .any(|d| plan.local[usize::from(d.model)].is_none())
            {
                continue;
            }
            let streams = f64::from(plan.engine.slots().min(tasks.len() as u32).max(1));
            let per_task: Vec<TaskOnNode> = tasks
                .iter()
                .map(|d| {
                    let size = scn.models[usize::from(d.model)].size_bytes;
                    let rates = plan.profile.rates(size).to_perf();
                    let prefill =
                        f64::from(d.prompt_tokens) / f64::from(rates.prefill_tps).max(1e-3);
                    let decode = f64::from(d.output_tokens) / f64::from(rates.decode_tps).max(1e-3);
                    TaskOnNode {
                        batched: prefill + decode / streams.powf(0.7),
                        alone: prefill + decode,
                    }
                })
                .collect();
            let whole: f64 = per_task.iter().map(|t| t.batched).sum();
            if whole > 0.0 {
                nodes.push(JobOnNode {
                    whole,
                    tasks: per_task,
                });
            }
        }
        solve_ideal(&nodes, 0.0)
    }

    /// The ideal makespans of an agent-loop job (its sub-agents' planned
    /// turns), µs, with prompt caches: a node running the job prefills the
    /// shared system prompt (and the job's own context) once, each
    /// sub-agent's first turn its task, and each later turn only what the
    /// turn added (the previous answer and the tool result), since it
    /// holds the rest.
    ///
    /// Per node `i` (prefill rate `P`, decode rate `D`, `s` = slots up to
    /// the sub-agents): `W_i = system / P + sum over turns (new / P +
    /// output / (D s^0.7))`, and a sub-agent's serial time `C_ai = system /
    /// P + sum over its turns (new / P + output / D) + its tool times`.
    /// Capacity-weighted: `max(1 / sum_i(1 / W_i), max_a min_i C_ai)`, the
    /// work shared in proportion to speed but no sooner than the longest
    /// sub-agent run alone on the node best for it. Fastest node alone:
    /// `min_i max(W_i, max_a C_ai)`. Whole-task: as
    /// [`Cluster::ideal_makespan`] with sub-agents as the tasks.
    pub fn ideal_loop_makespan(&self, scn: &Scenario, agents: &[Vec<PlannedTurn>]) -> Ideal {
        let Some(first) = agents.first().and_then(|a| a.first()) else {
            return solve_ideal(&[], 0.0);
        };
        // What every sub-agent of the job shares: the system prompt and
        // the job's own context, prefilled once on a node.
        let source = &scn.sources[usize::from(first.demand.source)];
        let job = match source.kind {
            crate::scenario::SourceKind::AgentLoop { job_tokens, .. } => job_tokens,
            _ => 0,
        };
        let system = f64::from(source.system_tokens) + f64::from(job);
        let mut nodes: Vec<JobOnNode> = Vec::with_capacity(self.nodes.len());
        for plan in &self.nodes {
            if agents
                .iter()
                .flatten()
                .any(|t| plan.local[usize::from(t.demand.model)].is_none())
            {
                continue;
            }
            let streams = f64::from(plan.engine.slots().min(agents.len() as u32).max(1));
            let mut system_s = 0.0;
            let per_agent: Vec<TaskOnNode> = agents
                .iter()
                .map(|turns| {
                    let mut task = TaskOnNode {
                        batched: 0.0,
                        alone: 0.0,
                    };
                    for (k, t) in turns.iter().enumerate() {
                        let size = scn.models[usize::from(t.demand.model)].size_bytes;
                        let rates = plan.profile.rates(size).to_perf();
                        let prefill_tps = f64::from(rates.prefill_tps).max(1e-3);
                        system_s = system / prefill_tps;
                        let prefill = f64::from(t.new_tokens) / prefill_tps;
                        let decode = f64::from(t.demand.output_tokens)
                            / f64::from(rates.decode_tps).max(1e-3);
                        task.batched += prefill + decode / streams.powf(0.7);
                        task.alone += prefill + decode;
                        if k + 1 < turns.len() {
                            task.alone += t.tool as f64 / 1e6;
                        }
                    }
                    task.alone += system_s;
                    task
                })
                .collect();
            let whole: f64 = system_s + per_agent.iter().map(|t| t.batched).sum::<f64>();
            if whole > 0.0 {
                nodes.push(JobOnNode {
                    whole,
                    tasks: per_agent,
                });
            }
        }
        let critical = (0..agents.len())
            .map(|a| {
                nodes
                    .iter()
                    .map(|n| n.tasks[a].alone)
                    .fold(f64::INFINITY, f64::min)
            })
            .fold(0.0, f64::max);
        solve_ideal(&nodes, critical)
    }

    /// (name, profile) per node, in scenario order.
    pub fn names(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .map(|n| (n.name.clone(), n.profile.name.clone()))
            .collect()
    }
}

/// A stable node id from the node's name, so ties broken by id do not move
/// when the seed changes.
pub fn node_id(name: &str) -> NodeId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    let hi = stream_seed(h, 0x5EED, 1);
    let lo = stream_seed(h, 0x5EED, 2);
    NodeId::from_u128((u128::from(hi) << 64) | u128::from(lo))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Publish,
    Telemetry,
    Report(u16),
    Engine(u16),
    Arrival(u16),
    Wake(u16, u32),
    /// An agent-loop sub-agent sends its next turn.
    Turn(u16, u32),
}

/// A report on its way to the router.
#[derive(Clone, Copy, Debug)]
struct Report {
    arrives: Micros,
    made: Micros,
    workload: Workload,
    /// Bit k: engine model k is loaded.
    loaded: u64,
    memory_used: u64,
    utilisation_pct: u8,
    pressure: Option<(Pressure, Micros)>,
}

#[derive(Clone, Debug)]
struct InFlight {
    demand: Demand,
    /// The most prompt tokens any node's engine held at dispatch (the
    /// oracle placement's).
    oracle: u32,
    arrival: Micros,
    node: u16,
    /// The router that dispatched it, and its reservation there.
    router: u16,
    reservation: ReservationId,
    /// The answer's length as the router planned for it (counted in the
    /// node's workload until the answer ends), and what it learns under.
    planned: u32,
    answer: AnswerKey,
    /// Its work as the cluster queue orders it (a continuation keeps its
    /// first run's, and so its place).
    work_ms: u32,
    /// When it went to its node.
    dispatched: Micros,
    resumed: Resumed,
}

/// Which batch jobs an interactive request may cut ([`Sim::victim`]).
#[derive(Clone, Copy, Debug)]
enum Victims {
    /// Those its router dispatched to a ranked node, and (routers per
    /// node) those the router's own node runs for its peers.
    Routed,
    /// Any that node `i` runs: a peer asked for a slot cuts one.
    On(usize),
}

/// A request waiting at its router for a slot.
#[derive(Clone, Debug)]
struct Queued {
    demand: Demand,
    arrival: Micros,
    resumed: Resumed,
}

/// What a batch job did before it was cut for interactive work, carried
/// by its continuation (`Sim::cut`).
#[derive(Clone, Copy, Debug, Default)]
struct Resumed {
    cuts: u32,
    /// When its first token reached the client: its TTFT stands.
    first_token: Option<Micros>,
    /// Answer tokens generated before its cuts.
    generated: u32,
    /// The first run's prompt tokens (the continuation's hold the answer
    /// so far too).
    prompt_tokens: u32,
    /// The first run's queue work.
    work_ms: Option<u32>,
}

/// What one router's prefix index learns from another's dispatch or the
/// engine's answer to it, on its way in the nodes' reports.
#[derive(Clone, Debug)]
struct Gossip {
    arrives: Micros,
    from: u16,
    node: NodeId,
    chain: PromptChain,
    /// `None`: routed there; `Some(n)`: the engine found `n` tokens cached.
    cached: Option<u32>,
}

/// One router: the scheduler, its reservations and the snapshot it ranks.
/// A single-router run has one; a per-node run one per node, each seeing
/// the others through the same reports.
struct Router {
    snapshot: ClusterSnapshot,
    scheduler: Scheduler,
    reservations: Reservations,
    /// Requests waiting for a slot (late binding).
    queue: ClusterQueue<Queued>,
    /// When it last routed interactive work.
    interactive_at: Option<Micros>,
}

/// Per-node state the simulation keeps beside the engine.
#[derive(Clone, Debug)]
struct NodeState {
    engine: EngineModel,
    due: Option<Micros>,
    pressure: PairPressure,
    last_busy: Micros,
    last_util_pct: u8,
    last_sample: Option<(Pressure, Micros)>,
    /// The latest band (and when it was sampled) the router has received.
    router_pressure: Option<(Pressure, Micros)>,
    reports: std::collections::VecDeque<Report>,
    /// Declared (router-visible) output tokens of in-flight jobs, and their
    /// real output tokens: the report's decode estimate is built from what
    /// the node's proxy knows, not from the engine's future.
    declared_out: u64,
    actual_out: u64,
}

impl NodeState {
    /// The workload as the node's proxy counts it: the engine's jobs, with
    /// output tokens still to come taken from what the requests declared
    /// (the proxy cannot know how long an answer will be).
    fn proxy_workload(&self, now: Micros) -> Workload {
        let engine_w = self.engine.workload(now);
        let generated = self.actual_out.saturating_sub(engine_w.decode_tokens);
        Workload {
            decode_tokens: self.declared_out.saturating_sub(generated),
            ..engine_w
        }
    }
}

struct Sim<'a> {
    scn: &'a Scenario,
    plan: &'a Cluster,
    nodes: Vec<NodeState>,
    /// Scenario node index by position in the id-sorted snapshot.
    by_snapshot: Vec<usize>,
    /// The router's mirror of the cluster, id-sorted like the snapshot.
    view: Vec<NodeSnapshot>,
    generation: u64,
    routers: Vec<Router>,
    /// Open-loop requests dealt over the entry nodes in turn.
    next_entry: usize,
    learner: PerfLearner,
    batching: BatchLearner,
    /// Learned something since the last publication.
    learner_dirty: bool,
    rng: ChaCha8Rng,
    ranking: Ranking,
    profile: RequestProfile,
    heap: BinaryHeap<Reverse<(Micros, u64, Ev)>>,
    seq: u64,
    sources: Vec<SourceState>,
    inflight: Vec<Option<InFlight>>,
    free: Vec<usize>,
    live: usize,
    records: Vec<Record>,
    generated: u64,
    completed: u64,
    batch: Vec<Demand>,
    engine_events: Vec<EngineEvent>,
    events: u64,
    last_finish: Micros,
    jobs: Jobs,
    turns: Turns,
    /// Agent-loop sub-agents between an answer and their next turn.
    tools_running: usize,
    cuts: u64,
    /// Requests sent to an engine with every slot taken (they queue there).
    past_slots: u64,
    /// Per-node routing: prefix-index updates for the other routers, in
    /// arrival order.
    gossip: std::collections::VecDeque<Gossip>,
}

/// Runs one scenario under one policy.
pub fn simulate(scn: &Scenario, plan: &Cluster, policy: Policy) -> Result<RunOutput, SimError> {
    let mut sim = Sim::new(scn, plan, policy);
    sim.run();
    Ok(sim.finish(policy))
}

impl<'a> Sim<'a> {
    fn new(scn: &'a Scenario, plan: &'a Cluster, policy: Policy) -> Self {
        let mut order: Vec<usize> = (0..plan.nodes.len()).collect();
        order.sort_by_key(|&i| plan.nodes[i].id);
        let nodes: Vec<NodeState> = plan
            .nodes
            .iter()
            .map(|p| NodeState {
                engine: p.engine.clone(),
                due: None,
                pressure: PairPressure::default(),
                last_busy: 0,
                last_util_pct: 0,
                last_sample: None,
                router_pressure: None,
                reports: std::collections::VecDeque::new(),
                declared_out: 0,
                actual_out: 0,
            })
            .collect();
        let view: Vec<NodeSnapshot> = order
            .iter()
            .map(|&i| initial_view(scn, &plan.nodes[i], &nodes[i].engine))
            .collect();
        let sources = scn
            .sources
            .iter()
            .enumerate()
            .map(|(i, s)| SourceState::new(scn.seed, i, s))
            .collect();
        let policy_index = Policy::ALL.iter().position(|p| *p == policy).unwrap_or(0);
        Sim {
            scn,
            plan,
            nodes,
            by_snapshot: order,
            routers: (0..match scn.routing {
                Routing::Single => 1,
                Routing::PerNode(_) => plan.nodes.len(),
            })
                .map(|_| Router {
                    snapshot: ClusterSnapshot::new(0, 0, view.clone()),
                    scheduler: Scheduler::with_policy(policy),
                    reservations: Reservations::new(),
                    queue: ClusterQueue::new(scn.queue.map(|q| q.order).unwrap_or_default()),
                    interactive_at: None,
                })
                .collect(),
            next_entry: 0,
            view,
            generation: 0,
            learner: PerfLearner::new(),
            batching: BatchLearner::new(),
            learner_dirty: false,
            rng: ChaCha8Rng::seed_from_u64(stream_seed(scn.seed, 0xD1CE, policy_index as u64)),
            ranking: Ranking::with_capacity(plan.nodes.len()),
            profile: RequestProfile::new(String::with_capacity(64), ApiFlavor::Ollama),
            heap: BinaryHeap::with_capacity(1024),
            seq: 0,
            sources,
            inflight: Vec::new(),
            free: Vec::new(),
            live: 0,
            records: Vec::new(),
            generated: 0,
            completed: 0,
            batch: Vec::new(),
            engine_events: Vec::new(),
            events: 0,
            last_finish: 0,
            jobs: Jobs::default(),
            turns: Turns::default(),
            tools_running: 0,
            cuts: 0,
            past_slots: 0,
            gossip: std::collections::VecDeque::new(),
        }
    }

    fn push(&mut self, at: Micros, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, ev)));
    }

    /// Whether periodic machinery must keep ticking.
    fn active(&self, now: Micros) -> bool {
        now < self.scn.duration
            || self.live > 0
            || self.tools_running > 0
            || self.routers.iter().any(|r| !r.queue.is_empty())
    }

    fn run(&mut self) {
        let n = self.nodes.len();
        self.push(0, Ev::Publish);
        self.push(self.scn.info.telemetry_interval, Ev::Telemetry);
        // Stagger reports across the interval, as independent nodes do, in
        // a few phase groups (one event per group keeps the queue short).
        let groups = n.clamp(1, REPORT_GROUPS);
        for g in 0..groups {
            let phase = self.scn.info.report_interval * g as u64 / groups as u64;
            self.push(phase, Ev::Report(g as u16));
        }
        for s in 0..self.scn.sources.len() {
            let src = &self.scn.sources[s];
            if let Some(t) = self.sources[s].next_arrival(src, 0)
                && t < self.scn.duration
            {
                self.push(t, Ev::Arrival(s as u16));
            }
            for u in 0..self.sources[s].users() {
                let t = self.sources[s].first_wake(src, u);
                self.push(t, Ev::Wake(s as u16, u));
            }
        }
        while let Some(Reverse((now, _, ev))) = self.heap.pop() {
            self.events += 1;
            match ev {
                Ev::Arrival(s) => self.on_arrival(now, usize::from(s)),
                Ev::Wake(s, u) => self.on_wake(now, usize::from(s), u),
                Ev::Turn(s, a) => self.on_turn(now, usize::from(s), a),
                Ev::Engine(i) => self.on_engine(now, usize::from(i)),
                Ev::Report(i) => self.on_report(now, usize::from(i)),
                Ev::Telemetry => self.on_telemetry(now),
                Ev::Publish => self.on_publish(now),
            }
        }
    }

    fn on_arrival(&mut self, now: Micros, s: usize) {
        let src = &self.scn.sources[s];
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        self.sources[s].open_loop_batch(src, &mut batch);
        if let Some(job) = batch.first().and_then(|d| d.burst) {
            let ideal = self.plan.ideal_makespan(self.scn, &batch);
            self.jobs.start((s as u16, job), now, ideal, batch.len());
        }
        for d in batch.drain(..) {
            self.dispatch(now, d);
        }
        self.batch = batch;
        if let Some(t) = self.sources[s].next_arrival(src, now)
            && t < self.scn.duration
        {
            self.push(t, Ev::Arrival(s as u16));
        }
    }

    fn on_wake(&mut self, now: Micros, s: usize, u: u32) {
        if now >= self.scn.duration {
            return;
        }
        let src = &self.scn.sources[s];
        if let Some(d) = self.sources[s].user_request(src, u) {
            self.dispatch(now, d);
            return;
        }
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        if let Some((job, plan)) = self.sources[s].start_job(src, u, &mut batch) {
            let ideal = self.plan.ideal_loop_makespan(self.scn, &plan);
            self.jobs.start((s as u16, job), now, ideal, plan.len());
        }
        for d in batch.drain(..) {
            self.dispatch(now, d);
        }
        self.batch = batch;
    }

    /// A sub-agent's tool ran: its next turn goes out (even past the
    /// duration, so that a started job ends).
    fn on_turn(&mut self, now: Micros, s: usize, agent: u32) {
        self.tools_running = self.tools_running.saturating_sub(1);
        if let Some(d) = self.sources[s].next_turn(agent) {
            self.dispatch(now, d);
        }
    }

    fn dispatch(&mut self, now: Micros, d: Demand) {
        self.generated += 1;
        let q = Queued {
            demand: d,
            arrival: now,
            resumed: Resumed::default(),
        };
        self.route(now, q, false);
    }

    /// Sends a request to the best node now, or, with late binding, queues
    /// it at its router while every node that could take it has its slots
    /// full (with preemption, an interactive one may cut a batch job for
    /// its slot instead). `forced`: a slot just freed for it (it goes to
    /// the best node whatever the router's view says).
    fn route(&mut self, now: Micros, q: Queued, forced: bool) {
        let Queued {
            demand: d,
            arrival,
            resumed,
        } = q;
        let now_ms = now / US_PER_MS;
        let model = &self.scn.models[usize::from(d.model)];
        self.profile.model.clear();
        self.profile.model.push_str(model.name.as_str());
        self.profile.streaming = d.streaming;
        self.profile.prompt_tokens = d.prompt_tokens;
        self.profile.max_output_tokens = d.declared_output;
        self.profile.tools = d.tools;
        self.profile.session = d.session;
        self.profile.prefix.clone_from(&d.prompt);
        let r = self.entry(&d);
        let router = &mut self.routers[r];
        router.scheduler.expect_answer(&mut self.profile);
        let planned = self.profile.answer_tokens();
        let answer = AnswerKey::of(&self.profile);
        // A router on a node reads that node's own workload live, as a
        // node's proxy does; the single router runs on no node.
        if let Routing::PerNode(_) = self.scn.routing {
            let own = &self.plan.nodes[r];
            let live = self.nodes[r].proxy_workload(now);
            router.reservations.set_live(Some((own.id, live)));
        }
        router.scheduler.rank_into(
            &mut self.ranking,
            &router.snapshot,
            &self.profile,
            &router.reservations,
            now_ms,
            &mut self.rng,
        );
        // Late binding: every candidate full, the request waits here; with
        // priorities, batch work also waits for the last free slot while
        // interactive work is about, or interactive work cuts batch work.
        let (free, slots) = self
            .ranking
            .iter()
            .filter_map(|c| c.score.prediction())
            .fold((0u32, 0u32), |(f, s), p| {
                (f + p.slots.saturating_sub(p.jobs_ahead), s + p.slots)
            });
        let late = self.scn.queue;
        let cut_for = if late.is_some_and(|q| q.preempt)
            && d.priority == Priority::Interactive
            && !forced
            && free == 0
        {
            self.victim(r, now, Victims::Routed)
                .and_then(|slot| self.cut(now, slot))
        } else {
            None
        };
        // Routers per node: with nothing of its own to cut, interactive
        // work goes on to ask the peers, which may cut batch work they run.
        let per_node = self.per_node();
        let ask_peers = per_node
            && late.is_some_and(|q| q.preempt)
            && d.priority == Priority::Interactive
            && !forced;
        let router = &mut self.routers[r];
        let batch_waits = late.is_some_and(|q| q.priorities() && !q.preempt)
            && d.priority == Priority::Batch
            && !batch_may_take(
                free,
                slots,
                router
                    .interactive_at
                    .map(|t| now.saturating_sub(t) / US_PER_MS),
                (now - arrival) / US_PER_MS,
            );
        if d.priority == Priority::Interactive {
            router.interactive_at = Some(now);
        }
        // A policy that predicts nothing never holds a request.
        let ranked = self
            .ranking
            .first()
            .is_some_and(|c| c.score.prediction().is_some());
        if late.is_some()
            && cut_for.is_none()
            && (!forced && free == 0 && !ask_peers || batch_waits)
            && ranked
        {
            self.wait_at(r, d, arrival, resumed);
            return;
        }
        // Routers per node: a view can show a peer's slot free that
        // another node's request has taken since it reported. The owner
        // reads its engine live and takes a request only into a free slot
        // (`x-pair-free-slot`), or, for interactive work, cuts a batch job
        // it runs, whoever routed it: the request goes to the first ranked
        // node that takes it, or waits here again.
        let mut cut_for = cut_for;
        let mut admitted_at = None;
        if late.is_some() && cut_for.is_none() && per_node {
            for k in 0..self.ranking.len() {
                if self.owner_admits(r, k, now) {
                    admitted_at = Some(k);
                    break;
                }
                let i = self.ranked_node(r, k);
                if ask_peers
                    && i.is_some_and(|i| i != r)
                    && let Some(node) = i
                        .and_then(|i| self.victim(r, now, Victims::On(i)))
                        .and_then(|slot| self.cut(now, slot))
                {
                    cut_for = Some(node);
                    break;
                }
            }
            if admitted_at.is_none() && cut_for.is_none() && ranked {
                self.wait_at(r, d, arrival, resumed);
                return;
            }
        }
        let router = &mut self.routers[r];
        // The first candidate (or the node whose batch job it cut, or the
        // first that took it), resolved to a node and its engine's model
        // index (both always exist: the snapshot is built from the plan).
        let snapshot = &router.snapshot;
        let homed = self
            .scn
            .homing
            .as_ref()
            .zip(d.subagent)
            .and_then(|(h, k)| h.get(usize::from(k)))
            .map(|&i| self.plan.nodes[i].id);
        let chosen = match (cut_for, homed) {
            (Some(node), _) | (None, Some(node)) => self.ranking.iter().find(|c| c.node == node),
            (None, None) => self.ranking.iter().nth(admitted_at.unwrap_or(0)),
        };
        let target = chosen.and_then(|c| {
            let i = self.by_snapshot[snapshot.index_of(c.node)?];
            let local = self.plan.nodes[i].local[usize::from(d.model)]?;
            let work_ms = c.score.prediction().map_or(0, |p| p.work_ms());
            Some((c.node, i, local, work_ms))
        });
        let Some((node_id, i, local, work_ms)) = target else {
            // No eligible node: the client gets a 502 at once.
            self.record(Record {
                arrival,
                node: None,
                source: d.source,
                ttft: 0,
                e2e: 0,
                queue: 0,
                output_tokens: 0,
                cold: false,
                prompt_tokens: 0,
                cached_tokens: 0,
                oracle_tokens: 0,
            });
            self.completed += 1;
            self.user_done(now, &d);
            return;
        };
        // The most any node's engine holds of the prompt now: what a
        // placement that knew every cache would find.
        let oracle = (0..self.nodes.len())
            .filter_map(|k| {
                let m = self.plan.nodes[k].local[usize::from(d.model)]?;
                Some(
                    self.nodes[k]
                        .engine
                        .cache()
                        .peek(m, &d.prompt, d.prompt_tokens),
                )
            })
            .max()
            .unwrap_or(0);
        let router = &mut self.routers[r];
        let reservation = router.reservations.reserve(node_id, &self.profile, now_ms);
        // The router's prefix index learns of its own dispatch at once, the
        // other routers' when the node next reports.
        if self.scn.prefix_index {
            router
                .scheduler
                .note_routed(&router.snapshot, node_id, &d.prompt, now_ms);
        }
        if let Some(session) = d.session {
            router.scheduler.bind_session(session, node_id, now_ms);
        }
        self.gossip(now, r, node_id, &d.prompt, None);
        let slot = match self.free.pop() {
            Some(k) => k,
            None => {
                self.inflight.push(None);
                self.inflight.len() - 1
            }
        };
        let spec = JobSpec {
            id: slot as u64,
            model: local,
            prompt_tokens: d.prompt_tokens,
            output_tokens: d.output_tokens,
            prompt: d.prompt.clone(),
        };
        let node = &mut self.nodes[i];
        node.declared_out += u64::from(planned);
        node.actual_out += u64::from(d.output_tokens);
        self.inflight[slot] = Some(InFlight {
            demand: d,
            oracle,
            arrival,
            node: i as u16,
            router: r as u16,
            reservation,
            planned,
            answer,
            work_ms: resumed.work_ms.unwrap_or(work_ms),
            dispatched: now,
            resumed,
        });
        self.live += 1;
        if !self.slot_free(i, now) {
            self.past_slots += 1;
        }
        // The model index is the engine's own; it cannot be out of range.
        let _ = self.nodes[i].engine.submit(now, spec);
        self.reschedule(i);
    }

    /// Queues a request at router `r`, in its place: its arrival, and its
    /// work as the first ranked candidate prices it (a continuation keeps
    /// its first run's).
    fn wait_at(&mut self, r: usize, demand: Demand, arrival: Micros, resumed: Resumed) {
        let best = self.ranking.first().and_then(|c| c.score.prediction());
        let waiting = Waiting {
            lane: u32::from(demand.model),
            arrived_ms: arrival / US_PER_MS,
            work_ms: resumed
                .work_ms
                .unwrap_or_else(|| best.map_or(0, |p| p.work_ms())),
            priority: demand.priority,
        };
        let q = Queued {
            demand,
            arrival,
            resumed,
        };
        self.routers[r].queue.push(waiting, q);
    }

    /// Whether the owner of the `k`th ranked node has a slot free for a
    /// request of router `r` now: its engine holds fewer requests than it
    /// has slots (the owner reads its engine live).
    fn owner_admits(&self, r: usize, k: usize, now: Micros) -> bool {
        self.ranked_node(r, k)
            .is_some_and(|i| self.slot_free(i, now))
    }

    /// Whether node `i`'s engine holds fewer requests than it has slots.
    fn slot_free(&self, i: usize, now: Micros) -> bool {
        let engine = &self.nodes[i].engine;
        engine.workload(now).pending() < engine.slots()
    }

    /// Whether a router runs on each node (rather than one for all).
    fn per_node(&self) -> bool {
        matches!(self.scn.routing, Routing::PerNode(_))
    }

    /// The scenario index of the `k`th ranked node, as router `r` sees it.
    fn ranked_node(&self, r: usize, k: usize) -> Option<usize> {
        let c = self.ranking.iter().nth(k)?;
        let pos = self.routers[r].snapshot.index_of(c.node)?;
        Some(self.by_snapshot[pos])
    }

    /// The batch job (its in-flight slot) that the interactive request just
    /// ranked cuts for a slot, if any (`pair_scheduler::preempt`), among
    /// `which` that hold a slot. The router prices them as it sees them:
    /// the tokens each has streamed, its own rates and planned answers.
    fn victim(&self, r: usize, now: Micros, which: Victims) -> Option<usize> {
        let wait_ms = match which {
            Victims::Routed => self
                .ranking
                .iter()
                .filter_map(|c| c.score.prediction())
                .map(|p| p.queue_ms)
                .min()?,
            Victims::On(i) => {
                self.ranking
                    .iter()
                    .find(|c| c.node == self.plan.nodes[i].id)
                    .and_then(|c| c.score.prediction())?
                    .queue_ms
            }
        };
        let per_node = self.per_node();
        let snapshot = &self.routers[r].snapshot;
        let mut slots = Vec::new();
        let mut running = Vec::new();
        for (slot, f) in self.inflight.iter().enumerate() {
            let Some(f) = f else { continue };
            let i = usize::from(f.node);
            let node_id = self.plan.nodes[i].id;
            let eligible = match which {
                // A router cuts what it routed; a node also what it runs
                // for its peers.
                Victims::Routed => {
                    (usize::from(f.router) == r || per_node && i == r)
                        && self.ranking.iter().any(|c| c.node == node_id)
                }
                Victims::On(k) => i == k,
            };
            if f.demand.priority != Priority::Batch || !eligible {
                continue;
            }
            let Some(generated) = self.nodes[i].engine.tokens_generated(slot as u64, now) else {
                continue;
            };
            let model = self.scn.models[usize::from(f.demand.model)].name.as_str();
            let perf = snapshot
                .node(node_id)
                .and_then(|n| n.find_model(model, ApiFlavor::Ollama))
                .and_then(|(_, entry)| entry.perf)
                .unwrap_or(ModelPerf::FALLBACK);
            let prefill_ms = |tokens: u32| f64::from(tokens) * 1e3 / f64::from(perf.prefill_tps);
            let decode_ms = |tokens: u32| f64::from(tokens) * 1e3 / f64::from(perf.decode_tps);
            let answered = f.resumed.generated.saturating_add(generated);
            // Past its planned length an answer's end is unknown: it counts
            // as a quarter of the plan still to come.
            let answer_left =
                decode_ms(f.planned.saturating_sub(answered).max(f.planned / 4).max(1));
            let (sunk, left) = if generated == 0 {
                let prefill = prefill_ms(f.demand.prompt_tokens);
                let spent = ((now - f.dispatched) / US_PER_MS) as f64;
                (
                    spent.min(prefill),
                    prefill - spent.min(prefill) + answer_left,
                )
            } else {
                (prefill_ms(f.demand.prompt_tokens + generated), answer_left)
            };
            slots.push(slot);
            running.push(Cuttable {
                sunk_ms: sunk.ceil() as u32,
                left_ms: left.ceil() as u32,
                cuts: f.resumed.cuts,
            });
        }
        preempt(wait_ms, &running).map(|k| slots[k])
    }

    /// Cuts the batch job in in-flight `slot` at `now`: its engine frees
    /// the slot, and it waits at its router again, in its old place, as a
    /// continuation (its prompt and its answer so far as the prompt, the
    /// rest of the answer to generate). Batch jobs queued in that engine
    /// go back to their routers too ([`Sim::withdraw_batch`]). Returns the
    /// node it left.
    fn cut(&mut self, now: Micros, slot: usize) -> Option<NodeId> {
        let i = usize::from(self.inflight.get(slot)?.as_ref()?.node);
        let c = self.nodes[i].engine.cut(now, slot as u64)?;
        self.cuts += 1;
        self.withdraw_batch(now, i);
        self.requeue(now, slot, Some(c));
        self.reschedule(i);
        Some(self.plan.nodes[i].id)
    }

    /// Batch jobs queued in node `i`'s engine (not holding a slot) go back
    /// to their routers' queues, so that interactive work sent there does
    /// not queue behind them.
    fn withdraw_batch(&mut self, now: Micros, i: usize) {
        let queued: Vec<usize> = (0..self.inflight.len())
            .filter(|&k| {
                self.inflight[k].as_ref().is_some_and(|f| {
                    usize::from(f.node) == i
                        && f.demand.priority == Priority::Batch
                        && self.nodes[i]
                            .engine
                            .tokens_generated(k as u64, now)
                            .is_none()
                })
            })
            .collect();
        for k in queued {
            if self.nodes[i].engine.cancel(now, k as u64) {
                self.requeue(now, k, None);
            }
        }
    }

    /// Puts the job in in-flight `slot`, which its engine no longer holds,
    /// back in its router's queue in its old place: after `cut`, as the
    /// continuation of what it generated.
    fn requeue(&mut self, now: Micros, slot: usize, cut: Option<pair_emulator::Cut>) {
        let Some(f) = self.inflight.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        self.live -= 1;
        let i = usize::from(f.node);
        let node = &mut self.nodes[i];
        node.declared_out = node.declared_out.saturating_sub(u64::from(f.planned));
        node.actual_out = node
            .actual_out
            .saturating_sub(u64::from(f.demand.output_tokens));
        let mut d = f.demand;
        // A job withdrawn from an engine's queue keeps what it had; a cut
        // one carries its answer so far into its continuation's prompt.
        let resumed = match cut {
            None => Resumed {
                work_ms: Some(f.work_ms),
                ..f.resumed
            },
            Some(c) => {
                let generated = c.generated.min(d.output_tokens.saturating_sub(1));
                let resumed = Resumed {
                    cuts: f.resumed.cuts + 1,
                    first_token: f
                        .resumed
                        .first_token
                        .or(c.first_token_us.map(|t| t + self.plan.nodes[i].rtt)),
                    generated: f.resumed.generated + generated,
                    prompt_tokens: if f.resumed.cuts == 0 {
                        d.prompt_tokens
                    } else {
                        f.resumed.prompt_tokens
                    },
                    work_ms: Some(f.work_ms),
                };
                if generated > 0 {
                    // The answer so far closes the prompt, as its text would.
                    let keep = d.prompt.matched_blocks(|_, b| b.end <= d.prompt_tokens);
                    let mut blocks = d.prompt.blocks()[..keep].to_vec();
                    let last = blocks.last().map_or(0, |b| b.hash);
                    blocks.push(Block {
                        hash: stream_seed(last, u64::from(resumed.cuts), u64::from(generated)),
                        end: d.prompt_tokens + generated,
                    });
                    d.prompt = PromptChain::from_blocks(blocks);
                    d.prompt_tokens += generated;
                    d.output_tokens -= generated;
                }
                resumed
            }
        };
        let router = &mut self.routers[usize::from(f.router)];
        router.reservations.release(f.reservation, now / US_PER_MS);
        let waiting = Waiting {
            lane: u32::from(d.model),
            arrived_ms: f.arrival / US_PER_MS,
            work_ms: f.work_ms,
            priority: d.priority,
        };
        let q = Queued {
            demand: d,
            arrival: f.arrival,
            resumed,
        };
        router.queue.push(waiting, q);
    }

    /// Queues a prefix-index update for the routers other than `from`.
    /// Simplification: it reaches them one report interval (plus the
    /// network delay) later, the longest a node's next report can take,
    /// rather than with the report that happens to carry it.
    fn gossip(
        &mut self,
        now: Micros,
        from: usize,
        node: NodeId,
        chain: &PromptChain,
        cached: Option<u32>,
    ) {
        if self.scn.prefix_index && self.routers.len() > 1 && !chain.is_empty() {
            self.gossip.push_back(Gossip {
                arrives: now + self.scn.info.report_interval + self.scn.info.network_delay,
                from: u16::try_from(from).unwrap_or(u16::MAX),
                node,
                chain: chain.clone(),
                cached,
            });
        }
    }

    /// The router a request enters at.
    fn entry(&mut self, d: &Demand) -> usize {
        match self.scn.routing {
            Routing::Single => 0,
            Routing::PerNode(Entry::At(i)) => i,
            Routing::PerNode(Entry::Spread) => match d.user {
                Some(u) => u as usize % self.routers.len(),
                None => {
                    self.next_entry = (self.next_entry + 1) % self.routers.len();
                    self.next_entry
                }
            },
        }
    }

    /// A slot freed on node `i`: the earliest due request waiting for a
    /// model it holds goes to the best node now.
    fn offer_slot(&mut self, now: Micros, i: usize) {
        if self.scn.queue.is_none() {
            return;
        }
        let lanes: Vec<u32> = (0..self.scn.models.len())
            .filter(|&m| self.plan.nodes[i].local[m].is_some())
            .map(|m| m as u32)
            .collect();
        // The node's own router hears of it at once, as a live node's
        // waiting requests do; the others at the node's next report (the
        // recheck on each published view). Interactive work first: batch
        // work may not take this slot (route decides, and queues it again).
        let r = match self.scn.routing {
            Routing::Single => 0,
            Routing::PerNode(_) => i,
        };
        let first = self.scn.queue.is_some_and(|q| q.priorities());
        let queue = &mut self.routers[r].queue;
        let popped = first
            .then(|| queue.pop_interactive(&lanes))
            .flatten()
            .or_else(|| queue.pop_first(&lanes));
        if let Some((_, q)) = popped {
            self.route(now, q, true);
        }
    }

    /// Every waiting request is ranked again on a fresh view: one a node
    /// now has room for goes (a view can show slots full that have freed).
    fn recheck_queues(&mut self, now: Micros) {
        if self.scn.queue.is_none() {
            return;
        }
        let lanes: Vec<u32> = (0..self.scn.models.len() as u32).collect();
        let mut waiting = Vec::new();
        for r in &mut self.routers {
            while let Some((_, w)) = r.queue.pop_first(&lanes) {
                waiting.push(w);
            }
        }
        for q in waiting {
            self.route(now, q, false);
        }
    }

    fn reschedule(&mut self, i: usize) {
        let at = self.nodes[i].engine.next_event_at();
        if at != self.nodes[i].due {
            self.nodes[i].due = at;
            if let Some(t) = at {
                self.push(t, Ev::Engine(i as u16));
            }
        }
    }

    fn on_engine(&mut self, now: Micros, i: usize) {
        if self.nodes[i].due != Some(now) {
            return; // superseded
        }
        self.nodes[i].due = None;
        let mut events = std::mem::take(&mut self.engine_events);
        events.clear();
        self.nodes[i].engine.advance(now, &mut events);
        let mut freed = 0;
        for ev in &events {
            if let EngineEvent::Finished(t) = ev {
                self.on_finished(i, t);
                freed += 1;
            }
        }
        self.engine_events = events;
        for _ in 0..freed {
            self.offer_slot(now, i);
        }
        self.reschedule(i);
    }

    fn on_finished(&mut self, i: usize, t: &pair_emulator::JobTiming) {
        let slot = t.id as usize;
        let Some(f) = self.inflight.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.free.push(slot);
        self.live -= 1;
        self.completed += 1;
        self.last_finish = self.last_finish.max(t.finished_us);
        let finished_ms = t.finished_us / US_PER_MS;
        let router = &mut self.routers[usize::from(f.router)];
        router.reservations.release(f.reservation, finished_ms);
        let answered = f.resumed.generated + t.output_tokens;
        router.scheduler.note_answer(f.answer, answered);
        // The engine said what it found cached (its usage): the dispatching
        // router corrects its index now, the others when the node reports.
        let node_id = self.plan.nodes[i].id;
        if self.scn.prefix_index {
            router
                .scheduler
                .note_cached(node_id, &f.demand.prompt, t.cached_tokens, finished_ms);
        }
        self.gossip(
            t.finished_us,
            usize::from(f.router),
            node_id,
            &f.demand.prompt,
            Some(t.cached_tokens),
        );
        let rtt = self.plan.nodes[i].rtt;
        // A fan-out sub-task ends with its answer; an agent-loop sub-agent
        // with its last turn's (`user_done`).
        if let (Some(job), None) = (f.demand.burst, f.demand.agent) {
            self.jobs
                .part_done((f.demand.source, job), t.finished_us + rtt, self.scn.warmup);
        }
        let plan = &self.plan.nodes[i];
        let node = &mut self.nodes[i];
        node.declared_out = node.declared_out.saturating_sub(u64::from(f.planned));
        node.actual_out = node
            .actual_out
            .saturating_sub(u64::from(f.demand.output_tokens));
        let ms = |us: u64| u32::try_from(us.div_ceil(US_PER_MS)).unwrap_or(u32::MAX);
        let model = self.scn.models[usize::from(f.demand.model)].name.as_str();
        // How decoding slows as streams share the engine: each request's
        // own stream beside those it overlapped, on the node's clock.
        self.learner_dirty |= self.batching.observe(
            plan.id,
            model,
            Decoded {
                streamed: Streamed {
                    first_token_ms: t.first_token_us / US_PER_MS,
                    end_ms: t.finished_us / US_PER_MS,
                },
                output_tokens: t.output_tokens,
                decode_ms: ms(t.finished_us - t.first_token_us),
            },
        );
        // The engine's own durations (Ollama reports prompt_eval_duration and
        // eval_duration); a cold job's prefill time includes its load.
        if !t.cold {
            self.learner_dirty |= self.learner.observe(&Observation {
                node: plan.id,
                model,
                // Only what was not cached was prefilled (as a node learns
                // from its job records).
                prompt_tokens: t.prompt_tokens - t.cached_tokens,
                ttft_ms: ms(t.first_token_us - t.started_us),
                output_tokens: t.output_tokens,
                duration_ms: ms(t.finished_us - t.started_us),
                // The engine's own durations split prefill from decode.
                whole: false,
            });
        }
        if let Some(session) = f.demand.session {
            self.turns
                .ran(session, f.node, f.arrival >= self.scn.warmup);
        }
        let first_token = f.resumed.first_token.unwrap_or(t.first_token_us + rtt);
        self.record(Record {
            arrival: f.arrival,
            node: Some(f.node),
            source: f.demand.source,
            ttft: first_token - f.arrival,
            e2e: t.finished_us - f.arrival + rtt,
            // At the cluster (late binding) and in the engine's queue.
            queue: t.started_us - f.arrival.min(t.submitted_us),
            output_tokens: answered,
            cold: t.cold,
            prompt_tokens: if f.resumed.cuts == 0 {
                f.demand.prompt_tokens
            } else {
                f.resumed.prompt_tokens
            },
            cached_tokens: t.cached_tokens,
            // A prefix prefilled while the job queued can beat what any
            // node held at dispatch; the oracle is never below the real.
            oracle_tokens: f.oracle.max(t.cached_tokens),
        });
        self.user_done(t.finished_us + rtt, &f.demand);
    }

    fn record(&mut self, r: Record) {
        if r.arrival >= self.scn.warmup {
            self.records.push(r);
        }
    }

    /// A closed-loop user got its answer at `at`: think, then ask again.
    fn user_done(&mut self, at: Micros, d: &Demand) {
        if let Some(agent) = d.agent {
            let s = usize::from(d.source);
            match self.sources[s].turn_done(agent) {
                AfterTurn::Next(tool) => {
                    self.tools_running += 1;
                    self.push(at + tool.max(1), Ev::Turn(d.source, agent));
                }
                AfterTurn::AgentDone { job, job_done } => {
                    self.jobs.part_done((d.source, job), at, self.scn.warmup);
                    if let Some(dev) = job_done {
                        let think = self.sources[s].think(&self.scn.sources[s], dev);
                        let wake = at + think.max(1);
                        if wake < self.scn.duration {
                            self.push(wake, Ev::Wake(d.source, dev));
                        }
                    }
                }
            }
            return;
        }
        if let Some(u) = d.user {
            let s = usize::from(d.source);
            let think = self.sources[s].think(&self.scn.sources[s], u);
            let wake = at + think.max(1);
            if wake < self.scn.duration {
                self.push(wake, Ev::Wake(d.source, u));
            }
        }
    }

    fn on_telemetry(&mut self, now: Micros) {
        let interval = self.scn.info.telemetry_interval;
        for node in &mut self.nodes {
            let busy = node.engine.busy_us(now);
            let util = (busy - node.last_busy) as f64 / interval as f64 * 100.0;
            node.last_busy = busy;
            node.last_util_pct = util.round().clamp(0.0, 100.0) as u8;
            let band = node.pressure.sample(util);
            node.last_sample = Some((band, now));
        }
        if self.active(now) {
            self.push(now + interval, Ev::Telemetry);
        }
    }

    fn on_report(&mut self, now: Micros, group: usize) {
        let groups = self.nodes.len().clamp(1, REPORT_GROUPS);
        for i in (group..self.nodes.len()).step_by(groups) {
            self.report(now, i);
        }
        if self.active(now) {
            self.push(
                now + self.scn.info.report_interval,
                Ev::Report(group as u16),
            );
        }
    }

    fn report(&mut self, now: Micros, i: usize) {
        let delay = self.scn.info.network_delay;
        let node = &mut self.nodes[i];
        let workload = node.proxy_workload(now);
        let mut loaded = 0u64;
        for m in node.engine.models() {
            if matches!(m.residency, Residency::Loaded) && m.index < 64 {
                loaded |= 1 << m.index;
            }
        }
        let report = Report {
            arrives: now + delay,
            made: now,
            workload,
            loaded,
            memory_used: node.engine.memory_used_bytes(),
            utilisation_pct: node.last_util_pct,
            pressure: node.last_sample,
        };
        node.reports.push_back(report);
    }

    fn on_publish(&mut self, now: Micros) {
        while self.gossip.front().is_some_and(|g| g.arrives <= now) {
            let Some(g) = self.gossip.pop_front() else {
                break;
            };
            let now_ms = g.arrives / US_PER_MS;
            for (r, router) in self.routers.iter_mut().enumerate() {
                if r == usize::from(g.from) {
                    continue;
                }
                match g.cached {
                    Some(n) => router.scheduler.note_cached(g.node, &g.chain, n, now_ms),
                    None => {
                        router
                            .scheduler
                            .note_routed(&router.snapshot, g.node, &g.chain, now_ms)
                    }
                }
            }
        }
        let info = self.scn.info;
        let learned = std::mem::take(&mut self.learner_dirty);
        let mut changed = learned || self.generation == 0;
        for (pos, &i) in self.by_snapshot.iter().enumerate() {
            let node = &mut self.nodes[i];
            let mut latest = None;
            while node.reports.front().is_some_and(|r| r.arrives <= now) {
                latest = node.reports.pop_front();
            }
            let v = &mut self.view[pos];
            if let Some(r) = latest {
                changed = true;
                v.workload = r.workload;
                v.reported_at_ms = r.made / US_PER_MS;
                if let Some(engine) = v.engines.first_mut() {
                    for (k, entry) in engine.models.iter_mut().enumerate() {
                        entry.loaded = k < 64 && r.loaded & (1 << k) != 0;
                    }
                }
                if let Some(g) = v.gpus.first_mut() {
                    g.vram_used_bytes = r.memory_used;
                    g.utilisation_pct = r.utilisation_pct;
                }
                if r.pressure.is_some() {
                    node.router_pressure = r.pressure;
                }
            }
            // Telemetry ages between reports and turns stale (pressure 1).
            let pressure = match node.router_pressure {
                Some((band, at)) => pair_pressure_seen(Some(band), at, now, info.stale_after),
                None => Pressure::UNKNOWN,
            };
            changed |= pressure != v.pressure;
            v.pressure = pressure;
            let plan = &self.plan.nodes[i];
            if learned && let Some(engine) = v.engines.first_mut() {
                for (k, entry) in engine.models.iter_mut().enumerate() {
                    let seed = plan.seed[k];
                    let learned = learned_perf(
                        self.learner.rates(plan.id, entry.name.as_str()),
                        self.batching.fitted(plan.id, entry.name.as_str()),
                        seed.unwrap_or(ModelPerf::FALLBACK),
                    );
                    entry.learned = learned.is_some();
                    entry.perf = learned.or(seed);
                }
            }
        }
        // Republish only when the picture changed (a real node swaps its
        // `Arc<ClusterSnapshot>` the same way).
        if changed {
            self.generation += 1;
            let snapshot =
                ClusterSnapshot::new(self.generation, now / US_PER_MS, self.view.clone());
            for r in &mut self.routers {
                r.snapshot = snapshot.clone();
                r.reservations.sync(&r.snapshot);
            }
        }
        self.recheck_queues(now);
        if self.active(now) {
            self.push(now + PUBLISH_INTERVAL, Ev::Publish);
        }
    }

    fn finish(mut self, policy: Policy) -> RunOutput {
        let end = self.last_finish.max(self.scn.duration);
        let names: Vec<(String, String, f64)> = self
            .plan
            .nodes
            .iter()
            .zip(&self.nodes)
            .map(|(p, n)| {
                (
                    p.name.clone(),
                    p.profile.name.clone(),
                    n.engine.busy_us(end) as f64 / end.max(1) as f64,
                )
            })
            .collect();
        let records = std::mem::take(&mut self.records);
        let sources: Vec<String> = self.scn.sources.iter().map(|s| s.name.clone()).collect();
        let (mut summary, ttft_sorted) = summarise(
            &records,
            &names,
            &sources,
            self.scn.slo.ttft_miss,
            self.generated,
            self.completed,
            (self.scn.warmup, self.scn.duration),
        );
        summary.fan_out = self.jobs.summary();
        summary.turns = self.turns.summary();
        RunOutput {
            policy,
            summary,
            ttft_sorted,
            events: self.events,
            in_flight_at_end: self.live + self.inflight.iter().filter(|f| f.is_some()).count(),
            cuts: self.cuts,
            jobs: self.jobs.done().to_vec(),
        }
    }
}

fn initial_view(scn: &Scenario, plan: &NodePlan, engine: &EngineModel) -> NodeSnapshot {
    let mut v = NodeSnapshot::new(plan.id, plan.name.clone());
    v.liveness = Liveness::Alive;
    v.rtt_us = u32::try_from(plan.rtt).unwrap_or(u32::MAX);
    let models = engine
        .models()
        .map(|m| ModelEntry {
            name: scn.models[scn
                .models
                .iter()
                .position(|x| x.name.as_str() == m.spec.name)
                .unwrap_or(0)]
            .name
            .clone(),
            size_bytes: Some(m.spec.size_bytes),
            loaded: matches!(m.residency, Residency::Loaded),
            perf: plan.seed.get(m.index).copied().flatten(),
            learned: false,
        })
        .collect();
    v.engines.push(EngineSnapshot {
        kind: EngineKind::Ollama,
        healthy: true,
        silent: false,
        continues_chat: None,
        slots: u16::try_from(engine.slots()).unwrap_or(u16::MAX),
        models,
    });
    v.gpus.push(GpuDevice {
        index: 0,
        name: plan.profile.name.clone(),
        utilisation_pct: 0,
        vram_used_bytes: engine.memory_used_bytes(),
        vram_total_bytes: engine.memory_bytes(),
    });
    v.pressure = Pressure::UNKNOWN;
    v.base_perf = plan.base_perf;
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::slo_met;
    use crate::search::{Probe, users_at_slo};
    use proptest::prelude::*;

    /// A small random scenario: node mix, open and closed sources, models.
    fn scenario(
        seed: u64,
        nodes: &[&str],
        users: u32,
        rate: f64,
        fan_out: u32,
        turns: bool,
        two_models: bool,
    ) -> Scenario {
        let mut t = format!(
            "name = \"p\"\nseed = {seed}\nduration_s = 40\nwarmup_s = 5\nslo = {{ ttft_p95_ms = 2000 }}\n\
             [[models]]\nname = \"a:8b\"\nsize_gb = 4.9\n[[models]]\nname = \"b:14b\"\nsize_gb = 9\n"
        );
        for (i, p) in nodes.iter().enumerate() {
            let models = if two_models && i % 2 == 0 {
                "[\"a:8b\", \"b:14b\"]"
            } else {
                "[\"a:8b\"]"
            };
            t.push_str(&format!(
                "[[nodes]]\nname = \"n{i}\"\nprofile = \"{p}\"\nmodels = {models}\npreloaded = [\"a:8b\"]\n"
            ));
        }
        let mix = if two_models {
            "models = { \"a:8b\" = 2, \"b:14b\" = 1 }\n"
        } else {
            ""
        };
        t.push_str(&format!(
            "[[workload]]\nname = \"c\"\nkind = \"closed-loop\"\nusers = {users}\n{mix}\
             think_ms = {{ dist = \"exponential\", mean = 3000 }}\n{}\
             prompt_tokens = {{ dist = \"lognormal\", median = 300, sigma = 1.0, max = 5000 }}\n\
             output_tokens = {{ dist = \"pareto\", scale = 40, alpha = 1.3, max = 1500 }}\nstreaming = 0.7\n",
            if turns { "turns = { dist = \"uniform\", min = 1, max = 5 }\n" } else { "" }
        ));
        t.push_str(&format!(
            "[[workload]]\nname = \"o\"\nkind = \"agents\"\nbursts_per_s = {rate}\n{mix}\
             fan_out = {{ dist = \"uniform\", min = 1, max = {fan_out} }}\n\
             prompt_tokens = {{ dist = \"fixed\", value = 200 }}\n\
             output_tokens = {{ dist = \"fixed\", value = 30 }}\nmax_tokens = 64\n"
        ));
        Scenario::parse(&t).unwrap()
    }

    fn run(scn: &Scenario, policy: Policy) -> RunOutput {
        simulate(scn, &Cluster::build(scn).unwrap(), policy).unwrap()
    }

    #[test]
    fn same_seed_same_results_different_seed_different_results() {
        let scn = scenario(3, &["rtx4090", "rtx3060", "laptop"], 6, 0.3, 6, true, true);
        for policy in Policy::ALL {
            let a = run(&scn, policy);
            let b = run(&scn, policy);
            assert_eq!(
                serde_json::to_string(&a.summary).unwrap(),
                serde_json::to_string(&b.summary).unwrap(),
                "{policy}"
            );
            assert_eq!(a.ttft_sorted, b.ttft_sorted);
            assert_eq!(a.events, b.events);
        }
        let mut other = scn.clone();
        other.seed = 4;
        assert_ne!(
            run(&scn, Policy::Pair).ttft_sorted,
            run(&other, Policy::Pair).ttft_sorted
        );
    }

    /// Per-node routing: every node routes its own clients with its own
    /// reservations. All clients at one node is one router again; spread
    /// over the nodes, each router sees only its own dispatches reserved,
    /// and the same load ends up less well placed.
    #[test]
    fn per_node_routers_see_only_their_own_reservations() {
        let mut scn = scenario(
            5,
            &["rtx4090", "rtx3060", "laptop"],
            10,
            0.2,
            6,
            false,
            false,
        );
        let single = run(&scn, Policy::LeastPending);
        scn.routing = Routing::from_flag("per-node:n0", &scn.nodes).unwrap();
        let at_one = run(&scn, Policy::LeastPending);
        assert_eq!(single.ttft_sorted, at_one.ttft_sorted);
        scn.routing = Routing::from_flag("per-node", &scn.nodes).unwrap();
        let spread = run(&scn, Policy::LeastPending);
        assert_ne!(spread.ttft_sorted, single.ttft_sorted);
        assert_eq!(spread.summary.generated, spread.summary.completed);
        for bad in ["per-node:nowhere", "mesh", "single:n0"] {
            assert!(Routing::from_flag(bad, &scn.nodes).is_err(), "{bad}");
        }
    }

    /// An agent job's ideal makespan is its work shared over the nodes in
    /// proportion to speed: two nodes like one halve it, and every job that
    /// started after the warm-up is measured.
    #[test]
    fn agent_jobs_are_measured_against_their_capacity_weighted_ideal() {
        let one = scenario(9, &["rtx4090"], 1, 0.2, 8, false, false);
        let two = scenario(9, &["rtx4090", "rtx4090"], 1, 0.2, 8, false, false);
        let tasks: Vec<Demand> = (0..6)
            .map(|_| Demand {
                source: 1,
                model: 0,
                prompt_tokens: 1000,
                output_tokens: 200,
                declared_output: 256,
                streaming: false,
                tools: false,
                priority: pair_scheduler::Priority::Interactive,
                session: None,
                user: None,
                burst: Some(1),
                agent: None,
                subagent: None,
                prompt: PromptChain::EMPTY,
            })
            .collect();
        let (p1, p2) = (Cluster::build(&one).unwrap(), Cluster::build(&two).unwrap());
        let i1 = p1.ideal_makespan(&one, &tasks).capacity;
        let i2 = p2.ideal_makespan(&two, &tasks).capacity;
        assert!(i1.is_finite() && i1 > 0.0);
        assert!((i1 / i2 - 2.0).abs() < 1e-9, "{i1} {i2}");
        let out = run(&two, Policy::PredictedLatency);
        let f = out.summary.fan_out.expect("agent jobs measured");
        assert!(
            f.jobs > 0 && f.makespan_p50_ms > 0.0 && f.ideal_p50_ms > 0.0,
            "{f:?}"
        );
        assert!(f.ratio_p50 <= f.ratio_p95);
        assert!(f.whole_ideal_p50_ms >= f.ideal_p50_ms && f.whole_ratio_p50 <= f.ratio_p50);
    }

    /// Sub-tasks that cannot be split keep a slow node out of the
    /// whole-task ideal while it could not finish even one of them in time,
    /// and no job beats its longest sub-task run alone on the fastest node.
    #[test]
    fn the_whole_task_ideal_leaves_out_nodes_too_slow_for_one_sub_task() {
        let task = |output_tokens| Demand {
            source: 1,
            model: 0,
            prompt_tokens: 1000,
            output_tokens,
            declared_output: 800,
            streaming: false,
            tools: false,
            priority: pair_scheduler::Priority::Interactive,
            session: None,
            user: None,
            burst: Some(1),
            agent: None,
            subagent: None,
            prompt: PromptChain::EMPTY,
        };
        let scn = scenario(9, &["rtx4090", "laptop"], 1, 0.2, 8, false, false);
        let plan = Cluster::build(&scn).unwrap();
        let rates = |profile: &str| {
            let size = scn.models[0].size_bytes;
            HardwareProfile::by_name(profile)
                .unwrap()
                .rates(size)
                .to_perf()
        };
        let alone = |profile: &str, out: u32| {
            let r = rates(profile);
            (1000.0 / f64::from(r.prefill_tps) + f64::from(out) / f64::from(r.decode_tps)) * 1e6
        };
        // Eight short sub-tasks: the laptop takes longer over one of them
        // than the 4090 over all eight, so it adds nothing whole.
        let eight = vec![task(100); 8];
        let ideal = plan.ideal_makespan(&scn, &eight);
        let fast_alone = Cluster::build(&scenario(9, &["rtx4090"], 1, 0.2, 8, false, false))
            .unwrap()
            .ideal_makespan(&scn, &eight)
            .capacity;
        assert!(ideal.capacity < fast_alone, "{ideal:?} {fast_alone}");
        assert!(alone("laptop", 100) > fast_alone);
        assert!(
            (ideal.whole_tasks / fast_alone - 1.0).abs() < 1e-3,
            "{ideal:?} {fast_alone}"
        );
        // One long sub-task among short ones: nothing ends before it does
        // alone on the 4090.
        let mut mixed = vec![task(20); 4];
        mixed.push(task(2000));
        let ideal = plan.ideal_makespan(&scn, &mixed);
        assert!(
            (ideal.whole_tasks - alone("rtx4090", 2000)).abs() < 1.0,
            "{ideal:?}"
        );
        assert!(ideal.capacity < ideal.whole_tasks);
    }

    /// Agent loops end every job they start, under every policy and either
    /// routing, and the same seed gives the same run; their sub-agents'
    /// later turns find their own context cached.
    #[test]
    fn agent_loops_finish_every_job_and_reuse_their_context() {
        let text = "name = \"l\"\nseed = 2\nduration_s = 120\nslo = { ttft_p95_ms = 2000 }\n\
             [[models]]\nname = \"a:8b\"\nsize_gb = 4.9\n\
             [[nodes]]\nname = \"n0\"\nprofile = \"rtx4090\"\nmodels = [\"a:8b\"]\n\
             [[nodes]]\nname = \"n1\"\nprofile = \"rtx3060\"\nmodels = [\"a:8b\"]\n\
             [[workload]]\nname = \"code\"\nkind = \"agent-loop\"\nusers = 2\nsystem_tokens = 8000\n\
             think_ms = { dist = \"fixed\", value = 2000 }\nfan_out = { dist = \"uniform\", min = 1, max = 6 }\n\
             turns = { dist = \"uniform\", min = 2, max = 5 }\ntool_tokens = { dist = \"uniform\", min = 100, max = 800 }\n\
             tool_ms = { dist = \"fixed\", value = 300 }\nprompt_tokens = { dist = \"fixed\", value = 300 }\n\
             output_tokens = { dist = \"uniform\", min = 20, max = 100 }\n";
        let mut scn = Scenario::parse(text).unwrap();
        for routing in [Routing::Single, Routing::PerNode(Entry::Spread)] {
            scn.routing = routing;
            for policy in Policy::ALL {
                let out = run(&scn, policy);
                let s = &out.summary;
                assert_eq!(out.in_flight_at_end, 0, "{policy}");
                assert_eq!(s.generated, s.completed, "{policy}");
                let jobs = s.fan_out.expect("jobs measured");
                assert!(jobs.jobs >= 4 && jobs.ratio_p50 > 0.0, "{policy}: {jobs:?}");
                let cache = s.cache.expect("tokens cached");
                // Every turn after a node's first holds at least the system
                // prompt there.
                assert!(cache.hit_share > 0.5, "{policy}: {cache:?}");
                assert!(cache.cached_tokens <= cache.oracle_tokens);
                assert_eq!(run(&scn, policy).ttft_sorted, out.ttft_sorted);
            }
        }
    }

    /// Chat users beside a batch farm on serial engines: with preemption a
    /// chat cuts a farm job instead of waiting for it, and every cut job
    /// still ends, with its whole answer.
    #[test]
    fn interactive_work_cuts_batch_work_which_still_ends_whole() {
        let mut scn =
            Scenario::parse(include_str!("../../../scenarios/chat-beside-farm.toml")).unwrap();
        scn.duration = 300 * 1_000_000;
        let with = |queue: &str| {
            let mut scn = scn.clone();
            scn.queue = crate::scenario::parse_queue(queue).unwrap();
            let plan = Cluster::build(&scn).unwrap();
            let mut sim = Sim::new(&scn, &plan, Policy::PredictedLatency);
            sim.run();
            let farm: Vec<(u32, Micros)> = sim
                .records
                .iter()
                .filter(|r| r.source == 1)
                .map(|r| (r.output_tokens, r.arrival))
                .collect();
            (sim.finish(Policy::PredictedLatency), farm)
        };
        let (priorities, farm_waits) = with("priorities");
        let (preempt, farm_cut) = with("preempt");
        assert_eq!(priorities.cuts, 0);
        assert!(preempt.cuts > 20, "{} cuts", preempt.cuts);
        for out in [&priorities, &preempt] {
            assert_eq!(out.in_flight_at_end, 0);
            assert_eq!(out.summary.generated, out.summary.completed);
        }
        // The same farm jobs, each answered once and whole.
        let mut a = farm_waits;
        let mut b = farm_cut;
        a.sort_unstable_by_key(|&(_, arrival)| arrival);
        b.sort_unstable_by_key(|&(_, arrival)| arrival);
        assert_eq!(a, b);
        let p95 = |out: &RunOutput, s: usize| out.summary.sources[s].ttft.p95_ms;
        assert!(p95(&preempt, 0) < p95(&priorities, 0));
        assert!(
            p95(&preempt, 1) < p95(&priorities, 1),
            "the farm keeps all slots"
        );
    }

    /// Routers per node holding requests at the cluster send one to a
    /// node only into a free slot, whatever their views of each other
    /// say: none queues in an engine (committed at once, many do). And
    /// interactive work asks its peers to cut batch work they run, so
    /// chat beside the farm is as quick as with one router.
    #[test]
    fn per_node_routers_never_count_one_slot_twice() {
        let run = |file: &str, queue: &str| {
            let mut scn = Scenario::parse(file).unwrap();
            scn.duration = 300 * 1_000_000;
            scn.routing = Routing::PerNode(Entry::Spread);
            scn.queue = crate::scenario::parse_queue(queue).unwrap();
            let plan = Cluster::build(&scn).unwrap();
            let mut sim = Sim::new(&scn, &plan, Policy::PredictedLatency);
            sim.run();
            let past = sim.past_slots;
            (past, sim.finish(Policy::PredictedLatency))
        };
        let serial = include_str!("../../../scenarios/serial-mixed.toml");
        assert!(run(serial, "off").0 > 50, "committed at once");
        for queue in ["fifo", "sjf"] {
            let (past, out) = run(serial, queue);
            assert_eq!(past, 0, "{queue}");
            assert_eq!(out.summary.generated, out.summary.completed);
        }
        let farm = include_str!("../../../scenarios/chat-beside-farm.toml");
        let (past, preempt) = run(farm, "preempt");
        assert_eq!(past, 0);
        assert!(preempt.cuts > 20, "{} cuts", preempt.cuts);
        let (_, priorities) = run(farm, "priorities");
        let chat_p95 = |out: &RunOutput| out.summary.sources[0].ttft.p95_ms;
        assert!(
            chat_p95(&preempt) < 0.5 * chat_p95(&priorities),
            "{} against {}",
            chat_p95(&preempt),
            chat_p95(&priorities)
        );
    }

    #[test]
    fn heterogeneous_cluster_predicted_latency_avoids_the_laptop() {
        // The hint, as a check that the plumbing (profiles, reports,
        // learner, predictor) reaches the policies: not a tuned result.
        let scn = scenario(
            5,
            &["rtx4090", "rtx3060", "laptop"],
            8,
            0.05,
            2,
            false,
            false,
        );
        let p = run(&scn, Policy::PredictedLatency);
        let rr = run(&scn, Policy::RoundRobin);
        let laptop = |r: &RunOutput| r.summary.nodes[2].request_share;
        assert!(
            laptop(&p) < laptop(&rr),
            "{} vs {}",
            laptop(&p),
            laptop(&rr)
        );
        assert!(p.summary.ttft.p95_ms < rr.summary.ttft.p95_ms);
    }

    #[test]
    fn users_at_slo_matches_its_own_boundary_probes() {
        let scn = scenario(9, &["rtx3060", "laptop"], 4, 0.01, 1, false, false);
        let plan = Cluster::build(&scn).unwrap();
        let probe = |users: u32| {
            let r = simulate(&scn.with_users(users), &plan, Policy::Pair).unwrap();
            Ok::<_, SimError>(Probe {
                users,
                ttft_p95_ms: r.summary.ttft.p95_ms,
                e2e_p95_ms: r.summary.e2e.p95_ms,
                pass: slo_met(&r.summary, scn.search.source, scn.slo.ttft_p95),
            })
        };
        let out = users_at_slo(64, &[], probe).unwrap();
        let r = out.users_at_slo;
        // Re-simulated independently, the boundary holds: r passes, r+1 fails.
        if r > 0 {
            assert!(probe(r).unwrap().pass);
        }
        if r < 64 {
            assert!(!probe(r + 1).unwrap().pass);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn every_request_completes_exactly_once(
            seed in any::<u64>(),
            kinds in proptest::collection::vec(0usize..5, 1..5),
            users in 0u32..12,
            rate in 0.01f64..0.5,
            fan_out in 1u32..8,
            turns in any::<bool>(),
            two_models in any::<bool>(),
            policy in 0usize..5,
            per_node in any::<bool>(),
            queue in prop::sample::select(vec!["off", "fifo", "sjf", "priorities", "preempt"]),
            batch in any::<bool>(),
        ) {
            let profiles = ["rtx4090", "rtx3060", "laptop", "m3-max", "cpu"];
            let nodes: Vec<&str> = kinds.iter().map(|&k| profiles[k]).collect();
            let mut scn = scenario(seed, &nodes, users, rate, fan_out, turns, two_models);
            if per_node {
                scn.routing = Routing::PerNode(Entry::Spread);
            }
            scn.queue = crate::scenario::parse_queue(queue).unwrap();
            if batch {
                scn.sources[1].priority = Priority::Batch;
            }
            let out = run(&scn, Policy::ALL[policy]);
            let s = &out.summary;
            prop_assert_eq!(out.in_flight_at_end, 0);
            prop_assert_eq!(s.generated, s.completed);
            prop_assert_eq!(s.rejected, 0);
            prop_assert!(s.requests <= s.generated);
            let per_node: u64 = s.nodes.iter().map(|n| n.requests).sum();
            prop_assert_eq!(per_node, s.requests);
            prop_assert!(s.ttft.p50_ms <= s.ttft.p95_ms && s.ttft.p95_ms <= s.e2e.max_ms + 1e-9);
            // Same seed, same run.
            let again = run(&scn, Policy::ALL[policy]);
            prop_assert_eq!(&again.ttft_sorted, &out.ttft_sorted);
        }
    }
}
