//! A routed request's job record (never prompt or output text): made when
//! the request is committed, finished when its answer ends however it
//! ends (completed, failed mid-stream, the client gone), and put in the job
//! log with the route's metrics.

use std::sync::Arc;
use std::time::Duration;

use pair_cluster::{Engaged, LoadGuard};
use pair_core::{ApiFlavor, JobId, JobRecord, JobStatus, NodeId, PromptChain, RequestProfile};
use pair_scheduler::{AnswerKey, ReservationId};
use tokio::time::Instant;

use crate::engine_report::{PromptCache, Reported};
use crate::metrics::RouteSlot;
use crate::state::ProxyState;
use crate::stream::{Ending, Watcher};

pub(crate) fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

/// A job record with what is known before any attempt. `recorded_by` is
/// this node: the origin, or the node running a relayed request.
pub(crate) fn new_record(
    id: JobId,
    flavor: ApiFlavor,
    route: &'static str,
    profile: &RequestProfile,
    origin: NodeId,
    recorded_by: NodeId,
    created_at_ms: u64,
) -> JobRecord {
    JobRecord {
        key: None,
        resumed: Vec::new(),
        waited: None,
        id,
        model: profile.model.clone(),
        flavor,
        route: route.into(),
        streaming: profile.streaming,
        origin,
        ran_on: None,
        attempts: 0,
        status: JobStatus::Running,
        http_status: None,
        created_at_ms,
        ttft_ms: None,
        duration_ms: None,
        prompt_tokens: Some(profile.prompt_tokens),
        output_tokens: None,
        error: None,
        recorded_by: Some(recorded_by),
        engine: None,
        cached_tokens: None,
    }
}

/// A job's record while no answer has been committed: if the request is
/// dropped now (its client went away before the answer's head), the job is
/// recorded as cancelled.
pub(crate) struct PendingJob {
    st: Arc<ProxyState>,
    record: Option<JobRecord>,
    t0: Instant,
}

impl PendingJob {
    pub(crate) fn new(st: &Arc<ProxyState>, record: JobRecord, t0: Instant) -> Self {
        Self {
            st: Arc::clone(st),
            record: Some(record),
            t0,
        }
    }

    /// The record, for whoever finishes it (the answer, or the failure).
    pub(crate) fn take(&mut self) -> Option<JobRecord> {
        self.record.take()
    }

    /// An answer was committed: its record goes to the answer's watcher.
    pub(crate) fn commit(mut self) -> Option<JobRecord> {
        self.record.take()
    }
}

impl Drop for PendingJob {
    fn drop(&mut self) {
        if let Some(mut rec) = self.record.take() {
            rec.status = JobStatus::Cancelled;
            rec.duration_ms = Some(millis(self.t0.elapsed()));
            rec.error = Some("client went away before the answer".into());
            self.st.finish_job(rec);
        }
    }
}

/// Finishes the job record when the answer ends, however it ends.
pub(crate) struct JobWatcher {
    pub(crate) st: Arc<ProxyState>,
    /// Taken by `finish` (called once).
    pub(crate) record: Option<JobRecord>,
    /// The route and its histograms, for a request this node's face took
    /// (`None`: a relayed one, counted at its origin).
    pub(crate) metrics: Option<(&'static str, Option<RouteSlot>)>,
    pub(crate) t0: Instant,
    /// The serving node's name when it is a peer (`None`: this node).
    pub(crate) peer_name: Option<String>,
    pub(crate) guard: Option<LoadGuard>,
    /// Held until the answer's end: the scheduler counts this request on
    /// its node until then (released by `finish`, or on drop).
    pub(crate) reservation: Option<ReservationId>,
    /// The local engine serving it, stamped as its tokens come (until the
    /// answer moves elsewhere after a cut); the answer waits on it until
    /// then.
    pub(crate) engine: Option<Engaged>,
    /// Where the answer moved after a cut, when it may move.
    pub(crate) resumed: Option<Arc<crate::resume::ResumeLog>>,
    /// Its first leg, for a batch answer that may be cut for interactive
    /// work: it holds the answer's load instead of `guard`,
    /// `reservation` and `engine`.
    pub(crate) leg: Option<Arc<crate::preempt::Leg>>,
    /// The model and client shape whose answer lengths this answer
    /// teaches, for a request this node routed.
    pub(crate) answer: Option<AnswerKey>,
    /// What the prefix index learns from the engine's account of its
    /// prompt cache, for a request this node routed.
    pub(crate) cache: Option<CacheNote>,
}

/// The node an answer came from and the prompt it was given: the engine's
/// count of cached prompt tokens at the answer's end corrects what the
/// scheduler believes that node holds of the prompt.
pub(crate) struct CacheNote {
    pub(crate) node: NodeId,
    pub(crate) prefix: PromptChain,
    /// The node's estimate of the prompt's tokens, for an engine that does
    /// not say how long the prompt was.
    pub(crate) estimated: u32,
    /// The chain's tokens the scheduler priced as cached on `node`.
    pub(crate) predicted: u32,
}

/// `share` of `tokens`, rounded (`as` saturates; the share is in [0, 1]).
fn share_of(tokens: u32, share: f64) -> u32 {
    (f64::from(tokens) * share + 0.5) as u32
}

impl CacheNote {
    /// Tells the scheduler what the engine found cached, in the chain's
    /// tokens (the engine counts its own tokens; the share carries over),
    /// and puts the engine's account in the record: the whole prompt and
    /// its cached part.
    fn apply(&self, st: &ProxyState, cache: PromptCache, rec: &mut JobRecord) {
        let share = cache.cached_share(self.estimated);
        st.note_cached(
            self.node,
            &self.prefix,
            share_of(self.prefix.tokens(), share),
        );
        let (prompt, cached) = cache.account(self.estimated);
        rec.prompt_tokens = Some(prompt);
        rec.cached_tokens = Some(cached);
    }

    /// The share of the prompt the scheduler expected cached, for an engine
    /// that says nothing of its cache.
    fn predicted_share(&self) -> f64 {
        match self.prefix.tokens() {
            0 => 0.0,
            t => f64::from(self.predicted.min(t)) / f64::from(t),
        }
    }
}

impl JobWatcher {
    fn release(&mut self) {
        if let Some(id) = self.reservation.take() {
            self.st.release(id);
        }
        if let Some(leg) = &self.leg {
            leg.end();
        }
        // A slot freed: a request waiting for one may go.
        self.st.waitroom.wake();
    }
}

impl Drop for JobWatcher {
    fn drop(&mut self) {
        self.release();
    }
}

impl Watcher for JobWatcher {
    fn progress(&mut self, events: u32) {
        if let Some(g) = self.guard.as_mut() {
            g.progress(events);
        }
        if let Some(leg) = &self.leg {
            leg.progress(events);
        }
        if self.resumed.as_ref().is_some_and(|r| r.moved()) {
            self.engine = None;
        } else if let Some(e) = &self.engine {
            e.touch();
        }
    }

    fn drained(&mut self) {
        self.guard.take();
        self.release();
    }

    fn finish(&mut self, ending: Ending, events: u32, reported: Option<Reported>) {
        let elapsed = self.t0.elapsed();
        let Some(mut rec) = self.record.take() else {
            self.guard.take();
            return;
        };
        rec.duration_ms = Some(millis(elapsed));
        if let Some(log) = &self.resumed {
            rec.resumed = log.moves();
        }
        rec.output_tokens = (events > 0).then_some(events);
        // The engine's own counts and durations beat the node's estimates.
        if let Some(r) = reported {
            rec.prompt_tokens = r.prompt_tokens.or(rec.prompt_tokens);
            rec.output_tokens = r.output_tokens.or(rec.output_tokens);
            rec.engine = r.timing;
        }
        // What the engine took from its cache corrects the prefix index and
        // the record (an answer that moved after a cut was counted by
        // another engine than the one noted); where it says nothing, the
        // record keeps the share the scheduler expected, so speeds are
        // learned from what was prefilled.
        if let Some(note) = self.cache.take()
            && ending == Ending::Completed
            && rec.resumed.is_empty()
        {
            match reported.and_then(|r| r.cache) {
                Some(cache) => note.apply(&self.st, cache, &mut rec),
                None => {
                    rec.cached_tokens = rec
                        .prompt_tokens
                        .map(|p| share_of(p, note.predicted_share()))
                        .filter(|&c| c > 0);
                }
            }
        }
        let ok = rec.http_status.is_some_and(|s| s < 400);
        // A whole answer teaches its length: counted by the engine, or by
        // its stream's events (one a token).
        if let Some(key) = self.answer.take()
            && ending == Ending::Completed
            && ok
            && let Some(tokens) = reported
                .and_then(|r| r.output_tokens)
                .or(rec.output_tokens.filter(|_| rec.streaming))
        {
            self.st.note_answer(key, tokens);
        }
        rec.status = match ending {
            Ending::Completed if ok => JobStatus::Completed,
            Ending::Completed => JobStatus::Failed,
            Ending::Failed { .. } => JobStatus::Failed,
            Ending::Cancelled => JobStatus::Cancelled,
        };
        rec.error = match ending {
            Ending::Failed { class } => Some(class.into()),
            Ending::Cancelled => Some("client went away".into()),
            Ending::Completed if !ok => rec
                .http_status
                .map(|s| format!("engine answered {s}").into()),
            Ending::Completed => None,
        };
        if let Some((route, slot)) = self.metrics {
            let node_name = self.peer_name.as_deref().unwrap_or(&self.st.node.name);
            self.st
                .metrics
                .count_request(route, rec.http_status.unwrap_or(0), node_name);
            if let Some(slot) = slot {
                let m = self.st.metrics.route_at(slot);
                m.duration.observe(elapsed.as_secs_f64());
                m.attempts.observe(f64::from(rec.attempts));
            }
        }
        self.guard.take();
        self.release();
        self.st.finish_job(rec);
    }
}
