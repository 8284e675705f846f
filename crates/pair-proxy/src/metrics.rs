//! Prometheus metrics of the request path, served at `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: String,
    pub status: u16,
    /// Node that served it, or "none".
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailoverLabels {
    /// Why the attempt failed: a status code or a transport class.
    pub reason: String,
}

type HistogramFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

fn attempts_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0])
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub ttft: HistogramFamily,
    pub duration: HistogramFamily,
    pub attempts: HistogramFamily,
    pub failovers: Family<FailoverLabels, Counter>,
    pub relayed_in: Counter,
    pub pending: Gauge,
    pub pressure: Gauge,
    pub peers: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("pair");
        let requests = Family::<RequestLabels, Counter>::default();
        let ttft = HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram);
        let duration =
            HistogramFamily::new_with_constructor(latency_histogram as fn() -> Histogram);
        let attempts =
            HistogramFamily::new_with_constructor(attempts_histogram as fn() -> Histogram);
        let failovers = Family::<FailoverLabels, Counter>::default();
        let relayed_in = Counter::default();
        let pending = Gauge::default();
        let pressure = Gauge::default();
        let peers = Gauge::default();
        registry.register(
            "requests",
            "Requests through this node's faces, by route, final status and serving node",
            requests.clone(),
        );
        registry.register(
            "ttft_seconds",
            "Time to the first response byte",
            ttft.clone(),
        );
        registry.register(
            "duration_seconds",
            "Whole request duration",
            duration.clone(),
        );
        registry.register(
            "attempts",
            "Dispatches per request, including the one that answered",
            attempts.clone(),
        );
        registry.register(
            "failovers",
            "Attempts abandoned for the next candidate, by reason",
            failovers.clone(),
        );
        registry.register(
            "relayed_in",
            "Requests relayed to this node by peers",
            relayed_in.clone(),
        );
        registry.register(
            "pending",
            "Requests running or queued on this node's engines",
            pending.clone(),
        );
        registry.register("pressure", "GPU pressure band 0-3", pressure.clone());
        registry.register("peers", "Paired peers currently routable", peers.clone());
        Self {
            registry,
            requests,
            ttft,
            duration,
            attempts,
            failovers,
            relayed_in,
            pending,
            pressure,
            peers,
        }
    }

    /// Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_and_histograms() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                route: "/api/chat".into(),
                status: 200,
                node: "a".into(),
            })
            .inc();
        m.ttft
            .get_or_create(&RouteLabels {
                route: "/api/chat".into(),
            })
            .observe(0.012);
        let text = m.encode();
        assert!(
            text.contains("pair_requests_total{route=\"/api/chat\",status=\"200\",node=\"a\"} 1"),
            "{text}"
        );
        assert!(text.contains("pair_ttft_seconds_bucket"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }
}
