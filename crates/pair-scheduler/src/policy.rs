//! Routing policies, selectable by name (CLI flags, config files, the simulator).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SchedulerError;

/// How candidates are ordered after the pinned node.
///
/// The baselines (`round-robin`, `least-pending`, `p2c`) and `pair` reproduce
/// their textbook or reference behaviour exactly, so the simulator compares
/// like with like. Only `predicted-latency` sinks suspect nodes and nodes
/// whose free VRAM cannot take the model, and only it uses session affinity.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Rotate through eligible nodes, one step per request.
    RoundRobin,
    /// Fewest pending jobs (queued + running + reserved) first.
    LeastPending,
    /// Power of two choices: sample two eligible nodes, the one with fewer
    /// pending jobs goes first, then the other, then the rest by node id.
    P2c,
    /// NVIDIA PAIR's rule: pending + pressure, then pressure, then node id.
    Pair,
    /// Smallest predicted latency as the client feels it: time to first token
    /// when streaming, time to the whole answer otherwise.
    #[default]
    PredictedLatency,
}

impl Policy {
    /// Whether the policy keeps a conversation on the node it ran on.
    pub fn keeps_sessions(self) -> bool {
        self == Policy::PredictedLatency
    }

    /// Every policy, in the order help texts list them.
    pub const ALL: [Policy; 5] = [
        Policy::PredictedLatency,
        Policy::Pair,
        Policy::LeastPending,
        Policy::P2c,
        Policy::RoundRobin,
    ];

    /// The names [`Policy::from_str`] accepts, in the order of [`Policy::ALL`]
    /// (for clap's `PossibleValuesParser` and help texts).
    pub const NAMES: [&'static str; 5] = [
        "predicted-latency",
        "pair",
        "least-pending",
        "p2c",
        "round-robin",
    ];

    const EXPECTED: &'static str = "predicted-latency, pair, least-pending, p2c, round-robin";

    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastPending => "least-pending",
            Policy::P2c => "p2c",
            Policy::Pair => "pair",
            Policy::PredictedLatency => "predicted-latency",
        }
    }

    /// Whether the policy consumes randomness (callers may pass any RNG to
    /// the others).
    pub fn uses_rng(self) -> bool {
        matches!(self, Policy::P2c)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = SchedulerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(t))
            .or_else(|| match t.to_ascii_lowercase().as_str() {
                "rr" | "round_robin" => Some(Policy::RoundRobin),
                "least_pending" => Some(Policy::LeastPending),
                "power-of-two" | "power-of-two-choices" => Some(Policy::P2c),
                "predicted_latency" | "latency" => Some(Policy::PredictedLatency),
                _ => None,
            })
            .ok_or_else(|| SchedulerError::UnknownPolicy {
                input: s.to_owned(),
                expected: Policy::EXPECTED,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_all() {
        for (p, name) in Policy::ALL.iter().zip(Policy::NAMES) {
            assert_eq!(p.as_str(), name);
            assert_eq!(name.parse::<Policy>().unwrap(), *p);
            assert_eq!(p.to_string(), name);
            let json = format!("\"{name}\"");
            assert_eq!(serde_json::to_string(p).unwrap(), json);
            assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), *p);
        }
        assert_eq!(Policy::default(), Policy::PredictedLatency);
        assert_eq!(" PAIR ".parse::<Policy>().unwrap(), Policy::Pair);
    }

    #[test]
    fn unknown_policy_names_the_input_and_the_choices() {
        let err = "fastest".parse::<Policy>().unwrap_err();
        match &err {
            SchedulerError::UnknownPolicy { input, expected } => {
                assert_eq!(input, "fastest");
                for name in Policy::NAMES {
                    assert!(expected.contains(name));
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
