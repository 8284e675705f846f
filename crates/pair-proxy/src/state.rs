//! The node's shared routing state: the published cluster snapshot (read
//! lock-free on every request), the scheduler with its reservations, the
//! hops (local engines, peer links), and the job log and metrics.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use pair_core::{
    ApiFlavor, ClusterSnapshot, JobRecord, NodeId, PromptChain, RequestProfile, SessionKey,
};
use pair_scheduler::predict::predict;
use pair_scheduler::{
    AnswerKey, Candidate, Policy, Ranking, ReservationId, Reservations, Reserved, Scheduler,
    SchedulerConfig,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use smallvec::SmallVec;

use crate::dispatch::LocalEngine;
use crate::gate::FaceGate;
use crate::metrics::Metrics;
use pair_cluster::{Bindings, LocalLoad, Peers};
use pair_http::Timeouts;
use pair_http::client::{HttpStack, LocalPool};
use pair_http::conns::{ClientDeadlines, ConnLimit};
use pair_jobs::JobLog;
use pair_link::PeerLink;
use pair_runtime::per_loop::{PerLoop, PerLoopArc};
use pair_runtime::runtime::EventLoops;

/// Request bodies above this are refused with 413 (PAIR's cap), and bodies
/// up to it are kept whole so a failed attempt can be replayed.
pub const DEFAULT_BODY_CAP: usize = 32 * 1024 * 1024;
/// Dispatches per request, including the one that answers (the failover
/// core's cap).
pub const MAX_ATTEMPTS: usize = pair_scheduler::MAX_DISPATCHES;

/// Static facts about this node, fixed at start-up.
#[derive(Clone, Debug)]
pub struct NodeIdentity {
    pub id: NodeId,
    pub name: String,
}

/// One event loop's copy of the scheduler: ranking a request reads and
/// writes only its loop's copy (its working buffers, its random numbers,
/// the live workload it is given), where one shared copy under one lock
/// cost a request 0.65 us more on two loops than on one (bench
/// `bookkeeping`, part `rank`). A change of what ranking reads (a
/// reservation, its release, a session's binding, a new snapshot) is made
/// to every copy, in one order ([`ProxyState::each_sched`]).
#[derive(Debug)]
struct Sched {
    scheduler: Scheduler,
    reservations: Reservations,
    rng: SmallRng,
    /// The ranking's working buffers, grown once and reused by every
    /// request (a request keeps only its [`Shortlist`]).
    ranking: Ranking,
}

/// The best candidates for one request, in order: at most
/// [`MAX_ATTEMPTS`] (all a request may try), held inline, so ranking
/// allocates nothing per request.
pub type Shortlist = SmallVec<[Candidate; MAX_ATTEMPTS]>;

/// Everything the faces and the relay share.
#[derive(Debug)]
pub struct ProxyState {
    pub node: NodeIdentity,
    /// This node's `x-pair-node` receipt value, made once.
    /// One per event loop (see [`LocalEngine::copy_for_loop`]).
    receipt_self: PerLoop<Option<http::HeaderValue>>,
    pub timeouts: Timeouts,
    /// How a stream cut after its first byte is continued elsewhere.
    pub resume: ResumePolicy,
    pub body_cap: usize,
    /// Which `Host` and `Origin` values the faces accept.
    pub gate: FaceGate,
    /// The cap on open connections (faces and cluster port).
    pub conns: Arc<ConnLimit>,
    /// How long a face's client may take.
    pub deadlines: ClientDeadlines,
    /// Body bytes the faces hold across connections while they arrive.
    pub body_budget: Arc<pair_http::conns::BodyBudget>,
    /// Which HTTP/1.1 implementation the faces use.
    pub http_stack: HttpStack,
    /// One engine connection pool per event loop (index:
    /// [`pair_runtime::runtime::current`]).
    local_pools: Vec<Arc<LocalPool>>,
    pub loops: Arc<EventLoops>,
    cluster: PerLoopArc<ClusterSnapshot>,
    /// Each loop's copies share no buffer ([`LocalEngine::copy_for_loop`]).
    engines: PerLoopArc<Vec<Arc<LocalEngine>>>,
    /// The mTLS links to peers (the cluster plane keeps them current).
    peers: Arc<Peers>,
    sched: PerLoop<Mutex<Sched>>,
    /// Held while a change is made to every loop's [`Sched`], so the copies
    /// see changes in the same order (a reservation gets the same id in
    /// each).
    sched_writes: Mutex<()>,
    /// Held from a request's ranking to its node's counting it (a
    /// reservation, or this node's load): requests the event loops take at
    /// the same instant are ranked one after the other, each seeing the
    /// ones before it (`ProxyState::dispatch_turn`).
    turn: Mutex<()>,
    /// This process, as the peers it relays to name it in their reports
    /// (drawn at start): with each reservation's sequence number it says
    /// which reservation a relayed request is.
    pub(crate) origin_epoch: u64,
    policy: Policy,
    pub load: Arc<LocalLoad>,
    bindings: Arc<Bindings>,
    /// What this node knows of where prompts went: see [`RoutedSeen`].
    routed_seen: Mutex<RoutedSeen>,
    pub jobs: Arc<JobLog>,
    pub metrics: Arc<Metrics>,
    /// Requests waiting for a slot (late binding).
    pub waitroom: crate::waiting::WaitRoom,
    /// Peers that refused a request for want of a free slot, each with the
    /// report of it this node had then: full until a newer one comes.
    refused: Mutex<Vec<(NodeId, u64)>>,
    /// Answer lengths learned per model and client shape, one table for
    /// every loop (a lock a request to read, one an answer to learn).
    answers: Mutex<pair_scheduler::AnswerLengths>,
    /// When the node started, or came back from a pause (a snapshot after
    /// a long gap: a stopped process, a suspended machine): until
    /// [`WARM_UP`] after it, the node may not yet know its own engine's
    /// models nor its peers'. And when the last snapshot came.
    warm: Mutex<(std::time::Instant, std::time::Instant)>,
}

/// Where prompts went, as far as this node's prefix index has taken it in.
#[derive(Debug, Default)]
struct RoutedSeen {
    /// Per peer, its boot and the last routed prompt applied from its
    /// reports.
    peers: HashMap<NodeId, (u64, u64)>,
    /// Per node, when this node last sent it a prompt: a peer's report of
    /// an older one is no news (the engine has taken this node's since),
    /// and applied late it would push the newer one out of a slot.
    own: HashMap<NodeId, u64>,
}

/// How long after start a request for a model no node is known to serve
/// waits for the first engine polls and peer reports instead of failing
/// at once.
pub const WARM_UP: std::time::Duration = std::time::Duration::from_secs(5);
/// A gap this long between two snapshots means the node was stopped.
const PAUSED_AFTER: std::time::Duration = std::time::Duration::from_secs(3);

/// How streams cut after their first byte are continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResumePolicy {
    /// Moves per answer at most; 0: none (`--resume off`). A batch answer
    /// that preemption may cut has `MAX_CUTS` more (`preempt::moves_allowed`).
    pub limit: u8,
}

impl ResumePolicy {
    pub const OFF: ResumePolicy = ResumePolicy { limit: 0 };

    pub fn on(self) -> bool {
        self.limit > 0
    }
}

impl Default for ResumePolicy {
    fn default() -> Self {
        Self { limit: 2 }
    }
}

/// How to build a [`ProxyState`].
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    pub node: NodeIdentity,
    pub scheduler: SchedulerConfig,
    pub timeouts: Timeouts,
    /// How a stream cut after its first byte is continued elsewhere.
    pub resume: ResumePolicy,
    pub body_cap: usize,
    pub engines: Vec<LocalEngine>,
    /// Where connections are served ([`EventLoops::single`]: the caller's runtime).
    pub loops: Arc<EventLoops>,
    /// Which `Host` and `Origin` values the faces accept.
    pub gate: FaceGate,
    /// Open connections the faces and the cluster port hold in all.
    pub max_connections: usize,
    /// How long a face's client may take.
    pub deadlines: ClientDeadlines,
    /// Body bytes the faces hold across connections while they arrive.
    pub body_budget: usize,
    /// Which HTTP/1.1 implementation the faces and the engine client use.
    pub http_stack: HttpStack,
    /// The links to peers, kept current by the cluster plane.
    pub peers: Arc<Peers>,
    /// This node's own workload, which its reports carry.
    pub load: Arc<LocalLoad>,
    /// Where conversations that entered here were sent, which its reports
    /// carry.
    pub bindings: Arc<Bindings>,
    /// Late binding: requests wait at this node, in this order, while every
    /// node that could take them is full, and whether interactive work
    /// cuts batch work (`None`: committed at once).
    pub queue: Option<crate::waiting::Queue>,
}

impl crate::preempt::Release for ProxyState {
    fn release(&self, id: ReservationId) {
        ProxyState::release(self, id);
    }
}

impl ProxyState {
    /// Time left of the node's [`WARM_UP`] (zero once over).
    pub fn warming_up(&self) -> std::time::Duration {
        self.warm.lock().map_or(std::time::Duration::ZERO, |w| {
            WARM_UP.saturating_sub(w.0.elapsed())
        })
    }

    pub fn new(config: ProxyConfig, jobs: Arc<JobLog>) -> Arc<Self> {
        let origin_epoch = rand::random::<u64>();
        let node_id = config.node.id;
        Arc::new(Self {
            origin_epoch,
            warm: Mutex::new((std::time::Instant::now(), std::time::Instant::now())),
            receipt_self: PerLoop::new_with(|| node_receipt(&config.node.name, config.node.id)),
            local_pools: (0..config.loops.len())
                .map(|_| LocalPool::with_stack(config.timeouts, config.http_stack))
                .collect(),
            loops: config.loops,
            cluster: PerLoopArc::new(ClusterSnapshot::default()),
            engines: PerLoopArc::new_each(|| copies_for_loop(&config.engines)),
            peers: config.peers,
            policy: config.scheduler.policy,
            sched: PerLoop::new_with(|| {
                Mutex::new(Sched {
                    scheduler: Scheduler::new(config.scheduler),
                    reservations: {
                        let mut r = Reservations::new();
                        r.set_origin(node_id, origin_epoch);
                        r
                    },
                    rng: SmallRng::from_os_rng(),
                    ranking: Ranking::new(),
                })
            }),
            sched_writes: Mutex::new(()),
            turn: Mutex::new(()),
            node: config.node,
            timeouts: config.timeouts,
            resume: config.resume,
            body_cap: config.body_cap,
            gate: config.gate,
            conns: ConnLimit::new(config.max_connections),
            deadlines: config.deadlines,
            body_budget: pair_http::conns::BodyBudget::new(config.body_budget),
            http_stack: config.http_stack,
            load: config.load,
            bindings: config.bindings,
            routed_seen: Mutex::default(),
            jobs,
            metrics: Arc::new(Metrics::new()),
            waitroom: crate::waiting::WaitRoom::new(config.queue),
            refused: Mutex::default(),
            answers: Mutex::default(),
        })
    }

    /// The engine connection pool of the event loop this runs on: its
    /// connections live on this thread.
    pub(crate) fn local_pool(&self) -> &LocalPool {
        let i = pair_runtime::runtime::current();
        &self.local_pools[i % self.local_pools.len()]
    }

    /// Closes engine connections idle past the pools' timeout, on every
    /// loop (the daemon calls it every [`pair_http::client::SWEEP_EVERY`]).
    pub fn sweep_engine_connections(&self) {
        for p in &self.local_pools {
            p.sweep();
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The current snapshot: this event loop's copy (an `Arc` clone: no
    /// lock, no copy, no count another loop writes).
    pub fn cluster(&self) -> Arc<ClusterSnapshot> {
        self.cluster.load_full()
    }

    /// Publishes a new snapshot; reservations it covers are dropped.
    pub fn publish(&self, snapshot: ClusterSnapshot) {
        if let Ok(mut w) = self.warm.lock() {
            let at = std::time::Instant::now();
            if at.duration_since(w.1) > PAUSED_AFTER {
                // Everything this node knew went stale while it was
                // stopped: warm up again.
                w.0 = at;
            }
            w.1 = at;
        }
        let now = now_ms();
        if let Some(me) = snapshot.node(self.node.id) {
            self.metrics.pressure.set(i64::from(me.pressure.band()));
        }
        self.each_sched(|s| {
            s.reservations.sync(&snapshot);
            s.reservations.expire(now);
        });
        self.learn_routed(&snapshot, now);
        self.metrics
            .peers
            .set(i64::try_from(snapshot.len().saturating_sub(1)).unwrap_or(i64::MAX));
        self.cluster.store(snapshot);
        // Peers' slots may have freed.
        self.waitroom.wake();
    }

    /// This node's engines: the running loop's copies.
    pub fn engines(&self) -> Arc<Vec<Arc<LocalEngine>>> {
        self.engines.load_full()
    }

    pub fn set_engines(&self, engines: Vec<LocalEngine>) {
        self.engines.store_each(|| copies_for_loop(&engines));
    }

    /// This node's `x-pair-node` receipt value, the running loop's copy.
    pub(crate) fn receipt_self(&self) -> Option<http::HeaderValue> {
        self.receipt_self.local().clone()
    }

    pub fn peer(&self, id: NodeId) -> Option<PeerLink> {
        self.peers.get(id)
    }

    pub fn peer_links(&self) -> Arc<HashMap<NodeId, PeerLink>> {
        self.peers.links()
    }

    /// A request's turn to be ranked and counted on the node it goes to:
    /// held from [`ProxyState::rank`] until its reservation or load is
    /// taken (nothing is awaited in between; a plain lock, held for a
    /// ranking's microsecond), so that requests arriving at once on
    /// different event loops spread as the ranking says instead of each
    /// picking the node the others just picked.
    pub fn dispatch_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.turn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ranks `request` over `cluster`, with this node's own workload read
    /// live: the snapshot's copy of it is up to one gossip interval old, and
    /// a request that has just finished here must not still weigh on it.
    /// `now`: the request's arrival (unix ms), for session affinity.
    pub fn rank(&self, cluster: &ClusterSnapshot, request: &RequestProfile, now: u64) -> Shortlist {
        let mut top = Shortlist::new();
        let live = cluster
            .node(self.node.id)
            .map(|me| (me.id, self.load.workload(me.slots())));
        if let Ok(s) = self.sched.local().lock().as_deref_mut() {
            let Sched {
                scheduler,
                reservations,
                rng,
                ranking,
            } = s;
            reservations.set_live(live);
            scheduler.rank_into(ranking, cluster, request, reservations, now, rng);
            top.extend(ranking.iter().take(MAX_ATTEMPTS).copied());
        }
        top
    }

    /// Sets `request`'s predicted answer length from what this node
    /// learned of its model and client shape.
    pub fn expect_answer(&self, request: &mut RequestProfile) {
        if let Ok(a) = self.answers.lock() {
            request.expected_output_tokens = Some(a.expect(request).mean);
        }
    }

    /// Learns that an answer to a request of `key` generated `tokens`.
    pub fn note_answer(&self, key: AnswerKey, tokens: u32) {
        if let Ok(mut a) = self.answers.lock() {
            a.learn(key, tokens);
        }
    }

    /// What `request` would feel if this node's engine took it now, from
    /// this node's live workload (`None` where this node does not list
    /// the model).
    pub fn local_prediction(
        &self,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        flavor: ApiFlavor,
    ) -> Option<pair_scheduler::Prediction> {
        let me = cluster.node(self.node.id)?;
        let (_, entry) = me.find_model(&request.model, flavor)?;
        let workload = self.load.workload(me.slots());
        Some(predict(
            me,
            &workload,
            entry,
            request,
            Reserved::default(),
            0,
        ))
    }

    /// Whether this node's engine takes a relayed request its sender held
    /// at the cluster (sent as work of `priority`): into a free slot, read
    /// live in the dispatch turn so two requests do not both see the last
    /// one free, or, for interactive work with preemption, into the slot a
    /// batch answer it runs gives up ([`crate::preempt::Legs::cut_on`]).
    ///
    /// `None` where it does not; else the slot it cut free, held until the
    /// request is counted (no other request relayed here, nor a
    /// continuation of this node's, is let into it first).
    pub(crate) fn takes_held(
        &self,
        request: &RequestProfile,
        flavor: ApiFlavor,
        priority: Option<pair_core::Priority>,
    ) -> Option<Option<pair_cluster::SlotHold>> {
        let predicted = {
            let _turn = self.dispatch_turn();
            self.local_prediction(&self.cluster(), request, flavor)
        };
        let Some(p) = predicted.filter(|p| p.slots > 0 && p.queued()) else {
            return Some(None);
        };
        let cut = priority == Some(pair_core::Priority::Interactive)
            && self.waitroom.preempts()
            && self.waitroom.legs.cut_on(self.node.id, p.queue_ms);
        // The hold is in this node's live workload: its own waiting
        // requests see the slot taken too.
        cut.then(|| Some(self.load.hold()))
    }

    /// Whether every slot of this node's engine for `request`'s model is
    /// taken now, for a caller that holds the dispatch turn.
    pub(crate) fn slots_full_in_turn(
        &self,
        cluster: &ClusterSnapshot,
        request: &RequestProfile,
        flavor: ApiFlavor,
    ) -> bool {
        self.local_prediction(cluster, request, flavor)
            .is_some_and(|p| p.slots > 0 && p.queued())
    }

    /// `node` refused a request for want of a free slot: it counts as full
    /// until a report of it newer than `cluster`'s.
    pub(crate) fn refused_for_slots(&self, cluster: &ClusterSnapshot, node: NodeId) {
        let Some(reported) = cluster.node(node).map(|n| n.reported_at_ms) else {
            return;
        };
        if let Ok(mut r) = self.refused.lock() {
            r.retain(|&(n, _)| n != node);
            r.push((node, reported));
        }
    }

    /// Whether `node` refused a request for want of a slot since its last
    /// report in `cluster`.
    pub(crate) fn refused_since_report(&self, cluster: &ClusterSnapshot, node: NodeId) -> bool {
        let Some(reported) = cluster.node(node).map(|n| n.reported_at_ms) else {
            return false;
        };
        self.refused
            .lock()
            .is_ok_and(|r| r.iter().any(|&(n, at)| n == node && at == reported))
    }

    /// Shows the candidates that refused for want of a slot since their
    /// last report in `cluster` as full (every slot with a job).
    pub(crate) fn full_where_refused(&self, cluster: &ClusterSnapshot, top: &mut Shortlist) {
        let Ok(mut refused) = self.refused.lock() else {
            return;
        };
        refused.retain(|&(n, at)| cluster.node(n).is_some_and(|s| s.reported_at_ms == at));
        if refused.is_empty() {
            return;
        }
        for c in top.iter_mut() {
            if refused.iter().any(|&(n, _)| n == c.node)
                && let pair_scheduler::Score::PredictedLatency(p) = &mut c.score
            {
                p.jobs_ahead = p.jobs_ahead.max(p.slots);
            }
        }
    }

    /// Counts `request` on `node` from `sent_ms` (unix ms, when it is
    /// dispatched), until the guard drops.
    pub fn reserve(&self, node: NodeId, request: &RequestProfile, sent_ms: u64) -> Reservation<'_> {
        let mut id = None;
        self.each_sched(|s| {
            let this = s.reservations.reserve(node, request, sent_ms);
            debug_assert!(id.is_none_or(|id| id == this), "copies out of step");
            id = Some(this);
        });
        Reservation { state: self, id }
    }

    /// Releases a reservation taken out of its guard ([`Reservation::keep`]).
    pub fn release(&self, id: ReservationId) {
        let now = now_ms();
        self.each_sched(|s| {
            s.reservations.release(id, now);
        });
    }

    /// Remembers which node a session's request committed to.
    pub fn bind_session(&self, session: Option<SessionKey>, node: NodeId) {
        // The locks only for a request that has a session.
        if let Some(session) = session {
            let now = now_ms();
            self.each_sched(|s| s.scheduler.bind_session(session, node, now));
            self.bindings.bind(session, node, now);
        }
    }

    /// Remembers that a request whose prompt is `prefix` committed to
    /// `node`: its engine now holds that prompt, and the next request that
    /// shares a prefix with it is priced with that prefix cached there.
    pub fn note_routed(&self, cluster: &ClusterSnapshot, node: NodeId, prefix: &PromptChain) {
        if prefix.is_empty() {
            return;
        }
        let now = now_ms();
        self.each_sched(|s| s.scheduler.note_routed(cluster, node, prefix, now));
        self.bindings.route(node, prefix, now);
        if let Ok(mut seen) = self.routed_seen.lock() {
            seen.own.insert(node, now);
        }
    }

    /// Applies the prompts peers report having routed, each once (by its
    /// reporter's boot and sequence number): every router's prefix index
    /// learns what each engine holds, whichever node sent it there.
    fn learn_routed(&self, snapshot: &ClusterSnapshot, now: u64) {
        let Ok(mut guard) = self.routed_seen.lock() else {
            return;
        };
        let RoutedSeen { peers, own } = &mut *guard;
        let mut news: Vec<&pair_core::Routed> = Vec::new();
        for peer in snapshot.nodes().iter().filter(|n| n.id != self.node.id) {
            let last = peers.entry(peer.id).or_insert((peer.boot, 0));
            if last.0 != peer.boot {
                *last = (peer.boot, 0);
            }
            let fresh: Vec<&pair_core::Routed> =
                peer.routed.iter().filter(|r| r.seq > last.1).collect();
            last.1 = fresh.iter().map(|r| r.seq).fold(last.1, u64::max);
            news.extend(
                fresh
                    .into_iter()
                    .filter(|r| own.get(&r.node).is_none_or(|&at| r.at_ms > at)),
            );
        }
        drop(guard);
        if news.is_empty() {
            return;
        }
        // Every loop's copy in one pass. Each prompt is held, and done as
        // far as this node will hear: the engine's report on it goes to the
        // peer that routed it, so its slot is not left looking busy here.
        self.each_sched(|s| {
            for r in &news {
                s.scheduler.note_routed(snapshot, r.node, &r.prefix, now);
                s.scheduler
                    .note_cached(r.node, &r.prefix, r.prefix.tokens(), now);
            }
        });
    }

    /// Corrects what `node` is believed to hold of `prefix` by what its
    /// engine said it found cached (`cached_tokens`, in the chain's
    /// tokens).
    pub fn note_cached(&self, node: NodeId, prefix: &PromptChain, cached_tokens: u32) {
        if prefix.is_empty() {
            return;
        }
        let now = now_ms();
        self.each_sched(|s| s.scheduler.note_cached(node, prefix, cached_tokens, now));
    }

    /// Makes a change to every loop's copy of the scheduler, in one order.
    fn each_sched(&self, mut change: impl FnMut(&mut Sched)) {
        // It guards no data: a panic while it was held left nothing torn.
        let _writing = self
            .sched_writes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for copy in self.sched.iter() {
            if let Ok(mut s) = copy.lock() {
                change(&mut s);
            }
        }
    }

    /// Records a job this node routed (the cluster plane learns the
    /// serving node's speed from the log, off the request path).
    pub fn finish_job(&self, rec: JobRecord) {
        self.jobs.record(rec);
    }
}

fn copies_for_loop(engines: &[LocalEngine]) -> Vec<Arc<LocalEngine>> {
    engines.iter().map(LocalEngine::copy_for_loop).collect()
}

/// The `x-pair-node` receipt value: `name (uuid)`.
pub(crate) fn node_receipt(name: &str, id: NodeId) -> Option<http::HeaderValue> {
    http::HeaderValue::from_str(&format!("{name} ({id})")).ok()
}

/// A scheduler reservation, released when dropped.
#[derive(Debug)]
pub struct Reservation<'a> {
    state: &'a ProxyState,
    id: Option<ReservationId>,
}

impl Reservation<'_> {
    /// The reservation, while this guard holds it.
    pub fn id(&self) -> Option<ReservationId> {
        self.id
    }

    /// Takes the reservation out of this guard, for a holder that outlives
    /// the borrow (an answer's body) and calls [`ProxyState::release`]
    /// itself: no reference count on the shared state per request.
    pub fn keep(mut self) -> Option<ReservationId> {
        self.id.take()
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.state.release(id);
        }
    }
}

pub fn now_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}

/// The wall clock, in Unix milliseconds, at `at` (an instant just taken):
/// the wall clock is read once a second per thread and `at` placed
/// against that reading, so a request stamps its job with the instant it
/// already took instead of reading a second clock. Within a millisecond
/// of [`now_ms`] (the monotonic clock does not drift from the wall clock
/// by that much in a second); a wall clock that is set shows within a
/// second.
pub fn unix_ms_at(at: tokio::time::Instant) -> u64 {
    use std::cell::Cell;
    thread_local! {
        static READ: Cell<Option<(tokio::time::Instant, u64)>> = const { Cell::new(None) };
    }
    READ.with(|read| {
        if let Some((base, ms)) = read.get()
            && let Some(since) = at.checked_duration_since(base)
            && since < Duration::from_secs(1)
        {
            return ms + since.as_millis() as u64;
        }
        let ms = now_ms();
        read.set(Some((at, ms)));
        ms
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A job's wall-clock stamp placed from its instant agrees with the
    /// wall clock, and instants later in the same second are placed by
    /// how much later they are.
    #[test]
    fn stamps_from_instants_follow_the_wall_clock() {
        let before = now_ms();
        let at = tokio::time::Instant::now();
        let stamp = unix_ms_at(at);
        let after = now_ms();
        // (Within the millisecond a placed stamp may lose to truncation.)
        assert!(
            (before - 1..=after).contains(&stamp),
            "{before} <= {stamp} <= {after}"
        );
        // The same reading places an instant 400 ms on at 400 ms on.
        let later = unix_ms_at(at + Duration::from_millis(400));
        assert!(
            (399..=401).contains(&(later - stamp)),
            "{stamp} then {later}"
        );
        // Past a second from the reading, the wall clock is read again.
        let fresh = unix_ms_at(at + Duration::from_secs(5));
        assert!(
            fresh >= after && fresh <= now_ms(),
            "{fresh} is not a fresh reading"
        );
    }

    /// Node 1 ("t"), predicted-latency with affinity, no engines.
    pub(crate) fn state(loops: Arc<EventLoops>, jobs: Arc<JobLog>) -> Arc<ProxyState> {
        ProxyState::new(
            ProxyConfig {
                node: NodeIdentity {
                    id: NodeId::from_u128(1),
                    name: "t".into(),
                },
                scheduler: SchedulerConfig::new(Policy::PredictedLatency),
                timeouts: Timeouts::default(),
                resume: ResumePolicy::default(),
                body_cap: 1024,
                engines: Vec::new(),
                loops,
                gate: crate::gate::FaceGate::default(),
                max_connections: 1024,
                deadlines: ClientDeadlines::default(),
                body_budget: 64 << 20,
                http_stack: HttpStack::default(),
                peers: Peers::new(),
                load: LocalLoad::new(),
                bindings: Arc::default(),
                queue: None,
            },
            jobs,
        )
    }

    /// Every loop's copy of the scheduler holds exactly what every loop
    /// did: reservations made on both loops at once, released from the
    /// other loop (so their ids must agree in every copy), and a session's
    /// binding.
    #[tokio::test]
    async fn every_loops_scheduler_sees_every_change() {
        let loops = EventLoops::start(2).unwrap();
        let st = state(Arc::clone(&loops), Arc::new(JobLog::in_memory()));
        let peer = NodeId::from_u128(2);
        let copies = |st: &ProxyState| -> Vec<(usize, u32, Option<NodeId>)> {
            st.sched
                .iter()
                .map(|c| {
                    let s = c.lock().unwrap();
                    (
                        s.reservations.len(),
                        s.reservations.on_node(peer, 0).jobs,
                        s.scheduler.session_node(pair_core::SessionKey(7), now_ms()),
                    )
                })
                .collect()
        };
        let reserve_on = |i: usize| {
            let st = Arc::clone(&st);
            loops.spawn_on(i, async move {
                let mut request = RequestProfile::new("m", pair_core::ApiFlavor::OpenAi);
                request.session = Some(pair_core::SessionKey(7));
                let ids: Vec<ReservationId> = (0..100)
                    .filter_map(|k| st.reserve(peer, &request, 1_000 + k).keep())
                    .collect();
                st.bind_session(request.session, peer);
                ids
            })
        };
        let (a, b) = (reserve_on(0), reserve_on(1));
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!((a.len(), b.len()), (100, 100));
        let all = copies(&st);
        assert_eq!(all.len(), pair_runtime::per_loop::slots());
        assert!(all.iter().all(|c| *c == (200, 200, Some(peer))), "{all:?}");
        // Each loop's reservations released from the other loop.
        let release_on = |i: usize, ids: Vec<ReservationId>| {
            let st = Arc::clone(&st);
            loops.spawn_on(i, async move {
                for id in ids {
                    st.release(id);
                }
            })
        };
        release_on(1, a).await.unwrap();
        release_on(0, b).await.unwrap();
        let all = copies(&st);
        assert!(all.iter().all(|c| c.0 == 0 && c.1 == 0), "{all:?}");
        loops.shutdown(std::time::Duration::from_secs(5)).await;
    }

    /// Each loop's engine copies and receipt value share no buffer with
    /// another loop's, so taking them per request writes only the loop's
    /// own reference counts.
    #[tokio::test]
    async fn each_loop_has_its_own_engine_copies() {
        let loops = EventLoops::start(2).unwrap();
        let st = state(Arc::clone(&loops), Arc::new(JobLog::in_memory()));
        let base: http::Uri = "http://127.0.0.1:11435".parse().unwrap();
        st.set_engines(vec![
            LocalEngine::new(pair_core::EngineKind::Ollama, base, None, Arc::default()).unwrap(),
        ]);
        let on = |i: usize| {
            let st = Arc::clone(&st);
            loops.spawn_on(i, async move {
                let engine = Arc::clone(&st.engines()[0]);
                (engine, st.receipt_self().unwrap())
            })
        };
        let (a, receipt_a) = on(0).await.unwrap();
        let (b, receipt_b) = on(1).await.unwrap();
        assert_eq!(a.authority().as_str(), "127.0.0.1:11435");
        assert_eq!(a.authority(), b.authority());
        assert_eq!(a.host(), b.host());
        assert_eq!(receipt_a, receipt_b);
        if pair_runtime::per_loop::slots() > 1 {
            assert!(!Arc::ptr_eq(&a, &b));
            let ptr = |s: &[u8]| s.as_ptr();
            assert_ne!(
                ptr(a.authority().as_str().as_bytes()),
                ptr(b.authority().as_str().as_bytes())
            );
            assert_ne!(ptr(a.host().as_bytes()), ptr(b.host().as_bytes()));
            assert_ne!(ptr(receipt_a.as_bytes()), ptr(receipt_b.as_bytes()));
        }
        loops.shutdown(std::time::Duration::from_secs(5)).await;
    }
}
