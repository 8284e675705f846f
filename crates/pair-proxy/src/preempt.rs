//! Preemption (`--queue preempt`): an interactive request that would wait
//! at the cluster for a slot takes a running batch job's instead. Which
//! job is the scheduler's call ([`pair_scheduler::preempt`]); here is the
//! node's side of it: the batch answers this node routed that can move
//! (streamed, continued from their text so far: [`crate::resume`]), each
//! leg of one priced as it runs ([`Leg`]), and the cut itself: the leg's
//! upstream connection dropped at once (its engine frees the slot), its
//! load and reservation released, and its continuation sent to wait at the
//! cluster again as batch work, in its old place, the node it was cut on
//! still a candidate (it is healthy).
//!
//! Nothing here runs unless the node preempts: a node that does not keeps
//! no legs and wraps no bodies.

use std::future::Future as _;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use pair_cluster::{Engaged, LoadGuard};
use pair_core::{ApiFlavor, ClusterSnapshot, ModelPerf, NodeId, RequestProfile};
use pair_scheduler::{Candidate, Cuttable, ReservationId, preempt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::dispatch::{BoxedBody, UpBody, UpBodyError};

/// Tokens given past which an answer is not cut: its stream may be too
/// long for a continuation to read back
/// ([`pair_translate::resume::KEPT_MAX`] bytes, at up to 256 bytes an
/// event), and a cut would end it instead of moving it.
const READ_BACK_TOKENS: u32 = 32_768;

/// Releases a reservation on a peer (the node's state).
pub(crate) trait Release: Send + Sync {
    fn release(&self, id: ReservationId);
}

/// A batch answer that may be cut, across its legs (the stream it began
/// as, then each continuation).
#[derive(Debug)]
pub(crate) struct Job {
    cuts: AtomicU32,
    /// Tokens its client has had, over every leg.
    tokens: AtomicU32,
    /// Cut to give its slot away: its continuation waits at the cluster
    /// before it goes (read once, by the continuation).
    yielded: AtomicBool,
    /// Moves the answer may still make ([`moves_allowed`], less its moves).
    moves_left: AtomicU32,
    /// Moves it made: a cut by a peer reaches this node as a failed
    /// stream, so the cap on cuts is kept on every move.
    moves: AtomicU32,
    /// When its request arrived: its place in the cluster queue.
    pub(crate) arrived: Instant,
}

/// How many times a batch answer that interactive work may cut can move:
/// its `--resume-limit` moves for failures, and
/// [`pair_scheduler::queue::MAX_CUTS`] more for cuts (a peer's cut reaches
/// the node that routed it as a failed stream, so the two share one
/// count), as the simulator cuts a job up to that many times.
pub(crate) fn moves_allowed(resume_limit: u8) -> u8 {
    let cuts = u8::try_from(pair_scheduler::queue::MAX_CUTS).unwrap_or(u8::MAX);
    resume_limit.saturating_add(cuts)
}

impl Job {
    /// An answer that may move `limit` times, whose request arrived at
    /// `arrived`.
    pub(crate) fn new(limit: u8, arrived: Instant) -> Self {
        Self {
            cuts: AtomicU32::new(0),
            tokens: AtomicU32::new(0),
            yielded: AtomicBool::new(false),
            moves_left: AtomicU32::new(u32::from(limit)),
            moves: AtomicU32::new(0),
            arrived,
        }
    }

    /// The answer moved (after a cut of any kind).
    pub(crate) fn moved(&self) {
        self.moves.fetch_add(1, Relaxed);
        let _ = self
            .moves_left
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Whether it was cut to give its slot away since this was last asked.
    pub(crate) fn take_yielded(&self) -> bool {
        self.yielded.swap(false, Relaxed)
    }

    /// Whether a cut can still move it (it has moves left).
    fn movable(&self) -> bool {
        self.moves_left.load(Relaxed) > 0 && self.tokens.load(Relaxed) < READ_BACK_TOKENS
    }

    /// Whether a peer serving it may cut it ([`pair_link::CUTTABLE_HEADER`]):
    /// it can move, and has moved fewer than [`pair_scheduler::queue::MAX_CUTS`]
    /// times (the peer cannot count its cuts on other nodes).
    pub(crate) fn peer_may_cut(&self) -> bool {
        self.movable()
            && self.moves.load(Relaxed) < pair_scheduler::queue::MAX_CUTS
            && self.cuts.load(Relaxed) < pair_scheduler::queue::MAX_CUTS
    }

    /// A peer cut it before its first byte (its attempt failed as
    /// `preempted`): one of its cuts.
    pub(crate) fn cut_elsewhere(&self) {
        self.cuts.fetch_add(1, Relaxed);
    }

    /// The client had `events` more tokens.
    pub(crate) fn progress(&self, events: u32) {
        self.tokens.fetch_add(events, Relaxed);
    }
}

/// What a leg is priced by: its prompt and planned answer, at the speeds
/// its node is known by.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Price {
    prompt_tokens: u32,
    planned: u32,
    prefill_tps: f64,
    decode_tps: f64,
}

impl Price {
    /// `profile` on `node`, at the speeds `cluster` knows it by (a fallback
    /// where it knows none).
    pub(crate) fn of(
        cluster: &ClusterSnapshot,
        node: NodeId,
        profile: &RequestProfile,
        flavor: ApiFlavor,
    ) -> Self {
        let perf = cluster
            .node(node)
            .and_then(|n| n.find_model(&profile.model, flavor))
            .and_then(|(_, entry)| entry.perf)
            .unwrap_or(ModelPerf::FALLBACK);
        Self {
            prompt_tokens: profile.prompt_tokens,
            planned: profile.answer_tokens(),
            prefill_tps: f64::from(perf.prefill_tps).max(1e-3),
            decode_tps: f64::from(perf.decode_tps).max(1e-3),
        }
    }

    /// What cutting it throws away and what it has left, with `generated`
    /// tokens of its answer given and `spent` on this leg so far, as the
    /// simulator prices a running job: before its first token, the prefill
    /// done so far; after it, the prompt and the answer so far prefilled
    /// again. Past its planned length an answer's end is unknown: a
    /// quarter of the plan counts as still to come.
    fn cuttable(&self, generated: u32, spent_ms: f64, cuts: u32) -> Cuttable {
        let prefill_ms = |tokens: u32| f64::from(tokens) * 1e3 / self.prefill_tps;
        let decode_ms = |tokens: u32| f64::from(tokens) * 1e3 / self.decode_tps;
        let answer_left = decode_ms(
            self.planned
                .saturating_sub(generated)
                .max(self.planned / 4)
                .max(1),
        );
        let (sunk, left) = if generated == 0 {
            let prefill = prefill_ms(self.prompt_tokens);
            let spent = spent_ms.min(prefill);
            (spent, prefill - spent + answer_left)
        } else {
            (
                prefill_ms(self.prompt_tokens.saturating_add(generated)),
                answer_left,
            )
        };
        // `as` saturates: the prices are finite and above zero.
        Cuttable {
            sunk_ms: sunk.ceil() as u32,
            left_ms: left.ceil() as u32,
            cuts,
        }
    }
}

/// What a leg holds on its node until it ends or is cut: its load on this
/// node's engine, its reservation on a peer, its engine's watch.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) guard: Option<LoadGuard>,
    pub(crate) reservation: Option<ReservationId>,
    pub(crate) engine: Option<Engaged>,
}

impl Held {
    fn release(self, owner: &dyn Release) {
        let Held {
            guard,
            reservation,
            engine,
        } = self;
        drop(guard);
        drop(engine);
        if let Some(id) = reservation {
            owner.release(id);
        }
    }
}

/// One leg of a batch answer on one node, from its commitment until it
/// ends or is cut.
pub(crate) struct Leg {
    /// Releases its reservation.
    owner: Arc<dyn Release>,
    /// The node's legs, which it is one of while it may be cut.
    legs: Arc<Legs>,
    node: NodeId,
    price: Price,
    job: Arc<Job>,
    began: Instant,
    over: AtomicBool,
    state: Mutex<LegState>,
}

#[derive(Debug, Default)]
struct LegState {
    cut: Option<oneshot::Sender<()>>,
    held: Option<Held>,
}

impl Leg {
    /// The job's leg on `node`, priced by `price`, and the body that
    /// drops its stream when it is cut: `body` wrapped.
    pub(crate) fn start(
        owner: Arc<dyn Release>,
        legs: &Arc<Legs>,
        node: NodeId,
        price: Price,
        job: &Arc<Job>,
        body: UpBody,
    ) -> (Arc<Leg>, UpBody) {
        let (tx, rx) = oneshot::channel();
        let leg = Arc::new(Leg {
            owner,
            legs: Arc::clone(legs),
            node,
            price,
            job: Arc::clone(job),
            began: Instant::now(),
            over: AtomicBool::new(false),
            state: Mutex::new(LegState {
                cut: Some(tx),
                held: None,
            }),
        });
        let body = UpBody::Translated(BoxedBody(Box::pin(CutBody {
            inner: body,
            cut: Some(rx),
            leg: Some(Ending(Arc::clone(&leg))),
        })));
        // It may be cut from its head on: a cut while it prefills throws
        // away the least work, and its request waits at the cluster again
        // (its attempt fails as `preempted`).
        if let Ok(mut legs) = legs.0.lock() {
            legs.push(Arc::clone(&leg));
        }
        (leg, body)
    }

    /// The leg was committed: it holds `held` until it ends or is cut.
    pub(crate) fn commit(self: &Arc<Self>, held: Held) {
        // Read under the lock `end` takes after marking the leg over: a
        // leg ended or cut before now releases what it held at once, one
        // ending after finds it here.
        match self.state.lock() {
            Ok(mut s) if !self.over.load(Relaxed) => s.held = Some(held),
            _ => held.release(&*self.owner),
        }
    }

    /// The client had `events` more tokens of this leg: its load falls,
    /// its engine is seen working.
    pub(crate) fn progress(&self, events: u32) {
        self.job.progress(events);
        if self.over.load(Relaxed) {
            return;
        }
        if let Ok(mut s) = self.state.lock()
            && let Some(held) = s.held.as_mut()
        {
            if let Some(g) = held.guard.as_mut() {
                g.progress(events);
            }
            if let Some(e) = &held.engine {
                e.touch();
            }
        }
    }

    /// The leg ended (its stream did, or it was cut): what it held is
    /// released and it can no longer be cut.
    pub(crate) fn end(self: &Arc<Self>) {
        if self.over.swap(true, Relaxed) {
            return;
        }
        let held = self.state.lock().ok().and_then(|mut s| {
            s.cut = None;
            s.held.take()
        });
        if let Some(held) = held {
            held.release(&*self.owner);
        }
        if let Ok(mut legs) = self.legs.0.lock() {
            legs.retain(|l| !Arc::ptr_eq(l, self));
        }
    }

    /// Cuts the leg: its stream fails at once (its connection dropped,
    /// the answer moves), what it held is released.
    fn cut(self: &Arc<Self>) {
        self.job.cuts.fetch_add(1, Relaxed);
        self.job.yielded.store(true, Relaxed);
        let cut = self.state.lock().ok().and_then(|mut s| s.cut.take());
        self.end();
        if let Some(tx) = cut {
            // The stream may have ended meanwhile: nothing to cut then.
            let _ = tx.send(());
        }
    }
}

impl std::fmt::Debug for Leg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leg")
            .field("node", &self.node)
            .field("price", &self.price)
            .finish_non_exhaustive()
    }
}

/// The batch legs a node's requests may cut (with preemption only).
#[derive(Debug, Default)]
pub(crate) struct Legs(Mutex<Vec<Arc<Leg>>>);

impl Legs {
    /// Cuts, for a request ranked `top` and predicted to wait for a slot,
    /// the batch leg on one of those nodes that the scheduler picks
    /// ([`pair_scheduler::preempt`]), if any: the node of the one cut (its
    /// slot is then free, and the request goes there).
    pub(crate) fn cut_for(&self, top: &[Candidate]) -> Option<NodeId> {
        let wait_ms = top
            .iter()
            .filter_map(|c| c.score.prediction())
            .map(|p| p.queue_ms)
            .min()?;
        self.cut_where(wait_ms, |node| top.iter().any(|c| c.node == node))
    }

    /// Cuts, for an interactive request predicted to wait `wait_ms` for a
    /// slot of `node`'s engine, the batch leg there that the scheduler
    /// picks (one this node routed, or one it serves for a peer that
    /// continues it): whether it cut one.
    pub(crate) fn cut_on(&self, node: NodeId, wait_ms: u32) -> bool {
        self.cut_where(wait_ms, |n| n == node).is_some()
    }

    fn cut_where(&self, wait_ms: u32, on: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        let victim = {
            let Ok(legs) = self.0.lock() else {
                return None;
            };
            let now = Instant::now();
            let (legs, running): (Vec<&Arc<Leg>>, Vec<Cuttable>) = legs
                .iter()
                .filter(|l| on(l.node) && l.job.movable())
                .map(|l| {
                    let spent = now.saturating_duration_since(l.began).as_secs_f64() * 1e3;
                    let priced = l.price.cuttable(
                        l.job.tokens.load(Relaxed),
                        spent,
                        l.job.cuts.load(Relaxed),
                    );
                    (l, priced)
                })
                .unzip();
            preempt(wait_ms, &running).and_then(|k| legs.get(k).map(|l| Arc::clone(l)))
        };
        let leg = victim?;
        tracing::info!(node = %leg.node, cuts = leg.job.cuts.load(Relaxed) + 1, "cut a batch answer for interactive work");
        leg.cut();
        Some(leg.node)
    }
}

/// Ends a leg when its body does, however it ends.
struct Ending(Arc<Leg>);

impl Drop for Ending {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A leg's stream: fails with [`UpBodyError::Preempted`] the moment the
/// leg is cut, dropping the upstream connection.
struct CutBody {
    inner: UpBody,
    cut: Option<oneshot::Receiver<()>>,
    leg: Option<Ending>,
}

impl http_body::Body for CutBody {
    type Data = Bytes;
    type Error = UpBodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, UpBodyError>>> {
        let this = &mut *self;
        if let Some(rx) = this.cut.as_mut()
            && let Poll::Ready(r) = std::pin::Pin::new(rx).poll(cx)
        {
            this.cut = None;
            if r.is_ok() {
                this.inner = UpBody::Fixed(None);
                this.leg = None;
                return Poll::Ready(Some(Err(UpBodyError::Preempted)));
            }
        }
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.cut = None;
            this.leg = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leg_is_priced_as_the_simulator_prices_a_running_job() {
        let price = Price {
            prompt_tokens: 1_000,
            planned: 400,
            prefill_tps: 1_000.0,
            decode_tps: 100.0,
        };
        // Prefilling: what was prefilled so far is lost.
        assert_eq!(
            price.cuttable(0, 250.0, 1),
            Cuttable {
                sunk_ms: 250,
                left_ms: 750 + 4_000,
                cuts: 1
            }
        );
        // Decoding: the prompt and the answer so far are prefilled again.
        assert_eq!(
            price.cuttable(100, 2_000.0, 0),
            Cuttable {
                sunk_ms: 1_100,
                left_ms: 3_000,
                cuts: 0
            }
        );
        // Past its plan, a quarter of the plan is still to come.
        assert_eq!(price.cuttable(600, 9_000.0, 0).left_ms, 1_000);
    }

    #[test]
    fn an_answer_that_cannot_move_again_is_not_cut() {
        let job = Job::new(1, Instant::now());
        assert!(job.movable());
        job.moved();
        assert!(!job.movable(), "its moves are used up");
        let job = Job::new(2, Instant::now());
        job.progress(READ_BACK_TOKENS);
        assert!(!job.movable(), "too long to read back");
        // A peer may cut it while it moved fewer than MAX_CUTS times.
        let job = Job::new(u8::MAX, Instant::now());
        for _ in 0..pair_scheduler::queue::MAX_CUTS {
            assert!(job.peer_may_cut());
            job.moved();
        }
        assert!(!job.peer_may_cut(), "cut often enough");
        assert!(job.movable(), "it may still move on a failure");
    }

    #[test]
    fn cuts_do_not_use_up_the_moves_a_failure_may_need() {
        // The default --resume-limit (2) would let a batch answer be cut
        // only twice, where the scheduler allows MAX_CUTS.
        let job = Job::new(moves_allowed(2), Instant::now());
        for _ in 0..pair_scheduler::queue::MAX_CUTS {
            assert!(job.movable() && job.peer_may_cut());
            job.moved();
        }
        assert!(!job.peer_may_cut(), "cut often enough");
        job.moved();
        assert!(job.movable(), "one failure's move is still left");
        job.moved();
        assert!(!job.movable(), "and then none");
        assert_eq!(moves_allowed(u8::MAX), u8::MAX);
    }
}
