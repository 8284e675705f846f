//! The cap on a node's open connections (faces and cluster port together),
//! so idle or stalled clients cannot take every file descriptor.
//!
//! At the cap, the connection that has been idle longest (a keep-alive
//! connection waiting for its next request, or one that has sent nothing
//! yet) is closed to make room, as nginx does when it runs short of
//! connections; with none idle, the new connection is refused (the faces
//! answer it 503). Marking a connection idle or busy touches only that
//! connection's own state; the registry is locked when a connection opens
//! or closes, and scanned only at the cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// How long a client of a face may take: deadlines that close idle and
/// stalled connections, so a slow or silent client holds a descriptor and
/// its buffers only for a bounded time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientDeadlines {
    /// A keep-alive connection with no request for this long is closed
    /// (nginx's `keepalive_timeout` is 75 s).
    pub idle: Duration,
    /// A request head must be whole this long after its first byte.
    pub head: Duration,
    /// A body must end this long after its head, plus a second for every
    /// [`ClientDeadlines::body_min_rate`] bytes that arrived (Apache's
    /// `mod_reqtimeout` rule): a client must keep sending, whatever length
    /// it declared.
    pub body_grace: Duration,
    pub body_min_rate: u64,
    /// A body with no byte for this long is cut, however much it sent
    /// before: what it earned by sending fast is not a licence to stall.
    pub body_stall: Duration,
}

impl Default for ClientDeadlines {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(60),
            head: Duration::from_secs(10),
            body_grace: Duration::from_secs(10),
            body_min_rate: 16 * 1024,
            body_stall: Duration::from_secs(10),
        }
    }
}

impl ClientDeadlines {
    /// When a body that started at `start`, has `received` bytes so far and
    /// got its last byte at `last`, must have ended or sent more: the
    /// sooner of its allowance (a grace plus a second per
    /// [`Self::body_min_rate`] bytes) and its last byte plus
    /// [`Self::body_stall`].
    pub fn body_deadline(&self, start: Instant, received: u64, last: Instant) -> Instant {
        let rate = self.body_min_rate.max(1);
        let earned =
            start + self.body_grace + Duration::from_millis(received.saturating_mul(1000) / rate);
        earned.min(last + self.body_stall)
    }
}

/// How many request body bytes the node holds while they arrive, across
/// every connection: a body that would take it past its cap is answered
/// 503 before any of it is read, so many clients each sending a large body
/// slowly cannot take the node's memory between them.
#[derive(Debug)]
pub struct BodyBudget {
    cap: usize,
    held: std::sync::atomic::AtomicUsize,
}

impl BodyBudget {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap,
            held: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Takes `len` bytes of the budget until the permit is dropped; `None`
    /// when they are not there.
    pub fn take(self: &Arc<Self>, len: usize) -> Option<BodyPermit> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(len).filter(|&n| n <= self.cap)
            })
            .ok()
            .map(|_| BodyPermit {
                budget: Arc::clone(self),
                len,
            })
    }
}

/// Bytes of the [`BodyBudget`] a body being read holds.
#[derive(Debug)]
pub struct BodyPermit {
    budget: Arc<BodyBudget>,
    len: usize,
}

impl BodyPermit {
    /// Takes `more` bytes on top of what the permit holds (a body of
    /// unknown length, as it arrives); `false`, holding what it held, when
    /// they are not there.
    pub fn grow(&mut self, more: usize) -> bool {
        let cap = self.budget.cap;
        let grown = self
            .budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|&n| n <= cap)
            })
            .is_ok();
        if grown {
            self.len += more;
        }
        grown
    }

    /// Gives `less` bytes back to the budget (a buffer that was held twice
    /// while it moved).
    pub fn shrink(&mut self, less: usize) {
        let less = less.min(self.len);
        self.budget.held.fetch_sub(less, Ordering::AcqRel);
        self.len -= less;
    }
}

impl Drop for BodyPermit {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.len, Ordering::AcqRel);
    }
}

/// Descriptors kept back from the cap for engine connections, peer links,
/// the job log, mDNS and the listeners themselves.
pub const FD_RESERVE: u64 = 128;

/// The cap that fits an open-file limit of `nofile` descriptors.
pub fn cap_for_fd_limit(nofile: u64) -> usize {
    usize::try_from(nofile.saturating_sub(FD_RESERVE).max(16)).unwrap_or(usize::MAX)
}

/// The open connections and the cap on them.
#[derive(Debug)]
pub struct ConnLimit {
    cap: usize,
    epoch: Instant,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    open: HashMap<u64, Arc<ConnState>>,
}

#[derive(Debug)]
struct ConnState {
    /// 0 while busy; otherwise 1 + the milliseconds since the limit's
    /// epoch at which it went idle.
    idle_since: AtomicU64,
    /// Cancelled when the connection is closed to make room.
    evicted: CancellationToken,
}

impl ConnLimit {
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            epoch: Instant::now(),
            registry: Mutex::new(Registry::default()),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Open connections counted.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // The registry is consistent after every statement: a panic while
        // it was held tore nothing.
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a new connection, idle until it says otherwise; at the cap
    /// the longest-idle connection is evicted for it. `None`: at the cap
    /// with every connection busy.
    pub fn admit(self: &Arc<Self>) -> Option<ConnGuard> {
        let mut r = self.lock();
        if r.open.len() >= self.cap {
            let oldest = r
                .open
                .iter()
                .filter_map(|(id, c)| {
                    let since = c.idle_since.load(Ordering::Relaxed);
                    (since != 0).then_some((since, *id))
                })
                .min()
                .map(|(_, id)| id)?;
            if let Some(evicted) = r.open.remove(&oldest) {
                evicted.evicted.cancel();
            }
        }
        let id = r.next_id;
        r.next_id += 1;
        let state = Arc::new(ConnState {
            idle_since: AtomicU64::new(self.stamp()),
            evicted: CancellationToken::new(),
        });
        r.open.insert(id, Arc::clone(&state));
        drop(r);
        Some(ConnGuard {
            limit: Arc::clone(self),
            id,
            state,
        })
    }

    fn stamp(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }
}

/// One counted connection; dropping it uncounts it.
#[derive(Debug)]
pub struct ConnGuard {
    limit: Arc<ConnLimit>,
    id: u64,
    state: Arc<ConnState>,
}

impl ConnGuard {
    /// Waiting for a request: may be closed to make room.
    pub fn idle(&self) {
        self.state
            .idle_since
            .store(self.limit.stamp(), Ordering::Relaxed);
    }

    /// Reading or answering a request: never closed to make room.
    pub fn busy(&self) {
        self.state.idle_since.store(0, Ordering::Relaxed);
    }

    /// Resolves when the connection was closed to make room.
    pub fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.state.evicted.cancelled()
    }

    pub fn is_evicted(&self) -> bool {
        self.state.evicted.is_cancelled()
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        // An evicted connection was uncounted when it was evicted.
        if !self.state.evicted.is_cancelled() {
            self.limit.lock().open.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_longest_idle_connection_makes_room() {
        let limit = ConnLimit::new(3);
        let a = limit.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = limit.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = limit.admit().unwrap();
        a.busy();
        // b went idle before c: b is evicted.
        let d = limit.admit().unwrap();
        assert!(b.is_evicted() && !a.is_evicted() && !c.is_evicted());
        assert_eq!(limit.open(), 3);
        drop(b);
        assert_eq!(limit.open(), 3, "an evicted guard was already uncounted");
        // Everyone busy: refused.
        c.busy();
        d.busy();
        assert!(limit.admit().is_none());
        // One goes idle again: it makes room.
        d.idle();
        let e = limit.admit().unwrap();
        assert!(d.is_evicted());
        drop((a, c, e));
        assert_eq!(limit.open(), 0);
    }

    #[test]
    fn a_body_s_deadline_moves_with_what_arrived_but_not_past_a_stall() {
        let d = ClientDeadlines::default();
        let t = Instant::now();
        assert_eq!(d.body_deadline(t, 0, t), t + Duration::from_secs(10));
        let s = t + Duration::from_secs(3);
        assert_eq!(
            d.body_deadline(t, 16 * 1024 * 5, s),
            t + Duration::from_secs(13),
            "a stall after the last byte ends it before the allowance"
        );
        // 32 MiB sent at once earns 2048 s of allowance; a stall of 10 s
        // ends it all the same.
        assert_eq!(
            d.body_deadline(t, 32 << 20, t + Duration::from_secs(1)),
            t + Duration::from_secs(11)
        );
        let slow = t + Duration::from_secs(1);
        assert_eq!(d.body_deadline(t, 0, slow), t + Duration::from_secs(10));
    }

    #[test]
    fn a_permit_grows_while_the_budget_has_room() {
        let b = BodyBudget::new(100);
        let mut p = b.take(0).unwrap();
        assert!(p.grow(60));
        assert!(!p.grow(41), "past the cap");
        assert_eq!(b.held(), 60, "a refused step holds nothing more");
        assert!(p.grow(40));
        assert!(b.take(1).is_none());
        p.shrink(30);
        assert_eq!(b.held(), 70, "a shrink gives its bytes back");
        p.shrink(500);
        assert_eq!(b.held(), 0, "never more than the permit held");
        assert!(b.take(100).is_some());
        drop(p);
        assert_eq!(b.held(), 0);
    }

    #[test]
    fn the_body_budget_is_held_while_permits_live() {
        let b = BodyBudget::new(100);
        let p1 = b.take(60).unwrap();
        assert!(b.take(41).is_none(), "over the cap");
        let p2 = b.take(40).unwrap();
        assert_eq!(b.held(), 100);
        drop(p1);
        assert_eq!(b.held(), 40);
        assert!(b.take(60).is_some());
        drop(p2);
        assert_eq!(b.held(), 0);
        assert!(b.take(101).is_none(), "never more than the cap at once");
    }

    #[test]
    fn the_cap_leaves_a_reserve_of_descriptors() {
        assert_eq!(cap_for_fd_limit(1024), 896);
        assert_eq!(cap_for_fd_limit(10), 16);
    }
}
