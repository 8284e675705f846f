//! The error type of pair-discovery's shell (the TXT codec has its own
//! [`crate::TxtError`], which is data about a peer's record, not a failure
//! of this node).

use std::net::SocketAddr;

/// What can go wrong running discovery or probing a peer.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("could not list local network interfaces")]
    Interfaces(#[source] std::io::Error),
    #[error("no address to advertise on the selected interfaces {0:?}")]
    NoAddress(crate::Interfaces),
    #[error("mDNS daemon failed")]
    Mdns(#[source] mdns_sd::Error),
    #[error("interface selection {input:?} is not `loopback`, `all` or a list of names")]
    BadInterfaces { input: String },
    #[error("static peer {input:?} is not HOST:PORT")]
    BadStaticPeer { input: String },
    #[error("static peer {host}:{port} did not resolve")]
    Resolve {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("probe of {addr}: TCP connect failed")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("probe of {addr}: HTTP exchange failed")]
    Http {
        addr: SocketAddr,
        #[source]
        source: hyper::Error,
    },
    #[error("probe of {addr}: node info answered HTTP {status}")]
    Status { addr: SocketAddr, status: u16 },
    #[error("probe of {addr}: node info body unreadable or too large")]
    Body {
        addr: SocketAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("probe of {addr}: node info is not valid JSON")]
    Json {
        addr: SocketAddr,
        #[source]
        source: serde_json::Error,
    },
    #[error("probe timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("probe has no address to try")]
    NoAddressToProbe,
}
