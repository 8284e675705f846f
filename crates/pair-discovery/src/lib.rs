//! Who is out there: mDNS advertise and browse (`_pair-node._tcp.local.`),
//! a strict TXT record codec, a peer table keyed by node UUID with active
//! liveness (probe, suspect, evict), and static peers for networks without
//! multicast.
//!
//! Pure cores ([`txt`], [`addrs`], [`table`]) hold every decision; the shell
//! ([`Discovery`]) feeds them from mdns-sd, TCP probes and timers and
//! publishes the table through `tokio::sync::watch`. mDNS only ever runs on
//! the interfaces the configuration names ([`Interfaces`]).

// Tests may unwrap: a panic is the failure report there.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod addrs;
pub mod config;
pub mod error;
pub mod probe;
pub mod shell;
pub mod table;
pub mod txt;

pub use addrs::{Interfaces, LocalAddr, advertised_addrs, is_virtual_interface, local_addrs};
pub use config::{DiscoveryConfig, MDNS_PORT, StaticPeer};
pub use error::DiscoveryError;
pub use probe::{NODE_INFO_PATH, probe, probe_addr};
pub use shell::{Discovery, SERVICE_TYPE};
pub use table::{
    LivenessConfig, PeerSet, PeerState, PeerTable, PeerView, ProbeFailure, ProbeOk, ProbeRequest,
};
pub use txt::{
    MAX_ADDRS, TXT_VERSION, TxtError, TxtRecord, decode_txt, decode_txt_wire, encode_txt,
    encode_txt_wire,
};
