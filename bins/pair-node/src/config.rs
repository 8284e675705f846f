//! The node's configuration: a TOML file, environment variables and flags,
//! parsed once into typed values (flags beat the environment, which beats
//! the file, which beats the defaults).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pair_core::EngineKind;
use pair_discovery::StaticPeer;
use pair_engines::EngineConfig;
use pair_http::HttpStack;
use pair_http::conns::ClientDeadlines;
use pair_scheduler::Policy;
use serde::Deserialize;

/// Default LAN port for everything between nodes.
pub const DEFAULT_CLUSTER_PORT: u16 = 14318;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid engine {input:?}: expected KIND=URL, e.g. ollama=http://127.0.0.1:11435")]
    EngineSyntax { input: String },
    #[error("invalid engine {input:?}")]
    Engine {
        input: String,
        #[source]
        source: pair_engines::EngineError,
    },
    #[error("invalid engine kind in {input:?}")]
    EngineKind {
        input: String,
        #[source]
        source: pair_core::CoreError,
    },
    #[error("invalid policy {0:?} (expected one of: {names})", names = Policy::NAMES.join(", "))]
    Policy(String),
    #[error("invalid static peer {input:?}")]
    Peer {
        input: String,
        #[source]
        source: pair_discovery::DiscoveryError,
    },
    #[error("invalid duration {input:?} for {what}")]
    Duration {
        what: &'static str,
        input: String,
        #[source]
        source: humantime::DurationError,
    },
    #[error("no state directory: set --state-dir, PAIR_STATE_DIR, XDG_CONFIG_HOME or HOME")]
    NoStateDir,
    /// Port inversion failed (e.g. the engine still holds the face's port):
    /// the engine crate's message says how to move it.
    #[error(transparent)]
    EnginePorts(pair_engines::EngineError),
}

/// Where mDNS runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mdns {
    /// No multicast: static peers only.
    Off,
    /// Loopback only (the demo, tests, a single machine).
    Loopback,
    /// Every real LAN interface (never container bridges or VPN tunnels).
    Lan,
}

/// The settings file, all optional. Same names as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub name: Option<String>,
    pub ollama_face: Option<SocketAddr>,
    pub openai_face: Option<SocketAddr>,
    pub cluster: Option<SocketAddr>,
    pub engines: Option<Vec<String>>,
    pub policy: Option<String>,
    pub peers: Option<Vec<String>>,
    pub mdns: Option<Mdns>,
    pub mdns_port: Option<u16>,
    pub first_byte_timeout: Option<String>,
    pub engine_cmd: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<String>,
    pub head_timeout: Option<String>,
    pub body_timeout: Option<String>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// Flags of `pair-node run` (each also readable from a `PAIR_*` variable).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct RunArgs {
    /// Settings file (TOML).
    #[arg(long, env = "PAIR_CONFIG")]
    pub config: Option<PathBuf>,
    /// State directory (identity, key, trust store, job history).
    /// Default: $XDG_CONFIG_HOME/pair.
    #[arg(long, env = "PAIR_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Display name of this node (default: host name).
    #[arg(long, env = "PAIR_NAME")]
    pub name: Option<String>,
    /// Ollama face address (loopback only). Default 127.0.0.1:11434.
    #[arg(long, env = "PAIR_OLLAMA_FACE")]
    pub ollama_face: Option<SocketAddr>,
    /// OpenAI / LM Studio face address (loopback only). Default 127.0.0.1:1234.
    #[arg(long, env = "PAIR_OPENAI_FACE")]
    pub openai_face: Option<SocketAddr>,
    /// Cluster port for peers. Default 0.0.0.0:14318.
    #[arg(long, env = "PAIR_CLUSTER")]
    pub cluster: Option<SocketAddr>,
    /// Local engine as KIND=URL (repeatable), e.g. ollama=http://127.0.0.1:11435.
    #[arg(long = "engine", env = "PAIR_ENGINES", value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Routing policy.
    #[arg(long, env = "PAIR_POLICY")]
    pub policy: Option<String>,
    /// Static peer HOST:PORT for networks without multicast (repeatable).
    #[arg(long = "peer", env = "PAIR_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Where mDNS runs.
    #[arg(long, value_enum, env = "PAIR_MDNS")]
    pub mdns: Option<Mdns>,
    /// mDNS UDP port (5353 on a real LAN).
    #[arg(long, env = "PAIR_MDNS_PORT")]
    pub mdns_port: Option<u16>,
    /// Give up on a node that sends no first byte within this (e.g. 120s).
    #[arg(long, env = "PAIR_FIRST_BYTE_TIMEOUT")]
    pub first_byte_timeout: Option<String>,
    /// Start the (default Ollama) engine on its moved port with this command
    /// when nothing answers there, e.g. "ollama serve"; `{host}` and `{port}`
    /// are replaced. The node stops the engine it started, and only that one.
    #[arg(long, env = "PAIR_ENGINE_CMD")]
    pub engine_cmd: Option<String>,
    /// A host name the faces answer besides localhost, 127.0.0.0/8 and
    /// `[::1]` (repeatable), for a reverse proxy of your own in front of the
    /// node; any other `Host` gets 403 (DNS-rebinding guard).
    #[arg(
        long = "allowed-host",
        env = "PAIR_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Open connections the faces and the cluster port hold in all; at the
    /// cap the longest-idle keep-alive connection is closed for a new one,
    /// and with none idle the new one gets 503. Default: the open-file
    /// limit less a reserve for engines, peers and files.
    #[arg(long, env = "PAIR_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Close a face's keep-alive connection after this long without a
    /// request. Default 60s.
    #[arg(long, env = "PAIR_IDLE_TIMEOUT")]
    pub idle_timeout: Option<String>,
    /// A request head must be whole this long after its first byte.
    /// Default 10s.
    #[arg(long, env = "PAIR_HEAD_TIMEOUT")]
    pub head_timeout: Option<String>,
    /// A request body must end this long after its head, plus one second
    /// per 16 KiB that arrived. Default 10s.
    #[arg(long, env = "PAIR_BODY_TIMEOUT")]
    pub body_timeout: Option<String>,
    /// Benchmarks only: serve the faces with hyper and call the engines
    /// with hyper-util's client instead of the hand-framed HTTP/1.1.
    #[arg(long, value_enum, hide = true)]
    pub http_stack: Option<HttpStackArg>,
}

/// `--http-stack`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HttpStackArg {
    Native,
    Hyper,
}

/// The node's configuration, typed.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub state_dir: PathBuf,
    pub name: String,
    pub ollama_face: SocketAddr,
    pub openai_face: SocketAddr,
    pub cluster: SocketAddr,
    pub engines: Vec<EngineConfig>,
    pub policy: Policy,
    pub peers: Vec<StaticPeer>,
    pub mdns: Mdns,
    pub mdns_port: u16,
    pub first_byte_timeout: Duration,
    /// No `--engine` given: the default engine is found (or launched) by
    /// port inversion.
    pub default_engine: bool,
    pub engine_cmd: Option<pair_engines::EngineCommand>,
    /// Event loops serving connections (thread per core, see
    /// `pair_http::runtime`); set from `--threads`, 1 in `resolve`.
    pub event_loops: usize,
    /// Host names the faces accept besides loopback ones.
    pub allowed_hosts: Vec<String>,
    /// Cap on open connections (`None`: from the open-file limit).
    pub max_connections: Option<usize>,
    /// How long a face's client may take.
    pub deadlines: ClientDeadlines,
    pub http_stack: HttpStack,
}

impl NodeConfig {
    /// Merges flags/env over the file over defaults. `home` and
    /// `xdg_config` come from the environment; `hostname` names the node.
    pub fn resolve(
        args: RunArgs,
        file: FileConfig,
        xdg_config: Option<PathBuf>,
        home: Option<PathBuf>,
        hostname: Option<String>,
    ) -> Result<Self, ConfigError> {
        let state_dir = match args.state_dir {
            Some(d) => d,
            None => default_state_dir(xdg_config, home)?,
        };
        let engines = if args.engines.is_empty() {
            file.engines.unwrap_or_default()
        } else {
            args.engines
        };
        let default_engine = engines.is_empty();
        let engines = if engines.is_empty() {
            vec![EngineConfig::moved_default(EngineKind::Ollama)]
        } else {
            engines
                .iter()
                .map(|e| parse_engine(e))
                .collect::<Result<_, _>>()?
        };
        let policy_name = args.policy.or(file.policy);
        let policy = match policy_name {
            Some(p) => p.parse::<Policy>().map_err(|_| ConfigError::Policy(p))?,
            None => Policy::default(),
        };
        let peers = if args.peers.is_empty() {
            file.peers.unwrap_or_default()
        } else {
            args.peers
        };
        let peers = peers
            .iter()
            .map(|p| {
                p.parse::<StaticPeer>().map_err(|source| ConfigError::Peer {
                    input: p.clone(),
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        let first_byte_timeout = duration(
            "first-byte-timeout",
            args.first_byte_timeout.or(file.first_byte_timeout),
            pair_http::Timeouts::default().first_byte,
        )?;
        let d = ClientDeadlines::default();
        let deadlines = ClientDeadlines {
            idle: duration(
                "idle-timeout",
                args.idle_timeout.or(file.idle_timeout),
                d.idle,
            )?,
            head: duration(
                "head-timeout",
                args.head_timeout.or(file.head_timeout),
                d.head,
            )?,
            body_grace: duration(
                "body-timeout",
                args.body_timeout.or(file.body_timeout),
                d.body_grace,
            )?,
            body_min_rate: d.body_min_rate,
        };
        Ok(Self {
            state_dir,
            name: args
                .name
                .or(file.name)
                .or(hostname)
                .unwrap_or_else(|| "pair-node".to_owned()),
            ollama_face: args
                .ollama_face
                .or(file.ollama_face)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 11434))),
            openai_face: args
                .openai_face
                .or(file.openai_face)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 1234))),
            cluster: args
                .cluster
                .or(file.cluster)
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], DEFAULT_CLUSTER_PORT))),
            engines,
            policy,
            peers,
            mdns: args.mdns.or(file.mdns).unwrap_or(Mdns::Lan),
            mdns_port: args
                .mdns_port
                .or(file.mdns_port)
                .unwrap_or(pair_discovery::MDNS_PORT),
            first_byte_timeout,
            default_engine,
            engine_cmd: match args.engine_cmd.or(file.engine_cmd) {
                Some(c) => Some(
                    pair_engines::EngineCommand::parse(&c)
                        .map_err(|source| ConfigError::Engine { input: c, source })?,
                ),
                None => None,
            },
            event_loops: 1,
            allowed_hosts: if args.allowed_hosts.is_empty() {
                file.allowed_hosts.unwrap_or_default()
            } else {
                args.allowed_hosts
            },
            max_connections: args.max_connections.or(file.max_connections),
            deadlines,
            http_stack: match args.http_stack {
                Some(HttpStackArg::Hyper) => HttpStack::Hyper,
                Some(HttpStackArg::Native) | None => HttpStack::Native,
            },
        })
    }
}

/// A duration flag (`120s`, `2m`), or `default` when it was not given.
fn duration(
    what: &'static str,
    input: Option<String>,
    default: Duration,
) -> Result<Duration, ConfigError> {
    match input {
        Some(s) => humantime::parse_duration(&s).map_err(|source| ConfigError::Duration {
            what,
            input: s,
            source,
        }),
        None => Ok(default),
    }
}

/// `$XDG_CONFIG_HOME/pair`, else `$HOME/.config/pair`.
pub fn default_state_dir(
    xdg_config: Option<PathBuf>,
    home: Option<PathBuf>,
) -> Result<PathBuf, ConfigError> {
    xdg_config
        .or_else(|| home.map(|h| h.join(".config")))
        .map(|d| d.join("pair"))
        .ok_or(ConfigError::NoStateDir)
}

/// `KIND=URL` (`ollama=http://127.0.0.1:11435`).
pub fn parse_engine(input: &str) -> Result<EngineConfig, ConfigError> {
    let (kind, url) = input
        .split_once('=')
        .ok_or_else(|| ConfigError::EngineSyntax {
            input: input.to_owned(),
        })?;
    let kind = kind
        .trim()
        .parse::<EngineKind>()
        .map_err(|source| ConfigError::EngineKind {
            input: input.to_owned(),
            source,
        })?;
    EngineConfig::new(kind, url.trim(), None).map_err(|source| ConfigError::Engine {
        input: input.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design() {
        let c = NodeConfig::resolve(
            RunArgs::default(),
            FileConfig::default(),
            None,
            Some("/home/u".into()),
            Some("box".into()),
        )
        .unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/home/u/.config/pair"));
        assert_eq!(c.name, "box");
        assert_eq!(c.ollama_face.port(), 11434);
        assert_eq!(c.openai_face.port(), 1234);
        assert_eq!(c.cluster.port(), 14318);
        assert_eq!(c.engines.len(), 1);
        assert_eq!(c.engines[0].kind, EngineKind::Ollama);
        assert_eq!(c.policy, Policy::PredictedLatency);
        assert_eq!(c.mdns, Mdns::Lan);
    }

    #[test]
    fn flags_beat_the_file() {
        let file: FileConfig = toml::from_str(
            r#"
            name = "from-file"
            policy = "pair"
            engines = ["lm-studio=http://127.0.0.1:1235"]
            first-byte-timeout = "30s"
            "#,
        )
        .unwrap();
        let args = RunArgs {
            name: Some("from-flag".into()),
            engines: vec!["openai-compat=http://127.0.0.1:8081".into()],
            ..RunArgs::default()
        };
        let c = NodeConfig::resolve(args, file, Some("/x".into()), None, None).unwrap();
        assert_eq!(c.name, "from-flag");
        assert_eq!(c.policy, Policy::Pair);
        assert_eq!(c.engines[0].kind, EngineKind::OpenAiCompat);
        assert_eq!(c.first_byte_timeout, Duration::from_secs(30));
        assert_eq!(c.state_dir, PathBuf::from("/x/pair"));
    }

    #[test]
    fn bad_values_are_named() {
        let bad = |args: RunArgs| {
            NodeConfig::resolve(args, FileConfig::default(), Some("/x".into()), None, None)
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad(RunArgs {
                policy: Some("fastest".into()),
                ..RunArgs::default()
            })
            .contains("fastest")
        );
        assert!(
            bad(RunArgs {
                engines: vec!["ollama".into()],
                ..RunArgs::default()
            })
            .contains("KIND=URL")
        );
        assert!(
            bad(RunArgs {
                first_byte_timeout: Some("soon".into()),
                ..RunArgs::default()
            })
            .contains("first-byte-timeout")
        );
        assert!(toml::from_str::<FileConfig>("colour = 1").is_err());
    }
}
