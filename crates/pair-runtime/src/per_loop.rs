//! State a request writes, kept once per event loop ([`crate::runtime`])
//! so the loops never write the same cache line: a counter both loops
//! bump on every request moves between their cores each time, which made
//! a request's bookkeeping several times dearer on two loops than on one
//! (pair-proxy's criterion bench `bookkeeping` measures it). Each loop
//! writes its own slot; readers (the `/metrics` scrape, the Jobs view,
//! ranking) add the slots up.
//!
//! A slot is picked by [`crate::runtime::current`], so threads outside the
//! extra loops (the node's own runtime, tests) share slot 0: slots hold
//! atomics or locks, and sharing one is only slower, never wrong.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

/// At most this many slots: more loops than this share them.
const MAX_SLOTS: usize = 64;

/// How many slots each [`PerLoop`] has: one per core (at least the default
/// number of event loops, which is the cores up to four), at most 64.
pub fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, MAX_SLOTS)
    })
}

/// One `T` per event loop, each on cache lines of its own.
#[derive(Debug)]
pub struct PerLoop<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T: Default> Default for PerLoop<T> {
    fn default() -> Self {
        Self::new_with(T::default)
    }
}

impl<T> PerLoop<T> {
    /// [`slots`] slots, each made by `make`.
    pub fn new_with(make: impl FnMut() -> T) -> Self {
        Self::with_slots(slots(), make)
    }

    /// `n` slots (at least one), each made by `make`.
    pub fn with_slots(n: usize, mut make: impl FnMut() -> T) -> Self {
        Self {
            slots: (0..n.max(1)).map(|_| CachePadded::new(make())).collect(),
        }
    }

    /// The calling event loop's slot (loops past the number of slots
    /// share them, round the ring).
    pub fn local(&self) -> &T {
        &self.slots[crate::runtime::current() % self.slots.len()]
    }

    /// Every slot, for adding up.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

/// A value every request reads and that seldom changes (the cluster
/// snapshot, twice a second), copied once per event loop. A request keeps
/// an `Arc` of it while it runs: taking one of a single shared copy writes
/// that copy's reference count, a cache line every loop would write twice
/// per request.
#[derive(Debug)]
pub struct PerLoopArc<T> {
    copies: PerLoop<ArcSwap<T>>,
}

impl<T: Clone> PerLoopArc<T> {
    pub fn new(value: T) -> Self {
        Self::new_each(|| value.clone())
    }

    /// Replaces every loop's copy.
    pub fn store(&self, value: T) {
        self.store_each(|| value.clone());
    }
}

impl<T> PerLoopArc<T> {
    /// Each loop's copy made by `copy`: for a value whose `Clone` shares
    /// what it holds (an `Arc`, a `Bytes`), a copy that does not.
    pub fn new_each(mut copy: impl FnMut() -> T) -> Self {
        Self {
            copies: PerLoop::new_with(|| ArcSwap::new(Arc::new(copy()))),
        }
    }

    /// Replaces every loop's copy with one made by `copy`.
    pub fn store_each(&self, mut copy: impl FnMut() -> T) {
        for slot in self.copies.iter() {
            slot.store(Arc::new(copy()));
        }
    }

    /// The calling loop's copy.
    pub fn load_full(&self) -> Arc<T> {
        self.copies.local().load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn slots_are_padded_apart_and_this_thread_writes_the_first() {
        let p: PerLoop<AtomicU64> = PerLoop::with_slots(3, AtomicU64::default);
        let at: Vec<usize> = p.iter().map(|s| std::ptr::from_ref(s) as usize).collect();
        assert!(
            at.windows(2).all(|w| w[1] - w[0] >= 64),
            "slots share a line: {at:x?}"
        );
        // This test's thread is no extra loop: slot 0.
        p.local().fetch_add(1, Relaxed);
        let per: Vec<u64> = p.iter().map(|s| s.load(Relaxed)).collect();
        assert_eq!(per, [1, 0, 0]);
    }

    /// Each loop reads a copy of its own, and a store reaches every copy.
    #[tokio::test]
    async fn per_loop_copies_are_distinct_and_all_replaced() {
        let v = Arc::new(PerLoopArc::new(vec![1u32]));
        let loops = crate::runtime::EventLoops::start(2).unwrap();
        let read_on = |i: usize| {
            let v = Arc::clone(&v);
            loops.spawn_on(i, async move { v.load_full() })
        };
        let (a, b) = (read_on(0).await.unwrap(), read_on(1).await.unwrap());
        assert_eq!((a.as_slice(), b.as_slice()), (&[1][..], &[1][..]));
        if slots() > 1 {
            assert!(!Arc::ptr_eq(&a, &b), "both loops share one copy");
        }
        v.store(vec![2]);
        let (a, b) = (read_on(0).await.unwrap(), read_on(1).await.unwrap());
        assert_eq!((a.as_slice(), b.as_slice()), (&[2][..], &[2][..]));
        loops.shutdown(std::time::Duration::from_secs(5)).await;
    }
}
