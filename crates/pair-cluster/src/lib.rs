//! The cluster plane of a pair node: everything between nodes.
//!
//! - [`port`]: the cluster port, plain HTTP (node info, pairing) and mutual
//!   TLS on one socket, only pinned peers past the handshake;
//!   [`routes`]: what peers post there (reports, job records). The relay
//!   route (a peer's request run here) is the request path's, mounted by
//!   the daemon.
//! - [`edge`]: the members route for edge clients and peers, and the
//!   clients a peer vouches for, kept pinned here.
//! - [`links`]: one [`pair_link::PeerLink`] per paired peer whose address
//!   is known, kept current.
//! - [`gossip`]: reports and job records pushed to every peer each
//!   interval, and the snapshot the scheduler ranks ([`snapshot`]:
//!   assembled from this node's own report and its peers' latest, pure),
//!   with what this node learned of engine speeds ([`learning`]).
//! - [`bindings`]: where this node sent the conversations that entered at
//!   it, which its report carries;
//! - [`load`]: this node's own workload, which the request path counts and
//!   the report carries; [`progress`]: whether each engine is getting
//!   anywhere (a stalled one leaves routing for a while).

pub mod bindings;
pub mod config;
pub mod edge;
pub mod gossip;
pub mod keys;
pub mod learning;
pub mod links;
pub mod load;
pub mod port;
pub mod progress;
pub mod reports;
pub mod routes;
pub mod snapshot;

use std::time::SystemTime;

pub use bindings::Bindings;
pub use config::GossipConfig;
pub use links::{AddrBook, Peers};
pub use load::{LoadGuard, LocalLoad, SlotHold};
pub use port::{ClusterPort, PeerIdentity};
pub use progress::{Engaged, Progress};
pub use reports::PeerReports;
pub use snapshot::{LocalReport, PeerStatus, SeedBySize};

/// The wall clock in Unix milliseconds (what snapshots and reports carry).
pub fn now_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}
