//! State a request writes, kept once per event loop ([`crate::loops`]) so
//! the loops never write the same cache line: a counter both loops bump
//! on every request moves between their cores each time (~100-200 ns a
//! move here), which made a request's bookkeeping cost 4x as much on two
//! loops as on one (bench `bookkeeping`, docs/benchmarks/proxy.md). Each
//! loop writes its own slot; readers (the `/metrics` scrape, the Jobs
//! view, ranking) add the slots up.
//!
//! A slot is picked by [`crate::loops::current`], so threads outside the
//! extra loops (the node's own runtime, tests) share slot 0: slots hold
//! atomics or locks, and sharing one is only slower, never wrong.

use std::sync::OnceLock;

use crossbeam_utils::CachePadded;

/// At most this many slots: more loops than this share them.
const MAX_SLOTS: usize = 64;

/// How many slots each [`PerLoop`] has: one per core (the default number
/// of event loops), at most [`MAX_SLOTS`].
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

    /// The calling event loop's slot.
    pub fn local(&self) -> &T {
        self.at(self.local_index())
    }

    /// Which slot [`PerLoop::local`] is, to come back to it from
    /// elsewhere ([`PerLoop::at`]).
    pub fn local_index(&self) -> usize {
        crate::loops::current() % self.slots.len()
    }

    /// The slot at `i` (taken modulo the number of slots).
    pub fn at(&self, i: usize) -> &T {
        &self.slots[i % self.slots.len()]
    }

    /// Every slot, for adding up.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn slots_are_padded_apart_and_add_up() {
        let p: PerLoop<AtomicU64> = PerLoop::with_slots(3, AtomicU64::default);
        let a = std::ptr::from_ref(p.at(0)) as usize;
        let b = std::ptr::from_ref(p.at(1)) as usize;
        assert!(b - a >= 64, "slots {a:#x} and {b:#x} share a line");
        for i in 0..7 {
            p.at(i).fetch_add(1, Relaxed);
        }
        let per: Vec<u64> = p.iter().map(|s| s.load(Relaxed)).collect();
        assert_eq!(per, [3, 2, 2], "indices wrap round");
        // This test's thread is no extra loop: slot 0.
        assert_eq!(p.local_index(), 0);
    }
}
