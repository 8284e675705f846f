//! One error type for everything the SDK does, saying whether trying again
//! may help and, for a request, which nodes were tried and what each did.

use std::fmt;

use pair_core::NodeId;

/// One node a request went to, and what came of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tried {
    pub node: NodeId,
    pub name: String,
    /// The status it answered (`503`) or what failed (`connect`,
    /// `transport`, `first-byte-timeout`).
    pub what: String,
}

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.name, self.node.short(), self.what)
    }
}

/// The nodes a request tried, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempts(pub Vec<Tried>);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node tried");
        }
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// This machine has not paired with any node yet.
    #[error(
        "this client is not paired with any node: run `pair-client pair join HOST:PORT --pin PIN` (state in {state_dir})"
    )]
    NotPaired { state_dir: String },
    /// No node could be probed: none known, none reachable.
    #[error("no node of the cluster answered a probe ({detail})")]
    NoNodes { detail: String },
    /// No reachable node holds the model.
    #[error("no reachable node serves model '{model}' (nodes probed: {probed})")]
    NoNodeServes { model: String, probed: usize },
    /// Every node holding the model is up but refuses this client's
    /// certificate: it is not, or no longer, paired with the cluster.
    #[error("every node that holds model '{model}' ({}) refuses this client: it is not paired with the cluster, or was unpaired (pair-client pair join HOST:PORT --pin PIN)", nodes.join(", "))]
    Refused { model: String, nodes: Vec<String> },
    /// Every attempt failed before an answer could be used.
    #[error("model '{model}': every attempt failed: {attempts}")]
    Exhausted { model: String, attempts: Attempts },
    /// Every node holding the model was down and none came back in time.
    #[error("model '{model}': every node that holds it is down ({attempts})")]
    OwnersGone { model: String, attempts: Attempts },
    /// A node answered with an error status that retrying elsewhere does
    /// not fix (400, 422, ...), or the last of the retried answers.
    #[error("model '{model}': node {node} answered {status}: {body}")]
    Status {
        model: String,
        node: String,
        status: u16,
        body: String,
        attempts: Attempts,
    },
    /// The answer broke after its first byte: nothing is resent.
    #[error("the answer from {node} broke after it began: {detail}")]
    Interrupted { node: String, detail: String },
    /// An answer that is not what its API promises.
    #[error("could not read the answer from {node}: {detail}")]
    BadAnswer { node: String, detail: String },
    /// The request could not be built (not JSON, no model).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Pairing, identity or pins.
    #[error(transparent)]
    Identity(#[from] pair_identity::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the same call may succeed if made again later (a node comes
    /// back, a busy engine frees up); `false` when the request itself or
    /// the set-up is at fault.
    pub fn may_retry(&self) -> bool {
        match self {
            Error::NoNodes { .. }
            | Error::Exhausted { .. }
            | Error::OwnersGone { .. }
            | Error::Interrupted { .. } => true,
            Error::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            Error::Identity(e) => e.refusal().is_some_and(pair_identity::Refusal::may_retry),
            Error::Io { .. } => true,
            Error::NotPaired { .. }
            | Error::Refused { .. }
            | Error::NoNodeServes { .. }
            | Error::BadAnswer { .. }
            | Error::InvalidRequest(_) => false,
        }
    }

    /// The nodes the request tried, when it got that far.
    pub fn attempts(&self) -> Option<&Attempts> {
        match self {
            Error::Exhausted { attempts, .. }
            | Error::OwnersGone { attempts, .. }
            | Error::Status { attempts, .. } => Some(attempts),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
