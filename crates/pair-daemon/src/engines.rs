//! Which engines the node fronts, decided at start: the ones named with
//! `--engine`, the one `--engine-cmd` starts (or adopts) on its moved port,
//! or, with neither, the ones found on this machine's loopback.

use pair_core::EngineKind;
use pair_engines::detect::{self, Finding};
use pair_engines::{EngineConfig, EngineSupervisor, SupervisorConfig};

use crate::config::{ConfigError, NodeConfig};

/// The engines to poll and route to, and the supervisor of the one the
/// node started, if any (stopped at shutdown).
#[derive(Debug)]
pub struct EngineSetup {
    pub engines: Vec<EngineConfig>,
    pub supervisor: Option<EngineSupervisor>,
}

/// Deadline for each identifying request of the start-up scan.
const SCAN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Decides the node's engines (see the module comment). Errors are the
/// user's to fix, each one sentence naming the command that fixes it.
pub async fn set_up(cfg: &NodeConfig) -> Result<EngineSetup, ConfigError> {
    match (&cfg.engine_cmd, cfg.default_engine) {
        (Some(cmd), _) => {
            // One engine, given or the default Ollama, started on its
            // moved port unless it already runs there.
            let engine = match cfg.engines.as_slice() {
                [one] => one.clone(),
                _ => return Err(ConfigError::EngineCmdNeedsOneEngine(cfg.engines.len())),
            };
            let mut sc = SupervisorConfig::new(engine.kind);
            sc.host = engine.base_url.host().to_owned();
            sc.ports.moved = engine.base_url.port();
            sc.ports.usual = face_port(cfg, engine.kind);
            sc.slots = engine.slots;
            sc.command = Some(cmd.clone());
            let sup = EngineSupervisor::start(sc)
                .await
                .map_err(ConfigError::EnginePorts)?;
            Ok(EngineSetup {
                engines: vec![sup.engine().clone()],
                supervisor: Some(sup),
            })
        }
        (None, false) => {
            for e in &cfg.engines {
                tracing::info!(engine = %e.kind, url = %e.base_url, "engine named with --engine");
            }
            Ok(EngineSetup {
                engines: cfg.engines.clone(),
                supervisor: None,
            })
        }
        (None, true) => Ok(EngineSetup {
            engines: detect(cfg).await?,
            supervisor: None,
        }),
    }
}

/// The port of the face that stands where an engine of `kind` usually
/// listens.
fn face_port(cfg: &NodeConfig, kind: EngineKind) -> u16 {
    match kind {
        EngineKind::Ollama => cfg.ollama_face.port(),
        EngineKind::LmStudio | EngineKind::OpenAiCompat => cfg.openai_face.port(),
    }
}

/// Scans the detection ports and the faces' own (an engine still there is
/// told how to move), logs what answered and adopts every engine; with
/// none, says what to run and awaits Ollama on the first detection port.
async fn detect(cfg: &NodeConfig) -> Result<Vec<EngineConfig>, ConfigError> {
    let host = "127.0.0.1";
    let faces = [cfg.ollama_face.port(), cfg.openai_face.port()];
    let mut ports = cfg.detect_ports.clone();
    for port in faces {
        if port != 0 && !ports.contains(&port) {
            ports.push(port);
        }
    }
    let found = detect::scan(host, &ports, SCAN_TIMEOUT)
        .await
        .map_err(ConfigError::EnginePorts)?;
    for (port, finding) in &found {
        match finding {
            Finding::Engine { product, models } => {
                let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
                tracing::info!(
                    port,
                    engine = %product,
                    kind = %product.kind(),
                    models = %names.join(", "),
                    "found {product} on 127.0.0.1:{port}"
                );
            }
            Finding::PairNode => {
                tracing::info!(
                    port,
                    "another pair-node answers on 127.0.0.1:{port}; not an engine"
                );
            }
            Finding::Other => tracing::info!(
                port,
                "something on 127.0.0.1:{port} answers no engine API pair knows; left alone"
            ),
            Finding::Free => {}
        }
    }
    let plan = detect::plan_found(host, &found, &faces).map_err(ConfigError::EnginePorts)?;
    if plan.is_empty() {
        let awaited = cfg
            .detect_ports
            .first()
            .copied()
            .unwrap_or_else(|| pair_engines::moved_port(EngineKind::Ollama));
        tracing::warn!("{}", detect::nothing_found_hint(&ports, awaited));
        return Ok(vec![EngineConfig {
            kind: EngineKind::Ollama,
            base_url: pair_engines::EngineUrl::http(host, awaited),
            slots: None,
        }]);
    }
    let list: Vec<String> = plan
        .iter()
        .map(|(product, e)| format!("{product} at {}", e.base_url))
        .collect();
    tracing::info!("routing to {} engine(s): {}", plan.len(), list.join("; "));
    Ok(plan.into_iter().map(|(_, e)| e).collect())
}
