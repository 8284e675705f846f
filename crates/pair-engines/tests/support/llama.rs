//! Starts a real OpenAI-compatible engine, llama-cpp-python's server with
//! the SmolLM2-135M GGUF, as a child the test owns (killed on drop).
//!
//! Paths from `pair_testkit::env::llama_paths` (`PAIR_LLAMA_PYTHON` /
//! `PAIR_LLAMA_MODEL`, else the cache `scripts/setup-python.sh` builds); a
//! missing interpreter or model fails the test.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use pair_core::EngineKind;
use pair_engines::{EngineCommand, PortUse, inspect_port};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The interpreter of the llama-cpp-python venv and the GGUF model.
pub(crate) fn llama_paths() -> anyhow::Result<(PathBuf, PathBuf)> {
    pair_testkit::env::llama_paths().map_err(anyhow::Error::msg)
}

/// The command line that serves the model under the alias `smollm2`, with
/// `{port}` left for the caller (or the supervisor) to fill in.
/// `--interrupt_requests False`: with the default, a second request
/// truncates the stream being served (see engine-figures.md).
pub(crate) fn llama_command() -> anyhow::Result<EngineCommand> {
    let (python, model) = llama_paths()?;
    let argv = [
        python.to_string_lossy().into_owned(),
        "-m".into(),
        "llama_cpp.server".into(),
        "--model".into(),
        model.to_string_lossy().into_owned(),
        "--model_alias".into(),
        "smollm2".into(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        "{port}".into(),
        "--interrupt_requests".into(),
        "False".into(),
    ];
    Ok(EngineCommand::from_argv(argv.into_iter().collect())?)
}

/// A llama-cpp-python server this test started.
#[derive(Debug)]
pub(crate) struct LlamaServer {
    child: Child,
    port: u16,
}

impl LlamaServer {
    /// Starts the server on `port` and waits until `/v1/models` answers.
    pub(crate) async fn start(port: u16) -> anyhow::Result<Self> {
        let cmd = llama_command()?;
        let child = Command::new(cmd.program())
            .args(cmd.render_args("127.0.0.1", port))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", cmd.program()))?;
        let mut server = Self { child, port };
        server.wait_ready(Duration::from_secs(90)).await?;
        Ok(server)
    }

    async fn wait_ready(&mut self, within: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let seen = inspect_port(
                EngineKind::OpenAiCompat,
                "127.0.0.1",
                self.port,
                Duration::from_secs(2),
            )
            .await?;
            if seen == PortUse::Engine {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "llama-cpp-python exited ({status}) before answering on port {}",
                    self.port
                );
            }
            if started.elapsed() > within {
                bail!(
                    "llama-cpp-python did not answer on port {} within {within:?}",
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills the server (SIGKILL: a crash, not a shutdown) and reaps it.
    pub(crate) async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await.context("killing llama-cpp-python")
    }
}
