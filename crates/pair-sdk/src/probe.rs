//! Probing a node: a fresh mTLS connection to its cluster port (the node
//! must be one this client pinned, and the one expected when an id is
//! known), then `GET /pair/v1/probe`. The round trip is measured here, on
//! the client, from the request's first byte sent to the answer's head.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use pair_core::NodeId;
use pair_identity::TrustStore;
use pair_link::edge::{PROBE_PATH, ProbeAnswer};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Largest probe answer read.
const PROBE_MAX_BYTES: usize = 4 << 20;

/// A node that answered its probe.
#[derive(Clone, Debug)]
pub struct Probed {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub rtt: Duration,
    pub answer: ProbeAnswer,
}

/// Why a probe failed, in a few words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeFailure {
    pub addr: SocketAddr,
    pub expected: Option<NodeId>,
    pub why: String,
}

/// What one probe needs.
#[derive(Clone)]
pub struct Prober {
    /// Accepts any pinned node; the answer says which one it was.
    pub tls: tokio_rustls::TlsConnector,
    pub trust: TrustStore,
    pub connect_timeout: Duration,
    pub probe_timeout: Duration,
}

impl ProbeFailure {
    /// The node is up but refused this client's certificate.
    pub fn is_refusal(&self) -> bool {
        self.why.starts_with("TLS: the node refused")
    }
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("connect_timeout", &self.connect_timeout)
            .field("probe_timeout", &self.probe_timeout)
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// Probes `addr`, expecting node `expected` when it is known.
    pub async fn probe(
        &self,
        addr: SocketAddr,
        expected: Option<NodeId>,
    ) -> Result<Probed, ProbeFailure> {
        let fail = |why: String| ProbeFailure {
            addr,
            expected,
            why,
        };
        match tokio::time::timeout(self.probe_timeout, self.exchange(addr, expected)).await {
            Ok(Ok(p)) => Ok(p),
            Ok(Err(why)) => Err(fail(why)),
            Err(_) => Err(fail(format!(
                "no answer within {} ms",
                self.probe_timeout.as_millis()
            ))),
        }
    }

    async fn exchange(&self, addr: SocketAddr, expected: Option<NodeId>) -> Result<Probed, String> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| "connect timed out".to_owned())?
            .map_err(|e| format!("connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .tls
            .connect(pair_identity::tls::server_name(), tcp)
            .await
            .map_err(|e| format!("TLS: {e} (is this client paired with the cluster?)"))?;
        let record = pair_identity::tls::peer_of_client_conn(&tls, &self.trust)
            .map_err(|e| format!("TLS: {e}"))?;
        if let Some(want) = expected
            && record.id != want
        {
            return Err(format!("answers as node {}, not {want}", record.id));
        }
        let read_error = Arc::new(std::sync::Mutex::new(None));
        let io = ReadWatch {
            inner: tls,
            error: Arc::clone(&read_error),
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        let req = http::Request::get(PROBE_PATH)
            .header(http::header::HOST, "pair")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let exchange = async {
            let sent = Instant::now();
            let resp = send.send_request(req).await.map_err(|e| describe(&e))?;
            let rtt = sent.elapsed();
            if !resp.status().is_success() {
                return Err(format!("probe answered {}", resp.status()));
            }
            let body = Limited::new(resp.into_body(), PROBE_MAX_BYTES)
                .collect()
                .await
                .map_err(|e| format!("probe body: {e}"))?
                .to_bytes();
            let answer: ProbeAnswer =
                serde_json::from_slice(&body).map_err(|e| format!("probe answer: {e}"))?;
            Ok((rtt, answer))
        };
        let conn = std::pin::pin!(conn);
        // The request first: hyper's connection ends quietly on a read
        // error while it is idle, and a refused certificate shows up as
        // an alert on the first read.
        let result = tokio::select! {
            biased;
            r = exchange => r,
            r = conn => Err(match r {
                Ok(()) => "connection closed".to_owned(),
                Err(e) => describe(&e),
            }),
        };
        let (rtt, answer) = result.map_err(|why| {
            // hyper ends an idle connection quietly on a read error: the
            // refusal may be known only here.
            read_error
                .lock()
                .ok()
                .and_then(|e| e.clone())
                .unwrap_or(why)
        })?;
        if answer.node.id != record.id {
            return Err(format!("node {} reports for {}", record.id, answer.node.id));
        }
        Ok(Probed {
            id: record.id,
            addr,
            rtt,
            answer,
        })
    }

    /// Probes every target at once.
    pub async fn round(
        &self,
        targets: Vec<(SocketAddr, Option<NodeId>)>,
    ) -> Vec<Result<Probed, ProbeFailure>> {
        futures_util::future::join_all(
            targets
                .into_iter()
                .map(|(addr, expected)| self.probe(addr, expected)),
        )
        .await
    }
}

/// The TLS stream, remembering the first read error (a refused
/// certificate's alert) in words.
struct ReadWatch<T> {
    inner: T,
    error: Arc<std::sync::Mutex<Option<String>>>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for ReadWatch<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Err(e)) = &r
            && let Ok(mut slot) = self.error.lock()
            && slot.is_none()
        {
            *slot = Some(describe_io(e));
        }
        r
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for ReadWatch<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn describe_io(e: &std::io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::AlertReceived(alert)) => format!(
            "TLS: the node refused this client ({alert:?}): not paired with it, or unpaired"
        ),
        Some(tls) => format!("TLS: {tls}"),
        None => format!("connection: {e}"),
    }
}

/// A failed exchange in a few words. In TLS 1.3 a server refuses a client
/// certificate after the client's side of the handshake is done, so the
/// refusal shows up as an alert on the first request.
fn describe(e: &hyper::Error) -> String {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(tls) = s.downcast_ref::<rustls::Error>() {
            return match tls {
                rustls::Error::AlertReceived(alert) => format!(
                    "TLS: the node refused this client ({alert:?}): not paired with it, or unpaired"
                ),
                other => format!("TLS: {other}"),
            };
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(tls) = inner.downcast_ref::<rustls::Error>()
        {
            return format!(
                "TLS: the node refused this client ({tls}): not paired with it, or unpaired"
            );
        }
        src = s.source();
    }
    format!("probe: {e}")
}

/// The prober's TLS: this identity, any pinned node.
pub fn connector(
    identity: &pair_identity::Identity,
    trust: &TrustStore,
) -> Result<tokio_rustls::TlsConnector, pair_identity::Error> {
    let config =
        pair_identity::tls::client_config(identity, trust, pair_identity::tls::Expect::AnyNode)?;
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
