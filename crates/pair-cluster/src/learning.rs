//! What the node learns of engines from finished jobs, read from the job
//! log off the request path: speeds of every node (its own jobs and its
//! peers', replicated) and how many requests its own engines run at once.

use std::sync::{Arc, Mutex};

use pair_core::{ModelPerf, NodeId};
use pair_jobs::JobLog;
use pair_scheduler::{
    BatchLearner, Decoded, Observation, PerfLearner, SlotLearner, Streamed, learned_perf,
};

/// Learned prefill and decode speeds per node and model, and this node's
/// slots per model.
#[derive(Debug)]
pub struct SpeedLearner {
    jobs: Arc<JobLog>,
    /// This node: slots are learned from the jobs it ran, timed on its clock.
    me: NodeId,
    inner: Mutex<Learning>,
}

#[derive(Debug)]
struct Learning {
    learner: PerfLearner,
    slots: SlotLearner,
    /// This node's engines: how decoding slows as streams share them.
    batching: BatchLearner,
    /// The job log's cursor: jobs past it are not learned from yet.
    seen: usize,
}

impl SpeedLearner {
    /// Learns from what `jobs` gets from now on (what it held at start was
    /// learned from before).
    pub fn new(jobs: Arc<JobLog>, me: NodeId) -> Self {
        let seen = jobs.end();
        Self {
            jobs,
            me,
            inner: Mutex::new(Learning {
                learner: PerfLearner::new(),
                slots: SlotLearner::new(),
                batching: BatchLearner::new(),
                seen,
            }),
        }
    }

    /// Learned speed of `model` on `node` over `seed`, if jobs taught any:
    /// the jobs added to the log since the last call are learned from
    /// first, each once (a record the log already held, echoed back by a
    /// peer, is not new). On this node, decoding is one stream's speed
    /// alone with the batching exponent its engine showed.
    pub fn learned(&self, node: NodeId, model: &str, seed: ModelPerf) -> Option<ModelPerf> {
        let mut l = self.inner.lock().ok()?;
        self.catch_up(&mut l);
        learned_perf(
            l.learner.rates(node, model),
            l.batching.fitted(node, model),
            seed,
        )
    }

    /// Requests this node's engine was seen running at once for `model`
    /// (see [`SlotLearner`]), if it ran any.
    pub fn slots(&self, model: &str) -> Option<u16> {
        let mut l = self.inner.lock().ok()?;
        self.catch_up(&mut l);
        l.slots.slots(self.me, model)
    }

    /// Learns from the jobs added to the log since the last call, each once.
    fn catch_up(&self, l: &mut Learning) {
        let (new, next) = self.jobs.after(l.seen, pair_jobs::KEEP_RECORDS);
        l.seen = next;
        for rec in &new {
            // Speeds: one observation per job, its origin's record (the
            // node that ran it records it too, and that record is
            // superseded).
            if rec.recorded_by.is_none_or(|by| by == rec.origin)
                && let Some(obs) = Observation::from_job(rec)
            {
                l.learner.observe(&obs);
            }
            // Slots: the records timed on this node's clock of the jobs its
            // engines ran (its own requests and the ones it ran for peers).
            // Not an answer that moved: its record runs from its first
            // token here to its end wherever it ended, past the cut that
            // freed this engine for others (preemption cuts to do so).
            let timed_here = rec.origin == self.me || rec.recorded_by == Some(self.me);
            if rec.ran_on == Some(self.me)
                && timed_here
                && rec.resumed.is_empty()
                && rec.status == pair_core::JobStatus::Completed
                && let (Some(ttft), Some(total)) = (rec.ttft_ms, rec.duration_ms)
            {
                let streamed = Streamed {
                    first_token_ms: rec.created_at_ms + u64::from(ttft),
                    end_ms: rec.created_at_ms + u64::from(total),
                };
                l.slots.observe(self.me, &rec.model, streamed);
                // A whole answer's first byte is its last: its record does
                // not show when decoding began, so it says nothing of how
                // decoding slowed as streams shared the engine.
                if !rec.streaming {
                    continue;
                }
                // The engine's own decode time when it gave one (no
                // network in it), else the stream's length.
                let decode_ms = rec
                    .engine
                    .and_then(|e| e.decode_ms)
                    .unwrap_or(total.saturating_sub(ttft));
                l.batching.observe(
                    self.me,
                    &rec.model,
                    Decoded {
                        streamed,
                        output_tokens: rec.output_tokens.unwrap_or(0),
                        decode_ms,
                    },
                );
            }
        }
    }

    #[cfg(test)]
    fn samples(&self, node: NodeId) -> u32 {
        let l = self.inner.lock().unwrap();
        l.learner.rates(node, "m").map_or(0, |r| r.samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::JobRecord;

    /// A completed job of 200 prompt tokens in 100 ms and 50 more tokens
    /// in the next second, run on node `ran_on`.
    fn job(id: u128, ran_on: u128) -> JobRecord {
        JobRecord {
            ran_on: Some(NodeId::from_u128(ran_on)),
            created_at_ms: 1,
            ttft_ms: Some(100),
            duration_ms: Some(1100),
            prompt_tokens: Some(200),
            output_tokens: Some(51),
            recorded_by: None,
            ..JobRecord::fixture(id)
        }
    }

    /// Finished jobs, this node's and a peer's, are learned from when the
    /// speeds are next asked for, each once: not what the log held at
    /// start, not a record echoed back by a peer, not twice on a second ask.
    #[test]
    fn learns_each_new_job_once_when_asked() {
        let jobs = Arc::new(JobLog::in_memory());
        jobs.record(job(1, 2));
        let l = SpeedLearner::new(Arc::clone(&jobs), NodeId::from_u128(1));
        jobs.record(job(2, 2));
        jobs.merge(vec![job(3, 2), job(2, 2)]);
        let two = NodeId::from_u128(2);
        assert_eq!(l.samples(two), 0, "nothing learned until asked");
        let perf = l.learned(two, "m", ModelPerf::FALLBACK).unwrap();
        // 200 prompt tokens in 100 ms; 50 more tokens in the next second.
        assert!((perf.prefill_tps - 2000.0).abs() < 1.0, "{perf:?}");
        assert!((perf.decode_tps - 50.0).abs() < 0.1, "{perf:?}");
        assert_eq!(l.samples(two), 2);
        assert!(l.learned(two, "m", ModelPerf::FALLBACK).is_some());
        assert_eq!(l.samples(two), 2, "asked again: nothing new");
    }

    /// Slots come from this node's own runs, timed on its clock: two of its
    /// requests streaming at once prove two; overlaps on a peer's engine,
    /// or in a record timed on another node's clock, prove nothing here.
    #[test]
    fn overlapping_runs_on_this_node_prove_its_slots() {
        let me = NodeId::from_u128(1);
        let jobs = Arc::new(JobLog::in_memory());
        let l = SpeedLearner::new(Arc::clone(&jobs), me);
        let at = |id: u128, ran_on: u128, origin: u128, created: u64| JobRecord {
            origin: NodeId::from_u128(origin),
            created_at_ms: created,
            recorded_by: (origin != 1).then_some(NodeId::from_u128(1)),
            ..job(id, ran_on)
        };
        // A peer's engine runs two at once: not this node's business.
        jobs.record(at(1, 2, 1, 1_000));
        jobs.record(at(2, 2, 1, 1_200));
        assert_eq!(l.slots("m"), None);
        // One at a time here.
        jobs.record(at(3, 1, 1, 10_000));
        jobs.record(at(4, 1, 1, 11_200));
        assert_eq!(l.slots("m"), Some(1));
        // A peer's request, run here and timed here, overlapping one of ours.
        jobs.record(at(5, 1, 3, 20_000));
        jobs.record(at(6, 1, 1, 20_300));
        assert_eq!(l.slots("m"), Some(2));
        // The peer's own record of a job run here is on its clock: ignored.
        let mut theirs = at(7, 1, 3, 30_000);
        theirs.recorded_by = None;
        jobs.merge(vec![theirs, at(8, 1, 3, 30_100), at(9, 1, 1, 30_200)]);
        assert_eq!(l.slots("m"), Some(2), "two of ours only overlap pairwise");
        // An answer cut here (to free the slot) and continued: its record
        // spans the requests that ran here after the cut; it proves nothing.
        let mut moved = at(10, 1, 1, 40_000);
        moved.duration_ms = Some(5_000);
        moved.resumed = vec![pair_core::Resumption {
            node: NodeId::from_u128(2),
            at_token: 10,
        }];
        jobs.record(moved);
        for (k, t) in [(11, 41_000), (12, 41_200)] {
            jobs.record(at(k, 1, 1, t));
        }
        assert_eq!(l.slots("m"), Some(2));
        assert_eq!(l.samples(NodeId::from_u128(1)), 7, "nor speeds");
    }

    /// This node's engine decodes 60 tokens/s alone and 2^0.5 times that
    /// with two streams: runs alone and in pairs teach it both, and the
    /// speed it advertises is one stream's alone with that exponent. The
    /// engine's own decode time wins over the stream's length.
    #[test]
    fn runs_alone_and_together_teach_this_node_how_batching_slows_decoding() {
        let me = NodeId::from_u128(1);
        let jobs = Arc::new(JobLog::in_memory());
        let l = SpeedLearner::new(Arc::clone(&jobs), me);
        let mut id = 0u128;
        let mut at = 0u64;
        let mut run = |streams: u32| {
            let per_stream = 60.0 * f64::from(streams).powf(0.5 - 1.0);
            let decode = (100.0 * 1000.0 / per_stream) as u32;
            for _ in 0..streams {
                id += 1;
                jobs.record(JobRecord {
                    created_at_ms: at,
                    ttft_ms: Some(100),
                    // The stream looks 300 ms longer than the engine's work.
                    duration_ms: Some(100 + decode + 300),
                    output_tokens: Some(101),
                    engine: Some(pair_core::EngineTiming {
                        prompt_ms: None,
                        decode_ms: Some(decode),
                    }),
                    ..job(id, 1)
                });
            }
            at += u64::from(decode) + 1_000;
        };
        for k in 0..60 {
            run(1 + k % 2);
        }
        let perf = l.learned(me, "m", ModelPerf::FALLBACK).unwrap();
        let e = perf.batch_exponent.unwrap();
        assert!((e - 0.5).abs() < 0.03, "{perf:?}");
        assert!((perf.decode_tps - 60.0).abs() < 2.0, "{perf:?}");
        // A peer's engine is not this node's to fit.
        assert_eq!(
            l.learned(NodeId::from_u128(2), "m", ModelPerf::FALLBACK),
            None
        );
    }
}
