//! The node's configuration: a TOML file, environment variables and flags,
//! parsed once into typed values (flags beat the environment, which beats
//! the file, which beats the defaults).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pair_core::EngineKind;
use pair_discovery::StaticPeer;
use pair_engines::{EngineConfig, EngineUrl};
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
    #[error(
        "invalid engine {input:?}: expected KIND=URL (ollama=http://127.0.0.1:11435) or KIND \
         alone for its moved port (ollama, lm-studio, openai-compat)"
    )]
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
    #[cfg(feature = "demo")]
    #[error("invalid emulated hardware")]
    Emulated(#[source] pair_emulator::EmulatorError),
    #[cfg(not(feature = "demo"))]
    #[error("--emulated-hardware needs a pair-node built with the demo feature")]
    NoEmulator,
    #[error("--emulated-speed-scale must be a positive number, not {0}")]
    SpeedScale(f64),
    #[error("invalid model alias {input:?}")]
    Alias {
        input: String,
        #[source]
        source: pair_core::CoreError,
    },
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
    /// An IPv6 zone that is malformed or names no interface here (static
    /// peers, `pair join`).
    #[error(transparent)]
    Address(pair_identity::Error),
    /// The engine's address is one of the node's own: it would poll and
    /// route into itself.
    #[error(
        "{} is this node's own {own} ({addr}): the node would send every request back into itself; {}",
        engine_label(*.kind, .url, *.default_engine),
        self_loop_fix(*.kind, .url, *.own, *.free_port, *.default_engine)
    )]
    EngineIsSelf {
        kind: EngineKind,
        url: EngineUrl,
        /// No `--engine` was given: this is the default engine's address.
        default_engine: bool,
        own: OwnPort,
        addr: SocketAddr,
        /// A port the engine could move to (none of the node's own).
        free_port: u16,
    },
    #[error(
        "engine {kind}={url} is not on this machine's loopback: prompts and answers would cross \
         the network unencrypted; run the engine on 127.0.0.1 or [::1], or pass \
         --allow-remote-engine (PAIR_ALLOW_REMOTE_ENGINE=1) if that network is yours"
    )]
    RemoteEngine { kind: EngineKind, url: EngineUrl },
    #[error("no state directory: this user has no home folder; set --state-dir or PAIR_STATE_DIR")]
    NoStateDir,
    /// `pair-node service install`'s flags are not `run`'s.
    #[error("the service's flags are not pair-node run's: {0}")]
    Service(clap::Error),
    /// Port inversion failed (e.g. the engine still holds the face's port):
    /// the engine crate's message says how to move it.
    #[error(transparent)]
    EnginePorts(pair_engines::EngineError),
    #[error(
        "invalid engine {input:?}: after `?` only slots=N (N at least 1) is understood, \
         e.g. ollama=http://127.0.0.1:11435?slots=4"
    )]
    EngineSlots { input: String },
    /// `--engine-cmd` starts one engine; several `--engine` leave open which.
    #[error(
        "--engine-cmd starts one engine, but {0} engines are named with --engine; \
         name the one it starts (start the others yourself)"
    )]
    EngineCmdNeedsOneEngine(usize),
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

/// Request body bytes held across connections while they arrive, by
/// default: two bodies at the 32 MiB cap.
pub const DEFAULT_BODY_BUDGET: usize = 64 << 20;

/// The settings file, all optional. Same names as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    pub name: Option<String>,
    pub ollama_face: Option<SocketAddr>,
    pub openai_face: Option<SocketAddr>,
    pub cluster: Option<SocketAddr>,
    pub engines: Option<Vec<String>>,
    pub allow_remote_engine: Option<bool>,
    pub policy: Option<String>,
    pub peers: Option<Vec<String>>,
    pub mdns: Option<Mdns>,
    pub mdns_port: Option<u16>,
    pub first_byte_timeout: Option<String>,
    pub engine_cmd: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
    pub aliases: Option<Vec<String>>,
    pub lan_face: Option<SocketAddr>,
    pub allowed_origins: Option<Vec<String>>,
    pub lan_max_per_address: Option<usize>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<String>,
    pub head_timeout: Option<String>,
    pub body_timeout: Option<String>,
    pub body_stall_timeout: Option<String>,
    pub body_budget_mib: Option<u64>,
    pub metrics_listen: Option<SocketAddr>,
    pub resume: Option<Switch>,
    pub resume_limit: Option<u8>,
    pub queue: Option<QueueSetting>,
}

/// Late binding: `off`, or the order requests wait in at the cluster
/// while every node that could take them is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum QueueSetting {
    /// Each request is committed to a node at once (its engine queues it).
    Off,
    /// First come, first served.
    Fifo,
    /// Shortest predicted job first, with aging.
    Sjf,
    /// Shortest first, `x-pair-priority: batch` after interactive work.
    Priorities,
    /// Priorities, and interactive work that would wait for a slot cuts a
    /// running batch answer, which continues later from its text so far.
    Preempt,
}

impl QueueSetting {
    pub fn queue(self) -> Option<pair_proxy::waiting::Queue> {
        use pair_proxy::waiting::Queue;
        use pair_scheduler::Order;
        match self {
            Self::Off => None,
            Self::Fifo => Some(Order::Fifo.into()),
            Self::Sjf => Some(Order::ShortestFirst.into()),
            Self::Priorities => Some(Order::Priorities.into()),
            Self::Preempt => Some(Queue::PREEMPT),
        }
    }
}

/// `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Switch {
    On,
    Off,
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
    /// Default: $XDG_CONFIG_HOME/pair on Linux, ~/Library/Application
    /// Support/pair on macOS, %LOCALAPPDATA%\pair on Windows.
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
    /// Local engine as KIND=URL (repeatable), e.g. ollama=http://127.0.0.1:11435,
    /// or KIND alone for the kind's moved port on loopback (11435, 1235);
    /// `?slots=N` after either says how many requests it runs at once
    /// (Ollama's OLLAMA_NUM_PARALLEL), else it is read or learned.
    /// Without it, engines are looked for on this machine's loopback.
    #[arg(long = "engine", env = "PAIR_ENGINES", value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Accept an engine that is not on loopback (another machine, a LAN
    /// address): prompts and answers then cross that network unencrypted.
    #[arg(
        long,
        env = "PAIR_ALLOW_REMOTE_ENGINE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub allow_remote_engine: bool,
    /// Routing policy.
    #[arg(long, env = "PAIR_POLICY")]
    pub policy: Option<String>,
    /// Static peer HOST:PORT for networks without multicast (repeatable);
    /// a link-local IPv6 peer with its interface: [fe80::1%eth0]:14318.
    #[arg(long = "peer", env = "PAIR_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Where mDNS runs.
    #[arg(long, value_enum, env = "PAIR_MDNS")]
    pub mdns: Option<Mdns>,
    /// mDNS UDP port (5353 on a real LAN).
    #[arg(long, env = "PAIR_MDNS_PORT")]
    pub mdns_port: Option<u16>,
    /// How long an engine may show no progress and give no reason to wait
    /// before it is taken as hung and routed around (default 10s; a model
    /// it is loading, its token counters moving, or a predicted queue or
    /// prefill are waited for longer); also how long a request waits for
    /// an owner of its model to come back.
    #[arg(long, env = "PAIR_FIRST_BYTE_TIMEOUT")]
    pub first_byte_timeout: Option<String>,
    /// Start the engine named with --engine (Ollama when none is) on its
    /// port with this command when nothing answers there, e.g. "ollama
    /// serve"; `{host}` and `{port}` are replaced. The node stops the engine
    /// it started, and only that one.
    #[arg(long, env = "PAIR_ENGINE_CMD")]
    pub engine_cmd: Option<String>,
    /// Tests only: the loopback ports engine detection looks at instead of
    /// the well-known ones.
    #[arg(long, env = "PAIR_DETECT_PORTS", value_delimiter = ',', hide = true)]
    pub detect_ports: Vec<u16>,
    /// A host name the faces answer besides localhost, 127.0.0.0/8 and
    /// `[::1]` (repeatable), for a reverse proxy of your own in front of the
    /// node; any other `Host` gets 403 (DNS-rebinding guard).
    #[arg(
        long = "allowed-host",
        env = "PAIR_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// Opens the LAN face on ADDR (e.g. 0.0.0.0:8443): every API on one
    /// port for other machines, each request with an API key made by
    /// `pair-node keys add` (Authorization: Bearer, or x-api-key). Off by
    /// default.
    #[arg(long, env = "PAIR_LAN_FACE")]
    pub lan_face: Option<SocketAddr>,
    /// An origin whose web pages may call the LAN face (repeatable), e.g.
    /// `http://nas.lan:8080` for Open WebUI; CORS preflights are answered
    /// for these.
    #[arg(
        long = "allowed-origin",
        env = "PAIR_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub allowed_origins: Vec<String>,
    /// Connections one client address may hold on the LAN face. Default 32.
    #[arg(long, env = "PAIR_LAN_MAX_PER_ADDRESS")]
    pub lan_max_per_address: Option<usize>,
    /// A model alias, PATTERN=MODEL (repeatable): requests for a model no
    /// node holds whose name matches PATTERN (an exact name, or `*` for any
    /// run of characters: 'claude-*=qwen2.5:7b') go to MODEL. Aliases hold
    /// cluster-wide: every node applies every node's, its own first.
    #[arg(long = "alias", env = "PAIR_ALIASES", value_delimiter = ',')]
    pub aliases: Vec<String>,
    /// Open connections the faces and the cluster port hold in all; at the
    /// cap the longest-idle keep-alive connection is closed for a new one,
    /// and with none idle the new one gets 503. Default: the open-file
    /// limit less a reserve for engines, peers and files.
    #[arg(long, env = "PAIR_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Also serve `GET /metrics` (Prometheus text, nothing else) on this
    /// address, e.g. 0.0.0.0:9464, for a Prometheus on another machine.
    /// Off by default: the faces serve `/metrics` on loopback only.
    #[arg(long, env = "PAIR_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
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
    /// A request body that sends no byte for this long is cut, however
    /// much it sent before. Default 10s.
    #[arg(long, env = "PAIR_BODY_STALL_TIMEOUT")]
    pub body_stall_timeout: Option<String>,
    /// Continue a stream cut after its first byte (its node gone, its
    /// engine crashed, the link cut) on another owner of the model, from
    /// where it was cut. Default on.
    #[arg(long, value_enum, env = "PAIR_RESUME")]
    pub resume: Option<Switch>,
    /// Moves of one answer at most before a cut ends it with an error.
    /// Default 2. A batch answer that `--queue preempt` may cut has 4 more,
    /// for its cuts.
    #[arg(long, env = "PAIR_RESUME_LIMIT", value_parser = clap::value_parser!(u8).range(1..))]
    pub resume_limit: Option<u8>,
    /// Late binding: while every node that could take a request has its
    /// slots full, it waits at the cluster (until `x-pair-deadline`, or 120
    /// s, then 503) and goes to the first node with room: `fifo`, `sjf`
    /// (shortest predicted job first, with aging), `priorities` (sjf, and
    /// `x-pair-priority: batch` after interactive work) or `preempt`
    /// (priorities, and interactive work cuts a running batch answer,
    /// which continues later). Default off.
    #[arg(long, value_enum, env = "PAIR_QUEUE")]
    pub queue: Option<QueueSetting>,
    /// Request body bytes the node holds while they arrive, over every
    /// connection, in MiB; a body with no room gets 503 and Retry-After.
    /// Default 64 (two bodies at the 32 MiB cap).
    #[arg(long, env = "PAIR_BODY_BUDGET_MIB")]
    pub body_budget_mib: Option<u64>,
    /// Benchmarks only: serve the faces with hyper and call the engines
    /// with hyper-util's client instead of the hand-framed HTTP/1.1.
    #[arg(long, value_enum, hide = true)]
    pub http_stack: Option<HttpStackArg>,
    /// The engine is an emulated one of this hardware profile (`pair-sim
    /// live`): the node reports a GPU of the profile's name, as NVML would.
    #[arg(long, hide = true)]
    pub emulated_hardware: Option<String>,
    /// With `--emulated-hardware`: advertise the profile's speeds until jobs
    /// teach the node its own, at this time scale (the emulated engine's
    /// wall seconds per modelled second).
    #[arg(long, hide = true, requires = "emulated_hardware")]
    pub emulated_speed_scale: Option<f64>,
    /// How often the node sends peers its report (default 500ms); a live
    /// twin on a faster clock scales it like everything else.
    #[arg(long, hide = true)]
    pub report_interval: Option<String>,
    /// How often telemetry samples the GPU and host (default 1s, as PAIR);
    /// a live twin on a faster clock scales it like everything else.
    #[arg(long, hide = true)]
    pub telemetry_interval: Option<String>,
}

/// `--emulated-hardware`: what a node over an emulated engine says of its
/// hardware (feature `demo`: the emulator's profiles).
#[cfg(feature = "demo")]
#[derive(Clone, Debug)]
pub struct EmulatedHardware {
    pub profile: pair_emulator::HardwareProfile,
    /// Advertise the profile's speeds at this time scale; `None`: nothing.
    pub speed_scale: Option<f64>,
}

/// `--http-stack`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HttpStackArg {
    Native,
    Hyper,
}

/// The LAN face's settings.
#[derive(Clone, Debug)]
pub struct LanFace {
    pub addr: SocketAddr,
    /// Origins whose pages may call it.
    pub origins: Vec<String>,
    /// Connections one client address may hold.
    pub per_address: usize,
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
    /// How a stream cut after its first byte is continued elsewhere.
    pub resume: pair_proxy::resume::ResumePolicy,
    /// Late binding (`--queue`); `None`: off.
    pub queue: Option<pair_proxy::waiting::Queue>,
    /// No `--engine` given: engines are detected on loopback, or with
    /// `--engine-cmd` the default Ollama is found or launched by port
    /// inversion.
    pub default_engine: bool,
    pub engine_cmd: Option<pair_engines::EngineCommand>,
    /// Loopback ports engine detection looks at.
    pub detect_ports: Vec<u16>,
    /// Event loops serving connections (thread per core, see
    /// `pair_runtime::runtime`); set from `--threads`, 1 in `resolve`.
    pub event_loops: usize,
    /// Host names the faces accept besides loopback ones.
    pub allowed_hosts: Vec<String>,
    /// Model aliases (`--alias`), advertised to the cluster.
    pub aliases: Vec<pair_core::ModelAlias>,
    /// The LAN face, when `--lan-face` opens one.
    pub lan: Option<LanFace>,
    /// Cap on open connections (`None`: from the open-file limit).
    pub max_connections: Option<usize>,
    /// Where `/metrics` is served besides the faces (`--metrics-listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// How long a face's client may take.
    pub deadlines: ClientDeadlines,
    /// Body bytes held across connections while they arrive.
    pub body_budget: usize,
    pub http_stack: HttpStack,
    #[cfg(feature = "demo")]
    pub emulated: Option<EmulatedHardware>,
    /// `--report-interval` (`None`: the gossip default).
    pub report_interval: Option<Duration>,
    /// `--telemetry-interval` (`None`: the sampler's default).
    pub telemetry_interval: Option<Duration>,
}

impl NodeConfig {
    /// Merges flags/env over the file over defaults. `default_state_dir`
    /// is the OS's folder for it ([`default_state_dir`]; `None` where the
    /// user has no home); `hostname` names the node;
    /// `local_ips` are this machine's addresses (an engine at one of them
    /// on a port the node binds would be the node itself).
    pub fn resolve(
        args: RunArgs,
        file: FileConfig,
        default_state_dir: Option<PathBuf>,
        hostname: Option<String>,
        local_ips: &[IpAddr],
    ) -> Result<Self, ConfigError> {
        let state_dir = match args.state_dir {
            Some(d) => d,
            None => default_state_dir.ok_or(ConfigError::NoStateDir)?,
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
            .map(|p| parse_peer(p))
            .collect::<Result<_, _>>()?;
        let first_byte_timeout = duration(
            "first-byte-timeout",
            args.first_byte_timeout.or(file.first_byte_timeout),
            pair_http::Timeouts::default().first_byte,
        )?;
        let ollama_face = args
            .ollama_face
            .or(file.ollama_face)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 11434)));
        let openai_face = args
            .openai_face
            .or(file.openai_face)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 1234)));
        let cluster = args
            .cluster
            .or(file.cluster)
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], DEFAULT_CLUSTER_PORT)));
        check_engines(
            &engines,
            &Host {
                own: [
                    (OwnPort::OllamaFace, ollama_face),
                    (OwnPort::OpenAiFace, openai_face),
                    (OwnPort::Cluster, cluster),
                ],
                local_ips,
                hostname: hostname.as_deref(),
            },
            default_engine,
            args.allow_remote_engine || file.allow_remote_engine.unwrap_or(false),
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
            body_stall: duration(
                "body-stall-timeout",
                args.body_stall_timeout.or(file.body_stall_timeout),
                d.body_stall,
            )?,
        };
        let body_budget = args
            .body_budget_mib
            .or(file.body_budget_mib)
            .map_or(DEFAULT_BODY_BUDGET, |mib| {
                usize::try_from(mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
            });
        #[cfg(not(feature = "demo"))]
        if args.emulated_hardware.is_some() {
            return Err(ConfigError::NoEmulator);
        }
        Ok(Self {
            state_dir,
            name: args
                .name
                .or(file.name)
                .or(hostname)
                .unwrap_or_else(|| "pair-node".to_owned()),
            ollama_face,
            openai_face,
            cluster,
            engines,
            policy,
            peers,
            mdns: args.mdns.or(file.mdns).unwrap_or(Mdns::Lan),
            mdns_port: args
                .mdns_port
                .or(file.mdns_port)
                .unwrap_or(pair_discovery::MDNS_PORT),
            first_byte_timeout,
            resume: match args.resume.or(file.resume).unwrap_or(Switch::On) {
                Switch::Off => pair_proxy::resume::ResumePolicy::OFF,
                Switch::On => pair_proxy::resume::ResumePolicy {
                    limit: args
                        .resume_limit
                        .or(file.resume_limit)
                        .filter(|n| *n > 0)
                        .unwrap_or(pair_proxy::resume::ResumePolicy::default().limit),
                },
            },
            queue: args.queue.or(file.queue).and_then(QueueSetting::queue),
            default_engine,
            engine_cmd: match args.engine_cmd.or(file.engine_cmd) {
                Some(c) => Some(
                    pair_engines::EngineCommand::parse(&c)
                        .map_err(|source| ConfigError::Engine { input: c, source })?,
                ),
                None => None,
            },
            detect_ports: if args.detect_ports.is_empty() {
                pair_engines::detect::well_known_ports()
            } else {
                args.detect_ports
            },
            event_loops: 1,
            allowed_hosts: if args.allowed_hosts.is_empty() {
                file.allowed_hosts.unwrap_or_default()
            } else {
                args.allowed_hosts
            },
            aliases: if args.aliases.is_empty() {
                file.aliases.unwrap_or_default()
            } else {
                args.aliases
            }
            .into_iter()
            .map(|a| {
                a.parse()
                    .map_err(|source| ConfigError::Alias { input: a, source })
            })
            .collect::<Result<_, _>>()?,
            lan: args.lan_face.or(file.lan_face).map(|addr| LanFace {
                addr,
                origins: if args.allowed_origins.is_empty() {
                    file.allowed_origins.clone().unwrap_or_default()
                } else {
                    args.allowed_origins.clone()
                },
                per_address: args
                    .lan_max_per_address
                    .or(file.lan_max_per_address)
                    .unwrap_or(pair_proxy::lan::DEFAULT_PER_ADDRESS),
            }),
            max_connections: args.max_connections.or(file.max_connections),
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            deadlines,
            body_budget,
            http_stack: match args.http_stack {
                Some(HttpStackArg::Hyper) => HttpStack::Hyper,
                Some(HttpStackArg::Native) | None => HttpStack::Native,
            },
            report_interval: interval("report-interval", args.report_interval)?,
            telemetry_interval: interval("telemetry-interval", args.telemetry_interval)?,
            #[cfg(feature = "demo")]
            emulated: match args.emulated_hardware {
                Some(name) => Some(EmulatedHardware {
                    profile: pair_emulator::HardwareProfile::by_name(&name)
                        .map_err(ConfigError::Emulated)?,
                    speed_scale: match args.emulated_speed_scale {
                        Some(s) if !(s.is_finite() && s > 0.0) => {
                            return Err(ConfigError::SpeedScale(s));
                        }
                        s => s,
                    },
                }),
                None => None,
            },
        })
    }
}

/// `--peer HOST:PORT`. A link-local IPv6 peer's zone is checked here and
/// written as its interface index, which the resolver reads for any address.
fn parse_peer(input: &str) -> Result<StaticPeer, ConfigError> {
    let peer = input
        .parse::<StaticPeer>()
        .map_err(|source| ConfigError::Peer {
            input: input.to_owned(),
            source,
        })?;
    if peer.zone().is_none() {
        return Ok(peer);
    }
    match pair_identity::PeerAddr::parse(input).map_err(ConfigError::Address)? {
        pair_identity::PeerAddr::Ip(SocketAddr::V6(a)) => Ok(StaticPeer {
            host: format!("{}%{}", a.ip(), a.scope_id()),
            port: a.port(),
        }),
        _ => Ok(peer),
    }
}

/// A port the node itself listens on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnPort {
    OllamaFace,
    OpenAiFace,
    Cluster,
}

impl OwnPort {
    /// The flag that moves it.
    pub fn flag(self) -> &'static str {
        match self {
            OwnPort::OllamaFace => "--ollama-face",
            OwnPort::OpenAiFace => "--openai-face",
            OwnPort::Cluster => "--cluster",
        }
    }
}

impl fmt::Display for OwnPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OwnPort::OllamaFace => "Ollama face",
            OwnPort::OpenAiFace => "OpenAI face",
            OwnPort::Cluster => "cluster port",
        })
    }
}

fn engine_label(kind: EngineKind, url: &EngineUrl, default_engine: bool) -> String {
    if default_engine {
        format!("the default engine address {url}")
    } else {
        format!("engine {kind}={url}")
    }
}

fn self_loop_fix(
    kind: EngineKind,
    url: &EngineUrl,
    own: OwnPort,
    free_port: u16,
    default_engine: bool,
) -> String {
    let host = if is_loopback_host(url.host()) && !url.host().contains(':') {
        url.host()
    } else {
        "127.0.0.1"
    };
    if default_engine {
        format!(
            "move the {own} with {} (the engine is expected on {host}:{}), or say where the engine runs with --engine {kind}=URL",
            own.flag(),
            url.port()
        )
    } else {
        format!(
            "move the engine to another port, e.g. {} with --engine {kind}=http://{host}:{free_port}, or move the {own} with {}",
            pair_engines::move_hint(kind, host, free_port),
            own.flag()
        )
    }
}

/// What the node knows of the machine it runs on.
#[derive(Clone, Copy, Debug)]
struct Host<'a> {
    /// Where the node listens.
    own: [(OwnPort, SocketAddr); 3],
    local_ips: &'a [IpAddr],
    hostname: Option<&'a str>,
}

/// Refuses an engine the node would route into itself (one of its own
/// addresses), then one off loopback unless `allow_remote`.
fn check_engines(
    engines: &[EngineConfig],
    host: &Host<'_>,
    default_engine: bool,
    allow_remote: bool,
) -> Result<(), ConfigError> {
    for e in engines {
        let url = &e.base_url;
        let hit = host.own.iter().find(|(_, bind)| {
            dials_into(url.host(), url.port(), *bind, host.local_ips, host.hostname)
        });
        if let Some(&(own, addr)) = hit {
            let taken = |p: u16| p == url.port() || host.own.iter().any(|(_, b)| b.port() == p);
            let mut free_port = pair_engines::moved_port(e.kind);
            while taken(free_port) {
                free_port = free_port.wrapping_add(1).max(1024);
            }
            return Err(ConfigError::EngineIsSelf {
                kind: e.kind,
                url: url.clone(),
                default_engine,
                own,
                addr,
                free_port,
            });
        }
        if !allow_remote && !is_loopback_host(url.host()) {
            return Err(ConfigError::RemoteEngine {
                kind: e.kind,
                url: url.clone(),
            });
        }
    }
    Ok(())
}

/// Whether `host` (an engine URL's host) stays on this machine without
/// resolving a name: `localhost`, 127.0.0.0/8, `::1` (also IPv4-mapped),
/// and the unspecified address, which the kernel dials as loopback. Any
/// other name counts as remote.
pub fn is_loopback_host(host: &str) -> bool {
    is_localhost(host)
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback() || ip.is_unspecified())
}

fn is_localhost(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    host.eq_ignore_ascii_case("localhost")
}

/// Whether dialling `host:port` reaches a socket bound to `bind` (port 0
/// never: the system picks a free one). A bind to `0.0.0.0` takes every
/// IPv4 address of the machine, `[::]` every address (dual stack);
/// `local_ips` are the machine's addresses and `hostname` its name. No
/// name is resolved: `localhost` is 127.0.0.1 and ::1, the machine's own
/// name any of its addresses, any other name is taken to be elsewhere.
pub fn dials_into(
    host: &str,
    port: u16,
    bind: SocketAddr,
    local_ips: &[IpAddr],
    hostname: Option<&str>,
) -> bool {
    if bind.port() == 0 || bind.port() != port {
        return false;
    }
    let targets: Vec<IpAddr> = if is_localhost(host) {
        vec![Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()]
    } else if let Ok(ip) = host.parse::<IpAddr>() {
        vec![ip.to_canonical()]
    } else if hostname.is_some_and(|h| {
        let h = h.trim_end_matches('.');
        let host = host.trim_end_matches('.');
        host.eq_ignore_ascii_case(h)
            || host
                .strip_suffix(".local")
                .is_some_and(|s| s.eq_ignore_ascii_case(h))
    }) {
        local_ips.iter().map(|ip| ip.to_canonical()).collect()
    } else {
        return false;
    };
    let bind_ip = bind.ip().to_canonical();
    targets.into_iter().any(|t| {
        // The kernel dials the unspecified address as loopback.
        let t = match t {
            IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            t => t,
        };
        if t == bind_ip {
            return true;
        }
        let local = t.is_loopback() || local_ips.iter().any(|ip| ip.to_canonical() == t);
        match bind.ip() {
            IpAddr::V4(b) => b.is_unspecified() && t.is_ipv4() && local,
            IpAddr::V6(b) => b.is_unspecified() && local,
        }
    })
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

/// An interval flag; `None` when not given or zero (the built-in default).
fn interval(what: &'static str, input: Option<String>) -> Result<Option<Duration>, ConfigError> {
    Ok(Some(duration(what, input, Duration::ZERO)?).filter(|d| !d.is_zero()))
}

/// The node's state folder on this OS (`pair_os::dirs`: `$XDG_CONFIG_HOME/pair`
/// or `~/.config/pair` on Linux, `~/Library/Application Support/pair` on
/// macOS, `%LOCALAPPDATA%\pair` on Windows).
pub fn default_state_dir() -> Result<PathBuf, ConfigError> {
    pair_os::Dirs::host(pair_os::App::Node)
        .map(|d| d.state)
        .ok_or(ConfigError::NoStateDir)
}

/// `KIND=URL` (`ollama=http://127.0.0.1:11435`), or `KIND` for the kind's
/// moved port on loopback; either may end in `?slots=N`, the requests the
/// engine runs at once (Ollama's `OLLAMA_NUM_PARALLEL`), where the engine
/// does not say so itself.
pub fn parse_engine(input: &str) -> Result<EngineConfig, ConfigError> {
    let (spec, slots) = match input.split_once('?') {
        Some((spec, query)) => {
            let n = query
                .strip_prefix("slots=")
                .and_then(|n| n.trim().parse::<u16>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| ConfigError::EngineSlots {
                    input: input.to_owned(),
                })?;
            (spec, Some(n))
        }
        None => (input, None),
    };
    let mut engine = parse_engine_url(input, spec)?;
    engine.slots = slots.and_then(std::num::NonZeroU16::new);
    Ok(engine)
}

fn parse_engine_url(input: &str, spec: &str) -> Result<EngineConfig, ConfigError> {
    let (kind, url) = match spec.split_once('=') {
        Some((kind, url)) => (kind, Some(url)),
        None => (spec, None),
    };
    let kind = kind.trim().parse::<EngineKind>().map_err(|source| {
        if url.is_none() {
            ConfigError::EngineSyntax {
                input: input.to_owned(),
            }
        } else {
            ConfigError::EngineKind {
                input: input.to_owned(),
                source,
            }
        }
    })?;
    let Some(url) = url else {
        return Ok(EngineConfig::moved_default(kind));
    };
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
            pair_os::Dirs::compute(pair_os::Os::Linux, pair_os::App::Node, &|k| {
                (k == "HOME").then(|| "/home/u".into())
            })
            .map(|d| d.state),
            Some("box".into()),
            &[],
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
        assert!(c.lan.is_none(), "the LAN face is opt-in");
        assert!(c.aliases.is_empty());
    }

    #[test]
    fn aliases_and_the_lan_face_come_from_the_file_unless_flags_name_them() {
        let resolve = |file: &str, args: RunArgs| {
            let file: FileConfig = toml::from_str(file).unwrap();
            NodeConfig::resolve(args, file, Some("/x/pair".into()), None, &[])
        };
        let file = r#"
            aliases = ["claude-*=qwen2.5:7b", "gpt-4o=llama3.2:3b"]
            lan-face = "0.0.0.0:8080"
            allowed-origins = ["http://nas.lan:3000"]
            lan-max-per-address = 4
            "#;
        let c = resolve(file, RunArgs::default()).unwrap();
        let aliases: Vec<_> = c
            .aliases
            .iter()
            .map(|a| (a.pattern.as_str(), a.target.to_string()))
            .collect();
        assert_eq!(
            aliases,
            [
                ("claude-*", "qwen2.5:7b".to_owned()),
                ("gpt-4o", "llama3.2:3b".to_owned())
            ]
        );
        let lan = c.lan.unwrap();
        assert_eq!(lan.addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(lan.origins, ["http://nas.lan:3000"]);
        assert_eq!(lan.per_address, 4);

        let flags = RunArgs {
            aliases: vec!["claude-haiku-*=llama3.2:3b".into()],
            lan_face: Some("127.0.0.1:9090".parse().unwrap()),
            allowed_origins: vec!["http://localhost:5173".into()],
            ..RunArgs::default()
        };
        let c = resolve(file, flags).unwrap();
        assert_eq!(c.aliases.len(), 1);
        assert_eq!(c.aliases[0].pattern, "claude-haiku-*");
        let lan = c.lan.unwrap();
        assert_eq!(lan.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(lan.origins, ["http://localhost:5173"]);
        assert_eq!(lan.per_address, 4, "the file's cap stands");

        let lan = resolve("lan-face = \"0.0.0.0:8080\"", RunArgs::default())
            .unwrap()
            .lan
            .unwrap();
        assert_eq!(lan.per_address, pair_proxy::lan::DEFAULT_PER_ADDRESS);
        let err = resolve("aliases = [\"claude-*\"]", RunArgs::default()).unwrap_err();
        assert!(matches!(err, ConfigError::Alias { .. }), "{err}");
        assert!(err.to_string().contains("claude-*"), "{err}");
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
        let c = NodeConfig::resolve(args, file, Some("/x/pair".into()), None, &[]).unwrap();
        assert_eq!(c.name, "from-flag");
        assert_eq!(c.policy, Policy::Pair);
        assert_eq!(c.engines[0].kind, EngineKind::OpenAiCompat);
        assert_eq!(c.first_byte_timeout, Duration::from_secs(30));
        assert_eq!(c.state_dir, PathBuf::from("/x/pair"));
    }

    #[test]
    fn resume_is_on_by_default_and_set_by_file_or_flag() {
        let resolve = |file: &str, args: RunArgs| {
            let file: FileConfig = toml::from_str(file).unwrap();
            NodeConfig::resolve(args, file, Some("/x/pair".into()), None, &[])
                .unwrap()
                .resume
        };
        let on = pair_proxy::resume::ResumePolicy::default();
        assert_eq!(resolve("", RunArgs::default()), on);
        assert_eq!(on.limit, 2);
        assert_eq!(
            resolve("resume = \"off\"", RunArgs::default()),
            pair_proxy::resume::ResumePolicy::OFF
        );
        assert_eq!(resolve("resume-limit = 4", RunArgs::default()).limit, 4);
        let flags = RunArgs {
            resume: Some(Switch::On),
            resume_limit: Some(1),
            ..RunArgs::default()
        };
        assert_eq!(
            resolve("resume = \"off\"\nresume-limit = 4", flags).limit,
            1
        );
        let off = RunArgs {
            resume: Some(Switch::Off),
            resume_limit: Some(3),
            ..RunArgs::default()
        };
        assert!(!resolve("", off).on());
    }

    #[test]
    fn bad_values_are_named() {
        let bad = |args: RunArgs| {
            NodeConfig::resolve(
                args,
                FileConfig::default(),
                Some("/x/pair".into()),
                None,
                &[],
            )
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
                engines: vec!["olama".into()],
                ..RunArgs::default()
            })
            .contains("KIND=URL")
        );
        let c = resolve(RunArgs {
            engines: vec!["lm-studio".into()],
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(c.engines[0].kind, EngineKind::LmStudio);
        assert_eq!(c.engines[0].base_url.to_string(), "http://127.0.0.1:1235");
        let c = resolve(RunArgs {
            engines: vec![
                "ollama=http://127.0.0.1:11435?slots=4".into(),
                "lm-studio?slots=2".into(),
            ],
            ..RunArgs::default()
        })
        .unwrap();
        let slots: Vec<_> = c.engines.iter().map(|e| e.slots.map(|n| n.get())).collect();
        assert_eq!(slots, [Some(4), Some(2)]);
        assert_eq!(c.engines[0].base_url.to_string(), "http://127.0.0.1:11435");
        for bad_slots in [
            "ollama?slots=0",
            "ollama?slot=2",
            "ollama=http://127.0.0.1:11435?x",
        ] {
            assert!(
                bad(RunArgs {
                    engines: vec![bad_slots.into()],
                    ..RunArgs::default()
                })
                .contains("slots=N"),
                "{bad_slots}"
            );
        }
        assert!(
            bad(RunArgs {
                first_byte_timeout: Some("soon".into()),
                ..RunArgs::default()
            })
            .contains("first-byte-timeout")
        );
        assert!(toml::from_str::<FileConfig>("colour = 1").is_err());
    }

    fn resolve(args: RunArgs) -> Result<NodeConfig, ConfigError> {
        let lan: IpAddr = "192.168.1.5".parse().unwrap();
        NodeConfig::resolve(
            args,
            FileConfig::default(),
            Some("/x/pair".into()),
            Some("box".into()),
            &[IpAddr::V4(Ipv4Addr::LOCALHOST), lan],
        )
    }

    fn with_engine(engine: &str, ollama_face: &str, cluster: &str) -> RunArgs {
        RunArgs {
            engines: vec![engine.into()],
            ollama_face: Some(ollama_face.parse().unwrap()),
            openai_face: Some("127.0.0.1:0".parse().unwrap()),
            cluster: Some(cluster.parse().unwrap()),
            ..RunArgs::default()
        }
    }

    #[test]
    fn an_engine_on_the_nodes_own_address_is_refused() {
        for (engine, face, cluster, own) in [
            (
                "ollama=http://127.0.0.1:11434",
                "127.0.0.1:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://localhost:11434",
                "127.0.0.1:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://[::1]:11434",
                "[::1]:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://127.0.0.1:11434",
                "0.0.0.0:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://[::1]:11434",
                "[::]:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://127.0.0.1:11434",
                "[::]:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "ollama=http://0.0.0.0:11434",
                "127.0.0.1:11434",
                "127.0.0.1:0",
                OwnPort::OllamaFace,
            ),
            (
                "lm-studio=http://127.0.0.1:14318",
                "127.0.0.1:0",
                "0.0.0.0:14318",
                OwnPort::Cluster,
            ),
            (
                "ollama=http://[::ffff:127.0.0.1]:7",
                "127.0.0.1:0",
                "0.0.0.0:7",
                OwnPort::Cluster,
            ),
        ] {
            let err = resolve(with_engine(engine, face, cluster)).unwrap_err();
            assert!(
                matches!(err, ConfigError::EngineIsSelf { own: o, .. } if o == own),
                "{engine} vs {face}/{cluster}: {err:?}"
            );
            let msg = err.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.contains(own.flag()), "{msg}");
        }
        let msg = resolve(with_engine(
            "ollama=http://127.0.0.1:11434",
            "127.0.0.1:11434",
            "127.0.0.1:0",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("OLLAMA_HOST=127.0.0.1:11435 ollama serve"),
            "{msg}"
        );
        assert!(
            msg.contains("--engine ollama=http://127.0.0.1:11435"),
            "{msg}"
        );
        // The suggested port is none of the node's own.
        let msg = resolve(with_engine(
            "ollama=http://127.0.0.1:11434",
            "127.0.0.1:11434",
            "0.0.0.0:11435",
        ))
        .unwrap_err()
        .to_string();
        assert!(msg.contains("OLLAMA_HOST=127.0.0.1:11436"), "{msg}");
    }

    #[test]
    fn a_lan_address_of_this_machine_is_its_own_when_bound_to_all() {
        let args = |engine: &str| RunArgs {
            allow_remote_engine: true,
            ..with_engine(engine, "127.0.0.1:0", "0.0.0.0:14318")
        };
        for engine in [
            "ollama=http://192.168.1.5:14318",
            "ollama=http://box:14318",
            "ollama=http://BOX.local:14318",
        ] {
            assert!(
                matches!(
                    resolve(args(engine)),
                    Err(ConfigError::EngineIsSelf {
                        own: OwnPort::Cluster,
                        ..
                    })
                ),
                "{engine}"
            );
        }
        // Other machines, other ports, and a cluster port bound to loopback
        // only, are not the node.
        for engine in [
            "ollama=http://192.168.1.6:14318",
            "ollama=http://gpu-box.lan:14318",
            "ollama=http://192.168.1.5:14319",
        ] {
            assert!(resolve(args(engine)).is_ok(), "{engine}");
        }
        let a = RunArgs {
            allow_remote_engine: true,
            ..with_engine(
                "ollama=http://192.168.1.5:14318",
                "127.0.0.1:0",
                "127.0.0.1:14318",
            )
        };
        assert!(resolve(a).is_ok());
        // A port chosen by the system never collides.
        assert!(
            resolve(with_engine(
                "ollama=http://127.0.0.1:11435",
                "127.0.0.1:0",
                "127.0.0.1:0"
            ))
            .is_ok()
        );
    }

    #[test]
    fn the_default_engine_on_a_face_is_refused() {
        let args = RunArgs {
            ollama_face: Some("127.0.0.1:11435".parse().unwrap()),
            ..RunArgs::default()
        };
        let err = resolve(args).unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::EngineIsSelf {
                    default_engine: true,
                    own: OwnPort::OllamaFace,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("default engine address http://127.0.0.1:11435"),
            "{msg}"
        );
        assert!(
            msg.contains("--ollama-face") && msg.contains("--engine ollama=URL"),
            "{msg}"
        );
    }

    #[test]
    fn a_remote_engine_needs_to_be_allowed() {
        for engine in [
            "ollama=http://192.168.1.20:11434",
            "ollama=http://gpu-box.lan:11434",
            "openai-compat=http://[fd00::2]:8080",
            "ollama=http://[fe80::1%25eth0]:8080",
        ] {
            let args = with_engine(engine, "127.0.0.1:0", "127.0.0.1:0");
            let err = resolve(args.clone());
            assert!(
                matches!(err, Err(ConfigError::RemoteEngine { .. })),
                "{engine}: {err:?}"
            );
            let msg = err.unwrap_err().to_string();
            assert!(
                msg.contains("--allow-remote-engine") && msg.contains("unencrypted"),
                "{msg}"
            );
            let allowed = RunArgs {
                allow_remote_engine: true,
                ..args
            };
            assert!(resolve(allowed).is_ok(), "{engine}");
        }
        for engine in [
            "ollama=http://127.0.0.1:11435",
            "ollama=http://127.1.2.3:11435",
            "ollama=http://localhost:11435",
            "ollama=http://LOCALHOST.:11435",
            "ollama=http://[::1]:11435",
        ] {
            assert!(
                resolve(with_engine(engine, "127.0.0.1:0", "127.0.0.1:0")).is_ok(),
                "{engine}"
            );
        }
        // The settings file can allow it too.
        let file: FileConfig = toml::from_str(
            r#"
            engines = ["ollama=http://10.0.0.9:11434"]
            allow-remote-engine = true
            "#,
        )
        .unwrap();
        assert!(
            NodeConfig::resolve(RunArgs::default(), file, Some("/x/pair".into()), None, &[])
                .is_ok()
        );
    }

    #[test]
    fn zoned_static_peers_carry_their_interface_index() {
        let c = resolve(RunArgs {
            peers: vec!["[fe80::1%2]:14318".into(), "gpu-box.lan:14318".into()],
            ..RunArgs::default()
        })
        .unwrap();
        assert_eq!(c.peers[0].host, "fe80::1%2");
        assert_eq!(c.peers[0].to_string(), "[fe80::1%2]:14318");
        assert_eq!(c.peers[1].host, "gpu-box.lan");
        if cfg!(target_os = "linux") {
            let lo = pair_identity::addr::interface_index("lo").unwrap();
            let c = resolve(RunArgs {
                peers: vec!["[fe80::1%lo]:14318".into()],
                ..RunArgs::default()
            })
            .unwrap();
            assert_eq!(c.peers[0].host, format!("fe80::1%{lo}"));
        }
        let err = resolve(RunArgs {
            peers: vec!["[fe80::1%nosuch9]:14318".into()],
            ..RunArgs::default()
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                ConfigError::Address(pair_identity::Error::NoSuchInterface { .. })
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("nosuch9"), "{err}");
        let err = resolve(RunArgs {
            peers: vec!["[fe80::1%]:14318".into()],
            ..RunArgs::default()
        })
        .unwrap_err();
        assert!(matches!(err, ConfigError::Peer { .. }), "{err:?}");
    }
}
