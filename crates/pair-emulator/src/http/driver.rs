//! Runs the pure [`EngineModel`] in real time: maps the wall clock (scaled by
//! `time_scale`) to the model's virtual microseconds, wakes when the next
//! event or token is due, and tells each waiting request how far it got.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use pair_core::PromptChain;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{EmulatorError, EngineEvent, EngineModel, JobSpec, JobTiming};

/// How far one request got, as its handler sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Tokens available to send.
    pub tokens: u32,
    /// Prefill finished (the first token or the embedding is ready).
    pub first_token: bool,
    pub done: Option<JobTiming>,
}

struct State {
    model: EngineModel,
    jobs: HashMap<u64, watch::Sender<Progress>>,
    next_id: u64,
}

/// The model shared between the driver task and the request handlers.
#[derive(Clone)]
pub(crate) struct Core {
    state: Arc<Mutex<State>>,
    wake: Arc<Notify>,
    start: Instant,
    time_scale: f64,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("time_scale", &self.time_scale)
            .finish_non_exhaustive()
    }
}

/// Cancels the job in the model when the handler lets go of it (client gone,
/// connection dropped by a fault) before it finished.
pub(crate) struct JobGuard {
    core: Core,
    id: u64,
    pub progress: watch::Receiver<Progress>,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        if self.progress.borrow().done.is_none() {
            let now = self.core.now_us();
            let mut st = self.core.lock();
            st.model.cancel(now, self.id);
            st.jobs.remove(&self.id);
            drop(st);
            self.core.wake.notify_one();
        }
    }
}

impl Core {
    pub(crate) fn new(model: EngineModel, time_scale: f64) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                model,
                jobs: HashMap::new(),
                next_id: 1,
            })),
            wake: Arc::new(Notify::new()),
            start: Instant::now(),
            time_scale,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Virtual microseconds since the engine started.
    pub(crate) fn now_us(&self) -> u64 {
        (self.start.elapsed().as_secs_f64() * 1e6 / self.time_scale) as u64
    }

    fn instant_of(&self, virtual_us: u64) -> Instant {
        self.start + Duration::from_secs_f64(virtual_us as f64 / 1e6 * self.time_scale)
    }

    /// Runs `f` on the model with its clock brought up to now.
    pub(crate) fn with_model<T>(&self, f: impl FnOnce(&EngineModel, u64) -> T) -> T {
        let now = self.now_us();
        let st = self.lock();
        f(&st.model, now)
    }

    /// Queues a job; the guard's receiver reports its progress.
    pub(crate) fn submit(
        &self,
        model: usize,
        prompt_tokens: u32,
        output_tokens: u32,
        prompt: PromptChain,
    ) -> Result<JobGuard, EmulatorError> {
        let now = self.now_us();
        let mut st = self.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.model.submit(
            now,
            JobSpec {
                id,
                model,
                prompt_tokens,
                output_tokens,
                prompt,
            },
        )?;
        let (tx, rx) = watch::channel(Progress::default());
        st.jobs.insert(id, tx);
        drop(st);
        self.wake.notify_one();
        Ok(JobGuard {
            core: self.clone(),
            id,
            progress: rx,
        })
    }

    /// Advances the model to now, publishes progress, and says when to wake.
    fn tick(&self, events: &mut Vec<EngineEvent>) -> Option<Instant> {
        let now = self.now_us();
        let mut st = self.lock();
        st.model.advance(now, events);
        for ev in events.drain(..) {
            match ev {
                EngineEvent::FirstToken { id, .. } => {
                    if let Some(tx) = st.jobs.get(&id) {
                        tx.send_modify(|p| {
                            p.first_token = true;
                            p.tokens = p.tokens.max(1);
                        });
                    }
                }
                EngineEvent::Finished(t) => {
                    if let Some(tx) = st.jobs.remove(&t.id) {
                        tx.send_modify(|p| {
                            p.first_token = true;
                            p.tokens = t.output_tokens;
                            p.done = Some(t);
                        });
                    }
                }
                _ => {}
            }
        }
        for (id, tx) in &st.jobs {
            if let Some(n) = st.model.tokens_generated(*id, now) {
                tx.send_if_modified(|p| {
                    let grew = n > p.tokens;
                    p.tokens = p.tokens.max(n);
                    grew
                });
            }
        }
        let next = [st.model.next_event_at(), st.model.next_token_at(now)]
            .into_iter()
            .flatten()
            .min();
        next.map(|t| self.instant_of(t.max(now + 1)))
    }

    /// The driver loop; ends when `cancel` fires.
    pub(crate) async fn drive(self, cancel: CancellationToken) {
        let mut events = Vec::new();
        loop {
            let next = self.tick(&mut events);
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = self.wake.notified() => {}
                () = sleep => {}
            }
        }
    }
}
