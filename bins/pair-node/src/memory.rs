//! Giving freed memory back. mimalloc returns memory freed in large
//! blocks (request bodies of up to 32 MiB) to the OS only when a thread
//! next allocates or frees such a block, once a short delay has passed: a
//! node that goes quiet after a flood of uploads would keep their
//! high-water mark for good, past its body budget. Once a second, a thread
//! of its own hands back what has waited out the delay.

// mimalloc's `mi_collect` is a C function: the one call here is unsafe
// code, allowed in this module alone.
#![allow(unsafe_code)]

use std::time::Duration;

/// How often freed memory past mimalloc's delay goes back to the OS.
const EVERY: Duration = Duration::from_secs(1);

/// Starts the thread that returns freed memory (for the commands that
/// serve: `run` and `demo`).
pub(crate) fn return_freed_memory() {
    let started = std::thread::Builder::new()
        .name("pair-memory".into())
        .spawn(|| {
            loop {
                std::thread::sleep(EVERY);
                // SAFETY: mi_collect has no preconditions; with `false` it
                // only returns memory already freed and past its delay.
                unsafe { libmimalloc_sys::mi_collect(false) };
            }
        });
    if let Err(e) = started {
        tracing::warn!(error = %e, "cannot start the thread that returns freed memory");
    }
}
