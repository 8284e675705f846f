//! What one node knows about the cluster at an instant: per-node engines,
//! models, pending work, GPUs, pressure, learned speed, liveness and RTT.
//!
//! Snapshots are plain values, built by the node's async shell from
//! discovery, telemetry, engine inventories and peers' workload reports, then
//! published behind an `Arc` and read lock-free by the request path.

use serde::{Deserialize, Serialize};

use crate::{ApiFlavor, EngineKind, ModelName, NodeId, SessionKey};

/// GPU pressure band, 0 (idle) to 3 (saturated), as PAIR defines it:
/// EWMA utilisation with bands at 40/70/85 % and hysteresis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub struct Pressure(u8);

impl Pressure {
    pub const IDLE: Pressure = Pressure(0);
    /// What stale, invalid or missing telemetry counts as (PAIR's rule).
    pub const UNKNOWN: Pressure = Pressure(1);
    pub const MAX: Pressure = Pressure(3);

    pub fn new(band: u8) -> Option<Pressure> {
        (band <= 3).then_some(Pressure(band))
    }
    pub fn band(self) -> u8 {
        self.0
    }
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure::UNKNOWN
    }
}

impl TryFrom<u8> for Pressure {
    type Error = String;
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        Pressure::new(v).ok_or_else(|| format!("pressure band {v} is outside 0..=3"))
    }
}

impl From<Pressure> for u8 {
    fn from(p: Pressure) -> u8 {
        p.0
    }
}

/// Whether a node can be routed to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    #[default]
    Alive,
    /// Missed announcements or a failed exchange; being probed. Still
    /// routable (a slow network is not a dead node) but ranked last.
    Suspect,
    /// Evicted: never routed to.
    Dead,
}

impl Liveness {
    pub fn is_routable(self) -> bool {
        !matches!(self, Liveness::Dead)
    }
}

/// Speed of one model on one node: learned from finished jobs, or seeded from
/// a hardware profile until the first jobs finish.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelPerf {
    /// Prompt tokens processed per second.
    #[serde(deserialize_with = "finite_rate")]
    pub prefill_tps: f32,
    /// Tokens generated per second by one stream decoding alone.
    #[serde(deserialize_with = "finite_rate")]
    pub decode_tps: f32,
    /// Time to load the model when it is not in memory, in milliseconds.
    pub load_ms: u32,
    /// Fixed cost per request (scheduling, template, first kernel launch).
    pub overhead_ms: u32,
    /// `k` streams decoding together produce `k^batch_exponent` times one
    /// stream's tokens: learned from the engine's own requests (0: streams
    /// take turns; 1: batching is free). `None`: not learned; the
    /// scheduler assumes a GPU's typical 0.7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_exponent: Option<f32>,
}

/// A rate a peer reports: finite and not negative (a number past `f32`'s
/// range would decode as infinity, which JSON cannot carry back).
fn finite_rate<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
    let v = f32::deserialize(d)?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(serde::de::Error::custom(format!(
            "a rate must be a finite, non-negative number of tokens per second, not {v}"
        )))
    }
}

impl ModelPerf {
    /// A conservative figure for a node that has told us nothing: a
    /// mid-range consumer GPU on an 8B model (see engine-figures.md).
    pub const FALLBACK: ModelPerf = ModelPerf {
        prefill_tps: 1_000.0,
        decode_tps: 40.0,
        load_ms: 3_000,
        overhead_ms: 30,
        batch_exponent: None,
    };
}

/// One model an engine holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub name: ModelName,
    /// Size on disk (roughly its memory footprint when loaded), if known.
    pub size_bytes: Option<u64>,
    /// Loaded in memory right now (`/api/ps`, LM Studio loaded state).
    pub loaded: bool,
    /// Learned or seeded speed for this model on this node.
    pub perf: Option<ModelPerf>,
    /// `perf` was learned from this node's finished jobs (not a seed): a
    /// node nothing was learned about yet is worth trying when idle.
    #[serde(default)]
    pub learned: bool,
}

/// One engine on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineSnapshot {
    pub kind: EngineKind,
    /// Answered its last health check.
    pub healthy: bool,
    /// Requests are overdue on it and it has sent nothing for seconds,
    /// health checks answered or not: it may be hung. Routing sends new
    /// work to other owners first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub silent: bool,
    /// Whether it continues a chat's final assistant message (rather than
    /// closing it and starting a new turn), as its probe found: `None`
    /// until one did ([`EngineSnapshot::can_continue_chat`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues_chat: Option<bool>,
    /// Requests it runs at once (Ollama's OLLAMA_NUM_PARALLEL, llama.cpp
    /// `-np`); at least 1.
    pub slots: u16,
    pub models: Vec<ModelEntry>,
}

impl EngineSnapshot {
    /// Whether a cut chat's continuation (the text so far as a final
    /// assistant message) may be sent to it: as its probe found (llama.cpp's
    /// server and vLLM do; llama-cpp-python's server starts a new turn),
    /// else by its kind (Ollama does; LM Studio is not known to).
    pub fn can_continue_chat(&self) -> bool {
        self.continues_chat
            .unwrap_or(self.kind == EngineKind::Ollama)
    }

    /// Whether this engine's `entry` is a better copy of a model than
    /// `other`'s `theirs`: an engine that is not silent first, then a
    /// loaded copy; the first found among equals.
    pub fn preferred_over(
        &self,
        entry: &ModelEntry,
        other: &EngineSnapshot,
        theirs: &ModelEntry,
    ) -> bool {
        (!self.silent, entry.loaded) > (!other.silent, theirs.loaded)
    }

    /// The entry that serves `requested` for `flavor`, if this engine is
    /// healthy, speaks the flavor and holds the model.
    pub fn find(&self, requested: &str, flavor: ApiFlavor) -> Option<&ModelEntry> {
        if !self.healthy || !self.kind.serves(flavor) {
            return None;
        }
        self.models
            .iter()
            .find(|m| m.name.matches(requested, self.kind))
    }
}

/// One GPU device on a node (PAIR reports only the busiest; we keep all).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    /// Instantaneous utilisation, percent.
    pub utilisation_pct: u8,
    pub vram_used_bytes: u64,
    pub vram_total_bytes: u64,
}

impl GpuDevice {
    pub fn vram_free_bytes(&self) -> u64 {
        self.vram_total_bytes.saturating_sub(self.vram_used_bytes)
    }
}

/// Work a node has accepted and not finished: jobs and estimated tokens.
///
/// PAIR counts jobs only; tokens let a 3-token request weigh less than a
/// 3,000-token one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    /// Requests holding an engine slot.
    pub running: u32,
    /// Requests waiting for a slot.
    pub queued: u32,
    /// Prompt tokens not yet prefilled (queued and running requests).
    pub prefill_tokens: u64,
    /// Output tokens not yet generated (queued and running requests).
    pub decode_tokens: u64,
}

impl Workload {
    /// PAIR's `pending`: queued plus running.
    pub fn pending(&self) -> u32 {
        self.running.saturating_add(self.queued)
    }
}

/// Everything known about one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSnapshot {
    pub id: NodeId,
    /// Human name (hostname or configured); display only, never identity.
    pub name: String,
    pub liveness: Liveness,
    /// Round-trip time from the node taking this snapshot, in microseconds
    /// (0 for itself).
    pub rtt_us: u32,
    pub engines: Vec<EngineSnapshot>,
    pub gpus: Vec<GpuDevice>,
    pub pressure: Pressure,
    pub workload: Workload,
    /// When the workload report was made, ms since the epoch (the
    /// scheduler's reservations older than this are covered by it).
    pub reported_at_ms: u64,
    /// Seed speed for models without learned figures on this node.
    pub base_perf: Option<ModelPerf>,
    /// Differs each time the node's process starts (0: not known), so
    /// peers can tell a restart from a pause.
    #[serde(default)]
    pub boot: u64,
    /// A digest of the clients this node paired and vouches for to its
    /// peers (0: none); peers fetch the list again when it changes.
    #[serde(default)]
    pub vouches: u64,
    /// A digest of the API key records this node holds (0: none); a peer
    /// whose own differs reads them and merges.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub keys: u64,
    /// Where this node recently sent conversations that entered at it,
    /// newest first, so every node can follow a conversation to the node
    /// that holds its prompt cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bindings: Vec<Binding>,
    /// The model aliases configured on this node; they hold cluster-wide
    /// ([`ClusterSnapshot::alias_for`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<crate::ModelAlias>,
    /// The prompts this node recently sent to a node, oldest first, so
    /// every router learns what each engine's prompt cache holds (a chain
    /// that extends an earlier one on the wire carries only its new
    /// blocks: [`crate::prompt::routed_wire`]).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::prompt::routed_wire"
    )]
    pub routed: Vec<crate::Routed>,
    /// Per router that relayed requests here (a peer, an edge client):
    /// the newest of its reservations this node has counted in
    /// `workload`. A router's reservation is covered by the report that
    /// says so, whatever the clocks say (a report made as the request was
    /// still on its way does not count it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admitted: Vec<Admitted>,
}

/// Which of one router's reservations a node has counted in its workload
/// ([`NodeSnapshot::admitted`]). A router numbers its reservations on each
/// node from 0; requests may arrive out of order (each on its own
/// connection), so the node keeps the newest number and which of the
/// [`Admitted::WINDOW`] before it came.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admitted {
    /// The router.
    pub from: NodeId,
    /// The router's process (drawn at its start): its reservations are
    /// numbered anew when it restarts.
    pub boot: u64,
    /// The newest of its reservations counted here.
    pub seq: u64,
    /// Bit `i`: reservation `seq - 1 - i` was counted too.
    #[serde(default)]
    pub window: u64,
    /// Of the newest and the [`Admitted::ENDS`] - 1 before it, those
    /// counted whose answers have ended here since (bit `d`: reservation
    /// `seq - d`): the workload read after this no longer counts them.
    /// `None` from a node that does not say, where the router falls back
    /// on when the report was made against when the answer ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<u64>,
}

impl Admitted {
    /// Routers a node keeps this for, the most recent.
    pub const MAX: usize = 64;
    /// Reservations before the newest whose arrival is kept; an older one
    /// has arrived, or failed and been released, by the time 64 newer ones
    /// to the same node were made.
    pub const WINDOW: u64 = 64;
    /// Reservations, the newest among them, whose end is kept.
    pub const ENDS: u64 = 64;

    /// The first reservation of a router's process counted.
    pub fn first(from: NodeId, boot: u64, seq: u64) -> Self {
        Self {
            from,
            boot,
            seq,
            window: 0,
            ended: Some(0),
        }
    }

    /// Reservation `seq` is counted now.
    pub fn admit(&mut self, seq: u64) {
        if seq > self.seq {
            let shift = seq - self.seq;
            self.window = if shift > Self::WINDOW {
                0
            } else {
                // The old newest becomes bit `shift - 1`.
                (self.window << (shift - 1) << 1) | (1 << (shift - 1))
            };
            if let Some(e) = self.ended.as_mut() {
                *e = if shift >= Self::ENDS { 0 } else { *e << shift };
            }
            self.seq = seq;
        } else if seq < self.seq && self.seq - seq <= Self::WINDOW {
            self.window |= 1 << (self.seq - seq - 1);
        }
    }

    /// Reservation `seq`, counted, has ended: the workload no longer
    /// counts it (call it after the workload dropped it).
    pub fn end(&mut self, seq: u64) {
        if let (Some(e), Some(d)) = (self.ended.as_mut(), self.seq.checked_sub(seq))
            && d < Self::ENDS
        {
            *e |= 1 << d;
        }
    }

    /// Whether reservation `seq`, counted, has ended here: `None` where
    /// this does not say (a node that does not track ends, or one older
    /// than the [`Admitted::ENDS`] newest).
    pub fn ended(&self, seq: u64) -> Option<bool> {
        let e = self.ended?;
        match self.seq.checked_sub(seq) {
            None => Some(false),
            Some(d) if d < Self::ENDS => Some(e >> d & 1 == 1),
            Some(_) => None,
        }
    }

    /// Whether reservation `seq` is counted (or too old to be on its way).
    pub fn counts(&self, seq: u64) -> bool {
        match self.seq.checked_sub(seq) {
            None => false,
            Some(0) => true,
            Some(d) if d > Self::WINDOW => true,
            Some(d) => self.window >> (d - 1) & 1 == 1,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A conversation's latest turn went to `node` at `at_ms` (ms since the
/// epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Binding {
    pub session: SessionKey,
    pub node: NodeId,
    pub at_ms: u64,
}

impl NodeSnapshot {
    /// A live, empty node; builders fill in the rest.
    pub fn new(id: NodeId, name: impl Into<String>) -> Self {
        Self {
            id,
            name: name.into(),
            liveness: Liveness::Alive,
            rtt_us: 0,
            engines: Vec::new(),
            gpus: Vec::new(),
            pressure: Pressure::UNKNOWN,
            workload: Workload::default(),
            reported_at_ms: 0,
            base_perf: None,
            boot: 0,
            vouches: 0,
            keys: 0,
            bindings: Vec::new(),
            aliases: Vec::new(),
            routed: Vec::new(),
            admitted: Vec::new(),
        }
    }

    /// The engine and model entry that would serve `requested`, preferring a
    /// loaded copy when several engines hold it.
    pub fn find_model(
        &self,
        requested: &str,
        flavor: ApiFlavor,
    ) -> Option<(&EngineSnapshot, &ModelEntry)> {
        let mut best: Option<(&EngineSnapshot, &ModelEntry)> = None;
        for engine in &self.engines {
            if let Some(entry) = engine.find(requested, flavor)
                && best.is_none_or(|(e, b)| engine.preferred_over(entry, e, b))
            {
                best = Some((engine, entry));
            }
        }
        best
    }

    /// Whether the engine that serves `model` here can continue an answer
    /// cut elsewhere: every engine continues a raw prompt, a chat's final
    /// assistant message only where [`EngineSnapshot::can_continue_chat`].
    pub fn continues(&self, model: &str, flavor: ApiFlavor, chat: bool) -> bool {
        self.find_model(model, flavor)
            .is_some_and(|(e, _)| !chat || e.can_continue_chat())
    }

    /// Routable and holding the model: PAIR's eligibility rule.
    pub fn is_eligible(&self, requested: &str, flavor: ApiFlavor) -> bool {
        self.liveness.is_routable() && self.find_model(requested, flavor).is_some()
    }

    /// Free VRAM summed over devices; `None` on a node without GPUs.
    pub fn vram_free_bytes(&self) -> Option<u64> {
        // Saturating: a peer's report can claim anything.
        (!self.gpus.is_empty()).then(|| {
            self.gpus
                .iter()
                .map(GpuDevice::vram_free_bytes)
                .fold(0u64, u64::saturating_add)
        })
    }

    /// Total parallel slots over healthy engines, at least 1.
    pub fn slots(&self) -> u32 {
        self.engines
            .iter()
            .filter(|e| e.healthy)
            .map(|e| u32::from(e.slots.max(1)))
            .sum::<u32>()
            .max(1)
    }
}

/// The whole cluster as seen by one node, sorted by [`NodeId`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterSnapshot {
    /// Increases with every publication; lets consumers skip unchanged ones.
    pub generation: u64,
    /// When it was assembled, ms since the epoch.
    pub taken_at_ms: u64,
    nodes: Vec<NodeSnapshot>,
}

impl ClusterSnapshot {
    /// Builds a snapshot; nodes are sorted by id and duplicates (same id)
    /// keep the last one given.
    pub fn new(generation: u64, taken_at_ms: u64, mut nodes: Vec<NodeSnapshot>) -> Self {
        nodes.reverse();
        nodes.sort_by_key(|n| n.id);
        nodes.dedup_by_key(|n| n.id);
        Self {
            generation,
            taken_at_ms,
            nodes,
        }
    }

    pub fn nodes(&self) -> &[NodeSnapshot] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeSnapshot> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Index of a node in [`Self::nodes`], for per-node side tables.
    pub fn index_of(&self, id: NodeId) -> Option<usize> {
        self.nodes.binary_search_by_key(&id, |n| n.id).ok()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether any node lists a model of this name, on any engine, routable
    /// or not.
    pub fn holds(&self, requested: &str) -> bool {
        self.nodes
            .iter()
            .flat_map(|n| &n.engines)
            .any(|e| e.models.iter().any(|m| m.name.matches(requested, e.kind)))
    }

    /// The alias a request for `requested` takes: none while any node
    /// holds a model of that name; else `own`'s aliases first, then the
    /// other nodes' in id order, an exact name before a pattern within
    /// each node's list.
    pub fn alias_for(&self, requested: &str, own: NodeId) -> Option<&crate::ModelAlias> {
        if self.nodes.iter().all(|n| n.aliases.is_empty()) || self.holds(requested) {
            return None;
        }
        let own_first = self
            .node(own)
            .into_iter()
            .chain(self.nodes.iter().filter(|n| n.id != own));
        own_first
            .filter_map(|n| crate::alias::find(&n.aliases, requested))
            .next()
    }

    /// The names of the models the cluster holds, sorted, each once.
    pub fn model_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .nodes
            .iter()
            .flat_map(|n| &n.engines)
            .flat_map(|e| e.models.iter().map(|m| m.name.as_str().to_owned()))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// However a router's reservations to a node arrive (any order,
        /// some never), a reservation counts exactly when it arrived, or
        /// when it is older than the window behind the newest that did.
        #[test]
        fn admitted_counts_what_arrived_in_any_order(
            order in proptest::sample::subsequence((0u64..150).collect::<Vec<_>>(), 1..150)
                .prop_shuffle(),
        ) {
            let mut a = Admitted::first(NodeId::from_u128(1), 7, order[0]);
            let mut arrived = std::collections::BTreeSet::from([order[0]]);
            for &seq in &order[1..] {
                a.admit(seq);
                arrived.insert(seq);
                let newest = *arrived.iter().next_back().unwrap();
                prop_assert_eq!(a.seq, newest);
                for s in 0..160u64 {
                    let want = arrived.contains(&s) || (s < newest && newest - s > Admitted::WINDOW);
                    prop_assert_eq!(a.counts(s), want, "seq {} after {:?}", s, arrived);
                }
            }
        }
    }

    proptest! {
        /// However a router's reservations arrive and end, one counted
        /// among the newest [`Admitted::ENDS`] is said to have ended exactly
        /// when it did; older ones, and a node that does not say, are
        /// unknown.
        #[test]
        fn ended_says_which_counted_answers_ended(
            order in proptest::sample::subsequence((0u64..150).collect::<Vec<_>>(), 1..150)
                .prop_shuffle(),
            ends in proptest::collection::vec(any::<bool>(), 150),
        ) {
            let mut a = Admitted::first(NodeId::from_u128(1), 7, order[0]);
            let mut ended = std::collections::BTreeSet::new();
            for (i, &seq) in order.iter().enumerate() {
                if i > 0 {
                    a.admit(seq);
                }
                // An answer marked in `ends` ends right after it arrives.
                if ends[seq as usize] {
                    a.end(seq);
                    ended.insert(seq);
                }
                for s in 0..=a.seq {
                    if a.seq - s < Admitted::ENDS && a.counts(s) {
                        prop_assert_eq!(a.ended(s), Some(ended.contains(&s)), "seq {}", s);
                    } else if a.seq - s >= Admitted::ENDS {
                        prop_assert_eq!(a.ended(s), None);
                    }
                }
            }
            a.ended = None;
            prop_assert_eq!(a.ended(a.seq), None);
        }
    }

    /// A node from before `ended` sends none: it reads as "not said", and
    /// a node that tracks ends sends them.
    #[test]
    fn ended_is_optional_on_the_wire() {
        let old = r#"{"from":"00000000-0000-0000-0000-000000000001","boot":7,"seq":3,"window":1}"#;
        let a: Admitted = serde_json::from_str(old).unwrap();
        assert_eq!((a.ended, a.ended(3)), (None, None));
        assert!(!serde_json::to_string(&a).unwrap().contains("ended"));
        let mut b = Admitted::first(NodeId::from_u128(1), 7, 3);
        b.end(3);
        let back: Admitted = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
        assert_eq!(back, b);
        assert_eq!(back.ended(3), Some(true));
    }

    #[test]
    fn a_reported_rate_must_be_finite_and_not_negative() {
        let perf = |p: &str| {
            serde_json::from_str::<ModelPerf>(&format!(
                r#"{{"prefill_tps":{p},"decode_tps":40.0,"load_ms":1,"overhead_ms":1}}"#
            ))
        };
        assert!(perf("1000.0").is_ok());
        for bad in ["1e39", "-1.0"] {
            let e = perf(bad).unwrap_err().to_string();
            assert!(e.contains("finite, non-negative"), "{bad}: {e}");
        }
    }

    fn node(id: u128, models: &[(&str, bool)], kind: EngineKind) -> NodeSnapshot {
        let mut n = NodeSnapshot::new(NodeId::from_u128(id), format!("n{id}"));
        n.engines.push(EngineSnapshot {
            kind,
            healthy: true,
            silent: false,
            continues_chat: None,
            slots: 1,
            models: models
                .iter()
                .map(|(name, loaded)| ModelEntry {
                    name: ModelName::new(*name).unwrap(),
                    size_bytes: None,
                    loaded: *loaded,
                    perf: None,
                    learned: false,
                })
                .collect(),
        });
        n
    }

    #[test]
    fn aliases_hold_cluster_wide_with_this_nodes_own_first() {
        let mut a = node(1, &[("qwen2.5:7b", true)], EngineKind::Ollama);
        let mut b = node(2, &[("llama3.2:3b", true)], EngineKind::OpenAiCompat);
        a.aliases = vec!["claude-*=qwen2.5:7b".parse().unwrap()];
        b.aliases = vec![
            "claude-*=llama3.2:3b".parse().unwrap(),
            "gpt-5=llama3.2:3b".parse().unwrap(),
        ];
        let s = ClusterSnapshot::new(1, 0, vec![a, b]);
        let (one, two) = (NodeId::from_u128(1), NodeId::from_u128(2));
        let target = |m: &str, own| s.alias_for(m, own).map(|a| a.target.as_str().to_owned());
        assert_eq!(
            target("claude-sonnet-4-5", one).as_deref(),
            Some("qwen2.5:7b")
        );
        assert_eq!(
            target("claude-sonnet-4-5", two).as_deref(),
            Some("llama3.2:3b")
        );
        // Another node's alias holds here too.
        assert_eq!(target("gpt-5", one).as_deref(), Some("llama3.2:3b"));
        // A name a node holds is never aliased.
        assert_eq!(target("qwen2.5:7b", two), None);
        assert_eq!(target("unknown", one), None);
        assert_eq!(s.model_names(), ["llama3.2:3b", "qwen2.5:7b"]);
    }

    #[test]
    fn snapshot_sorts_and_dedups_keeping_the_last() {
        let mut a = node(2, &[], EngineKind::Ollama);
        let b = node(1, &[], EngineKind::Ollama);
        let first = a.clone();
        a.name = "newer".into();
        let s = ClusterSnapshot::new(1, 0, vec![first, b, a]);
        assert_eq!(s.len(), 2);
        assert_eq!(s.nodes()[0].id, NodeId::from_u128(1));
        assert_eq!(s.node(NodeId::from_u128(2)).unwrap().name, "newer");
        assert_eq!(s.index_of(NodeId::from_u128(2)), Some(1));
        assert!(s.node(NodeId::from_u128(3)).is_none());
    }

    #[test]
    fn eligibility_needs_liveness_flavour_health_and_model() {
        let mut n = node(1, &[("llama3", false)], EngineKind::Ollama);
        assert!(n.is_eligible("llama3:latest", ApiFlavor::Ollama));
        assert!(n.is_eligible("llama3", ApiFlavor::OpenAi));
        assert!(!n.is_eligible("qwen", ApiFlavor::Ollama));
        n.liveness = Liveness::Suspect;
        assert!(n.is_eligible("llama3", ApiFlavor::Ollama));
        n.liveness = Liveness::Dead;
        assert!(!n.is_eligible("llama3", ApiFlavor::Ollama));
        n.liveness = Liveness::Alive;
        n.engines[0].healthy = false;
        assert!(!n.is_eligible("llama3", ApiFlavor::Ollama));

        let o = node(2, &[("smollm2", true)], EngineKind::OpenAiCompat);
        assert!(o.is_eligible("smollm2", ApiFlavor::OpenAi));
        // Whatever API the client speaks: the node translates.
        assert!(o.is_eligible("smollm2", ApiFlavor::Ollama));
        assert!(o.is_eligible("smollm2", ApiFlavor::Anthropic));
    }

    #[test]
    fn find_model_prefers_a_loaded_copy() {
        let mut n = node(1, &[("m", false)], EngineKind::Ollama);
        let mut second = n.engines[0].clone();
        second.kind = EngineKind::LmStudio;
        second.models[0].loaded = true;
        n.engines.push(second);
        let (engine, entry) = n.find_model("m", ApiFlavor::OpenAi).unwrap();
        assert_eq!(engine.kind, EngineKind::LmStudio);
        assert!(entry.loaded);
        // An engine that is not silent before a loaded copy.
        n.engines[1].silent = true;
        let (engine, entry) = n.find_model("m", ApiFlavor::OpenAi).unwrap();
        assert_eq!(engine.kind, EngineKind::Ollama);
        assert!(!entry.loaded);
    }

    #[test]
    fn pressure_is_bounded() {
        assert!(Pressure::new(4).is_none());
        assert!(serde_json::from_str::<Pressure>("7").is_err());
        assert_eq!(serde_json::from_str::<Pressure>("2").unwrap().band(), 2);
    }
}
