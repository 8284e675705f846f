//! Mutual TLS between paired machines: TLS 1.3 only, exact certificate
//! pinning against the live trust store, and reading the peer's NodeId.
//!
//! There is no CA. A certificate is accepted when its DER is byte-for-byte a
//! pinned one; the handshake signature is still verified with the provider's
//! algorithms, so presenting a pinned certificate without its key fails.
//! Verifiers read the trust store on every handshake: a new pin works at
//! once, and an unpaired peer's next handshake fails.

use std::sync::Arc;

use pair_core::{NodeId, Role};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::error::{Error, Result};
use crate::identity::{Identity, PeerCertInfo};
use crate::trust::{PeerRecord, TrustStore};

/// The server name clients send. Verification never looks at it (identity is
/// the pin plus the expected NodeId), and a constant leaks nothing.
pub const SERVER_NAME: &str = "pair.invalid";

/// Installs ring as the process-wide rustls provider. Idempotent: call it
/// once at start-up (calling it again is harmless).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn provider() -> Arc<CryptoProvider> {
    // The configs below always use ring explicitly, whatever the process
    // default is, so the workspace has one provider in practice.
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Which servers a client accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this pinned peer.
    Peer(NodeId),
    /// Any pinned peer with role node (for a shared HTTP client; read who
    /// answered with [`peer_from_tls_info`]).
    AnyNode,
}

/// Server-side verifier: the client's certificate must be pinned.
#[derive(Debug)]
pub struct PinnedClientVerifier {
    trust: TrustStore,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedClientVerifier {
    pub fn new(trust: TrustStore) -> Self {
        Self {
            trust,
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for PinnedClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.trust.pinned(end_entity) {
            Some(_) => Ok(ClientCertVerified::assertion()),
            None => {
                tracing::debug!(fingerprint = %crate::Fingerprint::of(end_entity), "refused an unpaired client certificate");
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::ApplicationVerificationFailure,
                ))
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // The configs are TLS 1.3 only; never accept a TLS 1.2 signature.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Client-side verifier: the server's certificate must be pinned, and be
/// the expected peer.
#[derive(Debug)]
pub struct PinnedServerVerifier {
    trust: TrustStore,
    expect: Expect,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedServerVerifier {
    pub fn new(trust: TrustStore, expect: Expect) -> Self {
        Self {
            trust,
            expect,
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for PinnedServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let refuse = || {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        };
        let Some(record) = self.trust.pinned(end_entity) else {
            tracing::debug!(fingerprint = %crate::Fingerprint::of(end_entity), "refused an unpaired server certificate");
            return refuse();
        };
        let ok = match self.expect {
            Expect::Peer(id) => record.id == id,
            Expect::AnyNode => record.role == Role::Node,
        };
        if ok {
            Ok(ServerCertVerified::assertion())
        } else {
            tracing::debug!(peer = %record.id, expected = ?self.expect, "refused a pinned server that is not the expected peer");
            refuse()
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A TLS 1.3 server config that requires a pinned client certificate and
/// presents this identity. Set `alpn_protocols` on it if needed.
pub fn server_config(identity: &Identity, trust: &TrustStore) -> Result<ServerConfig> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(PinnedClientVerifier::new(trust.clone())))
        .with_single_cert(vec![identity.cert_der().clone()], identity.key_der())?;
    Ok(without_resumption_server(config))
}

/// A resumed TLS 1.3 session skips certificate verification, so a peer
/// unpaired after its first handshake could come back on a ticket. Pins are
/// checked on every connection instead; connections are pooled anyway.
fn without_resumption_server(mut config: ServerConfig) -> ServerConfig {
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config
}

/// A TLS 1.3 client config that presents this identity and accepts only the
/// expected pinned server.
pub fn client_config(
    identity: &Identity,
    trust: &TrustStore,
    expect: Expect,
) -> Result<ClientConfig> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedServerVerifier::new(
            trust.clone(),
            expect,
        )))
        .with_client_auth_cert(vec![identity.cert_der().clone()], identity.key_der())?;
    let mut config = config;
    // See `without_resumption_server`: the server's pin is checked every time.
    config.resumption = rustls::client::Resumption::disabled();
    Ok(config)
}

/// A ready acceptor for the cluster port.
pub fn tls_acceptor(identity: &Identity, trust: &TrustStore) -> Result<tokio_rustls::TlsAcceptor> {
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server_config(
        identity, trust,
    )?)))
}

/// A connector for one expected peer; use it with [`server_name`].
pub fn tls_connector(
    identity: &Identity,
    trust: &TrustStore,
    peer: NodeId,
) -> Result<tokio_rustls::TlsConnector> {
    Ok(tokio_rustls::TlsConnector::from(Arc::new(client_config(
        identity,
        trust,
        Expect::Peer(peer),
    )?)))
}

/// The server name to pass to [`tokio_rustls::TlsConnector::connect`].
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME)
        .unwrap_or(ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()))
}

/// A reqwest client builder presenting this identity over mTLS and
/// accepting only `expect`. With [`Expect::AnyNode`], enable
/// `tls_info(true)` (done here) and read the responder with
/// [`peer_from_tls_info`].
pub fn reqwest_client_builder(
    identity: &Identity,
    trust: &TrustStore,
    expect: Expect,
) -> Result<reqwest::ClientBuilder> {
    let config = client_config(identity, trust, expect)?;
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(config)
        .tls_info(true)
        .no_proxy())
}

/// Who is on the other end, from the peer certificate chain of a
/// connection (`conn.peer_certificates()`).
pub fn peer_identity(certs: Option<&[CertificateDer<'_>]>) -> Result<PeerCertInfo> {
    let leaf = certs
        .and_then(<[_]>::first)
        .ok_or(Error::NoPeerCertificate)?;
    PeerCertInfo::parse(leaf)
}

/// The pinned record of the peer on a server-side connection.
pub fn peer_of_server_conn<IO>(
    stream: &tokio_rustls::server::TlsStream<IO>,
    trust: &TrustStore,
) -> Result<PeerRecord> {
    let (_, conn) = stream.get_ref();
    pinned_peer(conn.peer_certificates(), trust)
}

/// The pinned record of the peer on a client-side connection.
pub fn peer_of_client_conn<IO>(
    stream: &tokio_rustls::client::TlsStream<IO>,
    trust: &TrustStore,
) -> Result<PeerRecord> {
    let (_, conn) = stream.get_ref();
    pinned_peer(conn.peer_certificates(), trust)
}

/// The pinned record of the node that answered a reqwest response (needs a
/// client from [`reqwest_client_builder`]).
pub fn peer_from_tls_info(info: &reqwest::tls::TlsInfo, trust: &TrustStore) -> Result<PeerRecord> {
    let der = info.peer_certificate().ok_or(Error::NoPeerCertificate)?;
    let cert = CertificateDer::from(der);
    pinned_peer(Some(std::slice::from_ref(&cert)), trust)
}

fn pinned_peer(certs: Option<&[CertificateDer<'_>]>, trust: &TrustStore) -> Result<PeerRecord> {
    let info = peer_identity(certs)?;
    let leaf = certs
        .and_then(<[_]>::first)
        .ok_or(Error::NoPeerCertificate)?;
    // Unpaired since the handshake: the caller should drop the connection.
    trust
        .pinned(leaf)
        .filter(|r| r.id == info.id)
        .ok_or(Error::NotPaired(info.id))
}
