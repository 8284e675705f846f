//! This node's own workload: requests running on its engines, whether they
//! came from its faces or were relayed by peers. Peers see it in workload
//! reports; PAIR's `pending` is `running + queued` of this tracker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use pair_core::{Admitted, NodeId, Workload};

use crossbeam_utils::CachePadded;

use pair_runtime::per_loop::PerLoop;

/// Lock-free counters, one set per event loop ([`PerLoop`]: a request's
/// guard writes only its own loop's set), added up when read; one
/// [`LoadGuard`] per request in flight.
#[derive(Debug, Default)]
pub struct LocalLoad {
    /// Each loop's guards hold its counts by their own reference count
    /// (one on the [`LocalLoad`] would be a count both loops write).
    counts: PerLoop<Arc<CachePadded<Counts>>>,
    /// What the engines themselves last reported running and waiting
    /// (vLLM does): work sent straight to an engine's own port, which
    /// passes no guard.
    engine_running: AtomicU32,
    engine_waiting: AtomicU32,
    /// Per router that relayed requests here, the newest of its
    /// reservations counted in this workload and which have ended (most
    /// recent first, at most [`Admitted::MAX`]); written twice per relayed
    /// request, as it is counted and as it ends.
    admitted: Arc<std::sync::Mutex<Vec<Admitted>>>,
}

/// One event loop's share of [`LocalLoad`].
#[derive(Debug, Default)]
struct Counts {
    in_flight: AtomicU32,
    prefill_tokens: AtomicU64,
    decode_tokens: AtomicU64,
    /// Requests served since start, for reports and metrics.
    served: AtomicU64,
}

impl LocalLoad {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts a request against this node until the guard drops.
    pub fn begin(&self, prompt_tokens: u32, output_tokens: u32) -> LoadGuard {
        let c = self.counts.local();
        c.in_flight.fetch_add(1, Relaxed);
        c.prefill_tokens
            .fetch_add(u64::from(prompt_tokens), Relaxed);
        c.decode_tokens.fetch_add(u64::from(output_tokens), Relaxed);
        LoadGuard {
            counts: Arc::clone(c),
            prefill_left: prompt_tokens,
            decode_left: output_tokens,
            relayed: None,
        }
    }

    /// Holds one of the engines' slots for a request about to be counted
    /// ([`LocalLoad::begin`]) until the hold drops: a slot it freed (by
    /// cutting batch work) shows taken meanwhile, so no other request is
    /// let into it first. It counts no tokens and is not served.
    pub fn hold(&self) -> SlotHold {
        let c = self.counts.local();
        c.in_flight.fetch_add(1, Relaxed);
        SlotHold {
            counts: Arc::clone(c),
        }
    }

    /// A request relayed by `from`, under its reservation `(epoch, seq)`,
    /// is counted here by `guard` (its [`LocalLoad::begin`]): reports made
    /// from now on say so, and once the guard drops, that it has ended.
    pub fn admit(&self, guard: &mut LoadGuard, from: NodeId, (epoch, seq): (u64, u64)) {
        guard.relayed = Some(Relayed {
            admitted: Arc::clone(&self.admitted),
            from,
            epoch,
            seq,
        });
        let Ok(mut a) = self.admitted.lock() else {
            return;
        };
        match a.iter().position(|x| x.from == from) {
            Some(i) => {
                let mut x = a.remove(i);
                if x.boot == epoch {
                    x.admit(seq);
                } else {
                    x = Admitted::first(from, epoch, seq);
                }
                a.insert(0, x);
            }
            None => {
                a.truncate(Admitted::MAX - 1);
                a.insert(0, Admitted::first(from, epoch, seq));
            }
        }
    }

    /// What [`LocalLoad::admit`] recorded, for a report (read it before the
    /// workload: a request it names is then in the workload read after).
    pub fn admitted(&self) -> Vec<Admitted> {
        self.admitted.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// The workload as the scheduler models it: `slots` requests run at
    /// once on the engines, the rest wait; an engine's own larger counts
    /// (requests that bypassed the proxy) raise it.
    pub fn workload(&self, slots: u32) -> Workload {
        let (mut n, mut prefill_tokens, mut decode_tokens) = (0u32, 0u64, 0u64);
        for c in self.counts.iter() {
            n = n.saturating_add(c.in_flight.load(Relaxed));
            prefill_tokens = prefill_tokens.saturating_add(c.prefill_tokens.load(Relaxed));
            decode_tokens = decode_tokens.saturating_add(c.decode_tokens.load(Relaxed));
        }
        let running = n.min(slots.max(1));
        Workload {
            running: running.max(self.engine_running.load(Relaxed)),
            queued: (n - running).max(self.engine_waiting.load(Relaxed)),
            prefill_tokens,
            decode_tokens,
        }
    }

    /// The engines' own queue report, summed over those that give one
    /// (call it whenever they are polled).
    pub fn set_engine_queue(&self, running: u32, waiting: u32) {
        self.engine_running.store(running, Relaxed);
        self.engine_waiting.store(waiting, Relaxed);
    }

    pub fn in_flight(&self) -> u32 {
        self.counts
            .iter()
            .fold(0u32, |n, c| n.saturating_add(c.in_flight.load(Relaxed)))
    }

    pub fn served(&self) -> u64 {
        self.counts.iter().map(|c| c.served.load(Relaxed)).sum()
    }
}

/// One request's share of [`LocalLoad`]; the counts fall as the answer
/// streams and vanish when it ends, however it ends. It writes the
/// counts of the loop it began on, wherever it is dropped, so no loop's
/// counts go below zero.
#[derive(Debug)]
pub struct LoadGuard {
    counts: Arc<CachePadded<Counts>>,
    prefill_left: u32,
    decode_left: u32,
    /// The sender's reservation, for a relayed request
    /// ([`LocalLoad::admit`]).
    relayed: Option<Relayed>,
}

/// A relayed request's reservation, marked ended when its guard drops.
#[derive(Debug)]
struct Relayed {
    admitted: Arc<std::sync::Mutex<Vec<Admitted>>>,
    from: NodeId,
    epoch: u64,
    seq: u64,
}

impl Relayed {
    fn end(&self) {
        let Ok(mut a) = self.admitted.lock() else {
            return;
        };
        if let Some(x) = a
            .iter_mut()
            .find(|x| x.from == self.from && x.boot == self.epoch)
        {
            x.end(self.seq);
        }
    }
}

impl LoadGuard {
    /// The first token arrived: the prompt is no longer pending work.
    pub fn prefill_done(&mut self) {
        let n = std::mem::take(&mut self.prefill_left);
        if n > 0 {
            self.counts.prefill_tokens.fetch_sub(u64::from(n), Relaxed);
        }
    }

    /// `n` more output tokens were produced.
    pub fn decoded(&mut self, n: u32) {
        let n = n.min(self.decode_left);
        if n > 0 {
            self.decode_left -= n;
            self.counts.decode_tokens.fetch_sub(u64::from(n), Relaxed);
        }
    }

    /// A chunk of the answer with `events` stream events passed through:
    /// the prompt is done, and about `events` tokens were produced.
    pub fn progress(&mut self, events: u32) {
        self.prefill_done();
        self.decoded(events);
    }
}

/// A slot held for a request not counted yet ([`LocalLoad::hold`]).
#[derive(Debug)]
pub struct SlotHold {
    counts: Arc<CachePadded<Counts>>,
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        self.counts.in_flight.fetch_sub(1, Relaxed);
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.prefill_done();
        self.decoded(self.decode_left);
        let c = &self.counts;
        c.in_flight.fetch_sub(1, Relaxed);
        c.served.fetch_add(1, Relaxed);
        // After the workload dropped it: a report that says it ended
        // reads a workload without it.
        if let Some(r) = self.relayed.take() {
            r.end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_slot_shows_taken_until_the_hold_drops_and_is_not_served() {
        let load = LocalLoad::new();
        let running = load.begin(100, 50);
        let hold = load.hold();
        let w = load.workload(2);
        assert_eq!((w.running, w.queued), (2, 0));
        assert_eq!((w.prefill_tokens, w.decode_tokens), (100, 50));
        drop(hold);
        assert_eq!(load.workload(2).pending(), 1);
        drop(running);
        assert_eq!(load.workload(2), Workload::default());
        assert_eq!(load.served(), 1);
    }

    /// A report says which of a router's requests it counts and which of
    /// those have ended since: the router can tell a finished request the
    /// workload still counts from one it does not, without clocks.
    #[test]
    fn a_relayed_request_is_admitted_then_ended_as_its_guard_drops() {
        let load = LocalLoad::new();
        let (router, other) = (NodeId::from_u128(7), NodeId::from_u128(8));
        let mut a = load.begin(10, 5);
        load.admit(&mut a, router, (3, 0));
        let mut b = load.begin(10, 5);
        load.admit(&mut b, router, (3, 1));
        let mut c = load.begin(10, 5);
        load.admit(&mut c, other, (9, 0));
        let of = |from: NodeId| {
            load.admitted()
                .into_iter()
                .find(|x| x.from == from)
                .unwrap()
        };
        assert_eq!(of(router).ended(0), Some(false));
        drop(a);
        let r = of(router);
        assert!(r.counts(0) && r.counts(1));
        assert_eq!((r.ended(0), r.ended(1)), (Some(true), Some(false)));
        assert_eq!(of(other).ended(0), Some(false), "another router's own");
        assert_eq!(load.workload(4).running, 2);
        drop(b);
        assert_eq!(of(router).ended(1), Some(true));
        drop(c);
        assert_eq!(of(other).ended(0), Some(true));
        // A guard of a request no router reserved ends nothing.
        drop(load.begin(1, 1));
        assert_eq!(load.admitted().len(), 2);
    }

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

    /// Guards begun on several loops and dropped on another thread: the
    /// totals are the sum over loops, and each guard gives back exactly
    /// what it took from the slot it began on.
    #[tokio::test]
    async fn guards_on_every_loop_add_up_and_release() {
        let load = LocalLoad::new();
        let loops = pair_runtime::runtime::EventLoops::start(3).unwrap();
        let mut guards = Vec::new();
        for i in 0..6u32 {
            let load = Arc::clone(&load);
            let task = loops.spawn_on(usize::try_from(i).unwrap(), async move {
                let mut g = load.begin(10 * (i + 1), 100);
                g.decoded(i);
                (pair_runtime::runtime::current(), g)
            });
            guards.push(task.await.unwrap());
        }
        loops.shutdown(std::time::Duration::from_secs(5)).await;
        let mut loops_seen: Vec<usize> = guards.iter().map(|(l, _)| *l).collect();
        loops_seen.sort_unstable();
        loops_seen.dedup();
        assert!(loops_seen.len() > 1, "guards began on one loop only");
        let w = load.workload(4);
        assert_eq!((w.running, w.queued), (4, 2));
        assert_eq!(w.prefill_tokens, 10 * (1 + 2 + 3 + 4 + 5 + 6));
        assert_eq!(w.decode_tokens, 600 - (1 + 2 + 3 + 4 + 5));
        assert_eq!(load.in_flight(), 6);
        drop(guards);
        assert_eq!(load.workload(1), Workload::default());
        assert_eq!(load.served(), 6);
        for c in load.counts.iter() {
            assert_eq!(c.in_flight.load(Relaxed), 0);
        }
    }
}
