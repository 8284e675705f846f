//! The async poller: one owned task per engine that polls on an interval,
//! folds each poll into [`EngineState`] and publishes the latest
//! [`EngineReport`] on a `watch` channel. A dead or hung engine only delays
//! its own task (every request has a deadline); readers never wait on it.

use std::sync::Arc;
use std::time::SystemTime;

use pair_core::EngineSnapshot;
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{EngineConfig, EngineError, EngineProbe, EngineReport, EngineState, PollConfig};

/// The reading end of one engine's poller.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    config: EngineConfig,
    rx: watch::Receiver<EngineReport>,
    refresh: Arc<Notify>,
}

impl EngineHandle {
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The latest report (a clone; cheap, engines hold few models).
    pub fn report(&self) -> EngineReport {
        self.rx.borrow().clone()
    }

    /// The latest snapshot, as the cluster snapshot embeds it.
    pub fn snapshot(&self) -> EngineSnapshot {
        self.rx.borrow().snapshot.clone()
    }

    /// When the engine's token counters last moved (ms since the epoch).
    pub fn worked_at_ms(&self) -> Option<u64> {
        self.rx.borrow().worked_at_ms
    }

    /// A receiver that wakes when the report changes materially (health,
    /// models, slots, queue, version, failure kind).
    pub fn subscribe(&self) -> watch::Receiver<EngineReport> {
        self.rx.clone()
    }

    /// Polls now, reading the full inventory: for when the engine answered
    /// 404 for a model it advertised, or the user pulled a model.
    pub fn request_refresh(&self) {
        self.refresh.notify_one();
    }

    /// What [`Self::request_refresh`] signals, for code that cannot hold
    /// the handle (the request path, in another crate).
    pub fn refresh_signal(&self) -> Arc<Notify> {
        Arc::clone(&self.refresh)
    }
}

/// Starts polling `config` on a task owned by `tasks`, stopped by `cancel`.
/// The first poll runs at once; until it answers the engine is unhealthy.
pub fn spawn_poller(
    config: EngineConfig,
    poll: PollConfig,
    tasks: &TaskTracker,
    cancel: CancellationToken,
) -> Result<EngineHandle, EngineError> {
    let probe = EngineProbe::new(config.clone(), poll.timeout)?;
    let state = EngineState::new(&config, poll.fail_threshold, poll.inventory_every);
    let (tx, rx) = watch::channel(state.report().clone());
    let refresh = Arc::new(Notify::new());
    tasks.spawn(run(probe, state, poll, tx, Arc::clone(&refresh), cancel));
    Ok(EngineHandle {
        config,
        rx,
        refresh,
    })
}

async fn run(
    mut probe: EngineProbe,
    mut state: EngineState,
    poll: PollConfig,
    tx: watch::Sender<EngineReport>,
    refresh: Arc<Notify>,
    cancel: CancellationToken,
) {
    let mut ticker = tokio::time::interval(poll.interval);
    let mut first = true;
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = ticker.tick() => {}
            () = refresh.notified() => state.request_refresh(),
        }
        let read = state.inventory_read();
        let obs = tokio::select! {
            () = cancel.cancelled() => break,
            obs = probe.poll(read) => obs,
        };
        let was_healthy = state.is_healthy();
        let changed = state.apply(obs, now_ms());
        log_health(probe.config(), state.report(), was_healthy, first);
        first = false;
        tx.send_if_modified(|current| {
            *current = state.report().clone();
            changed
        });
    }
}

/// One line when the engine comes up or goes down, and one after the first
/// poll if it is not there yet (it is awaited, not reported ready).
fn log_health(config: &EngineConfig, r: &EngineReport, was_healthy: bool, first: bool) {
    let (kind, url) = (config.kind, &config.base_url);
    let healthy = r.snapshot.healthy;
    if healthy && !was_healthy {
        let models: Vec<&str> = r.snapshot.models.iter().map(|m| m.name.as_str()).collect();
        tracing::info!(engine = %kind, %url, models = %models.join(", "), "engine up: {kind} at {url}");
    } else if !healthy && was_healthy {
        tracing::warn!(engine = %kind, %url, failure = ?r.last_failure, "engine down: {kind} at {url}");
    } else if !healthy && first {
        tracing::info!(
            engine = %kind,
            %url,
            failure = ?r.last_failure,
            "waiting for {kind} at {url}: not answering yet; it is used as soon as it answers"
        );
    }
}

fn now_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}
