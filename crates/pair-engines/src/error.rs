//! The one error type of pair-engines: bad configuration, unreadable engine
//! answers, port conflicts at start-up, and a launched engine that failed.

use std::process::ExitStatus;
use std::time::Duration;

use pair_core::EngineKind;

use crate::ports::move_hint;

/// Everything that can go wrong in this crate.
///
/// Port conflicts render as one sentence the user can act on; the node prints
/// it and exits with code 64.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine URL is not `http://HOST:PORT`.
    #[error("invalid engine URL {input:?}: {reason}")]
    BadUrl { input: String, reason: &'static str },

    /// `--engine-cmd` could not be split into a program and its arguments.
    #[error("invalid engine command {input:?}: {reason}")]
    BadCommand { input: String, reason: &'static str },

    /// An engine answered with a body this adapter cannot read.
    #[error("{kind} answered {endpoint} with a body that does not parse")]
    BadBody {
        kind: EngineKind,
        endpoint: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// The HTTP client could not be built (TLS backend set-up).
    #[error("cannot build the engine HTTP client")]
    Client(#[source] reqwest::Error),

    /// The engine already listens on the port the proxy must own.
    #[error(
        "{kind} is already listening on 127.0.0.1:{usual}, the port pair's proxy needs. \
         Restart it on port {moved}: {hint}, or pass --engine-cmd so pair starts it there itself",
        hint = move_hint(*kind, "127.0.0.1", *moved)
    )]
    EngineOnUsualPort {
        kind: EngineKind,
        usual: u16,
        moved: u16,
    },

    /// Something that is not the engine holds the proxy's port.
    #[error(
        "port {port} is taken by a process that is not {kind}; pair's proxy needs it. \
         Stop that process or choose another proxy port"
    )]
    OtherOnUsualPort { kind: EngineKind, port: u16 },

    /// Something that is not the engine holds the engine's moved port.
    #[error(
        "port {port}, where {kind} should run behind pair, is taken by a process that is not \
         {kind}; free it or choose another engine port"
    )]
    OtherOnMovedPort { kind: EngineKind, port: u16 },

    /// The engine command could not be started at all.
    #[error("cannot start engine command {program:?}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },

    /// The engine command exited before the engine answered.
    #[error("engine command {program:?} exited ({status}) before {kind} answered on port {port}")]
    EngineExited {
        kind: EngineKind,
        program: String,
        port: u16,
        status: ExitStatus,
    },

    /// The engine command kept running but the engine never answered.
    #[error("{kind} did not answer on port {port} within {waited:?} of starting it")]
    NotReady {
        kind: EngineKind,
        port: u16,
        waited: Duration,
    },

    /// Waiting for or signalling the child process failed.
    #[error("cannot stop the engine process {pid}")]
    Stop {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}
