//! Scenario files: the TOML format, parsed once into typed values.
//!
//! The serde structs (`Raw*`) mirror the file; [`Scenario::parse`] turns them
//! into checked values (indices instead of names, microseconds instead of
//! seconds, distributions with their parameters verified), so the simulation
//! never re-checks anything. See docs/simulator.md for the format.

use std::collections::BTreeMap;
use std::path::Path;

use pair_core::ModelName;
use serde::Deserialize;

use crate::SimError;
use crate::dist::{Dist, Shape};

/// Simulated time in microseconds since the start of the run.
pub type Micros = u64;

pub(crate) const US_PER_MS: u64 = 1_000;
pub(crate) const US_PER_S: u64 = 1_000_000;

/// A whole scenario, ready to simulate.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub seed: u64,
    /// Closed-loop users stop starting requests, and open-loop sources stop
    /// arriving, at this time; requests in flight then drain.
    pub duration: Micros,
    /// Requests that arrive before this are served but not measured.
    pub warmup: Micros,
    pub slo: Slo,
    pub info: InfoDelays,
    pub models: Vec<ModelSpec>,
    /// One entry per node (a `count` in the file is expanded here).
    pub nodes: Vec<NodeSpec>,
    pub sources: Vec<Source>,
    pub search: SearchSpec,
    pub routing: Routing,
    /// Whether routers feed their scheduler's prefix index (what each
    /// node's engine caches), which predicted-latency prices prefill from;
    /// off, every node is priced as holding nothing.
    pub prefix_index: bool,
    /// Late binding: where every node that could take a request has its
    /// slots full, the request waits at its router as this says (`None`:
    /// it is committed to a node at once, as before).
    pub queue: Option<LateBinding>,
    /// Sub-agent `k` of every agent-loop job runs all its turns on node
    /// `homing[k]` (an index into `nodes`), whatever the router ranks: a
    /// placement to compare routing against ([`Scenario::with_homing`]),
    /// not a policy. `None` (and sub-agents past its end): routed.
    pub homing: Option<Vec<usize>>,
}

/// How requests wait for a slot at their router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LateBinding {
    /// The order the router's cluster queue serves in.
    pub order: pair_scheduler::Order,
    /// Interactive work that would wait cuts running batch work
    /// (`pair_scheduler::preempt`), which continues later from its text
    /// so far; the router does not keep batch work off the last free slot.
    pub preempt: bool,
}

impl LateBinding {
    /// Late binding in `order`, without preemption.
    pub fn of(order: pair_scheduler::Order) -> Self {
        Self {
            order,
            preempt: false,
        }
    }

    /// Batch work waits behind interactive work (and, without preemption,
    /// leaves it the last free slot).
    pub fn priorities(&self) -> bool {
        self.order == pair_scheduler::Order::Priorities
    }
}

/// Who routes the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// One router sees every request and every reservation.
    Single,
    /// Every node routes the requests of the clients that entered at it,
    /// with its own reservations and session table, as a live cluster does.
    PerNode(Entry),
}

impl Routing {
    /// `--routing`: `single`, `per-node`, or `per-node:NODE`.
    pub fn from_flag(flag: &str, nodes: &[NodeSpec]) -> Result<Routing, SimError> {
        let (mode, entry) = match flag.split_once(':') {
            Some((m, e)) => (m, Some(e.to_owned())),
            None => (flag, None),
        };
        parse_routing(
            &RawRouting {
                mode: Some(mode.to_owned()),
                entry,
                prefix_index: None,
                queue: None,
            },
            nodes,
        )
    }
}

/// Where the clients of a per-node cluster enter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Spread over the nodes: a closed-loop user always at the same node
    /// (user `u` at node `u mod n`), open-loop requests in turn.
    Spread,
    /// All at one node (an index into [`Scenario::nodes`]).
    At(usize),
}

/// The service level the users-at-SLO search holds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Slo {
    /// p95 time to first token must stay at or under this.
    pub ttft_p95: Micros,
    /// A request whose TTFT exceeds this counts as an SLO miss in the
    /// per-node table (defaults to `ttft_p95`).
    pub ttft_miss: Micros,
}

/// How stale the router's picture of the cluster is, as on a real node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InfoDelays {
    /// GPU utilisation sampling period (PAIR: 1 s).
    pub telemetry_interval: Micros,
    /// How often each node publishes its workload report and inventory.
    pub report_interval: Micros,
    /// One-way LAN delay for reports to reach the router.
    pub network_delay: Micros,
    /// Telemetry older than this counts as pressure 1 (PAIR: 10 s).
    pub stale_after: Micros,
    /// Round-trip time from the router to nodes that set none.
    pub default_rtt: Micros,
}

/// A model the cluster serves.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub name: ModelName,
    /// Weights in bytes: VRAM when loaded, what a cold load reads, and
    /// (through the hardware profile) how fast it prefills and decodes.
    pub size_bytes: u64,
}

/// What the router is told about a node's speed before it has learned it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedPerf {
    /// The node advertises its hardware profile's figures.
    Profile,
    /// The node advertises nothing; the scheduler must learn (or fall back).
    None,
}

/// One simulated node.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub name: String,
    /// Hardware profile name, resolved against pair-emulator's catalogue.
    pub profile: String,
    /// Indices into [`Scenario::models`].
    pub models: Vec<usize>,
    /// Loaded at time zero (the rest start cold).
    pub preloaded: Vec<usize>,
    /// Overrides the profile's parallel slots.
    pub slots: Option<u16>,
    pub rtt: Micros,
    pub seed_perf: SeedPerf,
}

/// Which model a request asks for, by weight.
#[derive(Clone, Debug)]
pub struct ModelMix {
    /// (model index, cumulative weight in (0, 1]).
    cumulative: Vec<(usize, f64)>,
}

impl ModelMix {
    pub fn pick(&self, u: f64) -> usize {
        self.cumulative
            .iter()
            .find(|(_, c)| u <= *c)
            .or(self.cumulative.last())
            .map_or(0, |(m, _)| *m)
    }

    pub fn models(&self) -> impl Iterator<Item = usize> + '_ {
        self.cumulative.iter().map(|(m, _)| *m)
    }
}

/// A stream of requests.
#[derive(Clone, Debug)]
pub struct Source {
    pub name: String,
    pub kind: SourceKind,
    pub mix: ModelMix,
    /// New prompt tokens per request (per turn in a multi-turn session).
    pub prompt_tokens: Dist,
    /// Tokens the model actually generates (before `max_tokens`).
    pub output_tokens: Dist,
    /// The client's `max_tokens`: caps the output and is what the router
    /// sees. Without it the router assumes the API default.
    pub max_tokens: Option<u32>,
    /// Fraction of requests that stream.
    pub streaming: f64,
    /// The class its requests carry (`x-pair-priority`).
    pub priority: pair_scheduler::Priority,
    /// Tokens of a system prompt (and tools) every request of the source
    /// starts with, identical across its requests, so an engine that holds
    /// it prefills only what follows; 0 for none.
    pub system_tokens: u32,
}

/// How a source's requests arrive.
#[derive(Clone, Debug)]
pub enum SourceKind {
    /// Open loop, exponential gaps.
    Poisson { rate_per_s: f64 },
    /// Open loop, on/off modulated: `rate_per_s` normally, `burst_rate_per_s`
    /// during bursts; exponential off and on periods.
    Bursty {
        rate_per_s: f64,
        burst_rate_per_s: f64,
        mean_gap: Micros,
        mean_burst: Micros,
    },
    /// Agents: at Poisson instants an agent fans out `fan_out` requests at
    /// once (tool calls, parallel sub-queries).
    Agents { bursts_per_s: f64, fan_out: Dist },
    /// Closed loop: each user sends a request, waits for the whole answer,
    /// thinks, and sends the next. With `turns`, users hold multi-turn
    /// conversations whose context grows and which carry a session key.
    ClosedLoop {
        users: u32,
        think_ms: Dist,
        turns: Option<Dist>,
        /// Context cap for a conversation, in tokens.
        context_limit: u32,
    },
    /// Coding agents (Claude Code, Codex): each of `users` developers
    /// starts a job, waits for it, thinks, and starts the next. A job fans
    /// out `fan_out` sub-agents at once; each is a loop of `turns` turns
    /// re-sending its whole conversation (the shared system prompt, the
    /// job's own context, its task from `prompt_tokens`, then every
    /// earlier answer and tool result), the next turn sent `tool_ms` after
    /// the answer with a tool result of `tool_tokens` appended.
    AgentLoop {
        users: u32,
        think_ms: Dist,
        fan_out: Dist,
        turns: Dist,
        tool_tokens: Dist,
        tool_ms: Dist,
        /// Tokens after the system prompt that one job's sub-agents share
        /// and the next job's do not (Claude Code's environment block
        /// names the job's working directory); 0 for none.
        job_tokens: u32,
    },
}

/// How users-at-SLO is searched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchSpec {
    /// Index into [`Scenario::sources`] of the closed-loop source whose
    /// users are varied; `None` when the scenario has none.
    pub source: Option<usize>,
    /// Upper bound of the search.
    pub max_users: u32,
    /// Probe duration (shorter than the main run keeps searches cheap).
    pub duration: Micros,
    pub warmup: Micros,
}

impl Scenario {
    /// Reads and parses a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, SimError> {
        let text = std::fs::read_to_string(path).map_err(|source| SimError::Read {
            path: path.to_owned(),
            source,
        })?;
        Scenario::parse(&text)
    }

    /// Parses scenario text (pure).
    pub fn parse(text: &str) -> Result<Scenario, SimError> {
        let raw: RawScenario = toml::from_str(text).map_err(SimError::Toml)?;
        raw.into_scenario()
    }

    /// The same scenario with `users` closed-loop users in the searched
    /// source and the search's probe duration.
    pub fn with_users(&self, users: u32) -> Scenario {
        let mut s = self.clone();
        if let Some(i) = self.search.source
            && let Some(
                SourceKind::ClosedLoop { users: u, .. } | SourceKind::AgentLoop { users: u, .. },
            ) = s.sources.get_mut(i).map(|x| &mut x.kind)
        {
            *u = users;
        }
        s.duration = self.search.duration;
        s.warmup = self.search.warmup;
        s
    }

    /// The same scenario with `users` closed-loop users in the searched
    /// source, for its own duration.
    pub fn with_users_kept_running(&self, users: u32) -> Scenario {
        let mut s = self.with_users(users);
        s.duration = self.duration;
        s.warmup = self.warmup;
        s
    }

    /// The same scenario run for `duration` (its warm-up kept), or an error
    /// if the warm-up would take all of it.
    pub fn with_duration(&self, duration: Micros) -> Result<Scenario, SimError> {
        if self.warmup >= duration {
            return Err(SimError::invalid(
                "duration_s",
                "must be longer than the scenario's warm-up",
            ));
        }
        let mut s = self.clone();
        s.duration = duration;
        Ok(s)
    }

    /// [`Scenario::with_users_kept_running`], or an error if the scenario
    /// has no closed-loop source to set users on.
    pub fn try_with_users(&self, users: u32) -> Result<Scenario, SimError> {
        if self.configured_users().is_none() {
            return Err(SimError::invalid(
                "search.source",
                "names no closed-loop source to set users on",
            ));
        }
        Ok(self.with_users_kept_running(users))
    }

    /// The same scenario with every agent job fanning out exactly `n`
    /// sub-tasks (agent-loop and agents sources), or an error if it has
    /// none or `n` is 0.
    pub fn with_fan_out(&self, n: u32) -> Result<Scenario, SimError> {
        if n == 0 {
            return Err(SimError::invalid("fan_out", "must be >= 1"));
        }
        let mut s = self.clone();
        let mut any = false;
        for src in &mut s.sources {
            if let SourceKind::AgentLoop { fan_out, .. } | SourceKind::Agents { fan_out, .. } =
                &mut src.kind
            {
                *fan_out = Dist::fixed(f64::from(n));
                any = true;
            }
        }
        if !any {
            return Err(SimError::invalid(
                "workload",
                "has no agents or agent-loop source to set fan_out on",
            ));
        }
        Ok(s)
    }

    /// The same scenario on the named nodes only (e.g. the fastest node
    /// alone), or an error if a name is unknown or a source's models are
    /// then held by no node.
    /// The scenario with every agent-loop job's sub-agent `k` homed on
    /// node `homing[k]` ([`Scenario::homing`]).
    pub fn with_homing(&self, homing: &[usize]) -> Result<Scenario, SimError> {
        if homing.iter().any(|&i| i >= self.nodes.len()) {
            return Err(SimError::invalid(
                "homing",
                "names a node past the scenario's last",
            ));
        }
        let mut s = self.clone();
        s.homing = Some(homing.to_vec());
        Ok(s)
    }

    pub fn with_only_nodes(&self, names: &[&str]) -> Result<Scenario, SimError> {
        for name in names {
            if !self.nodes.iter().any(|n| n.name == *name) {
                return Err(SimError::Unknown {
                    field: "nodes".into(),
                    what: "node",
                    name: (*name).to_owned(),
                });
            }
        }
        let mut s = self.clone();
        s.nodes.retain(|n| names.contains(&n.name.as_str()));
        for src in &s.sources {
            if src
                .mix
                .models()
                .any(|m| !s.nodes.iter().any(|n| n.models.contains(&m)))
            {
                return Err(SimError::invalid(
                    "nodes",
                    "left no node holding a source's model",
                ));
            }
        }
        // Per-node routing entered at a node that is gone enters anywhere.
        if let Routing::PerNode(Entry::At(_)) = s.routing {
            s.routing = Routing::PerNode(Entry::Spread);
        }
        Ok(s)
    }

    /// Users in the searched source as written in the file.
    pub fn configured_users(&self) -> Option<u32> {
        let i = self.search.source?;
        match self.sources.get(i)?.kind {
            SourceKind::ClosedLoop { users, .. } | SourceKind::AgentLoop { users, .. } => {
                Some(users)
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// The file format.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    seed: u64,
    duration_s: f64,
    #[serde(default)]
    warmup_s: f64,
    slo: RawSlo,
    #[serde(default)]
    info: RawInfo,
    models: Vec<RawModel>,
    nodes: Vec<RawNode>,
    workload: Vec<RawSource>,
    #[serde(default)]
    search: RawSearch,
    #[serde(default)]
    routing: RawRouting,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    /// "single" (default) or "per-node".
    #[serde(default)]
    mode: Option<String>,
    /// Per-node only: "spread" (default) or a node's name.
    #[serde(default)]
    entry: Option<String>,
    /// Feed the routers' prefix index (default true).
    #[serde(default)]
    prefix_index: Option<bool>,
    /// Late binding: "off" (default), "fifo", "sjf", "priorities" or
    /// "preempt".
    #[serde(default)]
    queue: Option<String>,
}

/// The name of a `queue` setting, as `parse_queue` takes it (and `pair-node
/// --queue`, but for `preempt`).
pub fn queue_name(queue: Option<LateBinding>) -> &'static str {
    use pair_scheduler::Order;
    match queue {
        None => "off",
        Some(LateBinding { preempt: true, .. }) => "preempt",
        Some(LateBinding { order, .. }) => match order {
            Order::Fifo => "fifo",
            Order::ShortestFirst => "sjf",
            Order::Priorities => "priorities",
        },
    }
}

/// A `queue` setting: `off`, `fifo`, `sjf`, `priorities` or `preempt`
/// (priorities, and interactive work cuts batch work for a slot).
pub fn parse_queue(s: &str) -> Result<Option<LateBinding>, SimError> {
    use pair_scheduler::Order;
    Ok(match s {
        "off" => None,
        "fifo" => Some(LateBinding::of(Order::Fifo)),
        "sjf" => Some(LateBinding::of(Order::ShortestFirst)),
        "priorities" => Some(LateBinding::of(Order::Priorities)),
        "preempt" => Some(LateBinding {
            order: Order::Priorities,
            preempt: true,
        }),
        _ => {
            return Err(SimError::invalid(
                "routing.queue",
                "is off, fifo, sjf, priorities or preempt",
            ));
        }
    })
}

/// `[routing]`: who routes, and where clients enter.
fn parse_routing(raw: &RawRouting, nodes: &[NodeSpec]) -> Result<Routing, SimError> {
    match raw.mode.as_deref() {
        None | Some("single") => {
            if raw.entry.is_some() {
                return Err(SimError::invalid(
                    "routing.entry",
                    "only a per-node cluster has entry nodes",
                ));
            }
            Ok(Routing::Single)
        }
        Some("per-node") => Ok(Routing::PerNode(match raw.entry.as_deref() {
            None | Some("spread") => Entry::Spread,
            Some(name) => {
                Entry::At(nodes.iter().position(|n| n.name == name).ok_or_else(|| {
                    SimError::Unknown {
                        field: "routing.entry".into(),
                        what: "node",
                        name: name.to_owned(),
                    }
                })?)
            }
        })),
        Some(other) => Err(SimError::Unknown {
            field: "routing.mode".into(),
            what: "mode (single, per-node)",
            name: other.to_owned(),
        }),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlo {
    ttft_p95_ms: f64,
    miss_ms: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInfo {
    #[serde(default = "default_telemetry_ms")]
    telemetry_interval_ms: f64,
    #[serde(default = "default_report_ms")]
    report_interval_ms: f64,
    #[serde(default = "default_delay_ms")]
    network_delay_ms: f64,
    #[serde(default = "default_stale_ms")]
    stale_after_ms: f64,
    #[serde(default = "default_rtt_ms")]
    rtt_ms: f64,
}

fn default_telemetry_ms() -> f64 {
    1_000.0
}
fn default_report_ms() -> f64 {
    500.0
}
fn default_delay_ms() -> f64 {
    2.0
}
fn default_stale_ms() -> f64 {
    10_000.0
}
fn default_rtt_ms() -> f64 {
    1.0
}

impl Default for RawInfo {
    fn default() -> Self {
        RawInfo {
            telemetry_interval_ms: default_telemetry_ms(),
            report_interval_ms: default_report_ms(),
            network_delay_ms: default_delay_ms(),
            stale_after_ms: default_stale_ms(),
            rtt_ms: default_rtt_ms(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    size_gb: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    profile: String,
    #[serde(default = "one")]
    count: u32,
    models: Vec<String>,
    /// Default: every model the node holds starts loaded.
    preloaded: Option<Vec<String>>,
    slots: Option<u16>,
    rtt_ms: Option<f64>,
    #[serde(default)]
    seed_perf: RawSeedPerf,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
enum RawSeedPerf {
    #[default]
    Profile,
    None,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    name: String,
    kind: RawKind,
    /// Model name -> weight. Default: the first model.
    #[serde(default)]
    models: BTreeMap<String, f64>,
    prompt_tokens: RawDist,
    output_tokens: RawDist,
    max_tokens: Option<u32>,
    #[serde(default = "one_f")]
    streaming: f64,
    /// "interactive" (default) or "batch" (`x-pair-priority`).
    #[serde(default)]
    priority: Option<String>,
    // poisson / bursty
    rate_per_s: Option<f64>,
    burst_rate_per_s: Option<f64>,
    burst_every_s: Option<f64>,
    burst_length_s: Option<f64>,
    // agents
    bursts_per_s: Option<f64>,
    fan_out: Option<RawDist>,
    // closed loop
    users: Option<u32>,
    think_ms: Option<RawDist>,
    turns: Option<RawDist>,
    context_limit: Option<u32>,
    // any kind
    system_tokens: Option<u32>,
    // agent loop
    tool_tokens: Option<RawDist>,
    tool_ms: Option<RawDist>,
    job_tokens: Option<u32>,
}

fn one_f() -> f64 {
    1.0
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum RawKind {
    Poisson,
    Bursty,
    Agents,
    ClosedLoop,
    AgentLoop,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct RawDist {
    dist: RawShape,
    value: Option<f64>,
    mean: Option<f64>,
    median: Option<f64>,
    sigma: Option<f64>,
    scale: Option<f64>,
    alpha: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum RawShape {
    Fixed,
    Uniform,
    Exponential,
    Lognormal,
    Pareto,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSearch {
    source: Option<String>,
    max_users: Option<u32>,
    duration_s: Option<f64>,
    warmup_s: Option<f64>,
}

// ---------------------------------------------------------------------------
// Raw -> typed.

fn micros(field: &str, v: f64) -> Result<Micros, SimError> {
    if !v.is_finite() || v < 0.0 {
        return Err(SimError::invalid(field, "must be a finite number >= 0"));
    }
    Ok((v * US_PER_S as f64).round() as Micros)
}

fn ms(field: &str, v: f64) -> Result<Micros, SimError> {
    micros(field, v / 1_000.0)
}

fn positive(field: &str, v: Option<f64>) -> Result<f64, SimError> {
    match v {
        Some(v) if v.is_finite() && v > 0.0 => Ok(v),
        Some(_) => Err(SimError::invalid(field, "must be a finite number > 0")),
        None => Err(SimError::invalid(field, "is required for this kind")),
    }
}

impl RawDist {
    fn parse(&self, field: &str) -> Result<Dist, SimError> {
        let f = |name: &str| format!("{field}.{name}");
        let need = |name: &str, v: Option<f64>| positive(&f(name), v);
        let shape = match self.dist {
            RawShape::Fixed => Shape::Fixed(
                self.value
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| SimError::invalid(f("value"), "must be a finite number >= 0"))?,
            ),
            RawShape::Uniform => {
                let lo = self.min.unwrap_or(0.0);
                let hi = need("max", self.max)?;
                if !(lo >= 0.0 && lo <= hi) {
                    return Err(SimError::invalid(f("min"), "must be >= 0 and <= max"));
                }
                Shape::Uniform { lo, hi }
            }
            RawShape::Exponential => Shape::Exponential {
                mean: need("mean", self.mean)?,
            },
            RawShape::Lognormal => Shape::LogNormal {
                mu: need("median", self.median)?.ln(),
                sigma: need("sigma", self.sigma)?,
            },
            RawShape::Pareto => Shape::Pareto {
                scale: need("scale", self.scale)?,
                alpha: need("alpha", self.alpha)?,
            },
        };
        let min = self.min.unwrap_or(0.0);
        let max = self.max.unwrap_or(f64::MAX);
        if !(min.is_finite() && min >= 0.0 && max >= min) {
            return Err(SimError::invalid(f("max"), "needs 0 <= min <= max"));
        }
        Ok(Dist { shape, min, max })
    }
}

impl RawScenario {
    /// One validator per section, in the order they depend on each other:
    /// nodes name models, a source needs a node holding its models, and the
    /// search names a source.
    fn into_scenario(self) -> Result<Scenario, SimError> {
        let (duration, warmup) = parse_root(&self.name, self.duration_s, self.warmup_s)?;
        let slo = parse_slo(&self.slo)?;
        let info = parse_info(&self.info)?;
        let models = parse_models(self.models)?;
        let nodes = parse_nodes(&self.nodes, &models, &info)?;
        let sources = parse_workload(&self.workload, &models, &nodes)?;
        let search = parse_search(&self.search, &sources, duration, warmup)?;
        let routing = parse_routing(&self.routing, &nodes)?;
        Ok(Scenario {
            name: self.name,
            description: self.description,
            seed: self.seed,
            duration,
            warmup,
            slo,
            info,
            models,
            nodes,
            sources,
            search,
            routing,
            prefix_index: self.routing.prefix_index.unwrap_or(true),
            queue: parse_queue(self.routing.queue.as_deref().unwrap_or("off"))?,
            homing: None,
        })
    }
}

/// The root table: a name, and how long the run and its warm-up last.
fn parse_root(name: &str, duration_s: f64, warmup_s: f64) -> Result<(Micros, Micros), SimError> {
    if name.trim().is_empty() {
        return Err(SimError::invalid("name", "must not be empty"));
    }
    let duration = micros("duration_s", duration_s)?;
    let warmup = micros("warmup_s", warmup_s)?;
    if duration == 0 || warmup >= duration {
        return Err(SimError::invalid(
            "warmup_s",
            "must be shorter than duration_s (and duration_s > 0)",
        ));
    }
    Ok((duration, warmup))
}

/// `[slo]`: the TTFT target, and the miss threshold (the target unless set).
fn parse_slo(raw: &RawSlo) -> Result<Slo, SimError> {
    let ttft_p95 = ms("slo.ttft_p95_ms", raw.ttft_p95_ms)?;
    if ttft_p95 == 0 {
        return Err(SimError::invalid("slo.ttft_p95_ms", "must be > 0"));
    }
    Ok(Slo {
        ttft_p95,
        ttft_miss: match raw.miss_ms {
            Some(m) => ms("slo.miss_ms", m)?,
            None => ttft_p95,
        },
    })
}

/// `[info]`: how stale the router's picture is (defaults as on a real node).
fn parse_info(raw: &RawInfo) -> Result<InfoDelays, SimError> {
    let info = InfoDelays {
        telemetry_interval: ms("info.telemetry_interval_ms", raw.telemetry_interval_ms)?,
        report_interval: ms("info.report_interval_ms", raw.report_interval_ms)?,
        network_delay: ms("info.network_delay_ms", raw.network_delay_ms)?,
        stale_after: ms("info.stale_after_ms", raw.stale_after_ms)?,
        default_rtt: ms("info.rtt_ms", raw.rtt_ms)?,
    };
    if info.telemetry_interval == 0 || info.report_interval == 0 {
        return Err(SimError::invalid(
            "info.report_interval_ms",
            "intervals must be > 0",
        ));
    }
    Ok(info)
}

/// `[[models]]`: at least one, each name once.
fn parse_models(raw: Vec<RawModel>) -> Result<Vec<ModelSpec>, SimError> {
    if raw.is_empty() {
        return Err(SimError::invalid("models", "needs at least one model"));
    }
    let mut models = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let field = format!("models[{i}]");
        let name = ModelName::new(m.name)
            .map_err(|_| SimError::invalid(format!("{field}.name"), "is not a valid model name"))?;
        if models.iter().any(|x: &ModelSpec| x.name == name) {
            return Err(SimError::invalid(
                format!("{field}.name"),
                "is listed twice",
            ));
        }
        let size_gb = positive(&format!("{field}.size_gb"), Some(m.size_gb))?;
        models.push(ModelSpec {
            name,
            size_bytes: (size_gb * 1e9).round() as u64,
        });
    }
    Ok(models)
}

/// The index in `models` of the model a section names.
fn model_index(models: &[ModelSpec], field: &str, name: &str) -> Result<usize, SimError> {
    models
        .iter()
        .position(|m| m.name.as_str() == name)
        .ok_or_else(|| SimError::Unknown {
            field: field.to_owned(),
            what: "model",
            name: name.to_owned(),
        })
}

/// `[[nodes]]`, each `count` expanded into that many nodes.
fn parse_nodes(
    raw: &[RawNode],
    models: &[ModelSpec],
    info: &InfoDelays,
) -> Result<Vec<NodeSpec>, SimError> {
    if raw.is_empty() {
        return Err(SimError::invalid("nodes", "needs at least one node"));
    }
    let mut nodes = Vec::new();
    for (i, n) in raw.iter().enumerate() {
        let field = format!("nodes[{i}]");
        if n.count == 0 || n.count > 1024 {
            return Err(SimError::invalid(
                format!("{field}.count"),
                "must be 1..=1024",
            ));
        }
        if n.models.is_empty() {
            return Err(SimError::invalid(
                format!("{field}.models"),
                "a node needs at least one model",
            ));
        }
        let held = n
            .models
            .iter()
            .map(|m| model_index(models, &format!("{field}.models"), m))
            .collect::<Result<Vec<_>, _>>()?;
        let preloaded = match &n.preloaded {
            None => held.clone(),
            Some(p) => {
                let mut v = Vec::new();
                for m in p {
                    let idx = model_index(models, &format!("{field}.preloaded"), m)?;
                    if !held.contains(&idx) {
                        return Err(SimError::invalid(
                            format!("{field}.preloaded"),
                            "names a model the node does not hold",
                        ));
                    }
                    v.push(idx);
                }
                v
            }
        };
        if n.slots == Some(0) {
            return Err(SimError::invalid(format!("{field}.slots"), "must be >= 1"));
        }
        let rtt = match n.rtt_ms {
            Some(r) => ms(&format!("{field}.rtt_ms"), r)?,
            None => info.default_rtt,
        };
        for k in 0..n.count {
            let name = if n.count == 1 {
                n.name.clone()
            } else {
                format!("{}-{}", n.name, k + 1)
            };
            if nodes.iter().any(|x: &NodeSpec| x.name == name) {
                return Err(SimError::invalid(format!("{field}.name"), "is not unique"));
            }
            nodes.push(NodeSpec {
                name,
                profile: n.profile.clone(),
                models: held.clone(),
                preloaded: preloaded.clone(),
                slots: n.slots,
                rtt,
                seed_perf: match n.seed_perf {
                    RawSeedPerf::Profile => SeedPerf::Profile,
                    RawSeedPerf::None => SeedPerf::None,
                },
            });
        }
    }
    Ok(nodes)
}

/// `[[workload]]`: the request sources, each against the models and the
/// nodes that hold them.
fn parse_workload(
    raw: &[RawSource],
    models: &[ModelSpec],
    nodes: &[NodeSpec],
) -> Result<Vec<Source>, SimError> {
    if raw.is_empty() {
        return Err(SimError::invalid("workload", "needs at least one source"));
    }
    let mut sources = Vec::with_capacity(raw.len());
    for (i, w) in raw.iter().enumerate() {
        let field = format!("workload[{i}]");
        if sources.iter().any(|x: &Source| x.name == w.name) {
            return Err(SimError::invalid(format!("{field}.name"), "is not unique"));
        }
        sources.push(parse_source(&field, w, models, nodes)?);
    }
    Ok(sources)
}

/// One `[[workload]]` entry, named `field` in errors.
fn parse_source(
    field: &str,
    w: &RawSource,
    models: &[ModelSpec],
    nodes: &[NodeSpec],
) -> Result<Source, SimError> {
    let f = |s: &str| format!("{field}.{s}");
    let mix = if w.models.is_empty() {
        ModelMix {
            cumulative: vec![(0, 1.0)],
        }
    } else {
        let total: f64 = w.models.values().sum();
        if !(total.is_finite() && total > 0.0) || w.models.values().any(|v| *v < 0.0) {
            return Err(SimError::invalid(
                f("models"),
                "weights must be >= 0 with a positive sum",
            ));
        }
        let mut acc = 0.0;
        let mut cumulative = Vec::new();
        for (name, weight) in &w.models {
            acc += weight / total;
            cumulative.push((model_index(models, &f("models"), name)?, acc));
        }
        ModelMix { cumulative }
    };
    for m in mix.models() {
        if !nodes.iter().any(|n| n.models.contains(&m)) {
            return Err(SimError::invalid(
                f("models"),
                "asks for a model no node holds",
            ));
        }
    }
    if !(0.0..=1.0).contains(&w.streaming) {
        return Err(SimError::invalid(f("streaming"), "is a fraction in 0..=1"));
    }
    if w.max_tokens == Some(0) {
        return Err(SimError::invalid(f("max_tokens"), "must be >= 1"));
    }
    let priority = match w.priority.as_deref() {
        None => pair_scheduler::Priority::Interactive,
        Some(p) => pair_scheduler::Priority::parse(p)
            .ok_or_else(|| SimError::invalid(f("priority"), "is interactive or batch"))?,
    };
    Ok(Source {
        name: w.name.clone(),
        kind: parse_source_kind(field, w)?,
        mix,
        prompt_tokens: w.prompt_tokens.parse(&f("prompt_tokens"))?,
        output_tokens: w.output_tokens.parse(&f("output_tokens"))?,
        max_tokens: w.max_tokens,
        streaming: w.streaming,
        priority,
        system_tokens: w.system_tokens.unwrap_or(0),
    })
}

/// How one `[[workload]]` entry's requests arrive: its `kind` and only the
/// fields that kind takes.
fn parse_source_kind(field: &str, w: &RawSource) -> Result<SourceKind, SimError> {
    let f = |s: &str| format!("{field}.{s}");
    let only = |allowed: &[&str]| -> Result<(), SimError> {
        let present = [
            ("rate_per_s", w.rate_per_s.is_some()),
            ("burst_rate_per_s", w.burst_rate_per_s.is_some()),
            ("burst_every_s", w.burst_every_s.is_some()),
            ("burst_length_s", w.burst_length_s.is_some()),
            ("bursts_per_s", w.bursts_per_s.is_some()),
            ("fan_out", w.fan_out.is_some()),
            ("users", w.users.is_some()),
            ("think_ms", w.think_ms.is_some()),
            ("turns", w.turns.is_some()),
            ("context_limit", w.context_limit.is_some()),
            ("tool_tokens", w.tool_tokens.is_some()),
            ("tool_ms", w.tool_ms.is_some()),
            ("job_tokens", w.job_tokens.is_some()),
        ];
        match present.iter().find(|(k, p)| *p && !allowed.contains(k)) {
            Some((k, _)) => Err(SimError::invalid(f(k), "does not apply to this kind")),
            None => Ok(()),
        }
    };
    Ok(match w.kind {
        RawKind::Poisson => {
            only(&["rate_per_s"])?;
            SourceKind::Poisson {
                rate_per_s: positive(&f("rate_per_s"), w.rate_per_s)?,
            }
        }
        RawKind::Bursty => {
            only(&[
                "rate_per_s",
                "burst_rate_per_s",
                "burst_every_s",
                "burst_length_s",
            ])?;
            SourceKind::Bursty {
                rate_per_s: positive(&f("rate_per_s"), w.rate_per_s)?,
                burst_rate_per_s: positive(&f("burst_rate_per_s"), w.burst_rate_per_s)?,
                mean_gap: micros(
                    &f("burst_every_s"),
                    positive(&f("burst_every_s"), w.burst_every_s)?,
                )?,
                mean_burst: micros(
                    &f("burst_length_s"),
                    positive(&f("burst_length_s"), w.burst_length_s)?,
                )?,
            }
        }
        RawKind::Agents => {
            only(&["bursts_per_s", "fan_out"])?;
            SourceKind::Agents {
                bursts_per_s: positive(&f("bursts_per_s"), w.bursts_per_s)?,
                fan_out: w
                    .fan_out
                    .as_ref()
                    .ok_or_else(|| SimError::invalid(f("fan_out"), "is required for agents"))?
                    .parse(&f("fan_out"))?,
            }
        }
        RawKind::ClosedLoop => {
            only(&["users", "think_ms", "turns", "context_limit"])?;
            let users = w
                .users
                .ok_or_else(|| SimError::invalid(f("users"), "is required for closed-loop"))?;
            SourceKind::ClosedLoop {
                users,
                think_ms: w
                    .think_ms
                    .as_ref()
                    .ok_or_else(|| SimError::invalid(f("think_ms"), "is required for closed-loop"))?
                    .parse(&f("think_ms"))?,
                turns: w.turns.as_ref().map(|t| t.parse(&f("turns"))).transpose()?,
                context_limit: w.context_limit.unwrap_or(8_192).max(1),
            }
        }
        RawKind::AgentLoop => {
            only(&[
                "users",
                "think_ms",
                "fan_out",
                "turns",
                "tool_tokens",
                "tool_ms",
                "job_tokens",
            ])?;
            let need = |name: &str, d: &Option<RawDist>| {
                d.as_ref()
                    .ok_or_else(|| SimError::invalid(f(name), "is required for agent-loop"))?
                    .parse(&f(name))
            };
            let users = w
                .users
                .ok_or_else(|| SimError::invalid(f("users"), "is required for agent-loop"))?;
            let fan_out = need("fan_out", &w.fan_out)?;
            let turns = need("turns", &w.turns)?;
            // A job of no sub-agents, or a sub-agent of no turns, would
            // never end; a count is drawn as at least 1, so only a cap
            // below 1 can force it.
            for (name, d) in [("fan_out", &fan_out), ("turns", &turns)] {
                if d.max < 1.0 {
                    return Err(SimError::invalid(f(name), "must allow at least 1"));
                }
            }
            SourceKind::AgentLoop {
                users,
                think_ms: need("think_ms", &w.think_ms)?,
                fan_out,
                turns,
                tool_tokens: need("tool_tokens", &w.tool_tokens)?,
                tool_ms: match &w.tool_ms {
                    Some(d) => d.parse(&f("tool_ms"))?,
                    None => Dist::fixed(0.0),
                },
                job_tokens: w.job_tokens.unwrap_or(0),
            }
        }
    })
}

/// `[search]`: which closed-loop source the users-at-SLO search varies, and
/// its probe runs (by default as long as the main run).
fn parse_search(
    raw: &RawSearch,
    sources: &[Source],
    duration: Micros,
    warmup: Micros,
) -> Result<SearchSpec, SimError> {
    let source = match &raw.source {
        Some(name) => {
            let i = sources
                .iter()
                .position(|s| &s.name == name)
                .ok_or_else(|| SimError::Unknown {
                    field: "search.source".into(),
                    what: "workload source",
                    name: name.clone(),
                })?;
            if !matches!(
                sources[i].kind,
                SourceKind::ClosedLoop { .. } | SourceKind::AgentLoop { .. }
            ) {
                return Err(SimError::invalid(
                    "search.source",
                    "must name a closed-loop or agent-loop source",
                ));
            }
            Some(i)
        }
        None => sources
            .iter()
            .position(|s| matches!(s.kind, SourceKind::ClosedLoop { .. })),
    };
    let search_duration = match raw.duration_s {
        Some(d) => micros("search.duration_s", d)?,
        None => duration,
    };
    let search_warmup = match raw.warmup_s {
        Some(d) => micros("search.warmup_s", d)?,
        None => warmup.min(search_duration / 2),
    };
    if search_duration == 0 || search_warmup >= search_duration {
        return Err(SimError::invalid(
            "search.warmup_s",
            "must be shorter than search.duration_s",
        ));
    }
    let max_users = raw.max_users.unwrap_or(1_024);
    if max_users == 0 {
        return Err(SimError::invalid("search.max_users", "must be >= 1"));
    }
    Ok(SearchSpec {
        source,
        max_users,
        duration: search_duration,
        warmup: search_warmup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
name = "t"
seed = 1
duration_s = 60
warmup_s = 5
slo = { ttft_p95_ms = 2000 }

[[models]]
name = "llama3.1:8b"
size_gb = 4.9

[[nodes]]
name = "gpu"
profile = "rtx4090"
count = 2
models = ["llama3.1:8b"]

[[workload]]
name = "chat"
kind = "closed-loop"
users = 4
think_ms = { dist = "exponential", mean = 3000 }
prompt_tokens = { dist = "lognormal", median = 300, sigma = 0.8, max = 4000 }
output_tokens = { dist = "pareto", scale = 60, alpha = 1.6, max = 1500 }
"#;

    #[test]
    fn minimal_scenario_parses_to_typed_values() {
        let s = Scenario::parse(MINIMAL).unwrap();
        assert_eq!(s.duration, 60 * US_PER_S);
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.nodes[1].name, "gpu-2");
        assert_eq!(s.nodes[0].preloaded, vec![0]);
        assert_eq!(s.search.source, Some(0));
        assert_eq!(s.configured_users(), Some(4));
        assert_eq!(s.with_users(9).configured_users(), Some(9));
        assert_eq!(s.slo.ttft_miss, 2_000 * US_PER_MS);
        assert_eq!(s.info.report_interval, 500 * US_PER_MS);
    }

    #[test]
    fn overrides_keep_the_scenario_checked() {
        let s = Scenario::parse(MINIMAL).unwrap();
        let longer = s.with_duration(120 * US_PER_S).unwrap();
        assert_eq!((longer.duration, longer.warmup), (120 * US_PER_S, s.warmup));
        assert!(matches!(
            s.with_duration(s.warmup),
            Err(SimError::Invalid { ref field, .. }) if field == "duration_s"
        ));
        let more = s.try_with_users(7).unwrap();
        assert_eq!(more.configured_users(), Some(7));
        assert_eq!(more.duration, s.duration);
        let mut open = s.clone();
        open.search.source = None;
        assert!(open.try_with_users(7).is_err());
    }

    #[test]
    fn unknown_fields_and_models_are_rejected() {
        let bad = MINIMAL.replace("count = 2", "count = 2\ncolour = \"red\"");
        assert!(matches!(Scenario::parse(&bad), Err(SimError::Toml(_))));
        let bad = MINIMAL.replace("models = [\"llama3.1:8b\"]", "models = [\"qwen\"]");
        assert!(matches!(
            Scenario::parse(&bad),
            Err(SimError::Unknown { what: "model", .. })
        ));
        let bad = MINIMAL.replace("users = 4", "users = 4\nrate_per_s = 3");
        assert!(matches!(
            Scenario::parse(&bad),
            Err(SimError::Invalid { ref field, .. }) if field == "workload[0].rate_per_s"
        ));
        let bad = MINIMAL.replace("sigma = 0.8", "sigma = -1");
        assert!(Scenario::parse(&bad).is_err());
        let bad = MINIMAL.replace("warmup_s = 5", "warmup_s = 60");
        assert!(Scenario::parse(&bad).is_err());
    }

    #[test]
    fn fan_out_and_node_overrides_stay_checked() {
        let s = Scenario::parse(MINIMAL).unwrap();
        // No agent source to set a fan-out on.
        assert!(s.with_fan_out(4).is_err());
        let one = s.with_only_nodes(&["gpu-2"]).unwrap();
        assert_eq!(one.nodes.len(), 1);
        assert_eq!(one.nodes[0].name, "gpu-2");
        assert!(matches!(
            s.with_only_nodes(&["nowhere"]),
            Err(SimError::Unknown { what: "node", .. })
        ));
        let agents = MINIMAL.replace(
            "kind = \"closed-loop\"",
            "kind = \"agent-loop\"\nsystem_tokens = 20000\nfan_out = { dist = \"uniform\", min = 1, max = 20 }\n\
             turns = { dist = \"uniform\", min = 5, max = 15 }\ntool_tokens = { dist = \"fixed\", value = 800 }",
        );
        let a = Scenario::parse(&agents).unwrap();
        assert_eq!(a.sources[0].system_tokens, 20_000);
        let ten = a.with_fan_out(10).unwrap();
        assert!(matches!(
            ten.sources[0].kind,
            SourceKind::AgentLoop { fan_out, .. } if fan_out == Dist::fixed(10.0)
        ));
        assert!(a.with_fan_out(0).is_err());
        // An agent loop's users are searched only when named.
        assert_eq!(a.configured_users(), None);
        let named = Scenario::parse(&format!("{agents}\n[search]\nsource = \"chat\"\n")).unwrap();
        assert_eq!(named.configured_users(), Some(4));
    }

    #[test]
    fn every_shipped_scenario_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                Scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
                n += 1;
            }
        }
        assert!(n >= 7, "expected the shipped scenarios, found {n}");
    }
}
