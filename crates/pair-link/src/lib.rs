//! The request side of pair below the proxy and the SDK: what a node's
//! pipeline and an edge client both need to send a request to a node.
//!
//! - [`link`]: the mTLS client to one node's cluster port ([`PeerLink`])
//!   and what goes wrong on it ([`ClusterError`]);
//! - [`failover`]: the failover driver's ([`pair_scheduler::drive`]) tokio
//!   side: how a failure to reach a node classifies itself, a timer;
//! - [`resume`]: a stream that goes on from another node when it is cut;
//! - [`edge`]: the probe answer and members list, on the wire;
//! - [`route`]: the inference routes ([`InferenceRoute`]), the only place
//!   that spells an inference path;
//! - [`header`]: the `x-pair-*` header names, requests' and answers'.

pub mod edge;
pub mod failover;
pub mod header;
pub mod link;
pub mod resume;
pub mod route;

use std::time::Duration;

pub use failover::{Rearmed, TLS_REFUSED};
pub use header::{
    ALONE_HEADER, CUTTABLE_HEADER, FAILED_HEADER, FREE_SLOT_HEADER, RESERVATION_HEADER,
    parse_reservation, reservation_value,
};
pub use link::{PeerLink, RELAY_PREFIX};
pub use route::{InferenceRoute, Work};

/// What goes wrong on a link to a node (between nodes, or from an edge
/// client to one).
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
