//! Fault injection and hit counting for emulated engines.
//!
//! Faults are rules, global or for one model, changed at runtime through a
//! cheap [`Faults`] handle or `POST /_emulator/faults`. Counters record how
//! many requests each route and each model received, faulted ones included,
//! so failover tests can assert exact hit counts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a fault does to a request it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer with this status and the engine's error body (404 uses the
    /// unknown-model body; 429 adds `Retry-After: 1`).
    Status(u16),
    /// Accept the request and never answer (until shutdown).
    Hang,
    /// Send the headers and this many body chunks, then drop the connection.
    CloseAfterChunks(u32),
    /// Send the headers and this many body chunks, then nothing more, the
    /// connection held open (until shutdown): an engine hung mid-answer
    /// while its health checks still answer.
    SilentAfterChunks(u32),
    /// Hold the response headers back this long (real time, not scaled).
    SlowFirstByteMs(u64),
    /// Add this much delay before every response it matches, listings
    /// included (a slow network; real time, not scaled).
    ExtraDelayMs(u64),
}

/// One fault rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FaultRule {
    /// Only requests naming this model (engine's name matching); `None`:
    /// every request, listings included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub action: FaultAction,
    /// Apply to this many matching requests, then expire; `None`: always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

impl FaultRule {
    pub fn global(action: FaultAction) -> Self {
        Self {
            model: None,
            action,
            times: None,
        }
    }
    pub fn for_model(model: impl Into<String>, action: FaultAction) -> Self {
        Self {
            model: Some(model.into()),
            action,
            times: None,
        }
    }
    /// Limits the rule to the next `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }
}

/// The faults that apply to one request, merged from every matching rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Applied {
    pub status: Option<u16>,
    pub hang: bool,
    pub close_after_chunks: Option<u32>,
    pub silent_after_chunks: Option<u32>,
    pub first_byte_delay: Duration,
}

/// A cheap, cloneable handle to an engine's fault rules.
#[derive(Clone, Debug, Default)]
pub struct Faults(Arc<Mutex<Vec<FaultRule>>>);

impl Faults {
    fn rules(&self) -> MutexGuard<'_, Vec<FaultRule>> {
        // A panic while holding this lock leaves plain data behind; keep going.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a rule (rules are checked in the order added).
    pub fn add(&self, rule: FaultRule) {
        self.rules().push(rule);
    }

    /// Replaces every rule.
    pub fn set(&self, rules: Vec<FaultRule>) {
        *self.rules() = rules;
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules().clear();
    }

    /// The rules now in force (expired ones are gone).
    pub fn list(&self) -> Vec<FaultRule> {
        self.rules().clone()
    }

    /// Answer `status` to requests for `model` (all requests if `None`),
    /// `times` times or always.
    pub fn fail(&self, model: Option<&str>, status: u16, times: Option<u32>) {
        self.add(FaultRule {
            model: model.map(str::to_owned),
            action: FaultAction::Status(status),
            times,
        });
    }

    pub fn hang(&self, model: Option<&str>) {
        self.add(FaultRule {
            model: model.map(str::to_owned),
            action: FaultAction::Hang,
            times: None,
        });
    }

    pub fn close_after_chunks(&self, model: Option<&str>, chunks: u32) {
        self.add(FaultRule {
            model: model.map(str::to_owned),
            action: FaultAction::CloseAfterChunks(chunks),
            times: None,
        });
    }

    pub fn slow_first_byte(&self, model: Option<&str>, delay: Duration) {
        self.add(FaultRule {
            model: model.map(str::to_owned),
            action: FaultAction::SlowFirstByteMs(millis(delay)),
            times: None,
        });
    }

    pub fn extra_delay(&self, model: Option<&str>, delay: Duration) {
        self.add(FaultRule {
            model: model.map(str::to_owned),
            action: FaultAction::ExtraDelayMs(millis(delay)),
            times: None,
        });
    }

    /// The faults for one request naming `model` (canonical engine name, if
    /// the request names a known model) and consumes their `times`.
    pub(crate) fn apply(&self, model: Option<&str>, matches: impl Fn(&str) -> bool) -> Applied {
        let mut out = Applied::default();
        let mut rules = self.rules();
        rules.retain_mut(|rule| {
            let hit = match (&rule.model, model) {
                (None, _) => true,
                (Some(want), Some(_)) => matches(want),
                (Some(_), None) => false,
            };
            if !hit {
                return true;
            }
            match rule.action {
                FaultAction::Status(code) => {
                    out.status.get_or_insert(code);
                }
                FaultAction::Hang => out.hang = true,
                FaultAction::CloseAfterChunks(n) => {
                    out.close_after_chunks = Some(out.close_after_chunks.map_or(n, |m| m.min(n)));
                }
                FaultAction::SilentAfterChunks(n) => {
                    out.silent_after_chunks = Some(out.silent_after_chunks.map_or(n, |m| m.min(n)));
                }
                FaultAction::SlowFirstByteMs(ms) | FaultAction::ExtraDelayMs(ms) => {
                    out.first_byte_delay += Duration::from_millis(ms);
                }
            }
            match &mut rule.times {
                None => true,
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n > 0
                }
            }
        });
        out
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Request counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct Hits(Arc<Mutex<HitCounts>>);

/// How many requests an engine received, by route and by model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HitCounts {
    pub total: u64,
    /// By route path as served, e.g. `/api/chat`.
    pub by_route: BTreeMap<String, u64>,
    /// By the model a request named, as written in the request.
    pub by_model: BTreeMap<String, u64>,
    /// By the request's `x-request-id` header, for requests that carry
    /// one (a test that tags each request can tell how often each one was
    /// sent and answered).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_request: BTreeMap<String, RequestHits>,
}

/// What an engine did with one tagged request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestHits {
    /// Times it arrived.
    pub hits: u32,
    /// Answers the engine sent to their end (not cut by a fault, not
    /// abandoned by the caller).
    pub completed: u32,
}

impl Hits {
    fn counts(&self) -> MutexGuard<'_, HitCounts> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    pub(crate) fn route(&self, route: &str) {
        let mut c = self.counts();
        c.total += 1;
        *c.by_route.entry(route.to_owned()).or_default() += 1;
    }
    pub(crate) fn request(&self, tag: &str) {
        self.counts()
            .by_request
            .entry(tag.to_owned())
            .or_default()
            .hits += 1;
    }
    pub(crate) fn completed(&self, tag: &str) {
        self.counts()
            .by_request
            .entry(tag.to_owned())
            .or_default()
            .completed += 1;
    }
    pub(crate) fn model(&self, model: &str) {
        *self.counts().by_model.entry(model.to_owned()).or_default() += 1;
    }
    pub(crate) fn counts_of(&self, tag: &str) -> RequestHits {
        self.counts()
            .by_request
            .get(tag)
            .copied()
            .unwrap_or_default()
    }
    pub(crate) fn snapshot(&self) -> HitCounts {
        self.counts().clone()
    }
    pub(crate) fn reset(&self) {
        *self.counts() = HitCounts::default();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_by_model_and_expire() {
        let f = Faults::default();
        f.add(FaultRule::for_model("a", FaultAction::Status(500)).times(2));
        f.add(FaultRule::global(FaultAction::SlowFirstByteMs(5)));
        let eq = |want: &str| want == "a";
        assert_eq!(f.apply(Some("a"), eq).status, Some(500));
        assert_eq!(f.apply(Some("b"), |w| w == "b").status, None);
        assert_eq!(f.apply(Some("a"), eq).status, Some(500));
        let third = f.apply(Some("a"), eq);
        assert_eq!(third.status, None);
        assert_eq!(third.first_byte_delay, Duration::from_millis(5));
        assert_eq!(f.list().len(), 1);
        assert_eq!(f.apply(None, eq).first_byte_delay, Duration::from_millis(5));
    }

    #[test]
    fn rules_round_trip_as_json() {
        let rule = FaultRule::for_model("m", FaultAction::CloseAfterChunks(3)).times(1);
        let json = serde_json::to_string(&rule).unwrap();
        assert_eq!(
            json,
            r#"{"model":"m","action":{"close_after_chunks":3},"times":1}"#
        );
        let hang: FaultRule = serde_json::from_str(r#"{"action":"hang"}"#).unwrap();
        assert_eq!(hang, FaultRule::global(FaultAction::Hang));
    }
}
