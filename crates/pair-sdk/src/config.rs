//! How an edge client is set up: where it keeps its identity and cache,
//! where it looks for nodes, how long a ranking lasts, how patient it is.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pair_scheduler::{FailoverConfig, Policy};

/// Where the client looks for nodes besides what it already knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mdns {
    /// No multicast: seeds, the cache and the cluster's members only.
    Off,
    /// Browse on loopback only, on this UDP port (tests, one-machine demos).
    Loopback { port: u16 },
    /// Browse on the machine's LAN interfaces, on the standard port.
    Lan,
}

/// Everything an edge client needs; see [`crate::ClientBuilder`].
#[derive(Clone, Debug)]
pub struct Config {
    /// Identity, pins and the ranking cache.
    pub state_dir: PathBuf,
    /// The name a node records when this client pairs.
    pub name: String,
    /// `host:port` of cluster ports: IP literals or DNS names; a name that
    /// resolves to several addresses gives a candidate for each.
    pub seeds: Vec<String>,
    pub mdns: Mdns,
    /// How long a ranking is used before it is probed again.
    pub cache_ttl: Duration,
    /// TCP and TLS connect to a node.
    pub connect_timeout: Duration,
    /// One probe, connect included.
    pub probe_timeout: Duration,
    /// How long an mDNS browse may take on a probe round that has nothing
    /// else to go on.
    pub browse_wait: Duration,
    /// The ranking policy (the nodes' default: predicted latency).
    pub policy: Policy,
    /// Attempts, stall allowance, back-off and patience per request (the
    /// nodes' rules).
    pub failover: FailoverConfig,
    /// How many times a stream cut after its first byte may go on from
    /// another node (0: never; it ends in [`crate::Error::Interrupted`]).
    pub resume_limit: u8,
}

impl Config {
    /// The defaults, with state kept in `state_dir`.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            name: default_name(),
            seeds: Vec::new(),
            mdns: Mdns::Off,
            cache_ttl: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(2),
            probe_timeout: Duration::from_millis(1500),
            browse_wait: Duration::from_millis(1500),
            policy: Policy::PredictedLatency,
            failover: FailoverConfig {
                patience: Duration::from_secs(60),
                ..FailoverConfig::default()
            },
            resume_limit: 2,
        }
    }

    /// The ranking cache's file.
    pub fn cache_path(&self) -> PathBuf {
        cache_path(&self.state_dir)
    }
}

/// `STATE_DIR/edge-cache.json`.
pub fn cache_path(state_dir: &Path) -> PathBuf {
    state_dir.join("edge-cache.json")
}

/// The client's state folder on this OS (`pair_os::dirs`):
/// `$XDG_STATE_HOME/pair-client` (`~/.local/state/pair-client`) on Linux,
/// `~/Library/Application Support/pair-client` on macOS,
/// `%LOCALAPPDATA%\pair-client` on Windows. `None` where the user has no
/// home: never a folder relative to wherever the client runs, which would
/// make a new identity each time.
pub fn default_state_dir() -> Option<PathBuf> {
    pair_os::Dirs::host(pair_os::App::Client).map(|d| d.state)
}

/// The host name (from the OS, `pair_os::hostname`), for the node's peer
/// list.
fn default_name() -> String {
    pair_os::hostname().unwrap_or_else(|| "pair-client".to_owned())
}

/// Builds a [`crate::Client`]: `Client::builder(dir).seed("gpu.lan:14318").build().await`.
#[derive(Clone, Debug)]
pub struct ClientBuilder {
    cfg: Config,
}

impl ClientBuilder {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            cfg: Config::new(state_dir),
        }
    }

    /// A node's cluster port, `host:port` (repeatable).
    pub fn seed(mut self, seed: impl Into<String>) -> Self {
        self.cfg.seeds.push(seed.into());
        self
    }

    pub fn mdns(mut self, mdns: Mdns) -> Self {
        self.cfg.mdns = mdns;
        self
    }

    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.cfg.cache_ttl = ttl;
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.connect_timeout = timeout;
        self
    }

    pub fn probe_timeout(mut self, timeout: Duration) -> Self {
        self.cfg.probe_timeout = timeout;
        self
    }

    pub fn policy(mut self, policy: Policy) -> Self {
        self.cfg.policy = policy;
        self
    }

    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.cfg.name = name.into();
        self
    }

    pub fn failover(mut self, failover: FailoverConfig) -> Self {
        self.cfg.failover = failover;
        self
    }

    /// Moves a cut stream may make (0: none; see [`Config::resume_limit`]).
    pub fn resume_limit(mut self, limit: u8) -> Self {
        self.cfg.resume_limit = limit;
        self
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Opens the client (see [`crate::Client::open`]).
    pub async fn build(self) -> crate::Result<crate::Client> {
        crate::Client::open(self.cfg).await
    }
}
