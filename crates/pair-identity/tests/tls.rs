//! Mutual TLS with pinned peers over real sockets: unpaired clients are
//! refused, paired ones are identified, unpairing refuses new connections
//! and closes open ones through the trust store's revocation event.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use pair_core::{NodeId, Role};
use pair_identity::tls::{peer_from_tls_info, peer_of_client_conn, peer_of_server_conn};
use pair_identity::{
    Expect, Identity, PeerRecord, TrustStore, install_crypto_provider, reqwest_client_builder,
    server_name, tls_acceptor, tls_connector,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

const WAIT: Duration = Duration::from_secs(10);

fn record_of(identity: &Identity, name: &str) -> PeerRecord {
    PeerRecord {
        id: identity.id(),
        name: name.to_owned(),
        role: identity.role(),
        cert_der: identity.cert_der().to_vec(),
        fingerprint: identity.fingerprint(),
        paired_at: 0,
        vouched_by: None,
    }
}

/// A TLS echo server: reports each handshake's outcome (the peer's NodeId or
/// an error), echoes, and drops a connection when its peer is unpaired.
async fn echo_server(
    identity: &Identity,
    trust: &TrustStore,
    tasks: &mut JoinSet<()>,
) -> (String, mpsc::UnboundedReceiver<Result<NodeId, String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let acceptor = tls_acceptor(identity, trust).unwrap();
    let trust = trust.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    tasks.spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            let trust = trust.clone();
            let tx = tx.clone();
            conns.spawn(async move {
                let mut tls = match acceptor.accept(tcp).await {
                    Ok(tls) => tls,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let peer = peer_of_server_conn(&tls, &trust).unwrap();
                let _ = tx.send(Ok(peer.id));
                let revoked = trust.revoked(peer.id);
                tokio::pin!(revoked);
                let mut buf = [0u8; 256];
                loop {
                    tokio::select! {
                        () = &mut revoked => return, // dropping the stream closes it
                        n = tls.read(&mut buf) => match n {
                            Ok(0) | Err(_) => return,
                            Ok(n) => if tls.write_all(&buf[..n]).await.is_err() { return },
                        },
                    }
                }
            });
        }
    });
    (addr, rx)
}

async fn connect(
    me: &Identity,
    trust: &TrustStore,
    server: NodeId,
    addr: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let connector = tls_connector(me, trust, server).unwrap();
    connect_with(&connector, addr).await
}

async fn connect_with(
    connector: &tokio_rustls::TlsConnector,
    addr: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connector.connect(server_name(), tcp).await
}

/// Whether an echo round trip works (TLS 1.3 clients finish before the
/// server has judged their certificate, so refusal shows on first use).
async fn echoes(stream: &mut tokio_rustls::client::TlsStream<TcpStream>) -> bool {
    if stream.write_all(b"ping").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 4];
    matches!(tokio::time::timeout(WAIT, stream.read_exact(&mut buf)).await, Ok(Ok(_)) if &buf == b"ping")
}

#[tokio::test]
async fn pinned_mutual_tls_accepts_identifies_and_revokes() {
    install_crypto_provider();
    let mut tasks = JoinSet::new();
    let server = Identity::generate(Role::Node).unwrap();
    let client = Identity::generate(Role::Client).unwrap();
    let server_trust = TrustStore::in_memory();
    let client_trust = TrustStore::in_memory();
    client_trust.insert(record_of(&server, "server")).unwrap();
    let (addr, mut outcomes) = echo_server(&server, &server_trust, &mut tasks).await;

    // Unpaired: the server refuses the handshake.
    if let Ok(mut s) = connect(&client, &client_trust, server.id(), &addr).await {
        assert!(!echoes(&mut s).await);
    }
    let outcome = tokio::time::timeout(WAIT, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        outcome.is_err(),
        "unpaired client was accepted: {outcome:?}"
    );

    // Paired: accepted, and the server knows who it is. One connector is
    // reused from here on, as the proxy does, so a resumed session would show.
    server_trust.insert(record_of(&client, "client")).unwrap();
    let connector = tls_connector(&client, &client_trust, server.id()).unwrap();
    let mut open = connect_with(&connector, &addr).await.unwrap();
    assert!(echoes(&mut open).await);
    let outcome = tokio::time::timeout(WAIT, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome, Ok(client.id()));
    let seen = peer_of_client_conn(&open, &client_trust).unwrap();
    assert_eq!(seen.id, server.id());

    // Unpaired again: the open connection is closed by the event...
    server_trust.remove(client.id()).unwrap();
    let mut buf = [0u8; 4];
    let closed = tokio::time::timeout(WAIT, open.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(closed, Ok(0) | Err(_)),
        "connection stayed open: {closed:?}"
    );
    // ...and a new one is refused, even from the connector that already
    // completed a handshake (no session resumption around the pin check).
    if let Ok(mut s) = connect_with(&connector, &addr).await {
        assert!(!echoes(&mut s).await);
    }
    let outcome = tokio::time::timeout(WAIT, outcomes.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(outcome.is_err());
}

#[tokio::test]
async fn client_refuses_unpinned_or_unexpected_servers() {
    install_crypto_provider();
    let mut tasks = JoinSet::new();
    let server = Identity::generate(Role::Node).unwrap();
    let other = Identity::generate(Role::Node).unwrap();
    let client = Identity::generate(Role::Node).unwrap();
    let server_trust = TrustStore::in_memory();
    server_trust.insert(record_of(&client, "client")).unwrap();
    let (addr, _outcomes) = echo_server(&server, &server_trust, &mut tasks).await;

    // The server is not pinned by the client.
    let client_trust = TrustStore::in_memory();
    assert!(
        connect(&client, &client_trust, server.id(), &addr)
            .await
            .is_err()
    );
    // Pinned, but the client expected another peer (e.g. a stale address).
    client_trust.insert(record_of(&server, "server")).unwrap();
    client_trust.insert(record_of(&other, "other")).unwrap();
    assert!(
        connect(&client, &client_trust, other.id(), &addr)
            .await
            .is_err()
    );
    // Pinned and expected.
    let mut ok = connect(&client, &client_trust, server.id(), &addr)
        .await
        .unwrap();
    assert!(echoes(&mut ok).await);
}

#[tokio::test]
async fn an_impostor_with_a_copied_certificate_but_no_key_is_refused() {
    install_crypto_provider();
    let mut tasks = JoinSet::new();
    let server = Identity::generate(Role::Node).unwrap();
    let client = Identity::generate(Role::Node).unwrap();
    // The impostor presents the real server's certificate with its own key.
    let impostor_key = Identity::generate(Role::Node).unwrap();
    let server_trust = TrustStore::in_memory();
    server_trust.insert(record_of(&client, "client")).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Built without rustls's key/certificate consistency check, as an
    // attacker's own TLS stack would.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let key = provider
        .key_provider
        .load_private_key(impostor_key.key_der())
        .unwrap();
    let certified = rustls::sign::CertifiedKey::new(vec![server.cert_der().clone()], key);
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(std::sync::Arc::new(rustls::sign::SingleCertAndKey::from(
            certified,
        )));
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    tasks.spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = acceptor.accept(tcp).await;
    });
    let client_trust = TrustStore::in_memory();
    client_trust.insert(record_of(&server, "server")).unwrap();
    let err = connect(&client, &client_trust, server.id(), &addr)
        .await
        .unwrap_err();
    let inner = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>());
    assert!(
        matches!(
            inner,
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::BadSignature
            ))
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn reqwest_client_presents_the_identity_and_reads_the_responder() {
    install_crypto_provider();
    let mut tasks = JoinSet::new();
    let server = Identity::generate(Role::Node).unwrap();
    let client = Identity::generate(Role::Client).unwrap();
    let server_trust = TrustStore::in_memory();
    server_trust.insert(record_of(&client, "sdk")).unwrap();
    let client_trust = TrustStore::in_memory();
    client_trust.insert(record_of(&server, "node")).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tls_acceptor(&server, &server_trust).unwrap();
    let trust = server_trust.clone();
    tasks.spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let peer = peer_of_server_conn(&tls, &trust).unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tls.read(&mut buf).await.unwrap();
            assert!(n > 0);
            req.extend_from_slice(&buf[..n]);
        }
        let body = peer.id.to_string();
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tls.write_all(resp.as_bytes()).await.unwrap();
        tls.shutdown().await.unwrap();
    });

    let http = reqwest_client_builder(&client, &client_trust, Expect::AnyNode)
        .unwrap()
        .build()
        .unwrap();
    let resp = http
        .get(format!("https://{addr}/whoami"))
        .send()
        .await
        .unwrap();
    let info = resp
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .unwrap()
        .clone();
    assert_eq!(
        peer_from_tls_info(&info, &client_trust).unwrap().id,
        server.id()
    );
    assert_eq!(resp.text().await.unwrap(), client.id().to_string());
}
