//! The `Scheduler` value: a policy, its small state (round-robin cursor,
//! session affinity table) and the ranking pass itself.

use pair_core::{ClusterSnapshot, NodeId, RequestProfile, SessionKey};
use rand_core::RngCore;
use serde::{Deserialize, Serialize};

use crate::affinity::AffinityTable;
use crate::predict::predict;
use crate::ranking::{Candidate, Reason, Score, SortKey};
use crate::reservations::Reserved;
use crate::{AffinityConfig, Policy, Ranking, Reservations};

/// How a [`Scheduler`] ranks. Plain data: parse it from flags or a config
/// file once, then build the scheduler from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerConfig {
    pub policy: Policy,
    /// Session affinity (predicted-latency only); `None` turns it off.
    pub affinity: Option<AffinityConfig>,
}

impl SchedulerConfig {
    /// `policy` with the default affinity settings.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            affinity: Some(AffinityConfig::default()),
        }
    }
}

/// Ranks eligible nodes for requests. A plain value: no clock, no RNG, no
/// I/O, no interior mutability; share it behind whatever lock the embedder
/// likes, or keep one per worker.
#[derive(Clone, Debug)]
pub struct Scheduler {
    policy: Policy,
    rr_cursor: u64,
    affinity: Option<AffinityTable>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new(SchedulerConfig::new(Policy::default()))
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            policy: config.policy,
            rr_cursor: 0,
            affinity: config.affinity.map(AffinityTable::new),
        }
    }

    /// A scheduler running `policy` with default settings.
    pub fn with_policy(policy: Policy) -> Self {
        Self::new(SchedulerConfig::new(policy))
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn config(&self) -> SchedulerConfig {
        SchedulerConfig {
            policy: self.policy,
            affinity: self.affinity.as_ref().map(|t| *t.config()),
        }
    }

    /// Ranks the eligible nodes of `cluster` for `request`. Allocates the
    /// returned list; see [`Scheduler::rank_into`] to reuse one.
    pub fn rank<R: RngCore + ?Sized>(
        &mut self,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
        now_ms: u64,
        rng: &mut R,
    ) -> Ranking {
        let mut out = Ranking::with_capacity(cluster.len());
        self.rank_into(&mut out, cluster, request, reservations, now_ms, rng);
        out
    }

    /// [`Scheduler::rank`] into a caller-owned buffer: once `out` has held
    /// as many candidates as the cluster has nodes, this allocates nothing.
    ///
    /// Order: the pinned node if eligible; then the session's node if
    /// affinity keeps it; then the policy's order; then any eligible node the
    /// policy did not order, by node id. `rng` is drawn from only by `p2c`;
    /// `now_ms` only ages session affinity.
    pub fn rank_into<R: RngCore + ?Sized>(
        &mut self,
        out: &mut Ranking,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
        now_ms: u64,
        rng: &mut R,
    ) {
        out.policy = self.policy;
        out.candidates.clear();
        self.score_eligible(&mut out.candidates, cluster, request, reservations);
        let c = &mut out.candidates;
        match self.policy {
            Policy::RoundRobin => self.order_round_robin(c),
            Policy::P2c => order_p2c(c, rng),
            Policy::LeastPending | Policy::Pair => {}
            Policy::PredictedLatency => self.apply_affinity(c, request, now_ms),
        }
        if let Some(pinned) = request.pinned
            && let Some(cand) = c.iter_mut().find(|x| x.node == pinned)
        {
            cand.key.tier = SortKey::PINNED;
            cand.reason = Reason::Pinned;
        }
        c.sort_unstable_by(|a, b| (a.key, a.node).cmp(&(b.key, b.node)));
    }

    /// Remembers that `session` is served by `node` (call it when a request
    /// of the session commits to a node). No-op without affinity.
    pub fn bind_session(&mut self, session: SessionKey, node: NodeId, now_ms: u64) {
        if let Some(t) = &mut self.affinity {
            t.bind(session, node, now_ms);
        }
    }

    /// Forgets a session's node; returns whether it was known.
    pub fn forget_session(&mut self, session: SessionKey) -> bool {
        self.affinity.as_mut().is_some_and(|t| t.forget(session))
    }

    /// Sessions currently remembered.
    pub fn sessions(&self) -> usize {
        self.affinity.as_ref().map_or(0, AffinityTable::len)
    }

    /// The node `session` is bound to, if any and not expired.
    pub fn session_node(&self, session: SessionKey, now_ms: u64) -> Option<NodeId> {
        self.affinity.as_ref().and_then(|t| t.get(session, now_ms))
    }

    /// One pass over the (id-sorted) snapshot, walking the (id-sorted)
    /// reservations beside it: eligibility, then the policy's score and key.
    fn score_eligible(
        &self,
        out: &mut Vec<Candidate>,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        reservations: &Reservations,
    ) {
        let reserved_lists = reservations.sorted();
        let mut r = 0;
        for node in cluster.nodes() {
            if !node.liveness.is_routable() {
                continue;
            }
            let Some((_, entry)) = node.find_model(&request.model, request.flavor) else {
                continue;
            };
            while r < reserved_lists.len() && reserved_lists[r].node < node.id {
                r += 1;
            }
            let reserved = match reserved_lists.get(r) {
                Some(list) if list.node == node.id => list.uncovered(node.reported_at_ms),
                _ => Reserved::default(),
            };
            let reported = node.workload.pending();
            let policy_key = |primary: u64, secondary: u64| SortKey {
                tier: SortKey::POLICY,
                class: 0,
                primary,
                secondary,
            };
            let pending = u64::from(reported) + u64::from(reserved.jobs);
            let (score, key) = match self.policy {
                Policy::RoundRobin => (Score::RoundRobin { turn: 0 }, policy_key(0, 0)),
                Policy::LeastPending => (
                    Score::LeastPending {
                        reported,
                        reserved: reserved.jobs,
                    },
                    policy_key(pending, 0),
                ),
                Policy::P2c => (
                    Score::P2c {
                        reported,
                        reserved: reserved.jobs,
                        sampled: false,
                    },
                    SortKey {
                        tier: SortKey::FALLBACK,
                        ..SortKey::default()
                    },
                ),
                Policy::Pair => {
                    let pressure = node.pressure.band();
                    (
                        Score::Pair {
                            reported,
                            reserved: reserved.jobs,
                            pressure,
                        },
                        policy_key(pending + u64::from(pressure), u64::from(pressure)),
                    )
                }
                Policy::PredictedLatency => {
                    let p = predict(node, entry, request, reserved);
                    let key = SortKey {
                        tier: SortKey::POLICY,
                        // Suspect nodes after live ones; within each, nodes
                        // the model cannot fit into after those it can.
                        class: u8::from(p.suspect) * 2 + u8::from(!p.fits_vram),
                        primary: u64::from(p.total_ms),
                        secondary: u64::from(p.jobs_ahead),
                    };
                    (Score::PredictedLatency(p), key)
                }
            };
            let reason = if key.tier == SortKey::FALLBACK {
                Reason::Fallback
            } else {
                Reason::Policy(self.policy)
            };
            out.push(Candidate {
                node: node.id,
                reason,
                score,
                key,
            });
        }
    }

    /// Rotates the id-ordered candidates by the cursor, which moves one
    /// step per ranking.
    fn order_round_robin(&mut self, c: &mut [Candidate]) {
        let n = c.len() as u64;
        if n > 0 {
            let start = self.rr_cursor % n;
            for (i, cand) in c.iter_mut().enumerate() {
                let turn = (i as u64 + n - start) % n;
                cand.key.primary = turn;
                cand.score = Score::RoundRobin {
                    turn: u32::try_from(turn).unwrap_or(u32::MAX),
                };
            }
        }
        self.rr_cursor = self.rr_cursor.wrapping_add(1);
    }

    /// Keeps the session on its node unless the policy's best other node is
    /// predicted markedly sooner (both bars of [`AffinityConfig`]), or the
    /// session's node sank (suspect, model does not fit).
    fn apply_affinity(&self, c: &mut [Candidate], request: &RequestProfile, now_ms: u64) {
        let (Some(table), Some(session)) = (&self.affinity, request.session) else {
            return;
        };
        let Some(home) = table.get(session, now_ms) else {
            return;
        };
        if request.pinned == Some(home) {
            return;
        }
        let Some(h) = c.iter().position(|x| x.node == home) else {
            return;
        };
        let best_other = c
            .iter()
            .enumerate()
            .filter(|(i, x)| *i != h && Some(x.node) != request.pinned)
            .map(|(_, x)| (x.key, x.node))
            .min();
        let home_key = c[h].key;
        let stay = match best_other {
            None => true,
            Some((other, _)) if other.class != home_key.class => home_key.class < other.class,
            Some((other, _)) => !table.config().should_move(
                u32::try_from(home_key.primary).unwrap_or(u32::MAX),
                u32::try_from(other.primary).unwrap_or(u32::MAX),
            ),
        };
        if stay {
            c[h].key.tier = SortKey::AFFINITY;
            c[h].reason = Reason::Affinity;
        }
    }
}

/// Power of two choices (as linkerd's `gen_pair`): two distinct indices
/// drawn uniformly; the one with fewer pending jobs first, then the other.
fn order_p2c<R: RngCore + ?Sized>(c: &mut [Candidate], rng: &mut R) {
    let n = c.len();
    let (a, b) = match n {
        0 => return,
        1 => (0, None),
        _ => {
            let a = index_below(rng, n);
            let mut b = index_below(rng, n - 1);
            if b >= a {
                b += 1;
            }
            (a, Some(b))
        }
    };
    let pending = |x: &Candidate| x.score.pending().unwrap_or(0);
    let (win, lose) = match b {
        Some(b) if (pending(&c[b]), c[b].node) < (pending(&c[a]), c[a].node) => (b, Some(a)),
        Some(b) => (a, Some(b)),
        None => (a, None),
    };
    for (i, rank) in [(Some(win), 0), (lose, 1)] {
        if let Some(i) = i {
            let cand = &mut c[i];
            cand.key = SortKey {
                tier: SortKey::POLICY,
                class: 0,
                primary: rank,
                secondary: 0,
            };
            cand.reason = Reason::Policy(Policy::P2c);
            if let Score::P2c { sampled, .. } = &mut cand.score {
                *sampled = true;
            }
        }
    }
}

/// A uniform index in `0..n` (n > 0) by Lemire's multiply-shift; the bias is
/// below n / 2^64, far under anything a scheduler could notice.
fn index_below<R: RngCore + ?Sized>(rng: &mut R, n: usize) -> usize {
    let wide = u128::from(rng.next_u64()) * n as u128;
    usize::try_from(wide >> 64).unwrap_or(0)
}
