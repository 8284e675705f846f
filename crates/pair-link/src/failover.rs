//! The failover driver's ([`pair_scheduler::drive`]) tokio side, shared by
//! a node's pipeline and the edge SDK: how a failure to reach a peer
//! classifies itself, and a tokio timer on a request's clock.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use pair_scheduler::drive::{Classified, Timer};

use crate::ClusterError;

/// The label of a refused TLS handshake: the node refused this client's
/// certificate, or its own is not the one pinned. Not a node failure.
pub const TLS_REFUSED: &str = "tls-refused";

/// How a failure to reach a peer classifies itself for failover: a node
/// and the edge SDK read it the same way.
impl Classified for ClusterError {
    fn class(&self) -> &'static str {
        use std::error::Error as _;
        let mut src: Option<&(dyn std::error::Error + 'static)> = self.source();
        while let Some(s) = src {
            let tls = s.downcast_ref::<rustls::Error>().is_some()
                || s.downcast_ref::<std::io::Error>()
                    .and_then(std::io::Error::get_ref)
                    .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
            if tls {
                return TLS_REFUSED;
            }
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connect",
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => "reset",
                    std::io::ErrorKind::TimedOut => "connect-timeout",
                    _ => "transport",
                };
            }
            src = s.source();
        }
        match self {
            ClusterError::Transport { source } if source.is_connect() => "connect",
            ClusterError::BadUri { .. } | ClusterError::BadRequest { .. } => "bad-request",
            ClusterError::Deadline(_) => "first-byte-timeout",
            _ => "transport",
        }
    }

    /// A refused or reset connection: the node's process is up, or
    /// restarting, and may take the request after a back-off.
    fn transient(&self) -> bool {
        matches!(self.class(), "connect" | "reset")
    }
}

/// A tokio timer on a request's clock (a node lends its connection's).
#[derive(Debug)]
pub struct Rearmed<'a> {
    sleep: Pin<&'a mut tokio::time::Sleep>,
    t0: tokio::time::Instant,
}

impl<'a> Rearmed<'a> {
    /// `sleep` as a timer for the request that arrived at `t0`.
    pub fn new(sleep: Pin<&'a mut tokio::time::Sleep>, t0: tokio::time::Instant) -> Self {
        Self { sleep, t0 }
    }
}

impl Future for Rearmed<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        self.sleep.as_mut().poll(cx)
    }
}

impl Timer for Rearmed<'_> {
    fn rearm(mut self: Pin<&mut Self>, at: Duration) {
        let at = self.t0 + at;
        self.sleep.as_mut().reset(at);
    }
}
