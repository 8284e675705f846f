//! This node's own workload: requests running on its engines, whether they
//! came from its faces or were relayed by peers. Peers see it in workload
//! reports; PAIR's `pending` is `running + queued` of this tracker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use pair_core::Workload;

/// Lock-free counters; one [`LoadGuard`] per request in flight.
#[derive(Debug, Default)]
pub struct LocalLoad {
    in_flight: AtomicU32,
    prefill_tokens: AtomicU64,
    decode_tokens: AtomicU64,
    /// Requests served since start, for reports and metrics.
    served: AtomicU64,
    /// What the engines themselves last reported running and waiting
    /// (vLLM does): work sent straight to an engine's own port, which
    /// passes no guard.
    engine_running: AtomicU32,
    engine_waiting: AtomicU32,
}

impl LocalLoad {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a request against this node until the guard drops.
    pub fn begin(self: &Arc<Self>, prompt_tokens: u32, output_tokens: u32) -> LoadGuard {
        self.in_flight.fetch_add(1, Relaxed);
        self.prefill_tokens
            .fetch_add(u64::from(prompt_tokens), Relaxed);
        self.decode_tokens
            .fetch_add(u64::from(output_tokens), Relaxed);
        LoadGuard {
            load: Arc::clone(self),
            prefill_left: prompt_tokens,
            decode_left: output_tokens,
        }
    }

    /// The workload as the scheduler models it: `slots` requests run at
    /// once on the engines, the rest wait; an engine's own larger counts
    /// (requests that bypassed the proxy) raise it.
    pub fn workload(&self, slots: u32) -> Workload {
        let n = self.in_flight.load(Relaxed);
        let running = n.min(slots.max(1));
        Workload {
            running: running.max(self.engine_running.load(Relaxed)),
            queued: (n - running).max(self.engine_waiting.load(Relaxed)),
            prefill_tokens: self.prefill_tokens.load(Relaxed),
            decode_tokens: self.decode_tokens.load(Relaxed),
        }
    }

    /// The engines' own queue report, summed over those that give one
    /// (call it whenever they are polled).
    pub fn set_engine_queue(&self, running: u32, waiting: u32) {
        self.engine_running.store(running, Relaxed);
        self.engine_waiting.store(waiting, Relaxed);
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Relaxed)
    }

    pub fn served(&self) -> u64 {
        self.served.load(Relaxed)
    }
}

/// One request's share of [`LocalLoad`]; the counts fall as the answer
/// streams and vanish when it ends, however it ends.
#[derive(Debug)]
pub struct LoadGuard {
    load: Arc<LocalLoad>,
    prefill_left: u32,
    decode_left: u32,
}

impl LoadGuard {
    /// The first token arrived: the prompt is no longer pending work.
    pub fn prefill_done(&mut self) {
        let n = std::mem::take(&mut self.prefill_left);
        if n > 0 {
            self.load.prefill_tokens.fetch_sub(u64::from(n), Relaxed);
        }
    }

    /// `n` more output tokens were produced.
    pub fn decoded(&mut self, n: u32) {
        let n = n.min(self.decode_left);
        if n > 0 {
            self.decode_left -= n;
            self.load.decode_tokens.fetch_sub(u64::from(n), Relaxed);
        }
    }

    /// A chunk of the answer with `events` stream events passed through:
    /// the prompt is done, and about `events` tokens were produced.
    pub fn progress(&mut self, events: u32) {
        self.prefill_done();
        self.decoded(events);
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.prefill_done();
        self.decoded(self.decode_left);
        self.load.in_flight.fetch_sub(1, Relaxed);
        self.load.served.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_count_and_release() {
        let load = LocalLoad::new();
        let mut a = load.begin(100, 50);
        let b = load.begin(10, 5);
        let w = load.workload(1);
        assert_eq!((w.running, w.queued), (1, 1));
        assert_eq!((w.prefill_tokens, w.decode_tokens), (110, 55));
        a.prefill_done();
        a.decoded(20);
        a.decoded(1000);
        let w = load.workload(4);
        assert_eq!((w.running, w.queued), (2, 0));
        assert_eq!((w.prefill_tokens, w.decode_tokens), (10, 5));
        drop(a);
        drop(b);
        assert_eq!(load.workload(1), Workload::default());
        assert_eq!(load.served(), 2);
    }

    #[test]
    fn an_engines_own_queue_raises_the_counts() {
        let load = LocalLoad::new();
        let _a = load.begin(10, 5);
        load.set_engine_queue(3, 2);
        let w = load.workload(4);
        assert_eq!((w.running, w.queued), (3, 2));
        load.set_engine_queue(0, 0);
        let w = load.workload(4);
        assert_eq!((w.running, w.queued), (1, 0));
    }
}
