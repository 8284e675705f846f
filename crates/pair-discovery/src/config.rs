//! Discovery configuration as typed values, parsed once.

use std::str::FromStr;
use std::time::Duration;

use pair_core::NodeId;

use crate::DiscoveryError;
use crate::addrs::Interfaces;
use crate::table::LivenessConfig;

/// The standard mDNS port.
pub const MDNS_PORT: u16 = 5353;

/// A manually given peer address (`--peer HOST:PORT`), for networks where
/// multicast does not pass (VPNs, Wi-Fi client isolation).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StaticPeer {
    /// A DNS name or an IP literal (IPv6 without brackets).
    pub host: String,
    /// The peer's cluster port.
    pub port: u16,
}

impl FromStr for StaticPeer {
    type Err = DiscoveryError;

    /// `host:port`, `1.2.3.4:port`, `[v6]:port` or `[v6%zone]:port`, as
    /// `pair_core::parse_peer_addr` reads them. The zone is kept in `host`
    /// as written, where the system resolver reads it; that it names an
    /// interface is for the caller to check.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts = pair_core::parse_peer_addr(s).map_err(|_| DiscoveryError::BadStaticPeer {
            input: s.to_owned(),
        })?;
        Ok(StaticPeer {
            host: parts.host.to_owned(),
            port: parts.port,
        })
    }
}

impl StaticPeer {
    /// The zone of a link-local IPv6 peer (`eth0` of `fe80::1%eth0`).
    pub fn zone(&self) -> Option<&str> {
        self.host.split_once('%').map(|(_, z)| z)
    }
}

impl std::fmt::Display for StaticPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Everything discovery needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryConfig {
    pub node_id: NodeId,
    /// Display name; also the start of the mDNS host name.
    pub node_name: String,
    /// Our cluster port (node info, pairing, mTLS relay).
    pub cluster_port: u16,
    /// Interfaces mDNS runs on.
    pub interfaces: Interfaces,
    /// UDP port of mDNS: 5353 on a LAN; tests use another to stay private.
    pub mdns_port: u16,
    /// Run mDNS at all (false: static peers only).
    pub mdns: bool,
    /// Announce ourselves (false for a requester-only client that browses).
    pub advertise: bool,
    pub static_peers: Vec<StaticPeer>,
    pub liveness: LivenessConfig,
    /// Overall limit of one probe (TCP connect + node-info GET). Kept under
    /// the probe interval so a hung peer fails each probe.
    pub probe_timeout: Duration,
    /// Period of the probe of static peer addresses not yet (or no longer)
    /// in the table.
    pub static_interval: Duration,
    /// Granularity of the liveness clock.
    pub tick: Duration,
}

impl DiscoveryConfig {
    /// Defaults: mDNS on `interfaces`, port 5353, advertise, 500 ms probes
    /// with a 400 ms timeout, static peers every 2 s, 100 ms ticks.
    pub fn new(
        node_id: NodeId,
        node_name: impl Into<String>,
        cluster_port: u16,
        interfaces: Interfaces,
    ) -> Self {
        Self {
            node_id,
            node_name: node_name.into(),
            cluster_port,
            interfaces,
            mdns_port: MDNS_PORT,
            mdns: true,
            advertise: true,
            static_peers: Vec::new(),
            liveness: LivenessConfig::default(),
            probe_timeout: Duration::from_millis(400),
            static_interval: Duration::from_secs(2),
            tick: Duration::from_millis(100),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_peers_parse() {
        let p: StaticPeer = "gpu-box.lan:14318".parse().unwrap();
        assert_eq!((p.host.as_str(), p.port), ("gpu-box.lan", 14318));
        let p: StaticPeer = "[fd00::2]:14318".parse().unwrap();
        assert_eq!((p.host.as_str(), p.port), ("fd00::2", 14318));
        assert_eq!(p.to_string(), "[fd00::2]:14318");
        let p: StaticPeer = "10.0.0.5:1".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.5:1");
        assert_eq!(p.zone(), None);
        // Link-local IPv6 with a zone: a name or an index.
        let p: StaticPeer = "[fe80::1%eth0]:14318".parse().unwrap();
        assert_eq!((p.host.as_str(), p.port), ("fe80::1%eth0", 14318));
        assert_eq!(p.zone(), Some("eth0"));
        assert_eq!(p.to_string(), "[fe80::1%eth0]:14318");
        let p: StaticPeer = "[fe80::1%2]:14318".parse().unwrap();
        assert_eq!((p.host.as_str(), p.zone()), ("fe80::1%2", Some("2")));
        // The refusals are pair_core::addr's vectors; one of each kind.
        for bad in ["[fe80::1%]:80", "fd00::2:80", "host:0"] {
            assert!(bad.parse::<StaticPeer>().is_err(), "{bad}");
        }
    }
}
