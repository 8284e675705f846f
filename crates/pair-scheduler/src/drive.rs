//! The one loop that runs [`Failover`]: a node's pipeline and the edge SDK
//! both hand it their half of a request ([`Exchange`]: the candidates, the
//! I/O of one attempt, what shows a node's progress) and get back the
//! answer it committed to or why it gave up.
//!
//! The driver owns everything that decides: which step comes next, when an
//! attempt is cut for making no progress, the client's deadline, what is
//! kept of answers that were not committed. The shells own only I/O and
//! their own bookkeeping (a load guard, a reservation, a node marked
//! failed). Time is the shell's too ([`Exchange::now`], [`Timer`]), so the
//! driver runs on any runtime (pair's shells lend it a tokio timer,
//! `pair_link::Rearmed`) and, in tests, on virtual time.
//!
//! Errors say how they fail ([`Classified`]), as pingora's do: a short
//! label, whether another node may take the request, and whether the node
//! only refused for now. The driver never reads error text.

use std::future::Future;
use std::pin::{Pin, pin};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use pair_core::{NodeId, RetryAdvice};

use crate::failover::{Decision, Failover, GiveUp, Outcome, Step, Target};

/// How an attempt's failure classifies itself for the failover rules.
pub trait Classified {
    /// A short, stable label for receipts, job records and metrics
    /// (`connect`, `reset`, `transport`, `tls-refused`, `body`, ...).
    fn class(&self) -> &'static str;
    /// Whether the request may go to another node.
    fn advice(&self) -> RetryAdvice {
        RetryAdvice::BeforeFirstByte
    }
    /// Whether the node refused only for now (a refused or reset
    /// connection: the process is up, or restarting), so it may take the
    /// request again after a back-off.
    fn transient(&self) -> bool;
}

/// A timer the shell lends the driver for its waits and stall checks
/// (a node lends its connection's, already in the timer wheel).
pub trait Timer: Future<Output = ()> {
    /// Fires at `at`, on the request's clock (since its arrival).
    fn rearm(self: Pin<&mut Self>, at: Duration);
}

/// The shell's half of one request's failover.
pub trait Exchange {
    /// An answer's head, its body not yet read.
    type Head;
    /// The answer handed back once committed.
    type Answer;
    /// What is kept of an answer that was not committed, in case every
    /// attempt fails and it is the one the client gets.
    type Kept;
    /// What counting a dispatch on its node holds (a load guard, a
    /// reservation) until the attempt's answer is done with it.
    type Ticket;
    type Error: Classified;

    /// Time since the request arrived.
    fn now(&self) -> Duration;
    /// Resolves at `at` (a fresh timer, for the client's deadline).
    fn sleep_until(&self, at: Duration) -> impl Future<Output = ()>;

    /// The request's candidates now, best first, handed to `decide`
    /// (which asks the failover rules) with whether the model has owners
    /// that are all down for now. `first`: nothing was dispatched yet. The
    /// shell counts a [`Step::Dispatch`] on its node before returning (so
    /// the next request ranked sees it); it may also answer a step of its
    /// own (a short wait while the node is starting).
    fn choose(
        &self,
        first: bool,
        decide: &mut dyn FnMut(&[Target], bool) -> Step,
    ) -> (Step, Option<Self::Ticket>);

    /// Sends the request to `node`, up to the answer's head.
    fn send(
        &self,
        node: NodeId,
        ticket: Option<Self::Ticket>,
    ) -> impl Future<Output = Result<Self::Head, Self::Error>>;

    /// The head's status and its `Retry-After` (the shell's own reaction
    /// to a status, such as re-reading an inventory on a 404, goes here).
    fn status(&self, node: NodeId, head: &Self::Head) -> (u16, Option<Duration>);

    /// Reads on to the answer's first byte (a whole answer, to its end).
    fn first_byte(&self, head: &mut Self::Head) -> impl Future<Output = Result<(), Self::Error>>;

    /// The answer committed to.
    fn commit(&self, node: NodeId, head: Self::Head) -> Self::Answer;

    /// What to keep of an answer that was not committed.
    fn keep(&self, node: NodeId, head: Self::Head) -> impl Future<Output = Option<Self::Kept>>;

    /// When `node` last showed progress on this request, or gave a reason
    /// to wait for it (a model loading, a queue ahead), on the request's
    /// clock; `None`: never. An attempt with none for its stall allowance
    /// is cut.
    fn last_progress(&self, node: NodeId) -> Option<Duration>;

    /// The request's candidates now, best first, as [`Exchange::choose`]
    /// would hand them over (nothing counted): asked when an attempt
    /// makes no progress, to see whether the request has somewhere else to
    /// go before cutting it.
    fn candidates(&self) -> Vec<Target>;

    /// `node`'s attempt was cut for making no progress.
    fn stalled(&self, node: NodeId) {
        let _ = node;
    }

    /// `node`'s attempt makes no progress and the request has nowhere
    /// else to go: it is waited for (said once per attempt, for the job
    /// record).
    fn waiting_alone(&self, node: NodeId) {
        let _ = node;
    }

    /// An attempt failed and was reported (for metrics).
    fn failed(&self, failover: &Failover) {
        let _ = failover;
    }
}

/// How a driven request ended.
#[derive(Debug)]
pub enum Driven<A, K> {
    /// An answer was committed: from here it is the client's, never resent.
    Committed { node: NodeId, answer: A },
    /// Nothing was committed; `kept`: the last answer a node gave.
    GaveUp { why: GiveUp, kept: Option<K> },
}

/// A stall timer that fires this late means this process itself was
/// stopped (or the machine suspended), not the node.
pub const FROZEN: Duration = Duration::from_secs(1);

/// Runs `failover` to its end with `ex` doing the I/O.
pub async fn drive<E: Exchange, T: Timer>(
    ex: &E,
    failover: &mut Failover,
    mut timer: Pin<&mut T>,
) -> Driven<E::Answer, E::Kept> {
    let mut kept = None;
    loop {
        let now = ex.now();
        let first = failover.dispatched() == 0;
        let (step, ticket) = ex.choose(first, &mut |targets, owners_down| {
            if owners_down {
                failover.owners_down();
            }
            failover.next_step(now, targets)
        });
        match step {
            Step::Dispatch {
                node, stall_after, ..
            } => match attempt(ex, failover, node, stall_after, ticket, timer.as_mut()).await {
                Ok(answer) => return Driven::Committed { node, answer },
                Err(k) => {
                    if k.is_some() {
                        kept = k;
                    }
                    ex.failed(failover);
                }
            },
            Step::Wait(d) => {
                drop(ticket);
                timer.as_mut().rearm(now.saturating_add(d));
                timer.as_mut().await;
            }
            Step::GiveUp(why) => return Driven::GaveUp { why, kept },
        }
    }
}

/// How racing an attempt's step against its clocks came out.
enum Raced<R> {
    Done(R),
    Stalled,
    PastDeadline,
}

/// One attempt, reported to `failover`: the committed answer, or what
/// was kept of a failed one.
async fn attempt<E: Exchange, T: Timer>(
    ex: &E,
    failover: &mut Failover,
    node: NodeId,
    stall_after: Duration,
    ticket: Option<E::Ticket>,
    mut timer: Pin<&mut T>,
) -> Result<E::Answer, Option<E::Kept>> {
    let deadline = failover.deadline();
    let head = race(
        ex,
        failover,
        ex.send(node, ticket),
        node,
        stall_after,
        deadline,
        timer.as_mut(),
    )
    .await;
    let mut head = match head {
        Raced::Done(Ok(h)) => h,
        Raced::Done(Err(e)) => {
            failover.report(ex.now(), failed(&e));
            return Err(None);
        }
        Raced::Stalled => return Err(stall(ex, failover, node)),
        Raced::PastDeadline => return Err(past_deadline(ex, failover)),
    };
    let (status, retry_after) = ex.status(node, &head);
    match failover.report(
        ex.now(),
        Outcome::Head {
            status,
            retry_after,
        },
    ) {
        Decision::Commit => return Ok(ex.commit(node, head)),
        Decision::Next => return Err(ex.keep(node, head).await),
        Decision::AwaitFirstByte => {}
    }
    let read = race(
        ex,
        failover,
        ex.first_byte(&mut head),
        node,
        stall_after,
        deadline,
        timer,
    )
    .await;
    let outcome = match read {
        Raced::Done(Ok(())) => Outcome::FirstByte,
        Raced::Done(Err(e)) => failed(&e),
        Raced::Stalled => return Err(stall(ex, failover, node)),
        Raced::PastDeadline => return Err(past_deadline(ex, failover)),
    };
    match failover.report(ex.now(), outcome) {
        Decision::Commit => Ok(ex.commit(node, head)),
        _ => Err(None),
    }
}

fn failed(e: &impl Classified) -> Outcome {
    Outcome::Failed {
        class: e.class(),
        advice: e.advice(),
        transient: e.transient(),
    }
}

#[cold]
fn stall<E: Exchange>(ex: &E, failover: &mut Failover, node: NodeId) -> Option<E::Kept> {
    ex.stalled(node);
    failover.report(ex.now(), Outcome::Stalled);
    None
}

/// An attempt the client's deadline cut (the node is not blamed).
#[cold]
fn past_deadline<E: Exchange>(ex: &E, failover: &mut Failover) -> Option<E::Kept> {
    failover.report(ex.now(), Outcome::PastDeadline);
    None
}

/// `step`, unless its node shows no progress for `allowance` first (and
/// the request has somewhere else to go), or the deadline comes (biased in
/// that order: an answer that is there wins).
async fn race<E: Exchange, T: Timer, R>(
    ex: &E,
    failover: &Failover,
    step: impl Future<Output = R>,
    node: NodeId,
    allowance: Duration,
    deadline: Option<Duration>,
    timer: Pin<&mut T>,
) -> Raced<R> {
    let mut step = pin!(step);
    let mut stall = pin!(stalled(ex, failover, node, allowance, timer));
    let mut past = pin!(async {
        match deadline {
            Some(at) => ex.sleep_until(at).await,
            None => std::future::pending().await,
        }
    });
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = step.as_mut().poll(cx) {
            return Poll::Ready(Raced::Done(r));
        }
        if stall.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Raced::Stalled);
        }
        if past.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Raced::PastDeadline);
        }
        Poll::Pending
    })
    .await
}

/// How often an attempt that makes no progress, with nowhere else to go,
/// looks again for another node (one that joined, or came back).
pub const ALONE_RECHECK: Duration = Duration::from_secs(1);

/// Resolves once `node` has shown no progress for `allowance`, counted
/// from now or its last progress, whichever is later, and the request has
/// somewhere else to go; with nowhere else, not before the failover's
/// silent bound ([`Failover::silent_bound`]).
async fn stalled<E: Exchange, T: Timer>(
    ex: &E,
    failover: &Failover,
    node: NodeId,
    allowance: Duration,
    mut timer: Pin<&mut T>,
) {
    let mut from = ex.now();
    let mut alone = false;
    loop {
        let due = from.saturating_add(allowance);
        timer.as_mut().rearm(due);
        timer.as_mut().await;
        let now = ex.now();
        if now.saturating_sub(due) > FROZEN {
            // The timer fired this late: this process was stopped, not the
            // node. Look again shortly, after what came in meanwhile.
            from = (now + FROZEN).saturating_sub(allowance).max(from);
            continue;
        }
        match ex.last_progress(node) {
            Some(last) if last > from => from = last,
            _ if now >= failover.silent_bound() || failover.elsewhere(node, &ex.candidates()) => {
                return;
            }
            _ => {
                // Slow is an answer; cut, it is none: wait on, looking
                // again shortly for progress or another node.
                if !alone {
                    alone = true;
                    ex.waiting_alone(node);
                }
                let next = now
                    .saturating_add(ALONE_RECHECK)
                    .min(failover.silent_bound());
                from = next.saturating_sub(allowance);
            }
        }
    }
}

/// `Retry-After` (RFC 9110: delay-seconds, or an HTTP date) as a wait from
/// `now`. Seconds past `u64` are as long a wait as there is (the failover
/// rules add waits saturating and bound them by the request's patience).
pub fn retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim_ascii();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(text.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let ra = |v: &str| retry_after(v.as_bytes(), now);
        assert_eq!(ra("5"), Some(Duration::from_secs(5)));
        assert_eq!(ra(" 0 "), Some(Duration::ZERO));
        assert_eq!(
            ra("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(ra(&later), Some(Duration::from_secs(90)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(ra(&earlier), Some(Duration::ZERO));
        for bad in ["", "+5", "-1", "5s", "soon", "\u{a0}5"] {
            assert_eq!(ra(bad), None, "{bad:?}");
        }
    }
}
