//! Port inversion, the shell: look at the proxy's port and the engine's
//! moved port, then adopt the engine already there, launch `--engine-cmd` on
//! the moved port as a child the node owns, or stop with one clear message.
//! Only a process this supervisor started is ever signalled.

use std::num::NonZeroU16;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use pair_core::EngineKind;
use pair_os::process::Stop;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::{
    EngineConfig, EngineError, EngineProbe, EngineUrl, PortPair, PortPlan, PortUse, plan_ports,
};

/// `--engine-cmd`: the program and arguments that start the engine. `{host}`
/// and `{port}` in arguments are replaced by where the engine must listen;
/// Ollama also gets `OLLAMA_HOST`, which is how it is told its port. Every
/// child also sees `PAIR_ENGINE_HOST` and `PAIR_ENGINE_PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineCommand {
    program: String,
    args: Vec<String>,
}

impl EngineCommand {
    /// Splits a command line as this OS's programs do (no expansion, no
    /// shell): POSIX quoting on Unix, the C runtime's rules on Windows, where
    /// `C:\models\x.gguf` keeps its backslashes (`pair_os::cmdline`).
    pub fn parse(input: &str) -> Result<Self, EngineError> {
        Self::parse_for(pair_os::Os::current(), input)
    }

    /// [`EngineCommand::parse`] as `os` would split it.
    pub fn parse_for(os: pair_os::Os, input: &str) -> Result<Self, EngineError> {
        let bad = |reason| EngineError::BadCommand {
            input: input.to_owned(),
            reason,
        };
        let words = pair_os::split_command_line(os, input).map_err(|e| {
            bad(match e {
                pair_os::SplitError::UnbalancedQuote => "unbalanced quote",
                pair_os::SplitError::TrailingBackslash => "ends with a backslash",
                pair_os::SplitError::Empty => "empty command",
            })
        })?;
        Self::from_argv(words).map_err(|_| bad("empty command"))
    }

    /// From an argument vector (clap's `num_args = 1..`).
    pub fn from_argv(argv: Vec<String>) -> Result<Self, EngineError> {
        let mut it = argv.into_iter();
        match it.next() {
            Some(program) if !program.is_empty() => Ok(Self {
                program,
                args: it.collect(),
            }),
            _ => Err(EngineError::BadCommand {
                input: String::new(),
                reason: "empty command",
            }),
        }
    }

    pub fn program(&self) -> &str {
        &self.program
    }

    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Whether an argument mentions `{port}`.
    pub fn mentions_port(&self) -> bool {
        self.args.iter().any(|a| a.contains("{port}"))
    }

    /// The arguments with `{host}` and `{port}` filled in.
    pub fn render_args(&self, host: &str, port: u16) -> Vec<String> {
        let port = port.to_string();
        self.args
            .iter()
            .map(|a| a.replace("{host}", host).replace("{port}", &port))
            .collect()
    }
}

/// How to start (or find) one engine behind the proxy.
#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    pub kind: EngineKind,
    /// Host the engine listens on, and the proxy's port is checked on:
    /// loopback by default.
    pub host: String,
    pub ports: PortPair,
    pub command: Option<EngineCommand>,
    pub slots: Option<NonZeroU16>,
    /// Deadline for each identification request.
    pub probe_timeout: Duration,
    /// How long a launched engine may take to answer.
    pub ready_timeout: Duration,
    /// Between the graceful stop (SIGTERM; `taskkill /T`) and the forced
    /// one at shutdown.
    pub stop_grace: Duration,
    /// Pass the child's stdout/stderr through (the default); tests silence it.
    pub inherit_output: bool,
}

impl SupervisorConfig {
    /// Loopback, the kind's usual and moved ports, no command.
    pub fn new(kind: EngineKind) -> Self {
        Self {
            kind,
            host: "127.0.0.1".to_owned(),
            ports: PortPair::for_kind(kind),
            command: None,
            slots: None,
            probe_timeout: Duration::from_secs(2),
            ready_timeout: Duration::from_secs(120),
            stop_grace: Duration::from_secs(5),
            inherit_output: true,
        }
    }
}

/// What answers at `host:port` for an engine of `kind`.
pub async fn inspect_port(
    kind: EngineKind,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<PortUse, EngineError> {
    let config = EngineConfig {
        kind,
        base_url: EngineUrl::http(host, port),
        slots: None,
    };
    Ok(EngineProbe::new(config, timeout)?.identify().await)
}

#[derive(Debug)]
struct OwnedChild {
    child: Child,
    pid: u32,
}

/// The engine behind the proxy, started or adopted; owns the child process
/// when it launched one (killed if the supervisor is dropped, stopped
/// gracefully by [`EngineSupervisor::shutdown`]).
#[derive(Debug)]
pub struct EngineSupervisor {
    engine: EngineConfig,
    plan: PortPlan,
    child: Option<OwnedChild>,
    stop_grace: Duration,
}

impl EngineSupervisor {
    /// Inspects both ports, decides with [`plan_ports`], and carries out the
    /// plan. For [`PortPlan::Launch`] it returns once the engine answers.
    pub async fn start(cfg: SupervisorConfig) -> Result<Self, EngineError> {
        let usual = inspect_port(cfg.kind, &cfg.host, cfg.ports.usual, cfg.probe_timeout).await?;
        let moved = inspect_port(cfg.kind, &cfg.host, cfg.ports.moved, cfg.probe_timeout).await?;
        let plan = plan_ports(cfg.kind, cfg.ports, usual, moved, cfg.command.is_some())?;
        let engine = EngineConfig {
            kind: cfg.kind,
            base_url: EngineUrl::http(cfg.host.as_str(), cfg.ports.moved),
            slots: cfg.slots,
        };
        let child = match (&plan, &cfg.command) {
            (PortPlan::Launch, Some(cmd)) => launch(&cfg, cmd).await?,
            _ => None,
        };
        let (kind, url) = (cfg.kind, &engine.base_url);
        match (plan, &child) {
            (PortPlan::Launch, Some(c)) => {
                tracing::info!(engine = %kind, %url, pid = c.pid, "started {kind} at {url}");
            }
            (PortPlan::Launch, None) => tracing::info!(
                engine = %kind,
                %url,
                "started {kind} at {url}; its command handed it to a daemon of its own, which pair leaves running"
            ),
            (PortPlan::Adopt, _) => {
                tracing::info!(engine = %kind, %url, "{kind} already runs at {url}: using it");
            }
            // The poller says when it comes up.
            (PortPlan::Await, _) => {}
        }
        Ok(Self {
            engine,
            plan,
            child,
            stop_grace: cfg.stop_grace,
        })
    }

    /// Where to poll and forward to.
    pub fn engine(&self) -> &EngineConfig {
        &self.engine
    }

    pub fn plan(&self) -> PortPlan {
        self.plan
    }

    /// The pid of the engine process this supervisor started, if any.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.pid)
    }

    /// The child's exit status if it has exited (it is not restarted: the
    /// poller marks the engine down, and the user sees why in the log).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.child.try_wait().ok().flatten())
    }

    /// Stops the engine if this supervisor started it, with its whole
    /// process tree (`pair_os::process`): SIGTERM to its process group
    /// (Windows: `taskkill /T`), then after [`SupervisorConfig::stop_grace`]
    /// SIGKILL to the group (`taskkill /T /F`) and the child itself. An
    /// adopted engine is left running. Returns the child's exit status, if
    /// there was a child.
    pub async fn shutdown(mut self) -> Result<Option<ExitStatus>, EngineError> {
        let grace = self.stop_grace;
        let Some(mut owned) = self.child.take() else {
            return Ok(None);
        };
        if let Ok(Some(status)) = owned.child.try_wait() {
            return Ok(Some(status));
        }
        // Still our un-reaped child, so its pid (and the group it leads) is
        // ours: signalling it cannot hit a stranger.
        stop_tree(owned.pid, Stop::Graceful).await;
        match tokio::time::timeout(grace, owned.child.wait()).await {
            Ok(status) => status.map(Some).map_err(|source| EngineError::Stop {
                pid: owned.pid,
                source,
            }),
            Err(_) => {
                // The tree first: once the leader is gone, Windows can no
                // longer find its children by it.
                stop_tree(owned.pid, Stop::Force).await;
                owned
                    .child
                    .kill()
                    .await
                    .map_err(|source| EngineError::Stop {
                        pid: owned.pid,
                        source,
                    })?;
                owned
                    .child
                    .wait()
                    .await
                    .map(Some)
                    .map_err(|source| EngineError::Stop {
                        pid: owned.pid,
                        source,
                    })
            }
        }
    }
}

async fn launch(
    cfg: &SupervisorConfig,
    cmd: &EngineCommand,
) -> Result<Option<OwnedChild>, EngineError> {
    if cfg.kind != EngineKind::Ollama && !cmd.mentions_port() {
        return Err(EngineError::BadCommand {
            input: cmd.program.clone(),
            reason: "needs {port} in its arguments so the engine listens on the moved port",
        });
    }
    let host = cfg.host.as_str();
    let port = cfg.ports.moved;
    let mut command = Command::new(&cmd.program);
    command
        .args(cmd.render_args(host, port))
        .env("PAIR_ENGINE_HOST", host)
        .env("PAIR_ENGINE_PORT", port.to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if cfg.kind == EngineKind::Ollama {
        command.env("OLLAMA_HOST", EngineUrl::http(host, port).authority());
    }
    if !cfg.inherit_output {
        command.stdout(Stdio::null()).stderr(Stdio::null());
    }
    // Its own process group, so shutdown reaches the engine's helpers
    // (Ollama's runners) and a Ctrl-C in the terminal reaches the node only.
    pair_os::process::isolate(command.as_std_mut());
    let mut child = command.spawn().map_err(|source| EngineError::Spawn {
        program: cmd.program.clone(),
        source,
    })?;
    let pid = child.id().unwrap_or(0);
    let started = Instant::now();
    let probe = EngineProbe::new(
        EngineConfig {
            kind: cfg.kind,
            base_url: EngineUrl::http(host, port),
            slots: None,
        },
        cfg.probe_timeout,
    )?;
    loop {
        if probe.identify().await == PortUse::Engine {
            // `lms server start` hands the server to LM Studio's daemon and
            // exits: then there is no child of ours left to own.
            return Ok(match child.try_wait() {
                Ok(Some(_)) => None,
                _ => Some(OwnedChild { child, pid }),
            });
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(EngineError::EngineExited {
                kind: cfg.kind,
                program: cmd.program.clone(),
                port,
                status,
            });
        }
        if started.elapsed() >= cfg.ready_timeout {
            stop_tree(pid, Stop::Force).await;
            let _ = child.kill().await;
            return Err(EngineError::NotReady {
                kind: cfg.kind,
                port,
                waited: cfg.ready_timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops the process tree our child `pid` leads, as this OS does it
/// (`pair_os::process::stop_command`), through the system's own tool, since
/// this crate forbids `unsafe` and carries no libc.
async fn stop_tree(pid: u32, how: Stop) {
    let Some(cmd) = pair_os::process::stop_command(pair_os::Os::current(), pid, how) else {
        return;
    };
    let _ = Command::new(cmd.program)
        .args(&cmd.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any argv, each word single-quoted (with `'` written as `'\''`),
        /// parses back to itself.
        #[test]
        fn quoted_argv_round_trips(argv in proptest::collection::vec("[^\\x00]{0,12}", 1..6)) {
            prop_assume!(!argv[0].is_empty());
            let line = argv
                .iter()
                .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
                .collect::<Vec<_>>()
                .join(" ");
            let c = EngineCommand::parse(&line).unwrap();
            prop_assert_eq!(c.program(), argv[0].as_str());
            prop_assert_eq!(c.args(), &argv[1..]);
        }
    }

    #[test]
    fn command_lines_split_like_a_shell_without_expansion() {
        let c = EngineCommand::parse(
            r#"  llama-server -m "/models/my model.gguf" --port {port} --alias 'a b' x\ y "#,
        )
        .unwrap();
        assert_eq!(c.program(), "llama-server");
        assert_eq!(
            c.args(),
            [
                "-m",
                "/models/my model.gguf",
                "--port",
                "{port}",
                "--alias",
                "a b",
                "x y"
            ]
        );
        assert!(c.mentions_port());
        assert_eq!(c.render_args("127.0.0.1", 1235)[3], "1235");
        assert_eq!(EngineCommand::parse(r#"a "" b"#).unwrap().args(), ["", "b"]);
        for bad in ["", "   ", "a 'b", "a \"b", "a \\"] {
            assert!(
                matches!(
                    EngineCommand::parse(bad),
                    Err(EngineError::BadCommand { .. })
                ),
                "{bad:?}"
            );
        }
        assert!(
            !EngineCommand::parse("ollama serve")
                .unwrap()
                .mentions_port()
        );
    }

    /// On Windows a path's backslashes are not escapes.
    #[test]
    fn windows_command_lines_keep_their_paths() {
        let c = EngineCommand::parse_for(
            pair_os::Os::Windows,
            r#""C:\Program Files\llama\llama-server.exe" -m C:\models\q.gguf --port {port}"#,
        )
        .unwrap();
        assert_eq!(c.program(), r"C:\Program Files\llama\llama-server.exe");
        assert_eq!(c.args(), [r"-m", r"C:\models\q.gguf", "--port", "{port}"]);
        assert!(matches!(
            EngineCommand::parse_for(pair_os::Os::Windows, "  "),
            Err(EngineError::BadCommand { .. })
        ));
    }
}
