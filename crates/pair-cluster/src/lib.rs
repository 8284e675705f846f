//! The cluster plane of a pair node: everything between nodes.
//!
//! - [`port`]: the cluster port, plain HTTP (node info, pairing) and mutual
//!   TLS on one socket, only pinned peers past the handshake;
//!   [`routes`]: what peers post there (reports, job records). The relay
//!   route (a peer's request run here) is the request path's, mounted by
//!   the daemon.
//! - [`edge`]: the probe answer and members list for edge clients, and
//!   the clients a peer vouches for, kept pinned here.
//! - [`link`]: the mTLS client to one peer (relay, reports, replication;
//!   the edge SDK's way to a node); [`links`]: one per paired peer whose
//!   address is known, kept current.
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
pub mod failover;
pub mod gossip;
pub mod keys;
pub mod learning;
pub mod link;
pub mod links;
pub mod load;
pub mod port;
pub mod progress;
pub mod reports;
pub mod resume;
pub mod routes;
pub mod snapshot;

use std::time::{Duration, SystemTime};

pub use bindings::Bindings;
pub use config::GossipConfig;
pub use failover::{Rearmed, TLS_REFUSED};
pub use link::{
    ALONE_HEADER, FAILED_HEADER, PeerLink, RELAY_PREFIX, RESERVATION_HEADER, parse_reservation,
    reservation_value,
};
pub use links::{AddrBook, Peers};
pub use load::{LoadGuard, LocalLoad};
pub use port::{ClusterPort, PeerIdentity};
pub use progress::{Engaged, Progress};
pub use reports::PeerReports;
pub use snapshot::{LocalReport, PeerStatus, SeedBySize};

/// What goes wrong between nodes.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("invalid peer address")]
    BadUri {
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("could not build the request to the peer")]
    BadRequest {
        #[source]
        source: http::Error,
    },
    #[error("peer transport error")]
    Transport {
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("no answer from the peer within {0:?}")]
    Deadline(Duration),
    #[error(transparent)]
    Tls(#[from] pair_identity::Error),
}

/// The wall clock in Unix milliseconds (what snapshots and reports carry).
pub fn now_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}
