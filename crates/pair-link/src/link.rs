//! The mTLS client to one paired peer's cluster port: what a node uses to
//! relay a request, push its report and replicate its jobs, and what a
//! requester-only client uses to reach a node. It verifies that the server
//! is exactly the pinned peer it expects.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pair_core::NodeId;
use pair_http::{Timeouts, client::http_connector};

use crate::ClusterError;

/// Path prefix under which a cluster port accepts relayed requests.
pub const RELAY_PREFIX: &str = "/pair/v1/relay";

type TlsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A pooled mTLS client to one peer, verifying that peer's pinned identity.
#[derive(Clone)]
pub struct PeerLink {
    pub id: NodeId,
    /// `https://ip:port`.
    pub base: Uri,
    client: TlsClient,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("id", &self.id)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl PeerLink {
    /// `tls` must verify the server as `id` (pair-identity builds it).
    pub fn new(
        id: NodeId,
        addr: std::net::SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        timeouts: Timeouts,
    ) -> Result<Self, ClusterError> {
        let base: Uri = format!("https://{addr}")
            .parse()
            .map_err(|source| ClusterError::BadUri { source })?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config((*tls).clone())
            .https_only()
            // The pinned verifier checks the certificate, not a name; a
            // fixed one also lets a link-local address carry its zone.
            .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
                pair_identity::tls::server_name(),
            ))
            .enable_http1()
            .wrap_connector(http_connector(timeouts));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Self { id, base, client })
    }

    /// The peer's cluster address.
    pub fn addr(&self) -> Option<std::net::SocketAddr> {
        self.base.authority()?.as_str().parse().ok()
    }

    /// The URI of `path_and_query` relayed to this peer.
    pub fn relay_uri(&self, path_and_query: &str) -> Result<Uri, ClusterError> {
        join_uri(&self.base, RELAY_PREFIX, path_and_query)
    }

    /// Sends a request whose URI is already this peer's (see
    /// [`PeerLink::relay_uri`]); no deadline of its own.
    pub fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> impl Future<Output = Result<Response<Incoming>, ClusterError>> + Send + 'static {
        let fut = self.client.request(req);
        async move {
            fut.await
                .map_err(|source| ClusterError::Transport { source })
        }
    }

    /// A GET or POST to a cluster-port path other than the relay (workload
    /// reports, job events), with a short deadline.
    pub async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Response<Incoming>, ClusterError> {
        let uri = join_uri(&self.base, "", path)?;
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|source| ClusterError::BadRequest { source })?;
        match tokio::time::timeout(deadline, self.client.request(req)).await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(source)) => Err(ClusterError::Transport { source }),
            Err(_) => Err(ClusterError::Deadline(deadline)),
        }
    }
}

/// `base` (scheme and authority) + `prefix` + `path_and_query`.
pub fn join_uri(base: &Uri, prefix: &str, path_and_query: &str) -> Result<Uri, ClusterError> {
    let mut s = String::with_capacity(64 + path_and_query.len());
    s.push_str(base.scheme_str().unwrap_or("http"));
    s.push_str("://");
    if let Some(a) = base.authority() {
        s.push_str(a.as_str());
    }
    s.push_str(prefix);
    s.push_str(path_and_query);
    s.parse().map_err(|source| ClusterError::BadUri { source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relay_uris_keep_the_query() {
        let base: Uri = "https://10.0.0.2:14318".parse().unwrap();
        let u = join_uri(&base, RELAY_PREFIX, "/v1/models?x=1").unwrap();
        assert_eq!(
            u.to_string(),
            "https://10.0.0.2:14318/pair/v1/relay/v1/models?x=1"
        );
    }
}
