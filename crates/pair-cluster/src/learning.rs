//! What the node learns of engines' speeds from finished jobs, its own and
//! its peers' (replicated), read from the job log off the request path.

use std::sync::{Arc, Mutex};

use pair_core::{ModelPerf, NodeId};
use pair_jobs::JobLog;
use pair_scheduler::{Observation, PerfLearner};

/// Learned prefill and decode speeds per node and model.
#[derive(Debug)]
pub struct SpeedLearner {
    jobs: Arc<JobLog>,
    inner: Mutex<Learning>,
}

#[derive(Debug)]
struct Learning {
    learner: PerfLearner,
    /// The job log's cursor: jobs past it are not learned from yet.
    seen: usize,
}

impl SpeedLearner {
    /// Learns from what `jobs` gets from now on (what it held at start was
    /// learned from before).
    pub fn new(jobs: Arc<JobLog>) -> Self {
        let seen = jobs.end();
        Self {
            jobs,
            inner: Mutex::new(Learning {
                learner: PerfLearner::new(),
                seen,
            }),
        }
    }

    /// Learned speed of `model` on `node` over `seed`, if jobs taught any:
    /// the jobs added to the log since the last call are learned from
    /// first, each once (a record the log already held, echoed back by a
    /// peer, is not new).
    pub fn learned(&self, node: NodeId, model: &str, seed: ModelPerf) -> Option<ModelPerf> {
        let mut l = self.inner.lock().ok()?;
        let Learning { learner, seen } = &mut *l;
        let (new, next) = self.jobs.after(*seen, pair_jobs::KEEP_RECORDS);
        *seen = next;
        // One observation per job: its origin's record (the node that ran
        // it records it too, and that record is superseded).
        for rec in new
            .iter()
            .filter(|r| r.recorded_by.is_none_or(|by| by == r.origin))
        {
            if let Some(obs) = Observation::from_job(rec) {
                learner.observe(&obs);
            }
        }
        learner.rates(node, model).map(|r| r.over(seed))
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
    use pair_core::{ApiFlavor, JobId, JobRecord, JobStatus};

    /// A completed job of 200 prompt tokens in 100 ms and 50 more tokens
    /// in the next second, run on node `ran_on`.
    fn job(id: u128, ran_on: u128) -> JobRecord {
        JobRecord {
            id: JobId::from_uuid(uuid::Uuid::from_u128(id)),
            model: "m".into(),
            flavor: ApiFlavor::Ollama,
            route: "/api/chat".into(),
            streaming: true,
            origin: NodeId::from_u128(1),
            ran_on: Some(NodeId::from_u128(ran_on)),
            attempts: 1,
            status: JobStatus::Completed,
            http_status: Some(200),
            created_at_ms: 1,
            ttft_ms: Some(100),
            duration_ms: Some(1100),
            prompt_tokens: Some(200),
            output_tokens: Some(51),
            error: None,
            recorded_by: None,
        }
    }

    /// Finished jobs, this node's and a peer's, are learned from when the
    /// speeds are next asked for, each once: not what the log held at
    /// start, not a record echoed back by a peer, not twice on a second ask.
    #[test]
    fn learns_each_new_job_once_when_asked() {
        let jobs = Arc::new(JobLog::in_memory());
        jobs.record(job(1, 2));
        let l = SpeedLearner::new(Arc::clone(&jobs));
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
}
