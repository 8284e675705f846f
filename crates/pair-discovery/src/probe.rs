//! The active probe: a short TCP dial to a peer's cluster port and an
//! identity check through `GET /pair/v1/node-info`.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use pair_core::{NodeId, NodeInfo};
use serde::Deserialize;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::DiscoveryError;
use crate::table::ProbeOk;

/// Path of the node-info document (served by pair-telemetry's router).
pub const NODE_INFO_PATH: &str = pair_core::NODE_INFO_PATH;
/// Largest node-info body a probe reads.
const MAX_BODY: usize = 64 * 1024;

/// The part of node info a probe needs; other fields are ignored so newer
/// peers can add some.
#[derive(Deserialize)]
struct Identity {
    id: NodeId,
    #[serde(default)]
    name: String,
}

/// Probes `addrs` (best first; a link-local IPv6 one with its scope id)
/// within `timeout` overall, and returns the identity of the first address
/// that answers.
pub async fn probe(addrs: &[SocketAddr], timeout: Duration) -> Result<ProbeOk, DiscoveryError> {
    let deadline = Instant::now() + timeout;
    let mut last = DiscoveryError::NoAddressToProbe;
    for &addr in addrs {
        match tokio::time::timeout_at(deadline, probe_addr(addr)).await {
            Ok(Ok(ok)) => return Ok(ok),
            Ok(Err(err)) => last = err,
            Err(_) => return Err(DiscoveryError::Timeout(timeout)),
        }
    }
    Err(last)
}

/// One address: connect (timed: that is the RTT), then GET node info.
pub async fn probe_addr(addr: SocketAddr) -> Result<ProbeOk, DiscoveryError> {
    let started = Instant::now();
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| DiscoveryError::Connect { addr, source })?;
    let rtt_us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
    // Best effort: a probe is one small request.
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|source| DiscoveryError::Http { addr, source })?;
    let exchange = async {
        let mut req = hyper::Request::new(Empty::<Bytes>::new());
        *req.uri_mut() = hyper::Uri::from_static(NODE_INFO_PATH);
        let headers = req.headers_mut();
        // Without the zone (as curl sends it): it means nothing to the peer.
        let host = SocketAddr::new(addr.ip(), addr.port()).to_string();
        if let Ok(host) = hyper::header::HeaderValue::from_str(&host) {
            headers.insert(hyper::header::HOST, host);
        }
        headers.insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        let resp = sender
            .send_request(req)
            .await
            .map_err(|source| DiscoveryError::Http { addr, source })?;
        if !resp.status().is_success() {
            return Err(DiscoveryError::Status {
                addr,
                status: resp.status().as_u16(),
            });
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|source| DiscoveryError::Body { addr, source })?
            .to_bytes();
        let identity = serde_json::from_slice::<Identity>(&body)
            .map_err(|source| DiscoveryError::Json { addr, source })?;
        // The full document is a bonus: a peer of another version may
        // differ in the telemetry fields, never in the identity.
        let info = serde_json::from_slice::<NodeInfo>(&body).ok().map(Box::new);
        Ok((identity, info))
    };
    // The connection future must be polled alongside the exchange; it is
    // owned here rather than spawned, so nothing outlives the probe.
    tokio::pin!(exchange);
    let (identity, info) = tokio::select! {
        r = &mut exchange => r?,
        c = conn => {
            c.map_err(|source| DiscoveryError::Http { addr, source })?;
            exchange.await?
        }
    };
    Ok(ProbeOk {
        id: identity.id,
        name: identity.name,
        addr,
        port: addr.port(),
        rtt_us,
        info,
    })
}
