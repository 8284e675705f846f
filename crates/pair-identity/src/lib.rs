//! Node identity, trust store, PIN pairing through SPAKE2, mutual TLS with pinned peers.
//!
//! Security is the product here: a user pairs two machines with a 6-digit PIN
//! and from then on only paired machines can use the cluster. The threat model
//! is written down in `docs/threat-model.md`.
//!
//! # Identity ([`identity`])
//! Every node (and every requester-only client of the edge SDK) has a stable
//! UUID and an Ed25519 key, created on first start under the state directory
//! (`identity/key.pem`, mode 0600; `identity/cert.pem`). The certificate is
//! self-signed: CN = UUID, URI SANs `urn:pair:node:<uuid>` and
//! `urn:pair:role:{node,client}`, serverAuth + clientAuth, 20 years, a random
//! positive 16-byte serial. Its fingerprint is the SHA-256 of the DER. Validity dates
//! are not what makes a certificate trusted: the pin is.
//!
//! # Trust store ([`trust`])
//! One JSON file (`trust.json`) with one record per paired peer: UUID, name,
//! role, certificate DER, fingerprint, paired-at. Every change rewrites the
//! whole file through a temp file, fsync and rename, so a crash leaves the
//! old pins or the new ones, never half of each; leftover temp files are
//! removed on open; a damaged file is an error naming the file. In memory,
//! [`TrustStore`] is a live handle: TLS verifiers read it on every handshake
//! and [`TrustStore::subscribe`] / [`TrustStore::revoked`] tell the proxy to
//! close a peer's connections the moment it is unpaired.
//!
//! # Pairing protocol ([`protocol`], [`wire`], [`service`])
//! Two round trips of small versioned JSON messages over plain HTTP on the
//! cluster port (`{"v":1,"kind":...,"body":{...}}`, binary fields base64):
//!
//! ```text
//! joiner                                            inviter (open invite, PIN P)
//!   JoinerHello { joiner: {id, role, name, cert}, nonce_j, X = SPAKE2_A(P) }
//!   ── POST /pair/v1/start ─────────────────────────────────────────────────▶
//!         counts one attempt (persisted) · checks cert ⇔ claimed id/role
//!         K = SPAKE2_B(P, X) · fresh session s, nonce_i, share Y
//!         T = SHA-256(label, s, joiner{id,role,name,fp,nonce,X}, inviter{...,Y})
//!         k_i, k_j = HKDF-SHA256(salt = T, ikm = K, "…confirm inviter"/"…joiner")
//!   ◀──── InviterHello { s, inviter: {id, role, name, cert}, nonce_i, Y, HMAC(k_i, T) }
//!   K = SPAKE2_A(P, Y) · same T · verify the inviter's MAC (constant time)
//!   JoinerConfirm { s, HMAC(k_j, T) }
//!   ── POST /pair/v1/confirm ───────────────────────────────────────────────▶
//!         verify the joiner's MAC · session is single-use · pin the joiner
//!   ◀──── InviterDone { s }
//!   pin the inviter
//! ```
//!
//! What each side proves: the inviter's MAC proves it knows the PIN and saw
//! exactly the joiner's identity, name, certificate fingerprint, nonce and
//! SPAKE2 share; the joiner's MAC proves the same the other way. Both MACs
//! cover both certificate fingerprints, so a relay that swaps a certificate
//! (a man in the middle who does not know the PIN) breaks confirmation, and
//! each side pins exactly the certificate its peer holds the key for (the
//! key is proved later by every TLS handshake). Keys differ per direction,
//! so a MAC cannot be reflected. Fresh nonces, a fresh SPAKE2 scalar and a
//! fresh session id per attempt, and single-use sessions, make a replayed
//! exchange fail even against a new invite with the same PIN.
//!
//! Limits (after Matter and HomeKit; [`Limits`]): one invite at a time, 5
//! minutes; every `start` counts as an attempt (and a failure in the ledger)
//! until its confirmation verifies, so an attacker cannot walk away after
//! learning the inviter's MAC for free; 5 attempts close the invite; at most
//! 20 failures per sliding hour, persisted in `pairing-failures.json` before
//! the answer leaves (a restart does not reset it), after which invites are
//! refused until failures age out; at most 64 unauthenticated sessions, each
//! 30 seconds; messages capped at 16 KiB. Every failure is logged with the
//! peer's claimed id and a refusal code, never the PIN ([`Pin`]'s `Debug`
//! hides it and it is zeroized on drop).
//!
//! # Why this is stronger than PAIR's scheme
//! PAIR runs EAP-NOOB over plain HTTP and stretches the PIN with PBKDF2
//! (50,000 iterations) before MACing the exchange. Stretching only slows an
//! offline search: one million PINs × 50,000 iterations is about 10^11
//! SHA-256 compressions, well under a minute on one GPU,
//! and PAIR's own known-issues page says an active man in the middle on the
//! LAN can brute-force the PIN. With SPAKE2 a recorded exchange gives an
//! eavesdropper nothing to test PINs against (the transcript is
//! indistinguishable from random without solving CDH), and an active attacker
//! learns one yes/no per online attempt, of which there are 5 per invite and
//! 20 per hour. Success chance for an attacker: 5 in a million per invite.
//!
//! The joiner dials the inviter at a [`PeerAddr`]: a host name, an IP
//! literal, or a link-local IPv6 address with its zone (`[fe80::1%eth0]:port`).
//!
//! # Mutual TLS ([`tls`])
//! rustls 0.23 with the ring provider, TLS 1.3 only. The server requires a
//! client certificate and accepts exactly the pinned ones (DER equality
//! against the live store); the client accepts exactly the expected pinned
//! peer ([`Expect`]). Handshake signatures are still verified with the
//! provider's algorithms, so a copied certificate without its key fails.
//! [`tls::peer_of_server_conn`] and friends tell the application who is on
//! the other end.
//!
//! # API keys ([`keys`])
//! The opt-in LAN face admits requests that carry an API key
//! (`pair-sk-…`, 32 random bytes). [`KeyStore`] keeps only SHA-256 hashes
//! in `keys.json` (mode 0600, written like the trust store) and merges
//! records with peers as a union in which a revocation always wins, so a
//! key made on one node works on every node and a revocation reaches
//! every node. [`RateLimiter`] (per key) and [`FailureGate`] (per client
//! address, IPv6 by /64) are pure state machines the shell feeds with `now`.
//!
//! Call [`install_crypto_provider`] once at start-up: reqwest (built with
//! `rustls-no-provider`) panics when building any client without one.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod addr;
pub mod control;
pub mod error;
pub mod fingerprint;
pub mod identity;
pub mod keys;
pub mod protocol;
pub mod service;
mod store_file;
pub mod tls;
pub mod trust;
pub mod wire;

pub use addr::PeerAddr;
pub use control::ControlToken;
pub use error::{Error, Refusal, Result};
pub use fingerprint::Fingerprint;
pub use identity::{Identity, IdentityPaths, PeerCertInfo};
pub use keys::{
    FailureGate, FailureLimits, KeyId, KeyRecord, KeyStore, RateLimiter, Secret, parse_presented,
};
pub use protocol::{
    FailureLedger, InviteStatus, Inviter, Joiner, JoinerConfirmed, Limits, LocalParty, Pin,
};
pub use service::{PairingService, join};
pub use tls::{
    Expect, client_config, install_crypto_provider, peer_identity, reqwest_client_builder,
    server_config, server_name, tls_acceptor, tls_connector,
};
pub use trust::{PeerRecord, TrustEvent, TrustStore};
