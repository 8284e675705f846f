//! Thread per core: the node's connections are dealt round-robin over N
//! event loops. Loop 0 is the runtime that started the node (it also runs
//! the control plane: pollers, gossip, discovery, the accept loops); loops
//! 1..N are current-thread tokio runtimes on threads of their own. Each
//! loop has its own upstream pool (the caller picks the client of the
//! loop it runs on, [`current`]), so a request, its upstream connection
//! and its answer's body all stay on one thread: no cross-thread wake-ups,
//! no work stealing, no locks contended on the hot path.
//!
//! Why: one current-thread runtime costs the least CPU per request but
//! stops at one core; tokio's multi-thread runtime uses every core but
//! costs about a quarter more CPU per request in cross-worker wake-ups on
//! a 2-core box. This is nginx's model (one event loop per worker) with
//! tokio's runtime in each loop.

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Every loop keeps one timer this far ahead at all times. Tokio's timer
/// wheel wakes its driver (an eventfd write, a syscall) whenever a new
/// timer becomes the earliest one; without an anchor, a loop whose wheel
/// emptied between requests paid that for every request's first-byte
/// deadline (minutes away). One wake-up a second per idle loop is the cost.
const TIMER_ANCHOR: std::time::Duration = std::time::Duration::from_secs(1);

async fn anchor(stop: CancellationToken) {
    let mut tick = tokio::time::interval(TIMER_ANCHOR);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
    }
}

thread_local! {
    static LOOP: Cell<usize> = const { Cell::new(0) };
}

/// Which event loop this thread runs: 1.. on the extra loops' threads, 0
/// anywhere else (the node's own runtime, tests' runtimes).
pub fn current() -> usize {
    LOOP.with(Cell::get)
}

/// The node's event loops. The extra loops' threads stop on
/// [`EventLoops::shutdown`] (after the faces have drained their
/// connections) or when this is dropped.
#[derive(Debug)]
pub struct EventLoops {
    extra: Vec<Handle>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    next: AtomicUsize,
    stop: CancellationToken,
}

impl EventLoops {
    /// Just the caller's loop.
    fn caller_only() -> Self {
        Self {
            extra: Vec::new(),
            threads: std::sync::Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
            stop: CancellationToken::new(),
        }
    }

    /// Everything on the caller's runtime (one loop).
    pub fn single() -> Arc<Self> {
        Arc::new(Self::caller_only())
    }

    /// `n` loops in all: the caller's runtime and `n - 1` new threads.
    /// Must be called on a tokio runtime (loop 0).
    pub fn start(n: usize) -> std::io::Result<Arc<Self>> {
        // Built in place, so an error half-way drops it and the threads
        // already running see `stop`.
        let mut loops = Self::caller_only();
        tokio::spawn(anchor(loops.stop.clone()));
        for i in 1..n.max(1) {
            // Each runtime is built (and dropped) on its own thread: a
            // runtime dropped here, in async code, would panic.
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let stop = loops.stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("pair-loop-{i}"))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    LOOP.with(|l| l.set(i));
                    if tx.send(Ok(rt.handle().clone())).is_ok() {
                        rt.block_on(anchor(stop));
                    }
                })?;
            let handle = rx
                .recv()
                .map_err(|_| std::io::Error::other("event loop thread ended at start"))??;
            loops.extra.push(handle);
            if let Ok(mut t) = loops.threads.lock() {
                t.push(thread);
            }
        }
        Ok(Arc::new(loops))
    }

    /// Stops the extra loops and waits (up to `limit`) for their threads,
    /// dropping whatever still runs on them: call it once the faces have
    /// drained (or their grace ran out), so state those tasks hold (the
    /// job log, which flushes when dropped) is released before exit.
    pub async fn shutdown(&self, limit: std::time::Duration) {
        self.stop.cancel();
        let threads = self
            .threads
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        let deadline = tokio::time::Instant::now() + limit;
        for t in threads {
            while !t.is_finished() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("an event loop did not stop in time");
            }
        }
    }

    /// How many loops there are (at least 1).
    pub fn len(&self) -> usize {
        self.extra.len() + 1
    }

    /// Always false: there is at least the caller's loop.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Runs `task` on loop `i` (`i % len()`): on one of the extra loops'
    /// threads, or for loop 0 on the caller's runtime (a tokio runtime,
    /// as for [`EventLoops::start`]). For work that must run where a
    /// connection would (tests, benches).
    pub fn spawn_on<F>(&self, i: usize, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match (i % self.len())
            .checked_sub(1)
            .and_then(|j| self.extra.get(j))
        {
            Some(handle) => handle.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Serves `tcp` with `serve` on the next loop, tracked by `tasks`.
    pub fn spawn<F, Fut>(&self, tasks: &TaskTracker, tcp: TcpStream, serve: F)
    where
        F: FnOnce(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.len();
        let Some(handle) = i.checked_sub(1).and_then(|j| self.extra.get(j)) else {
            tasks.spawn(serve(tcp));
            return;
        };
        // The socket leaves this loop's reactor and joins the other's.
        let tcp = match tcp.into_std() {
            Ok(tcp) => tcp,
            Err(error) => {
                tracing::warn!(%error, "could not hand a connection to another event loop");
                return;
            }
        };
        handle.spawn(tasks.track_future(async move {
            match TcpStream::from_std(tcp) {
                Ok(tcp) => serve(tcp).await,
                Err(error) => tracing::warn!(%error, "event loop could not take a connection"),
            }
        }));
    }
}

impl Drop for EventLoops {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Connections are dealt round-robin, each served on its loop's thread,
    /// and the tracker sees them finish.
    #[tokio::test]
    async fn connections_are_dealt_over_every_loop() {
        let loops = EventLoops::start(3).unwrap();
        assert_eq!(loops.len(), 3);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tasks = TaskTracker::new();
        let mut seen = Vec::new();
        for _ in 0..6 {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let (tcp, _) = listener.accept().await.unwrap();
            loops.spawn(&tasks, tcp, |mut tcp| async move {
                let which = u8::try_from(current()).unwrap();
                let _ = tcp.write_all(&[which]).await;
            });
            let mut b = [0u8; 1];
            client.read_exact(&mut b).await.unwrap();
            seen.push(b[0]);
        }
        assert_eq!(seen, [0, 1, 2, 0, 1, 2]);
        tasks.close();
        tokio::time::timeout(std::time::Duration::from_secs(5), tasks.wait())
            .await
            .unwrap();
        // Shutdown ends the loop threads (and drops what still runs there).
        let (held, release) = tokio::sync::oneshot::channel::<()>();
        // After six connections the seventh goes to loop 0 and the eighth,
        // held open forever, to loop 1.
        let _first = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        loops.spawn(&tasks, tcp, |_tcp| async {});
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        loops.spawn(&tasks, tcp, move |_tcp| async move {
            let _keep = held;
            std::future::pending::<()>().await;
        });
        loops.shutdown(std::time::Duration::from_secs(5)).await;
        assert!(loops.threads.lock().unwrap().is_empty());
        // The task on loop 1 was dropped with its runtime.
        let dropped = tokio::time::timeout(std::time::Duration::from_secs(5), release).await;
        assert!(dropped.unwrap().is_err());
        let mut b = [0u8; 1];
        assert_eq!(client.read(&mut b).await.unwrap(), 0, "its socket closed");
    }
}
