//! The one error type of the simulator library: bad scenarios, I/O, output.

use std::path::PathBuf;

/// Everything that can go wrong between reading a scenario and writing its
/// report. Configuration errors are the caller's fault (exit code 64 in the
/// binary); I/O errors are the machine's.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("scenario is not valid TOML for pair-sim")]
    Toml(#[source] toml::de::Error),
    #[error("scenario field `{field}`: {reason}")]
    Invalid { field: String, reason: &'static str },
    #[error("scenario field `{field}`: unknown {what} {name:?}")]
    Unknown {
        field: String,
        what: &'static str,
        name: String,
    },
    #[error(
        "unknown policy {0:?} (expected one of: round-robin, least-pending, p2c, pair, predicted-latency, all)"
    )]
    UnknownPolicy(String),
    #[error("cannot encode the report as JSON")]
    Json(#[source] serde_json::Error),
    #[error("engine model rejected the scenario for node `{node}`")]
    Engine {
        node: String,
        #[source]
        source: pair_emulator::EmulatorError,
    },
    /// The live twin's cluster or clients failed.
    #[error("live run: {context}")]
    Live {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl SimError {
    /// Whether the error is the user's configuration (exit code 64) rather
    /// than the environment's.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            SimError::Toml(_)
                | SimError::Invalid { .. }
                | SimError::Unknown { .. }
                | SimError::UnknownPolicy(_)
                | SimError::Engine { .. }
        )
    }

    pub(crate) fn live(
        context: &str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        SimError::Live {
            context: context.to_owned(),
            source: Some(source.into()),
        }
    }

    pub(crate) fn live_msg(context: String) -> Self {
        SimError::Live {
            context,
            source: None,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: &'static str) -> Self {
        SimError::Invalid {
            field: field.into(),
            reason,
        }
    }
}
