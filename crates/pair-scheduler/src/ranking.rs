//! The scheduler's answer: an ordered candidate list, each candidate with the
//! score that put it there, printable as a route receipt.

use std::fmt;

use pair_core::NodeId;
use serde::{Deserialize, Serialize};

use crate::Policy;

/// Ordered candidates for one request. Failover walks it front to back; an
/// empty ranking means no eligible node holds the model.
///
/// Reuse one value with [`crate::Scheduler::rank_into`]: once its buffers
/// have grown to the cluster's size, ranking allocates nothing.
#[derive(Clone, Default)]
pub struct Ranking {
    pub(crate) policy: Policy,
    pub(crate) candidates: Vec<Candidate>,
    /// Candidates in node-id order, before sorting.
    pub(crate) scratch: Vec<Candidate>,
    /// Packed sort keys (see [`SortKey::pack`]), sorted as plain integers.
    pub(crate) keys: Vec<u64>,
}

impl PartialEq for Ranking {
    fn eq(&self, other: &Self) -> bool {
        self.policy == other.policy && self.candidates == other.candidates
    }
}

impl fmt::Debug for Ranking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ranking")
            .field("policy", &self.policy)
            .field("candidates", &self.candidates)
            .finish()
    }
}

impl Ranking {
    pub fn new() -> Self {
        Self::default()
    }

    /// A ranking whose buffer already holds `nodes` candidates.
    pub fn with_capacity(nodes: usize) -> Self {
        Self {
            policy: Policy::default(),
            candidates: Vec::with_capacity(nodes),
            scratch: Vec::with_capacity(nodes),
            keys: Vec::with_capacity(nodes),
        }
    }

    /// The policy that produced this ranking.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    pub fn first(&self) -> Option<&Candidate> {
        self.candidates.first()
    }

    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Candidate> {
        self.candidates.iter()
    }

    /// Node ids in rank order.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = NodeId> + '_ {
        self.candidates.iter().map(|c| c.node)
    }

    /// Where `node` ranks, if it is a candidate at all.
    pub fn position(&self, node: NodeId) -> Option<usize> {
        self.candidates.iter().position(|c| c.node == node)
    }

    pub fn get(&self, node: NodeId) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.node == node)
    }
}

impl<'a> IntoIterator for &'a Ranking {
    type Item = &'a Candidate;
    type IntoIter = std::slice::Iter<'a, Candidate>;
    fn into_iter(self) -> Self::IntoIter {
        self.candidates.iter()
    }
}

/// One eligible node, why it sits where it does, and its score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub node: NodeId,
    pub reason: Reason,
    pub score: Score,
    /// Total order used to sort; the node id breaks the last ties.
    pub(crate) key: SortKey,
}

impl Candidate {
    /// What the failover core needs of it: the node, and the time to its
    /// first byte the scheduler predicts.
    pub fn target(&self) -> crate::Target {
        crate::Target {
            node: self.node,
            predicted: self
                .score
                .prediction()
                .map(|p| std::time::Duration::from_millis(u64::from(p.first_token_ms()))),
        }
    }
}

impl fmt::Display for Candidate {
    /// The route receipt: `predicted-latency: predicted ttft 412ms = ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.score)
    }
}

/// Sort order of a candidate: lower first, node id last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SortKey {
    /// 0 pinned, 1 session affinity, 2 policy order, 3 fallback.
    pub(crate) tier: u8,
    /// Within a tier: 0 normal; higher sinks (suspect, does not fit).
    pub(crate) class: u8,
    pub(crate) primary: u64,
    pub(crate) secondary: u64,
}

impl SortKey {
    pub(crate) const PINNED: u8 = 0;
    pub(crate) const AFFINITY: u8 = 1;
    pub(crate) const POLICY: u8 = 2;
    pub(crate) const FALLBACK: u8 = 3;

    /// Candidates beyond this many cannot be indexed by a packed key.
    pub(crate) const PACKED_MAX: usize = 1 << 16;
    const PRIMARY_MAX: u64 = (1 << 28) - 1;
    const SECONDARY_MAX: u64 = (1 << 16) - 1;

    /// The key with its scores saturated to the widths [`SortKey::pack`]
    /// keeps: 28 bits of primary (74 hours of predicted latency, 268 M
    /// pending jobs) and 16 of secondary. Saturation only merges absurd
    /// values, which then fall back to node-id order; it never reverses one.
    pub(crate) fn saturated(&self) -> SortKey {
        SortKey {
            tier: self.tier.min(3),
            class: self.class.min(3),
            primary: self.primary.min(Self::PRIMARY_MAX),
            secondary: self.secondary.min(Self::SECONDARY_MAX),
        }
    }

    /// The saturated key as one integer, with `index` (the candidate's place
    /// in node-id order, below [`SortKey::PACKED_MAX`]) in the low 16 bits,
    /// so that sorting the integers sorts by key, then node id.
    pub(crate) fn pack(&self, index: usize) -> u64 {
        let k = self.saturated();
        u64::from(k.tier) << 62
            | u64::from(k.class) << 60
            | k.primary << 32
            | k.secondary << 16
            | (index as u64 & Self::SECONDARY_MAX)
    }
}

/// Why a candidate holds its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "policy")]
pub enum Reason {
    /// The user asked for this node by name.
    Pinned,
    /// The session last ran here and no other node is predicted sooner by
    /// more than the tie margin.
    Affinity,
    /// Placed by the policy's order.
    Policy(Policy),
    /// Nothing is learned about the model on this idle node yet: tried
    /// ahead of the policy's pick (see `Scheduler::explore`).
    Explore,
    /// Not ordered by the policy (p2c's unsampled nodes): stable node id order.
    Fallback,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Pinned => f.write_str("pinned"),
            Reason::Affinity => f.write_str("session affinity"),
            Reason::Policy(p) => write!(f, "{p}"),
            Reason::Explore => f.write_str("exploring (nothing learned here yet)"),
            Reason::Fallback => f.write_str("fallback by node id"),
        }
    }
}

/// The numbers a policy looked at for one node. Jobs are counted as the
/// node last reported them plus this router's own reservations.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "policy")]
pub enum Score {
    RoundRobin {
        /// Requests until this node's turn comes round (0 = its turn now).
        turn: u32,
    },
    LeastPending {
        reported: u32,
        reserved: u32,
    },
    P2c {
        reported: u32,
        reserved: u32,
        /// One of the two nodes drawn for this request.
        sampled: bool,
    },
    Pair {
        reported: u32,
        reserved: u32,
        pressure: u8,
    },
    PredictedLatency(Prediction),
}

impl Score {
    /// Pending jobs including reservations, for the policies that count them.
    pub fn pending(&self) -> Option<u32> {
        match *self {
            Score::LeastPending { reported, reserved }
            | Score::P2c {
                reported, reserved, ..
            }
            | Score::Pair {
                reported, reserved, ..
            } => Some(reported.saturating_add(reserved)),
            Score::PredictedLatency(p) => Some(p.jobs_ahead),
            Score::RoundRobin { .. } => None,
        }
    }

    pub fn prediction(&self) -> Option<&Prediction> {
        match self {
            Score::PredictedLatency(p) => Some(p),
            _ => None,
        }
    }
}

impl fmt::Display for Score {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Score::RoundRobin { turn } => write!(f, "turn {turn}"),
            Score::LeastPending { reported, reserved } => write!(
                f,
                "pending {} = reported {reported} + reserved {reserved}",
                reported.saturating_add(reserved)
            ),
            Score::P2c {
                reported,
                reserved,
                sampled,
            } => write!(
                f,
                "pending {} = reported {reported} + reserved {reserved} ({})",
                reported.saturating_add(reserved),
                if sampled { "sampled" } else { "not sampled" }
            ),
            Score::Pair {
                reported,
                reserved,
                pressure,
            } => write!(
                f,
                "pending+pressure {} = reported {reported} + reserved {reserved} + pressure {pressure}",
                u64::from(reported) + u64::from(reserved) + u64::from(pressure)
            ),
            Score::PredictedLatency(p) => fmt::Display::fmt(&p, f),
        }
    }
}

/// What the client feels, and so what predicted-latency minimises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Streaming: time to the first token.
    FirstToken,
    /// Not streaming: time to the whole answer.
    WholeAnswer,
}

/// Where a node's speed figures came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateSource {
    /// The model entry's own figures (learned from finished jobs or seeded).
    Model,
    /// The node's base profile.
    Node,
    /// The node's GPU, by the rule of thumb in `prior.rs`.
    Hardware,
    /// Nothing known: [`pair_core::ModelPerf::FALLBACK`].
    Fallback,
}

impl RateSource {
    pub fn as_str(self) -> &'static str {
        match self {
            RateSource::Model => "model rates",
            RateSource::Node => "node base rates",
            RateSource::Hardware => "rates from its GPU",
            RateSource::Fallback => "fallback rates",
        }
    }
}

/// predicted-latency's breakdown for one node, in whole milliseconds.
/// `total_ms` is the sum of the parts, so a receipt always adds up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    pub metric: Metric,
    pub total_ms: u32,
    /// Waiting for a slot behind work already queued (and reserved).
    pub queue_ms: u32,
    /// Prefilling this request's prompt, sharing the engine with the
    /// requests already running.
    pub prefill_ms: u32,
    /// Prompt tokens the node is believed to hold in its KV cache, left out
    /// of `prefill_ms`.
    #[serde(default)]
    pub cached_tokens: u32,
    /// Generating the answer (0 for [`Metric::FirstToken`]).
    pub decode_ms: u32,
    /// Generating the expected answer whatever the metric: with
    /// `prefill_ms`, the request's own work ([`Prediction::work_ms`]).
    #[serde(default)]
    pub answer_ms: u32,
    /// The engine's fixed cost per request.
    pub overhead_ms: u32,
    /// Loading the model when it is not in memory.
    pub load_ms: u32,
    pub rtt_ms: u32,
    /// Jobs ahead of this request: reported pending plus reservations.
    pub jobs_ahead: u32,
    pub slots: u32,
    /// Free VRAM can hold the model (or it is loaded, or nothing is known).
    pub fits_vram: bool,
    pub suspect: bool,
    /// The engine holding the model is silent (requests overdue on it,
    /// nothing from it for seconds): it may be hung.
    #[serde(default)]
    pub silent: bool,
    pub rates: RateSource,
    /// The rates were learned from the node's jobs with this model.
    #[serde(default)]
    pub learned: bool,
}

impl Prediction {
    /// When the first token is due, streamed or not: the wait for a slot,
    /// the model's load, the prompt's prefill, the engine's overhead and
    /// the round trip.
    pub fn first_token_ms(&self) -> u32 {
        [
            self.queue_ms,
            self.load_ms,
            self.prefill_ms,
            self.overhead_ms,
            self.rtt_ms,
        ]
        .into_iter()
        .fold(0u32, u32::saturating_add)
    }

    /// The request's own work on this node, waiting aside: prefilling
    /// what is not cached and generating the expected answer. What a
    /// cluster queue orders by ([`crate::ClusterQueue`]).
    pub fn work_ms(&self) -> u32 {
        self.prefill_ms.saturating_add(self.answer_ms)
    }

    /// No slot is free for it: it would wait in the engine's own queue.
    pub fn queued(&self) -> bool {
        self.jobs_ahead >= self.slots
    }
}

impl fmt::Display for Prediction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.metric {
            Metric::FirstToken => "ttft",
            Metric::WholeAnswer => "total",
        };
        write!(
            f,
            "predicted {what} {}ms = queue {} + prefill {}",
            self.total_ms, self.queue_ms, self.prefill_ms
        )?;
        if self.cached_tokens > 0 {
            write!(f, " ({} cached)", self.cached_tokens)?;
        }
        if self.metric == Metric::WholeAnswer {
            write!(f, " + decode {}", self.decode_ms)?;
        }
        write!(
            f,
            " + overhead {} + load {} + rtt {} [{} ahead on {} slot{}; {}",
            self.overhead_ms,
            self.load_ms,
            self.rtt_ms,
            self.jobs_ahead,
            self.slots,
            if self.slots == 1 { "" } else { "s" },
            self.rates.as_str()
        )?;
        if !self.fits_vram {
            f.write_str("; does not fit in free VRAM")?;
        }
        if self.suspect {
            f.write_str("; node suspect")?;
        }
        if self.silent {
            f.write_str("; engine silent")?;
        }
        f.write_str("]")
    }
}
