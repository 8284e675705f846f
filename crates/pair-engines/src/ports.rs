//! Port inversion, the pure decision: pair's proxy owns the engine's usual
//! port and the engine runs behind it on the moved one. Given what answers
//! on each port and whether pair may launch the engine, say what to do.

use pair_core::EngineKind;
use serde::{Deserialize, Serialize};

use crate::EngineError;

/// What answers on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortUse {
    /// Nothing listens.
    Free,
    /// The configured engine answers its own API there.
    Engine,
    /// Something listens, but it is not the engine.
    Other,
}

/// The proxy's port and the engine's port for one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortPair {
    /// The engine's usual port, which the proxy takes (11434, 1234).
    pub usual: u16,
    /// Where the engine runs behind the proxy (11435, 1235).
    pub moved: u16,
}

impl PortPair {
    /// The defaults for `kind`: usual and usual + 1.
    pub fn for_kind(kind: EngineKind) -> Self {
        Self {
            usual: kind.usual_port(),
            moved: crate::moved_port(kind),
        }
    }
}

/// What to do about the engine at start-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortPlan {
    /// The engine already runs on the moved port: use it, never stop it.
    Adopt,
    /// Start the configured engine command on the moved port; pair owns
    /// that process and stops it on shutdown.
    Launch,
    /// Nothing there and no command: poll the moved port anyway. The engine
    /// counts as down (its models unroutable) until the user starts it.
    Await,
}

/// Decides the start-up plan for one engine.
///
/// The usual port must be free for the proxy. If the engine itself holds
/// it, the error tells the user the one command that moves it; pair never
/// stops a process it did not start, even with `--engine-cmd`.
pub fn plan_ports(
    kind: EngineKind,
    ports: PortPair,
    usual: PortUse,
    moved: PortUse,
    can_launch: bool,
) -> Result<PortPlan, EngineError> {
    match usual {
        PortUse::Engine => {
            return Err(EngineError::EngineOnUsualPort {
                kind,
                usual: ports.usual,
                moved: ports.moved,
            });
        }
        PortUse::Other => {
            return Err(EngineError::OtherOnUsualPort {
                kind,
                port: ports.usual,
            });
        }
        PortUse::Free => {}
    }
    match (moved, can_launch) {
        (PortUse::Engine, _) => Ok(PortPlan::Adopt),
        (PortUse::Other, _) => Err(EngineError::OtherOnMovedPort {
            kind,
            port: ports.moved,
        }),
        (PortUse::Free, true) => Ok(PortPlan::Launch),
        (PortUse::Free, false) => Ok(PortPlan::Await),
    }
}

/// The command that starts `kind` on `host:port`, for messages.
pub fn move_hint(kind: EngineKind, host: &str, port: u16) -> String {
    match kind {
        EngineKind::Ollama => format!("`OLLAMA_HOST={host}:{port} ollama serve`"),
        EngineKind::LmStudio => format!("`lms server start --port {port}`"),
        EngineKind::OpenAiCompat => format!(
            "`llama-server --port {port}` (llama.cpp), `vllm serve MODEL --port {port}` (vLLM) \
             or `python -m llama_cpp.server --port {port}` (llama-cpp-python)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL_USES: [PortUse; 3] = [PortUse::Free, PortUse::Engine, PortUse::Other];

    #[test]
    fn engine_on_the_usual_port_gets_one_clear_message() {
        let k = EngineKind::Ollama;
        let err = plan_ports(
            k,
            PortPair::for_kind(k),
            PortUse::Engine,
            PortUse::Free,
            true,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            EngineError::EngineOnUsualPort {
                usual: 11434,
                moved: 11435,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.contains("OLLAMA_HOST=127.0.0.1:11435 ollama serve"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));

        let lms = EngineKind::LmStudio;
        let msg = plan_ports(
            lms,
            PortPair::for_kind(lms),
            PortUse::Engine,
            PortUse::Free,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("lms server start --port 1235"), "{msg}");
        let oai = EngineKind::OpenAiCompat;
        let msg = plan_ports(
            oai,
            PortPair::for_kind(oai),
            PortUse::Engine,
            PortUse::Free,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("--port 1235"), "{msg}");
    }

    #[test]
    fn adopt_launch_or_await() {
        let k = EngineKind::OpenAiCompat;
        let p = PortPair {
            usual: 40001,
            moved: 40002,
        };
        assert_eq!(
            plan_ports(k, p, PortUse::Free, PortUse::Engine, true).unwrap(),
            PortPlan::Adopt
        );
        assert_eq!(
            plan_ports(k, p, PortUse::Free, PortUse::Engine, false).unwrap(),
            PortPlan::Adopt
        );
        assert_eq!(
            plan_ports(k, p, PortUse::Free, PortUse::Free, true).unwrap(),
            PortPlan::Launch
        );
        assert_eq!(
            plan_ports(k, p, PortUse::Free, PortUse::Free, false).unwrap(),
            PortPlan::Await
        );
        assert!(matches!(
            plan_ports(k, p, PortUse::Free, PortUse::Other, true),
            Err(EngineError::OtherOnMovedPort { port: 40002, .. })
        ));
        assert!(matches!(
            plan_ports(k, p, PortUse::Other, PortUse::Free, true),
            Err(EngineError::OtherOnUsualPort { port: 40001, .. })
        ));
    }

    fn use_of() -> impl Strategy<Value = PortUse> {
        proptest::sample::select(ALL_USES.to_vec())
    }

    proptest! {
        /// Launch only onto a free moved port, only with a command, only
        /// with the usual port free: pair never fights a process it did not
        /// start.
        #[test]
        fn never_launches_over_anything(usual in use_of(), moved in use_of(), can in any::<bool>()) {
            let k = EngineKind::Ollama;
            match plan_ports(k, PortPair::for_kind(k), usual, moved, can) {
                Ok(PortPlan::Launch) => prop_assert!(can && usual == PortUse::Free && moved == PortUse::Free),
                Ok(PortPlan::Adopt) => prop_assert!(usual == PortUse::Free && moved == PortUse::Engine),
                Ok(PortPlan::Await) => prop_assert!(!can && usual == PortUse::Free && moved == PortUse::Free),
                Err(_) => prop_assert!(usual != PortUse::Free || moved == PortUse::Other),
            }
        }
    }
}
