//! Whether an engine is getting anywhere: the last time it sent anything
//! (a head, a token) on any request, and whether an attempt on it was just
//! cut for making no progress. The request path stamps it; the node's own
//! report takes a stalled engine out of routing for a while, so a hung
//! engine (one that still answers its health probe) is routed around.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// How long an engine stays out of routing after an attempt on it stalled
/// (unless it makes progress first), by default: then one request tries it
/// again (and waits at most its allowance if it is still hung).
pub const STALL_COOLDOWN: Duration = Duration::from_secs(10);

/// The stamp's resolution.
const TICK_MS: u64 = 50;

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
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
