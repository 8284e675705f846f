//! Whether an engine is getting anywhere: the last time it sent anything
//! (a head, a token) on any request, the attempts waiting on it, and
//! whether an attempt on it was just cut for making no progress. The
//! request path stamps it; the node's own report says an engine is silent
//! (attempts overdue on it and nothing from it for [`SILENT_AFTER`]: new
//! work goes to other owners first) and takes a stalled one out of routing
//! for a while, so a hung engine (one that still answers its health probe)
//! is routed around within seconds, long before the attempts on it are cut.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// How long an engine stays out of routing after an attempt on it stalled
/// (unless it makes progress first), by default: then one request tries it
/// again (and waits at most its allowance if it is still hung).
pub const STALL_COOLDOWN: Duration = Duration::from_secs(10);

/// The stamp's resolution.
const TICK_MS: u64 = 50;

/// An engine with an attempt overdue on it that has sent nothing, on any
/// request, for this long is silent: ranked after the owners that are not
/// (it is not cut, and takes work when no one else can). Report and
/// gossip add at most an interval each, so a hung engine is routed around
/// within 3 s of its first silent attempt.
pub const SILENT_AFTER: Duration = Duration::from_secs(2);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn stamp(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX)
}

/// One engine's progress.
#[derive(Debug)]
pub struct Progress {
    /// Milliseconds after the epoch of the last progress (0: none yet).
    last: AtomicU64,
    /// Until when (ms after the epoch) the engine counts as stalled.
    stalled_until: AtomicU64,
    /// Stalls in a row with no progress between: each doubles the
    /// cooldown (up to 16 times), so an engine that stays hung is tried
    /// less and less often.
    strikes: AtomicU64,
    cooldown: Duration,
    /// Attempts waiting on it: when each began and when it is overdue
    /// (ms after the epoch). A few at a time; locked once as an attempt
    /// begins and once as it ends, and by the report.
    waiting: Mutex<Vec<Waiting>>,
    next_wait: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    id: u64,
    began: u64,
    due: u64,
}

impl Default for Progress {
    fn default() -> Self {
        Self::with_cooldown(STALL_COOLDOWN)
    }
}

impl Progress {
    /// An engine that stays out of routing for `cooldown` after a stall.
    pub fn with_cooldown(cooldown: Duration) -> Self {
        // The stamps count from the first engine made, not from the first
        // stamp read.
        epoch();
        Self {
            last: AtomicU64::new(0),
            stalled_until: AtomicU64::new(0),
            strikes: AtomicU64::new(0),
            cooldown,
            waiting: Mutex::new(Vec::new()),
            next_wait: AtomicU64::new(0),
        }
    }

    /// An attempt on the engine begins, expected to show something
    /// within `expect` (the scheduler's prediction of its first byte, or
    /// of the whole answer when it is not streamed); it counts until the
    /// returned guard is dropped (its answer ended or it was given up).
    pub fn engage(self: &Arc<Self>, expect: Duration) -> Engaged {
        let began = stamp(Instant::now());
        // Predictions run short: overdue at twice the prediction, and
        // never before the engine has been silent for `SILENT_AFTER`.
        let late = expect.saturating_mul(2).max(SILENT_AFTER);
        let due = began.saturating_add(u64::try_from(late.as_millis()).unwrap_or(u64::MAX));
        let id = self.next_wait.fetch_add(1, Relaxed);
        if let Ok(mut w) = self.waiting.lock() {
            w.push(Waiting { id, began, due });
        }
        Engaged {
            progress: Arc::clone(self),
            id,
        }
    }

    /// Whether an attempt is overdue on it and it has sent nothing, on
    /// any request, for [`SILENT_AFTER`] (since that attempt began): it
    /// may be hung, and new work goes to other owners first.
    pub fn silent(&self) -> bool {
        let now = stamp(Instant::now());
        let last = self.last.load(Relaxed);
        let quiet = u64::try_from(SILENT_AFTER.as_millis()).unwrap_or(u64::MAX);
        self.waiting.lock().is_ok_and(|w| {
            w.iter()
                .any(|a| now >= a.due && now.saturating_sub(last.max(a.began)) >= quiet)
        })
    }

    /// The engine sent something: it is alive and working.
    pub fn touch(&self) {
        let now = stamp(Instant::now()).max(1);
        // Every token of every stream lands here: write the shared stamp
        // only when it moves by a tick.
        let last = self.last.load(Relaxed);
        // The first stamp always lands (one within a tick of the epoch
        // would otherwise read as none).
        if last == 0 || now.saturating_sub(last) >= TICK_MS {
            self.last.fetch_max(now, Relaxed);
        }
        if self.stalled_until.load(Relaxed) != 0 {
            self.stalled_until.store(0, Relaxed);
        }
        if self.strikes.load(Relaxed) != 0 {
            self.strikes.store(0, Relaxed);
        }
    }

    /// Its poller saw its token counters move at `unix_ms` (work on a
    /// prompt, or for a client pair does not see): progress as of then.
    pub fn worked_at(&self, unix_ms: u64) {
        let ago = pair_core::unix_ms(std::time::SystemTime::now()).saturating_sub(unix_ms);
        let at = Instant::now()
            .checked_sub(Duration::from_millis(ago))
            .unwrap_or_else(epoch);
        if stamp(at) > self.last.load(Relaxed) {
            self.last.fetch_max(stamp(at).max(1), Relaxed);
            self.stalled_until.store(0, Relaxed);
            self.strikes.store(0, Relaxed);
        }
    }

    /// When it last sent anything, if it ever did.
    pub fn last_seen(&self) -> Option<Instant> {
        match self.last.load(Relaxed) {
            0 => None,
            ms => Some(epoch() + Duration::from_millis(ms)),
        }
    }

    /// An attempt on it made no progress within its allowance.
    pub fn mark_stalled(&self) {
        if self.stalled() {
            // The other attempts that were waiting on it when it hung:
            // one stall, one strike.
            return;
        }
        let strikes = self.strikes.fetch_add(1, Relaxed).min(4);
        let until = stamp(Instant::now() + self.cooldown * (1u32 << strikes));
        self.stalled_until.store(until, Relaxed);
    }

    /// Whether it counts as stalled now (out of routing).
    pub fn stalled(&self) -> bool {
        let until = self.stalled_until.load(Relaxed);
        until != 0 && stamp(Instant::now()) < until
    }
}

/// An attempt waiting on an engine ([`Progress::engage`]); derefs to the
/// engine's [`Progress`].
#[derive(Debug)]
pub struct Engaged {
    progress: Arc<Progress>,
    id: u64,
}

impl std::ops::Deref for Engaged {
    type Target = Progress;

    fn deref(&self) -> &Progress {
        &self.progress
    }
}

impl Drop for Engaged {
    fn drop(&mut self) {
        if let Ok(mut w) = self.progress.waiting.lock()
            && let Some(at) = w.iter().position(|a| a.id == self.id)
        {
            w.swap_remove(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_engine_with_an_overdue_attempt_and_nothing_sent_is_silent() {
        let p = Arc::new(Progress::default());
        p.touch();
        let step = Duration::from_millis(100);
        // Predicted at 3 s: overdue at 6 s, not at the silence's 2 s.
        let slow = p.engage(Duration::from_secs(3));
        tokio::time::advance(SILENT_AFTER + step).await;
        assert!(!p.silent(), "not yet overdue");
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(p.silent(), "overdue and nothing for 6 s");
        // Anything from the engine, on any request, is progress.
        p.touch();
        assert!(!p.silent());
        tokio::time::advance(SILENT_AFTER - step).await;
        assert!(!p.silent(), "quiet for less than the silence");
        tokio::time::advance(step * 2).await;
        assert!(p.silent());
        drop(slow);
        assert!(!p.silent(), "nothing waits on it");
        // A quick prediction: silent at `SILENT_AFTER`, counted from the
        // attempt's start (what the engine did before is not held against
        // it, nor for it).
        let quick = p.engage(Duration::from_millis(50));
        tokio::time::advance(SILENT_AFTER - step).await;
        assert!(!p.silent());
        tokio::time::advance(step * 2).await;
        assert!(p.silent());
        // Only the attempts still waiting count.
        let other = p.engage(Duration::ZERO);
        drop(quick);
        assert!(!p.silent(), "the other attempt has just begun");
        drop(other);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stall_lasts_its_cooldown_or_until_progress() {
        let p = Progress::default();
        let before = Instant::now();
        p.touch();
        assert!(p.last_seen().unwrap() >= before - Duration::from_millis(1));
        p.mark_stalled();
        assert!(p.stalled());
        tokio::time::advance(STALL_COOLDOWN + Duration::from_millis(5)).await;
        assert!(!p.stalled(), "the cooldown ended");
        p.mark_stalled();
        p.touch();
        assert!(!p.stalled(), "progress ends it at once");
    }

    #[tokio::test]
    async fn token_counters_that_moved_are_progress_and_end_a_stall() {
        let p = Progress::default();
        p.touch();
        let first = p.last_seen().unwrap();
        p.mark_stalled();
        // Counters that moved before the last progress change nothing.
        p.worked_at(pair_core::unix_ms(std::time::SystemTime::now()) - 60_000);
        assert!(p.stalled());
        assert_eq!(p.last_seen(), Some(first));
        tokio::time::sleep(Duration::from_millis(2 * TICK_MS)).await;
        p.worked_at(pair_core::unix_ms(std::time::SystemTime::now()));
        assert!(!p.stalled(), "the engine is working");
        assert!(p.last_seen().unwrap() > first);
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_that_stays_hung_is_tried_less_and_less_often() {
        let base = Duration::from_secs(3);
        let p = Progress::with_cooldown(base);
        let step = Duration::from_millis(100);
        for times in [1u32, 2, 4, 8, 16, 16] {
            p.mark_stalled();
            p.mark_stalled();
            tokio::time::advance(base * times - step).await;
            assert!(p.stalled(), "{times}x");
            tokio::time::advance(step * 2).await;
            assert!(!p.stalled(), "{times}x");
        }
        // Progress forgives it.
        p.touch();
        p.mark_stalled();
        tokio::time::advance(base + step).await;
        assert!(!p.stalled());
    }
}
