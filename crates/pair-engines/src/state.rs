//! The pure core of engine polling: how one poll's observation folds into
//! the engine's published report (health with a failure threshold, last good
//! inventory kept while the engine is down, slots, queue depth). No I/O, no
//! clock: the shell passes `now_ms`.

use std::num::NonZeroU32;

use pair_core::{EngineKind, EngineSnapshot, ModelEntry};
use serde::{Deserialize, Serialize};

use crate::{EngineConfig, QueueDepth};

/// Why a poll's health check failed, as data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "status")]
pub enum ProbeFailure {
    /// Nothing listens: the engine process is gone (or not started yet).
    Refused,
    /// No answer within the poll timeout: hung, or overloaded.
    Timeout,
    /// The engine answered with this HTTP status.
    Status(u16),
    /// It answered 2xx with a body the adapter cannot read.
    BadBody,
    /// The connection broke some other way (reset, closed early).
    Transport,
}

impl ProbeFailure {
    /// Failures that say for certain the engine cannot serve now, so it is
    /// marked down on the first one: nothing listening, or the engine itself
    /// saying "not ready" (llama.cpp answers 503 while loading a model).
    pub fn is_definitive(self) -> bool {
        matches!(self, ProbeFailure::Refused | ProbeFailure::Status(503))
    }
}

/// Health with hysteresis: a definitive failure marks the engine down at
/// once, other failures only after `threshold` in a row (one slow answer
/// from a busy engine is not a dead engine); one success brings it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthTracker {
    threshold: NonZeroU32,
    consecutive_failures: u32,
    healthy: bool,
    ever_healthy: bool,
}

/// What one observation did to health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Unchanged,
    BecameHealthy,
    BecameUnhealthy,
}

impl HealthTracker {
    /// Starts unhealthy: nothing is routed to an engine before it answers.
    pub fn new(threshold: NonZeroU32) -> Self {
        Self {
            threshold,
            consecutive_failures: 0,
            healthy: false,
            ever_healthy: false,
        }
    }

    pub fn observe(&mut self, result: Result<(), ProbeFailure>) -> Transition {
        let was = self.healthy;
        match result {
            Ok(()) => {
                self.consecutive_failures = 0;
                self.healthy = true;
                self.ever_healthy = true;
            }
            Err(f) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if f.is_definitive() || self.consecutive_failures >= self.threshold.get() {
                    self.healthy = false;
                }
            }
        }
        match (was, self.healthy) {
            (false, true) => Transition::BecameHealthy,
            (true, false) => Transition::BecameUnhealthy,
            _ => Transition::Unchanged,
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }
}

/// Whether a poll reads the full model list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InventoryRead {
    Skip,
    /// Routine refresh; an adapter may skip it where reading the list is
    /// costly for the engine (llama-cpp-python takes its model lock).
    Periodic,
    /// Needed now: nothing read yet, engine recovered, or asked for.
    Required,
}

impl InventoryRead {
    pub fn any(self) -> bool {
        !matches!(self, InventoryRead::Skip)
    }
}

/// What one poll saw. `None` fields were not read this time (or could not
/// be) and leave the previous value in place.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    pub health: Result<(), ProbeFailure>,
    /// The full model list, when it was read this poll.
    pub models: Option<Vec<ModelEntry>>,
    /// Parallel slots the engine reports (llama.cpp `/props`).
    pub slots: Option<u16>,
    /// Queue gauges, when the engine exports them.
    pub queue: Option<QueueDepth>,
    /// Engine version (Ollama `/api/version`).
    pub version: Option<String>,
    /// A count of the engine's work whose change means it is working:
    /// tokens processed since it started (its `/metrics` counters), or
    /// where it exports none, the tokens its slots have decoded (llama.cpp
    /// `/slots`).
    pub work_tokens: Option<u64>,
    /// Whether it continues a chat's final assistant message, when its
    /// routes told this poll (OpenAI-compatible servers:
    /// [`crate::EngineProbe`]).
    pub continues_chat: Option<bool>,
}

impl Observation {
    /// A poll whose health check failed: nothing else was read.
    pub fn failed(failure: ProbeFailure) -> Self {
        Self {
            health: Err(failure),
            models: None,
            slots: None,
            queue: None,
            version: None,
            work_tokens: None,
            continues_chat: None,
        }
    }
}

/// What the poller publishes for one engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineReport {
    /// The engine as the scheduler sees it. While `healthy` is false its
    /// models stay listed (the last inventory) but are not routable:
    /// [`EngineSnapshot::find`] skips an unhealthy engine.
    pub snapshot: EngineSnapshot,
    /// Queue gauges from the engine's `/metrics` (vLLM, llama.cpp), if any.
    pub queue: Option<QueueDepth>,
    pub version: Option<String>,
    /// The most recent failure, cleared by a successful poll.
    pub last_failure: Option<ProbeFailure>,
    pub consecutive_failures: u32,
    /// When the engine last answered, ms since the epoch.
    pub last_ok_ms: Option<u64>,
    /// When the model list was last read, ms since the epoch.
    pub inventory_at_ms: Option<u64>,
    /// When the engine's token counters last moved, ms since the epoch: it
    /// was working (on a prompt, or for a client pair does not see), even
    /// with nothing streamed through pair.
    #[serde(default)]
    pub worked_at_ms: Option<u64>,
}

impl EngineReport {
    /// The state before the first poll: unhealthy, no models.
    pub fn initial(kind: EngineKind, slots: u16) -> Self {
        Self {
            snapshot: EngineSnapshot {
                kind,
                healthy: false,
                silent: false,
                continues_chat: None,
                slots: slots.max(1),
                models: Vec::new(),
            },
            queue: None,
            version: None,
            last_failure: None,
            consecutive_failures: 0,
            last_ok_ms: None,
            inventory_at_ms: None,
            worked_at_ms: None,
        }
    }

    /// Whether `other` differs in anything a consumer acts on (timestamps
    /// and failure counts aside), so unchanged polls wake nobody.
    pub fn differs_materially(&self, other: &EngineReport) -> bool {
        self.snapshot != other.snapshot
            || self.queue != other.queue
            || self.version != other.version
            || self.last_failure != other.last_failure
    }
}

/// The fold of observations into a report, plus the decision of when to
/// re-read the full inventory.
#[derive(Clone, Debug)]
pub struct EngineState {
    configured_slots: Option<u16>,
    reported_slots: Option<u16>,
    /// The most requests the engine's own gauges (vLLM's
    /// `num_requests_running`, llama.cpp's `requests_processing`) showed
    /// running at once since it came up: it has at least that many slots.
    most_running: u16,
    inventory_every: NonZeroU32,
    polls: u64,
    refresh_due: bool,
    tracker: HealthTracker,
    report: EngineReport,
    /// The token counters' last reading.
    work_tokens: Option<u64>,
}

impl EngineState {
    pub fn new(
        config: &EngineConfig,
        fail_threshold: NonZeroU32,
        inventory_every: NonZeroU32,
    ) -> Self {
        let configured_slots = config.slots.map(|s| s.get());
        Self {
            configured_slots,
            reported_slots: None,
            most_running: 0,
            inventory_every,
            polls: 0,
            refresh_due: true,
            tracker: HealthTracker::new(fail_threshold),
            report: EngineReport::initial(config.kind, configured_slots.unwrap_or(1)),
            work_tokens: None,
        }
    }

    /// Whether the coming poll should read the full model list: required
    /// on the first poll, after a recovery or on request; periodic every
    /// `inventory_every`-th poll.
    pub fn inventory_read(&self) -> InventoryRead {
        if self.refresh_due {
            InventoryRead::Required
        } else if self
            .polls
            .is_multiple_of(u64::from(self.inventory_every.get()))
        {
            InventoryRead::Periodic
        } else {
            InventoryRead::Skip
        }
    }

    /// Asks for a full inventory on the next poll (say, after an engine
    /// answered 404 for a model it advertised).
    pub fn request_refresh(&mut self) {
        self.refresh_due = true;
    }

    /// Folds one poll in; returns whether the report changed materially.
    pub fn apply(&mut self, obs: Observation, now_ms: u64) -> bool {
        let before = self.report.clone();
        self.polls = self.polls.wrapping_add(1);
        let transition = self.tracker.observe(obs.health);
        let r = &mut self.report;
        r.consecutive_failures = self.tracker.consecutive_failures();
        match obs.health {
            Ok(()) => {
                r.last_failure = None;
                r.last_ok_ms = Some(now_ms);
                if let Some(models) = obs.models {
                    r.snapshot.models = models;
                    r.inventory_at_ms = Some(now_ms);
                    self.refresh_due = false;
                }
                if obs.slots.is_some() {
                    self.reported_slots = obs.slots;
                }
                r.queue = obs.queue;
                if let Some(q) = obs.queue {
                    let running = u16::try_from(q.running).unwrap_or(u16::MAX);
                    self.most_running = self.most_running.max(running);
                }
                if obs.version.is_some() {
                    r.version = obs.version;
                }
                if obs.continues_chat.is_some() {
                    r.snapshot.continues_chat = obs.continues_chat;
                }
                if let Some(tokens) = obs.work_tokens {
                    // Either way: a slot's count restarts with its next
                    // request (a counter only restarts with the engine,
                    // whose failed poll forgets it first).
                    if self.work_tokens.is_some_and(|before| tokens != before) {
                        r.worked_at_ms = Some(now_ms);
                    }
                    self.work_tokens = Some(tokens);
                }
            }
            Err(f) => {
                r.last_failure = Some(f);
                // A recovered engine may be a different process with other
                // models and flags: read everything again when it is back.
                self.refresh_due = true;
                self.reported_slots = None;
                self.most_running = 0;
                self.work_tokens = None;
                r.queue = None;
                r.snapshot.continues_chat = None;
            }
        }
        if transition == Transition::BecameHealthy && r.inventory_at_ms.is_none() {
            self.refresh_due = true;
        }
        r.snapshot.healthy = self.tracker.is_healthy();
        r.snapshot.slots = self
            .configured_slots
            .or(self.reported_slots)
            .unwrap_or(1)
            .max(self.most_running)
            .max(1);
        before.differs_materially(&self.report)
    }

    pub fn report(&self) -> &EngineReport {
        &self.report
    }

    pub fn is_healthy(&self) -> bool {
        self.tracker.is_healthy()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::ModelName;
    use proptest::prelude::*;

    fn nz(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    fn model(name: &str) -> ModelEntry {
        ModelEntry {
            name: ModelName::new(name).unwrap(),
            size_bytes: Some(1),
            loaded: true,
            perf: None,
            learned: false,
        }
    }

    fn ok(models: Option<Vec<ModelEntry>>) -> Observation {
        Observation {
            health: Ok(()),
            models,
            slots: None,
            queue: None,
            version: None,
            work_tokens: None,
            continues_chat: None,
        }
    }

    fn state(slots: Option<u16>) -> EngineState {
        let cfg = EngineConfig::new(EngineKind::OpenAiCompat, "127.0.0.1:1235", slots).unwrap();
        EngineState::new(&cfg, nz(2), nz(5))
    }

    /// vLLM says nothing of its slots but shows how many requests run: as
    /// many as it was seen running at once, it has; until it restarts.
    #[test]
    fn moving_token_counters_are_work_and_still_ones_are_not() {
        let mut s = state(None);
        let tokens = |n: u64| Observation {
            work_tokens: Some(n),
            ..ok(None)
        };
        s.apply(tokens(100), 1);
        assert_eq!(
            s.report().worked_at_ms,
            None,
            "a first reading is no change"
        );
        s.apply(tokens(100), 2);
        assert_eq!(s.report().worked_at_ms, None);
        s.apply(tokens(140), 3);
        assert_eq!(s.report().worked_at_ms, Some(3));
        s.apply(tokens(140), 4);
        assert_eq!(s.report().worked_at_ms, Some(3));
        // A restarted engine counts from zero again: no work until it moves.
        s.apply(Observation::failed(ProbeFailure::Refused), 5);
        s.apply(tokens(7), 6);
        assert_eq!(s.report().worked_at_ms, Some(3));
        s.apply(tokens(9), 7);
        assert_eq!(s.report().worked_at_ms, Some(7));
        // A slot's decoded count starts again with its next request: a
        // fall is work too.
        s.apply(tokens(2), 8);
        assert_eq!(s.report().worked_at_ms, Some(8));
    }

    #[test]
    fn requests_seen_running_at_once_are_slots() {
        let mut s = state(None);
        let running = |n: u32| Observation {
            queue: Some(crate::QueueDepth {
                running: n,
                waiting: 0,
            }),
            ..ok(None)
        };
        s.apply(running(1), 1);
        assert_eq!(s.report().snapshot.slots, 1);
        s.apply(running(6), 2);
        s.apply(running(2), 3);
        assert_eq!(s.report().snapshot.slots, 6, "the most seen stays");
        let mut failed = ok(None);
        failed.health = Err(ProbeFailure::Refused);
        s.apply(failed, 4);
        s.apply(running(0), 5);
        assert_eq!(
            s.report().snapshot.slots,
            1,
            "a restarted engine starts over"
        );
        // A configured figure is a floor the gauges can only raise.
        let mut s = state(Some(4));
        s.apply(running(2), 1);
        assert_eq!(s.report().snapshot.slots, 4);
    }

    #[test]
    fn refused_is_down_at_once_timeouts_need_the_threshold() {
        let mut h = HealthTracker::new(nz(2));
        assert!(!h.is_healthy());
        assert_eq!(h.observe(Ok(())), Transition::BecameHealthy);
        assert_eq!(h.observe(Err(ProbeFailure::Timeout)), Transition::Unchanged);
        assert!(h.is_healthy());
        assert_eq!(
            h.observe(Err(ProbeFailure::Timeout)),
            Transition::BecameUnhealthy
        );
        assert_eq!(h.observe(Ok(())), Transition::BecameHealthy);
        assert_eq!(
            h.observe(Err(ProbeFailure::Refused)),
            Transition::BecameUnhealthy
        );
        h.observe(Ok(()));
        assert_eq!(
            h.observe(Err(ProbeFailure::Status(503))),
            Transition::BecameUnhealthy
        );
        h.observe(Ok(()));
        assert_eq!(
            h.observe(Err(ProbeFailure::Status(500))),
            Transition::Unchanged
        );
    }

    #[test]
    fn dead_engine_keeps_its_models_but_is_not_routable_then_recovers() {
        let mut s = state(None);
        assert_eq!(s.inventory_read(), InventoryRead::Required);
        assert!(s.apply(ok(Some(vec![model("smollm2")])), 10));
        assert!(s.report().snapshot.healthy);
        assert!(
            s.report()
                .snapshot
                .find("smollm2", pair_core::ApiFlavor::OpenAi)
                .is_some()
        );
        assert_eq!(s.inventory_read(), InventoryRead::Skip);

        assert!(s.apply(Observation::failed(ProbeFailure::Refused), 20));
        let r = s.report();
        assert!(!r.snapshot.healthy);
        assert_eq!(r.snapshot.models.len(), 1);
        assert!(
            r.snapshot
                .find("smollm2", pair_core::ApiFlavor::OpenAi)
                .is_none()
        );
        assert_eq!(r.last_ok_ms, Some(10));
        assert_eq!(
            s.inventory_read(),
            InventoryRead::Required,
            "re-read everything after recovery"
        );

        assert!(s.apply(ok(Some(vec![model("other")])), 30));
        assert!(s.report().snapshot.healthy);
        assert_eq!(s.report().snapshot.models[0].name.as_str(), "other");
        assert_eq!(s.report().inventory_at_ms, Some(30));
    }

    #[test]
    fn unchanged_polls_are_not_material() {
        let mut s = state(None);
        s.apply(ok(Some(vec![model("a")])), 1);
        assert!(!s.apply(ok(None), 2));
        assert!(!s.apply(ok(Some(vec![model("a")])), 3));
        assert_eq!(s.report().last_ok_ms, Some(3));
    }

    #[test]
    fn slots_configured_beat_reported_beat_one() {
        let mut s = state(None);
        s.apply(ok(None), 1);
        assert_eq!(s.report().snapshot.slots, 1);
        s.apply(
            Observation {
                slots: Some(4),
                ..ok(None)
            },
            2,
        );
        assert_eq!(s.report().snapshot.slots, 4);
        let mut c = state(Some(2));
        c.apply(
            Observation {
                slots: Some(4),
                ..ok(None)
            },
            2,
        );
        assert_eq!(c.report().snapshot.slots, 2);
    }

    #[test]
    fn inventory_is_periodic_and_on_request() {
        let mut s = state(None);
        let mut reads = 0;
        for t in 0..20 {
            let inv = s.inventory_read().any();
            reads += u32::from(inv);
            s.apply(ok(inv.then(Vec::new)), t);
        }
        assert_eq!(reads, 4);
        s.request_refresh();
        assert_eq!(s.inventory_read(), InventoryRead::Required);
    }

    fn failure() -> impl Strategy<Value = ProbeFailure> {
        prop_oneof![
            Just(ProbeFailure::Refused),
            Just(ProbeFailure::Timeout),
            Just(ProbeFailure::BadBody),
            Just(ProbeFailure::Transport),
            (400u16..600).prop_map(ProbeFailure::Status),
        ]
    }

    proptest! {
        #[test]
        fn health_follows_the_rule(
            threshold in 1u32..5,
            seq in proptest::collection::vec(proptest::option::of(failure()), 0..40),
        ) {
            let mut h = HealthTracker::new(nz(threshold));
            let mut run = 0u32;
            let mut expect = false;
            for step in seq {
                h.observe(step.map_or(Ok(()), Err));
                match step {
                    None => { run = 0; expect = true; }
                    Some(f) => {
                        run += 1;
                        if f.is_definitive() || run >= threshold { expect = false; }
                    }
                }
                prop_assert_eq!(h.is_healthy(), expect);
                prop_assert_eq!(h.consecutive_failures(), run);
            }
        }

        #[test]
        fn snapshot_health_matches_tracker_and_models_survive_failures(
            seq in proptest::collection::vec(proptest::option::of(failure()), 1..30),
        ) {
            let mut s = state(None);
            s.apply(ok(Some(vec![model("m")])), 0);
            for (t, step) in seq.into_iter().enumerate() {
                let obs = step.map_or_else(|| ok(None), Observation::failed);
                s.apply(obs, t as u64 + 1);
                prop_assert_eq!(s.report().snapshot.healthy, s.is_healthy());
                prop_assert_eq!(s.report().snapshot.models.len(), 1);
                prop_assert!(s.report().snapshot.slots >= 1);
            }
        }
    }
}
