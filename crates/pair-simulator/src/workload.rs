//! Workload generators: when requests arrive and what they ask for.
//!
//! Each source, and each closed-loop user, draws from its own seeded RNG
//! stream, so the demand is the same whatever the routing policy does: two
//! policies are compared on the same requests (closed-loop users send the
//! same sequence; only its timing follows the service they get).
//!
//! Every request carries its prompt as a [`PromptChain`] of named segments
//! (a source's shared system prompt, a user's message, an answer, a tool
//! result), so engines' caches and the scheduler's prefix index see which
//! requests share a prefix. Segments, not 64-token blocks: a chain has a
//! few dozen blocks at most and costs one small allocation per request.

use std::collections::VecDeque;

use pair_core::{ChainBuilder, PromptChain, SessionKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::dist::{exponential, unit_open};
use crate::scenario::{Micros, Source, SourceKind, US_PER_MS, US_PER_S};

/// One request as the client sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    pub source: u16,
    pub model: u16,
    /// Tokens the engine must prefill (whole context for multi-turn chats),
    /// before what its cache holds.
    pub prompt_tokens: u32,
    /// The prompt as a chain of segments (what caches match on). In a
    /// conversation (multi-turn chats, agent loops) the answer's segment
    /// ends it: an engine keeps the answer's KV after generating it (a
    /// llama.cpp slot holds prompt and answer), so the next turn, which
    /// re-sends it, finds it cached. Engines never count more than the
    /// prompt as cached, so the tail past `prompt_tokens` costs nothing.
    pub prompt: PromptChain,
    /// Tokens the engine will generate.
    pub output_tokens: u32,
    /// What the router is told to expect (the client's max, or the API
    /// default when it sets none).
    pub declared_output: u32,
    pub streaming: bool,
    /// The request offers tools: an agent-loop turn.
    pub tools: bool,
    /// Its class (`x-pair-priority`), from its source.
    pub priority: pair_scheduler::Priority,
    pub session: Option<SessionKey>,
    /// The closed-loop user waiting for this answer (for an agent loop,
    /// the developer whose job it is).
    pub user: Option<u32>,
    /// The agent job (one fan-out burst of its source, or one agent-loop
    /// job) this sub-task is part of.
    pub burst: Option<u32>,
    /// The agent-loop sub-agent that sends the next turn after this answer.
    pub agent: Option<u32>,
    /// Which of its job's sub-agents that is (from 0).
    pub subagent: Option<u16>,
}

/// Mixes a seed with stream identifiers (SplitMix64 finaliser), so each
/// source and user gets an independent, reproducible stream.
pub fn stream_seed(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03).rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Segment kinds, mixed into segment ids so that a user message and an
/// answer with the same counters never name the same content.
const SEG_SYSTEM: u64 = 1;
const SEG_MESSAGE: u64 = 2;
const SEG_ANSWER: u64 = 3;
const SEG_TOOL: u64 = 4;
const SEG_JOB: u64 = 5;

/// A segment's id: unique per (source, kind, owner, counter).
fn seg(source: u16, kind: u64, owner: u64, n: u64) -> u64 {
    stream_seed(
        u64::from(source) << 8 | kind,
        owner.wrapping_add(1),
        n.wrapping_add(1),
    )
}

/// A chain builder holding the source's shared system prompt, if any.
fn with_system(source: &Source, index: u16) -> ChainBuilder {
    let mut b = ChainBuilder::new();
    if source.system_tokens > 0 {
        b.segment(seg(index, SEG_SYSTEM, 0, 0), source.system_tokens);
    }
    b
}

/// A closed-loop user's conversation state.
#[derive(Clone, Debug)]
struct User {
    rng: ChaCha8Rng,
    /// Context carried into the next turn, as segments.
    context: ChainBuilder,
    turns_left: u32,
    conversation: u64,
    /// Messages sent (names their segments).
    sent: u64,
}

/// One planned turn of an agent-loop sub-agent.
#[derive(Clone, Debug)]
pub struct PlannedTurn {
    pub demand: Demand,
    /// Prompt tokens this turn adds to the previous turn's prompt (the
    /// previous answer and the tool result; for the first turn, the task
    /// after the system prompt).
    pub new_tokens: u32,
    /// Tool time between this answer and the next turn.
    pub tool: Micros,
}

/// A sub-agent in flight: its job, its developer and its turns to come.
#[derive(Clone, Debug)]
struct SubAgent {
    dev: u32,
    turns: VecDeque<PlannedTurn>,
}

/// What follows an agent-loop answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterTurn {
    /// The sub-agent sends its next turn after this tool time.
    Next(Micros),
    /// The sub-agent is done; `job_done` names the developer when it was
    /// the job's last sub-agent.
    AgentDone { job: u32, job_done: Option<u32> },
}

/// Generator state of one source.
#[derive(Clone, Debug)]
pub struct SourceState {
    index: u16,
    rng: ChaCha8Rng,
    /// Bursty sources: in a burst, and when that flips.
    bursting: bool,
    flip_at: Micros,
    users: Vec<User>,
    /// Agent jobs started so far (their ids).
    bursts: u32,
    /// Open-loop requests made (names their segments).
    made: u64,
    /// Agent loop: sub-agents in flight (a slab), its free entries, and
    /// per developer the sub-agents of its job still running and the job.
    agents: Vec<Option<SubAgent>>,
    free_agents: Vec<u32>,
    running: Vec<(u32, u32)>,
}

impl SourceState {
    pub fn new(seed: u64, index: usize, source: &Source) -> Self {
        let index16 = u16::try_from(index).unwrap_or(u16::MAX);
        let mut rng = ChaCha8Rng::seed_from_u64(stream_seed(seed, 1 + index as u64, 0));
        let users = match source.kind {
            SourceKind::ClosedLoop { users, .. } | SourceKind::AgentLoop { users, .. } => (0
                ..users)
                .map(|u| User {
                    rng: ChaCha8Rng::seed_from_u64(stream_seed(
                        seed,
                        1 + index as u64,
                        1 + u64::from(u),
                    )),
                    context: ChainBuilder::new(),
                    turns_left: 0,
                    conversation: 0,
                    sent: 0,
                })
                .collect(),
            _ => Vec::new(),
        };
        let running = vec![(0, 0); users.len()];
        let flip_at = match source.kind {
            SourceKind::Bursty { mean_gap, .. } => exponential(&mut rng, mean_gap as f64) as Micros,
            _ => Micros::MAX,
        };
        Self {
            index: index16,
            rng,
            bursting: false,
            flip_at,
            users,
            bursts: 0,
            made: 0,
            agents: Vec::new(),
            free_agents: Vec::new(),
            running,
        }
    }

    /// For open-loop sources: the next arrival after `now` (None for
    /// closed-loop sources, whose users wake themselves).
    pub fn next_arrival(&mut self, source: &Source, now: Micros) -> Option<Micros> {
        let rate_at = |bursting: bool| match source.kind {
            SourceKind::Poisson { rate_per_s } => rate_per_s,
            SourceKind::Bursty {
                rate_per_s,
                burst_rate_per_s,
                ..
            } => {
                if bursting {
                    burst_rate_per_s
                } else {
                    rate_per_s
                }
            }
            SourceKind::Agents { bursts_per_s, .. } => bursts_per_s,
            SourceKind::ClosedLoop { .. } | SourceKind::AgentLoop { .. } => 0.0,
        };
        if matches!(
            source.kind,
            SourceKind::ClosedLoop { .. } | SourceKind::AgentLoop { .. }
        ) {
            return None;
        }
        let mut t = now;
        loop {
            let rate = rate_at(self.bursting);
            let gap = exponential(&mut self.rng, US_PER_S as f64 / rate).max(1.0) as Micros;
            let next = t.saturating_add(gap);
            if next < self.flip_at {
                return Some(next);
            }
            // The rate changes before the next arrival: memorylessness lets
            // us restart the draw at the switch with the new rate.
            t = self.flip_at;
            self.bursting = !self.bursting;
            if let SourceKind::Bursty {
                mean_gap,
                mean_burst,
                ..
            } = source.kind
            {
                let mean = if self.bursting { mean_burst } else { mean_gap };
                self.flip_at =
                    t.saturating_add(exponential(&mut self.rng, mean as f64).max(1.0) as Micros);
            }
        }
    }

    /// Requests arriving at one open-loop arrival instant (agents fan out).
    pub fn open_loop_batch(&mut self, source: &Source, out: &mut Vec<Demand>) {
        let n = match &source.kind {
            SourceKind::Agents { fan_out, .. } => fan_out.sample_count(&mut self.rng, 1),
            _ => 1,
        };
        let burst = matches!(source.kind, SourceKind::Agents { .. }).then(|| {
            self.bursts = self.bursts.wrapping_add(1);
            self.bursts
        });
        for _ in 0..n {
            let mut d = draw(&mut self.rng, source, self.index, None, None);
            self.made += 1;
            let mut chain = with_system(source, self.index);
            chain.segment(
                seg(self.index, SEG_MESSAGE, u64::MAX, self.made),
                d.prompt_tokens,
            );
            d.prompt = chain.finish();
            d.prompt_tokens = d.prompt.tokens();
            d.burst = burst;
            out.push(d);
        }
    }

    /// Closed-loop users in this source.
    pub fn users(&self) -> u32 {
        u32::try_from(self.users.len()).unwrap_or(u32::MAX)
    }

    /// A closed-loop user's first wake-up: a random phase within one think
    /// time, so users do not all start in the same microsecond.
    pub fn first_wake(&mut self, source: &Source, user: u32) -> Micros {
        match (&source.kind, self.users.get_mut(user as usize)) {
            (
                SourceKind::ClosedLoop { think_ms, .. } | SourceKind::AgentLoop { think_ms, .. },
                Some(u),
            ) => (think_ms.sample(&mut u.rng) * US_PER_MS as f64 * unit_open(&mut u.rng)) as Micros,
            _ => 0,
        }
    }

    /// The next request of a closed-loop user.
    pub fn user_request(&mut self, source: &Source, user: u32) -> Option<Demand> {
        let SourceKind::ClosedLoop {
            turns,
            context_limit,
            ..
        } = &source.kind
        else {
            return None;
        };
        let index = self.index;
        let u = self.users.get_mut(user as usize)?;
        u.sent += 1;
        let message = seg(index, SEG_MESSAGE, u64::from(user), u.sent);
        let Some(turns) = turns else {
            let mut d = draw(&mut u.rng, source, index, None, Some(user));
            let mut chain = with_system(source, index);
            chain.segment(message, d.prompt_tokens);
            d.prompt = chain.finish();
            d.prompt_tokens = d.prompt.tokens();
            return Some(d);
        };
        if u.turns_left == 0 {
            u.turns_left = turns.sample_count(&mut u.rng, 1);
            u.context = with_system(source, index);
            u.conversation += 1;
        }
        let session =
            |conversation| SessionKey(stream_seed(u64::from(index), u64::from(user), conversation));
        let mut d = draw(
            &mut u.rng,
            source,
            index,
            Some(session(u.conversation)),
            Some(user),
        );
        let fresh = d.prompt_tokens;
        if u.context.tokens().saturating_add(fresh) > *context_limit {
            // The chat outgrew its context: the client starts a new one.
            u.conversation += 1;
            u.context = with_system(source, index);
            d.session = Some(session(u.conversation));
        }
        u.context
            .segment(message, fresh.min((*context_limit).max(1)));
        d.prompt_tokens = u.context.tokens();
        u.turns_left -= 1;
        // The answer joins the context of the next turn.
        u.context.segment(
            seg(index, SEG_ANSWER, u64::from(user), u.sent),
            d.output_tokens,
        );
        d.prompt = u.context.clone().finish();
        Some(d)
    }

    /// An agent-loop developer starts a job: its sub-agents' turns are all
    /// drawn now (so the job's ideal can be priced whole), the first turn of
    /// each goes into `out`, and the plan comes back (the first turn of each
    /// sub-agent first). None for other sources.
    pub fn start_job(
        &mut self,
        source: &Source,
        dev: u32,
        out: &mut Vec<Demand>,
    ) -> Option<(u32, Vec<Vec<PlannedTurn>>)> {
        let SourceKind::AgentLoop {
            fan_out,
            turns,
            tool_tokens,
            tool_ms,
            job_tokens,
            ..
        } = &source.kind
        else {
            return None;
        };
        let index = self.index;
        let u = self.users.get_mut(dev as usize)?;
        self.bursts = self.bursts.wrapping_add(1);
        let job = self.bursts;
        let n = fan_out.sample_count(&mut u.rng, 1);
        let mut plan = Vec::with_capacity(n as usize);
        for a in 0..n {
            // Owner of this sub-agent's segments: unique per job and agent.
            let owner = stream_seed(u64::from(dev), u64::from(job), u64::from(a));
            let session = SessionKey(stream_seed(u64::from(index), owner, 0xA6E));
            let count = turns.sample_count(&mut u.rng, 1);
            let mut context = with_system(source, index);
            if *job_tokens > 0 {
                // The job's own context, the same for its sub-agents.
                context.segment(
                    seg(index, SEG_JOB, u64::from(dev), u64::from(job)),
                    *job_tokens,
                );
            }
            let mut agent = Vec::with_capacity(count as usize);
            let mut new_tokens = 0;
            for k in 0..count {
                // Every turn draws a whole request (model, lengths,
                // streaming); only the first turn's message is sent (the
                // task): a later turn's new tokens are the tool result.
                let mut d = draw(&mut u.rng, source, index, Some(session), Some(dev));
                if k == 0 {
                    // The task: the first user message after the system prompt.
                    context.segment(seg(index, SEG_MESSAGE, owner, 0), d.prompt_tokens);
                    new_tokens = d.prompt_tokens;
                }
                d.prompt_tokens = context.tokens();
                d.burst = Some(job);
                d.subagent = u16::try_from(a).ok();
                d.tools = true;
                let tool_result = tool_tokens.sample_count(&mut u.rng, 1);
                let tool = (tool_ms.sample(&mut u.rng) * US_PER_MS as f64) as Micros;
                context.segment(seg(index, SEG_ANSWER, owner, u64::from(k)), d.output_tokens);
                d.prompt = context.clone().finish();
                context.segment(seg(index, SEG_TOOL, owner, u64::from(k)), tool_result);
                agent.push(PlannedTurn {
                    demand: d,
                    new_tokens,
                    tool,
                });
                // The answer is held with the prompt: the next turn adds
                // only the tool result.
                new_tokens = tool_result;
            }
            plan.push(agent);
        }
        self.running[dev as usize] = (n, job);
        for agent in &plan {
            let slot = match self.free_agents.pop() {
                Some(k) => k,
                None => {
                    self.agents.push(None);
                    u32::try_from(self.agents.len() - 1).unwrap_or(u32::MAX)
                }
            };
            let mut turns: VecDeque<PlannedTurn> = agent.iter().cloned().collect();
            for t in &mut turns {
                t.demand.agent = Some(slot);
            }
            // The turn in flight stays at the front until it is answered.
            if let Some(first) = turns.front() {
                out.push(first.demand.clone());
            }
            if let Some(e) = self.agents.get_mut(slot as usize) {
                *e = Some(SubAgent { dev, turns });
            }
        }
        Some((job, plan))
    }

    /// An agent-loop turn of sub-agent `agent` was answered.
    pub fn turn_done(&mut self, agent: u32) -> AfterTurn {
        let Some(Some(a)) = self.agents.get_mut(agent as usize) else {
            return AfterTurn::Next(0);
        };
        // The answered turn is at the front; the next follows its tool time.
        let done = a.turns.pop_front();
        if !a.turns.is_empty() {
            return AfterTurn::Next(done.map_or(0, |t| t.tool));
        }
        let dev = a.dev;
        self.agents[agent as usize] = None;
        self.free_agents.push(agent);
        let (left, job) = &mut self.running[dev as usize];
        *left = left.saturating_sub(1);
        AfterTurn::AgentDone {
            job: *job,
            job_done: (*left == 0).then_some(dev),
        }
    }

    /// The next turn of sub-agent `agent` (after `turn_done` said `Next`).
    pub fn next_turn(&self, agent: u32) -> Option<Demand> {
        let a = self.agents.get(agent as usize)?.as_ref()?;
        a.turns.front().map(|t| t.demand.clone())
    }

    /// Think time before a closed-loop user's next request, in microseconds.
    pub fn think(&mut self, source: &Source, user: u32) -> Micros {
        match (&source.kind, self.users.get_mut(user as usize)) {
            (
                SourceKind::ClosedLoop { think_ms, .. } | SourceKind::AgentLoop { think_ms, .. },
                Some(u),
            ) => (think_ms.sample(&mut u.rng) * US_PER_MS as f64) as Micros,
            _ => 0,
        }
    }
}

/// Draws one request's model and lengths; `prompt_tokens` is the fresh
/// part (the message), and the caller builds the chain.
fn draw<R: Rng + ?Sized>(
    rng: &mut R,
    source: &Source,
    index: u16,
    session: Option<SessionKey>,
    user: Option<u32>,
) -> Demand {
    let model = u16::try_from(source.mix.pick(unit_open(rng))).unwrap_or(0);
    let fresh = source.prompt_tokens.sample_count(rng, 1);
    let mut output = source.output_tokens.sample_count(rng, 1);
    let declared = match source.max_tokens {
        Some(max) => {
            output = output.min(max);
            max
        }
        None => pair_core::RequestProfile::DEFAULT_OUTPUT_TOKENS,
    };
    let streaming = unit_open(rng) <= source.streaming;
    Demand {
        source: index,
        model,
        prompt_tokens: fresh,
        prompt: PromptChain::EMPTY,
        output_tokens: output,
        declared_output: declared,
        streaming,
        tools: false,
        priority: source.priority,
        session,
        user,
        burst: None,
        agent: None,
        subagent: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    const S: &str = r#"
name = "w"
duration_s = 100
slo = { ttft_p95_ms = 1000 }
[[models]]
name = "a"
size_gb = 1
[[models]]
name = "b"
size_gb = 2
[[nodes]]
name = "n"
profile = "rtx4090"
models = ["a", "b"]
[[workload]]
name = "p"
kind = "poisson"
rate_per_s = 10
models = { a = 3, b = 1 }
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
max_tokens = 40
[[workload]]
name = "burst"
kind = "bursty"
rate_per_s = 1
burst_rate_per_s = 50
burst_every_s = 10
burst_length_s = 2
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
[[workload]]
name = "agents"
kind = "agents"
bursts_per_s = 1
fan_out = { dist = "uniform", min = 2, max = 8 }
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
[[workload]]
name = "chat"
kind = "closed-loop"
users = 3
think_ms = { dist = "fixed", value = 1000 }
turns = { dist = "fixed", value = 3 }
context_limit = 100000
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
"#;

    #[test]
    fn poisson_rate_and_model_mix() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[0];
        let mut st = SourceState::new(1, 0, src);
        let mut t = 0;
        let mut n = 0u32;
        let mut batch = Vec::new();
        while let Some(next) = st.next_arrival(src, t) {
            if next > 1_000 * US_PER_S {
                break;
            }
            t = next;
            n += 1;
            st.open_loop_batch(src, &mut batch);
        }
        assert!((9_500..10_500).contains(&n), "n {n}");
        let a = batch.iter().filter(|d| d.model == 0).count() as f64 / batch.len() as f64;
        assert!((0.72..0.78).contains(&a), "share of a {a}");
        assert!(
            batch
                .iter()
                .all(|d| d.output_tokens == 40 && d.declared_output == 40)
        );
    }

    #[test]
    fn bursty_source_alternates_rates() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[1];
        let mut st = SourceState::new(1, 1, src);
        let mut t = 0;
        let mut n = 0u32;
        while let Some(next) = st.next_arrival(src, t) {
            if next > 1_000 * US_PER_S {
                break;
            }
            t = next;
            n += 1;
        }
        // 1/6 of the time at 50/s, 5/6 at 1/s: about 9.2/s on average.
        assert!((6_000..13_000).contains(&n), "n {n}");
    }

    #[test]
    fn agents_fan_out() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[2];
        let mut st = SourceState::new(1, 2, src);
        let mut sizes = Vec::new();
        for _ in 0..200 {
            let mut b = Vec::new();
            st.open_loop_batch(src, &mut b);
            sizes.push(b.len());
        }
        assert!(sizes.iter().all(|n| (2..=8).contains(n)));
        assert!(sizes.iter().any(|n| *n >= 6));
    }

    #[test]
    fn multi_turn_context_grows_within_a_session() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[3];
        let mut st = SourceState::new(1, 3, src);
        let turns: Vec<Demand> = (0..6).map(|_| st.user_request(src, 1).unwrap()).collect();
        let prompts: Vec<u32> = turns.iter().map(|d| d.prompt_tokens).collect();
        assert_eq!(prompts, vec![100, 250, 400, 100, 250, 400]);
        assert_eq!(turns[0].session, turns[2].session);
        assert_ne!(turns[2].session, turns[3].session);
        assert!(turns.iter().all(|d| d.user == Some(1)));
        assert_eq!(turns[0].declared_output, 256);
    }

    /// Coding agents: a 20k-token system prompt, 1-20 sub-agents of 5-15
    /// turns, tool results of 0.5-3k tokens, answers of 50-400.
    const AGENTS: &str = r#"
name = "a"
duration_s = 100
slo = { ttft_p95_ms = 1000 }
[[models]]
name = "a"
size_gb = 1
[[nodes]]
name = "n"
profile = "rtx4090"
models = ["a"]
[[workload]]
name = "code"
kind = "agent-loop"
users = 2
think_ms = { dist = "fixed", value = 1000 }
system_tokens = 20000
fan_out = { dist = "uniform", min = 1, max = 20 }
turns = { dist = "uniform", min = 5, max = 15 }
prompt_tokens = { dist = "uniform", min = 200, max = 2000 }
tool_tokens = { dist = "uniform", min = 500, max = 3000 }
tool_ms = { dist = "uniform", min = 100, max = 2000 }
output_tokens = { dist = "uniform", min = 50, max = 400 }
[[workload]]
name = "chat"
kind = "closed-loop"
users = 3
system_tokens = 1500
think_ms = { dist = "fixed", value = 1000 }
turns = { dist = "fixed", value = 3 }
prompt_tokens = { dist = "fixed", value = 100 }
output_tokens = { dist = "fixed", value = 50 }
"#;

    #[test]
    fn agent_jobs_fan_out_into_loops_that_share_the_system_prompt() {
        let s = Scenario::parse(AGENTS).unwrap();
        let src = &s.sources[0];
        let mut st = SourceState::new(4, 0, src);
        let mut fan_outs = Vec::new();
        let mut turn_counts = Vec::new();
        let mut system = None;
        for job in 0..40 {
            let mut first = Vec::new();
            let (id, plan) = st.start_job(src, job % 2, &mut first).unwrap();
            assert_eq!(first.len(), plan.len());
            assert!((1..=20).contains(&plan.len()), "{}", plan.len());
            fan_outs.push(plan.len());
            for agent in &plan {
                assert!((5..=15).contains(&agent.len()), "{}", agent.len());
                turn_counts.push(agent.len());
                // Every request starts with the same 20k-token block.
                for t in agent {
                    let head = t.demand.prompt.blocks()[0];
                    assert_eq!(head.end, 20_000);
                    assert_eq!(*system.get_or_insert(head), head);
                    assert_eq!(t.demand.burst, Some(id));
                    assert_eq!(
                        t.demand.prompt_tokens + t.demand.output_tokens,
                        t.demand.prompt.tokens()
                    );
                    assert!((50..=400).contains(&t.demand.output_tokens));
                }
                // The task follows the system prompt; each later turn
                // re-sends the whole previous prompt plus the answer and a
                // tool result of 0.5-3k tokens.
                assert!((200..=2000).contains(&agent[0].new_tokens));
                for w in agent.windows(2) {
                    let (prev, next) = (&w[0].demand, &w[1].demand);
                    assert_eq!(
                        next.prompt.common_tokens(prev.prompt.blocks()),
                        prev.prompt_tokens + prev.output_tokens
                    );
                    let tool = next.prompt_tokens - prev.prompt_tokens - prev.output_tokens;
                    assert!((500..=3000).contains(&tool), "{tool}");
                    assert_eq!(w[1].new_tokens, tool);
                    assert!((100_000..=2_000_000).contains(&w[0].tool));
                    assert_eq!(next.session, prev.session);
                }
            }
            // Sub-agents share the system prompt and nothing more.
            if let [a, b, ..] = plan.as_slice() {
                assert_eq!(first_turns_share(plan.as_slice()), Some(20_000));
                assert_ne!(a[0].demand.session, b[0].demand.session);
            }
            // Run the job's loops to their end: every turn comes out once, in
            // order, and the last sub-agent ends the job.
            let mut ended = 0;
            for (k, d) in first.iter().enumerate() {
                let agent = d.agent.unwrap();
                let mut sent = 1;
                loop {
                    match st.turn_done(agent) {
                        AfterTurn::Next(tool) => {
                            assert_eq!(tool, plan[k][sent - 1].tool);
                            assert_eq!(
                                st.next_turn(agent).unwrap().prompt,
                                plan[k][sent].demand.prompt
                            );
                            sent += 1;
                        }
                        AfterTurn::AgentDone { job, job_done } => {
                            assert_eq!(job, id);
                            ended += 1;
                            assert_eq!(job_done.is_some(), ended == plan.len());
                            break;
                        }
                    }
                }
                assert_eq!(sent, plan[k].len());
            }
        }
        assert!(fan_outs.iter().any(|n| *n <= 5) && fan_outs.iter().any(|n| *n >= 15));
        assert!(turn_counts.iter().any(|n| *n <= 6) && turn_counts.iter().any(|n| *n >= 14));
        // Other sources have no jobs.
        assert!(st.start_job(&s.sources[1], 0, &mut Vec::new()).is_none());
    }

    /// The prompt tokens the first two sub-agents' first turns share, if
    /// the job has two.
    fn first_turns_share(plan: &[Vec<PlannedTurn>]) -> Option<u32> {
        let [a, b, ..] = plan else {
            return None;
        };
        Some(
            a[0].demand
                .prompt
                .common_tokens(b[0].demand.prompt.blocks()),
        )
    }

    /// `job_tokens`: one job's sub-agents share a block after the system
    /// prompt (Claude Code's environment names the job's directory); the
    /// next job's, the same developer's or another's, do not.
    #[test]
    fn a_jobs_sub_agents_share_its_own_context_and_the_next_job_does_not() {
        let s = Scenario::parse(&AGENTS.replace(
            "system_tokens = 20000\n",
            "system_tokens = 20000\njob_tokens = 3000\n",
        ))
        .unwrap();
        let src = &s.sources[0];
        let mut st = SourceState::new(4, 0, src);
        let (mut shared, mut pairs) = (Vec::new(), 0);
        for job in 0..6 {
            let (_, plan) = st.start_job(src, job % 2, &mut Vec::new()).unwrap();
            let first = &plan[0][0].demand;
            // System prompt, then the job's block, then the task.
            assert_eq!(first.prompt.blocks()[0].end, 20_000);
            let job_block = first.prompt.blocks()[1];
            assert_eq!(job_block.end, 23_000);
            for t in plan.iter().flatten() {
                assert_eq!(t.demand.prompt.blocks()[1], job_block);
                assert!(t.demand.prompt_tokens > 23_000);
            }
            shared.push(job_block);
            // Two sub-agents of the job share the system prompt and the
            // job's block, and no more.
            if let Some(common) = first_turns_share(plan.as_slice()) {
                assert_eq!(common, 23_000);
                pairs += 1;
            }
        }
        assert!(pairs > 0);
        for (i, block) in shared.iter().enumerate() {
            assert!(
                !shared[i + 1..].contains(block),
                "every job has a block of its own"
            );
        }
        // Only agent loops take it.
        let err = Scenario::parse(&AGENTS.replace(
            "system_tokens = 1500\n",
            "system_tokens = 1500\njob_tokens = 10\n",
        ))
        .unwrap_err();
        assert!(err.to_string().contains("job_tokens"), "{err}");
    }

    #[test]
    fn chat_users_share_the_system_prompt_and_their_chains_grow() {
        let s = Scenario::parse(AGENTS).unwrap();
        let src = &s.sources[1];
        let mut st = SourceState::new(1, 1, src);
        let a: Vec<Demand> = (0..4).map(|_| st.user_request(src, 0).unwrap()).collect();
        let b = st.user_request(src, 1).unwrap();
        let tokens: Vec<u32> = a.iter().map(|d| d.prompt_tokens).collect();
        assert_eq!(tokens, vec![1600, 1750, 1900, 1600]);
        // Each turn's chain holds the previous turn's prompt and answer.
        assert_eq!(a[1].prompt.common_tokens(a[0].prompt.blocks()), 1650);
        assert_eq!(a[2].prompt.common_tokens(a[1].prompt.blocks()), 1800);
        // A new conversation and another user share only the system prompt.
        assert_eq!(a[3].prompt.common_tokens(a[2].prompt.blocks()), 1500);
        assert_eq!(b.prompt.common_tokens(a[0].prompt.blocks()), 1500);
    }

    #[test]
    fn bad_agent_loops_are_refused() {
        for (from, to, field) in [
            (
                "tool_ms = { dist = \"uniform\", min = 100, max = 2000 }\n",
                "",
                None,
            ),
            (
                "tool_tokens = { dist = \"uniform\", min = 500, max = 3000 }\n",
                "",
                Some("workload[0].tool_tokens"),
            ),
            (
                "turns = { dist = \"uniform\", min = 5, max = 15 }",
                "turns = { dist = \"fixed\", value = 0, max = 0 }",
                Some("workload[0].turns"),
            ),
            (
                "fan_out = { dist = \"uniform\", min = 1, max = 20 }",
                "",
                Some("workload[0].fan_out"),
            ),
            (
                "users = 2",
                "users = 2\nrate_per_s = 1",
                Some("workload[0].rate_per_s"),
            ),
            (
                "users = 3",
                "users = 3\ntool_ms = { dist = \"fixed\", value = 1 }",
                Some("workload[1].tool_ms"),
            ),
        ] {
            let text = AGENTS.replacen(from, to, 1);
            assert_ne!(text, AGENTS, "{from}");
            match (Scenario::parse(&text), field) {
                (Ok(_), None) => {}
                (Err(crate::SimError::Invalid { field: f, .. }), Some(want)) => assert_eq!(f, want),
                (other, want) => panic!("{from}: {:?} wanted {want:?}", other.map(|s| s.name)),
            }
        }
    }

    #[test]
    fn users_draw_independent_reproducible_streams() {
        let s = Scenario::parse(S).unwrap();
        let src = &s.sources[3];
        let mut a = SourceState::new(9, 3, src);
        let mut b = SourceState::new(9, 3, src);
        // Interleaving users differently does not change any user's stream.
        let a0 = a.think(src, 0);
        let _ = a.think(src, 1);
        let _ = b.think(src, 1);
        assert_eq!(b.think(src, 0), a0);
    }
}
