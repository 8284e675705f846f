//! Node identity, trust store, PIN pairing through SPAKE2, mutual TLS with pinned peers.
//!
//! See the module docs below and `docs/threat-model.md`.

pub mod error;
pub mod fingerprint;
mod fsutil;
pub mod identity;
pub mod protocol;
pub mod service;
pub mod tls;
pub mod trust;
pub mod wire;

pub use error::{Error, Refusal, Result};
pub use fingerprint::Fingerprint;
pub use identity::{Identity, IdentityPaths, PeerCertInfo};
pub use protocol::{
    FailureLedger, InviteStatus, Inviter, Joiner, JoinerConfirmed, Limits, LocalParty, Pin,
};
pub use service::{PairingService, join};
pub use tls::{
    Expect, client_config, install_crypto_provider, peer_identity, reqwest_client_builder,
    server_config, server_name, tls_acceptor, tls_connector,
};
pub use trust::{PeerRecord, TrustEvent, TrustStore};
