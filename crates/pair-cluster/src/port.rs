//! The cluster port (default 14318): one LAN port for everything between
//! nodes. A connection whose first byte is a TLS handshake record is mutual
//! TLS (relay, reports, jobs), and only pinned peers get past the handshake;
//! anything else is plain HTTP, which serves only node info and pairing (the
//! PAKE protects pairing; node info is public telemetry, as in PAIR). The
//! node's connection cap covers this port too.
//!
//! A peer's connections are closed the moment it is unpaired.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Extension;
use hyper_util::rt::TokioIo;
use pair_http::hyper_conn::{accept, serve_router};
use pair_identity::TrustStore;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use pair_core::{NodeId, Role};
use pair_http::conns::{ConnGuard, ConnLimit};
use pair_runtime::runtime::EventLoops;

/// Who is on the other end of an mTLS connection; the port puts it in
/// every request's extensions after the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    pub id: NodeId,
    pub role: Role,
    /// Where the connection came from (its port is ephemeral).
    pub remote: std::net::SocketAddr,
}

/// First byte of a TLS record carrying a handshake.
const TLS_HANDSHAKE: u8 = 0x16;
/// A connection that sends nothing, or does not finish its TLS handshake,
/// within this is dropped (slowloris guard).
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// What the cluster port serves.
#[derive(Clone)]
pub struct ClusterPort {
    /// Plain HTTP: node info and pairing.
    pub plain: Router,
    /// Behind mTLS; requests carry [`PeerIdentity`] in their extensions.
    pub secure: Router,
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub trust: TrustStore,
    /// Connections are dealt over the node's event loops, like the faces'.
    pub loops: Arc<EventLoops>,
    /// The node's cap on open connections, shared with the faces.
    pub conns: Arc<ConnLimit>,
}

impl std::fmt::Debug for ClusterPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterPort").finish_non_exhaustive()
    }
}

/// Accepts until `shutdown`; connection tasks are tracked by `tasks`.
pub async fn serve(
    listener: TcpListener,
    port: ClusterPort,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) {
    while let Some((tcp, remote)) = accept(&listener, &shutdown, "cluster port").await {
        let Some(slot) = port.conns.admit() else {
            tracing::warn!(%remote, "connection cap reached with every connection busy: cluster connection refused");
            continue;
        };
        let loops = Arc::clone(&port.loops);
        let port = port.clone();
        let shutdown = shutdown.clone();
        loops.spawn(&tasks, tcp, move |tcp| async move {
            if let Err(reason) = connection(tcp, remote, port, &slot, shutdown).await {
                tracing::debug!(%remote, reason, "cluster connection closed");
            }
        });
    }
}

async fn connection(
    tcp: TcpStream,
    remote: std::net::SocketAddr,
    port: ClusterPort,
    slot: &ConnGuard,
    shutdown: CancellationToken,
) -> Result<(), &'static str> {
    let mut first = [0u8; 1];
    let n = tokio::select! {
        r = tokio::time::timeout(HANDSHAKE_DEADLINE, tcp.peek(&mut first)) => r
            .map_err(|_| "silent client")?
            .map_err(|_| "peek failed")?,
        () = slot.evicted() => return Err("closed to make room for another connection"),
    };
    if n == 0 {
        return Ok(());
    }
    // Past its first byte a connection is not evicted: hyper's head
    // deadline and the TLS handshake's bound what a silent one holds.
    slot.busy();
    if first[0] != TLS_HANDSHAKE {
        let svc = port.plain.clone();
        return serve_router(
            TokioIo::new(tcp),
            svc,
            Some(HEADER_DEADLINE),
            shutdown,
            None,
        )
        .await;
    }
    let tls = match tokio::time::timeout(
        HANDSHAKE_DEADLINE,
        port.acceptor.accept(tcp).into_fallible(),
    )
    .await
    {
        Err(_) => return Err("tls handshake timed out"),
        Ok(Err((_, tcp))) => {
            close_gently(tcp).await;
            return Err("tls handshake refused (unpaired or bad certificate)");
        }
        Ok(Ok(tls)) => tls,
    };
    let record = pair_identity::tls::peer_of_server_conn(&tls, &port.trust)
        .map_err(|_| "peer not pinned")?;
    let peer = PeerIdentity {
        id: record.id,
        role: record.role,
        remote,
    };
    let svc = port.secure.clone().layer(Extension(peer));
    let trust = port.trust.clone();
    // Fires on unpairing, and when the peer re-pairs with a new certificate.
    let fingerprint = record.fingerprint;
    let revoked = async move { trust.cert_revoked(fingerprint).await };
    serve_router(
        TokioIo::new(tls),
        svc,
        Some(HEADER_DEADLINE),
        shutdown,
        Some(Box::pin(revoked)),
    )
    .await
}

/// Closes a refused connection so the peer reads why: the TLS alert is
/// already written; what the client sent after its side of the handshake
/// (in TLS 1.3 it may already be sending its request) is drained first, or
/// closing with it unread would reset the connection and lose the alert.
async fn close_gently(mut tcp: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tcp.shutdown().await;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        let mut left = 256 * 1024usize;
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 || n >= left {
                return;
            }
            left -= n;
        }
    })
    .await;
}

/// A request head must arrive within this on the cluster port (slowloris
/// guard for a LAN-facing socket).
const HEADER_DEADLINE: Duration = Duration::from_secs(30);
