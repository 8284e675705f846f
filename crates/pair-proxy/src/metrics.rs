//! Prometheus metrics of the request path, served at `/metrics`.

use arc_swap::ArcSwap;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
    /// Node that served it, or "none".
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
}

/// One inference route's histograms, looked up once at start so the
/// request path neither hashes labels nor takes the family's lock; a
/// request finds them by its [`RouteSlot`] (no reference count taken: a
/// count both event loops would write on every request).
#[derive(Debug)]
pub struct RouteMetrics {
    pub ttft: Histogram,
    pub duration: Histogram,
    pub attempts: Histogram,
}

/// An inference route's place among the histograms ([`Metrics::route_slot`]),
/// found once per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteSlot(usize);

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
    /// One per [`crate::route::INFERENCE_ROUTES`], in its order.
    routes: Vec<(&'static str, RouteMetrics)>,
    /// `requests` counters already looked up: the request path finds its
    /// counter with a short scan instead of hashing a label set (and
    /// allocating the node's name) each time. Read without a lock: a
    /// reader-writer lock's read count is a cache line both event loops
    /// wrote on every request.
    served: ArcSwap<Vec<(RequestLabels, Counter)>>,
}

/// Past this many label sets the cache stops growing (the family still
/// counts every one).
const SERVED_CACHE: usize = 256;

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
        let routes = crate::route::INFERENCE_ROUTES
            .iter()
            .map(|&route| {
                let l = RouteLabels { route };
                let handles = RouteMetrics {
                    ttft: ttft.get_or_create(&l).clone(),
                    duration: duration.get_or_create(&l).clone(),
                    attempts: attempts.get_or_create(&l).clone(),
                };
                (route, handles)
            })
            .collect();
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
            routes,
            served: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// Counts one request answered on `route` with `status` by `node` (a
    /// node name, or "none").
    pub fn count_request(&self, route: &'static str, status: u16, node: &str) {
        let hit = |(k, _): &&(RequestLabels, Counter)| {
            k.status == status && k.route == route && k.node == node
        };
        if let Some((_, c)) = self.served.load().iter().find(hit) {
            c.inc();
            return;
        }
        let labels = RequestLabels {
            route,
            status,
            node: node.to_owned(),
        };
        let c = self.requests.get_or_create(&labels).clone();
        c.inc();
        // Rare (a label set's first request): the list is copied with the
        // new entry (`rcu` copies again if another one landed meanwhile).
        self.served.rcu(|served| {
            let mut next = Vec::clone(served);
            if next.len() < SERVED_CACHE && !next.iter().any(|e| hit(&e)) {
                next.push((labels.clone(), c.clone()));
            }
            next
        });
    }

    /// Where an inference route's histograms are; `None` only for a route
    /// not in [`crate::route::INFERENCE_ROUTES`], which `route::classify`
    /// takes every route it names from.
    pub fn route_slot(&self, route: &str) -> Option<RouteSlot> {
        self.routes
            .iter()
            .position(|(r, _)| *r == route)
            .map(RouteSlot)
    }

    /// The histograms at `slot`.
    pub fn route_at(&self, slot: RouteSlot) -> &RouteMetrics {
        // Every `Metrics` lists the same routes, so any slot is in range.
        &self.routes[slot.0].1
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
        m.count_request("/api/chat", 200, "a");
        m.count_request("/api/chat", 200, "a");
        m.count_request("/api/chat", 502, "none");
        let slot = m.route_slot("/api/chat").unwrap();
        m.route_at(slot).ttft.observe(0.012);
        let text = m.encode();
        assert!(
            text.contains("pair_requests_total{route=\"/api/chat\",status=\"200\",node=\"a\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "pair_requests_total{route=\"/api/chat\",status=\"502\",node=\"none\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("pair_ttft_seconds_count{route=\"/api/chat\"} 1"),
            "{text}"
        );
        // Every inference route is exported from the start, at zero.
        assert!(
            text.contains("pair_duration_seconds_count{route=\"/v1/messages\"} 0"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    /// Two threads counting, past the cache's size: every request counted
    /// once under its own labels, cached or not.
    #[test]
    fn counts_every_request_from_two_threads() {
        let m = std::sync::Arc::new(Metrics::new());
        let nodes: Vec<String> = (0..SERVED_CACHE + 20).map(|i| format!("n{i}")).collect();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (m, nodes) = (std::sync::Arc::clone(&m), nodes.clone());
                std::thread::spawn(move || {
                    for round in 0..3 {
                        for n in &nodes {
                            m.count_request("/api/chat", 200 + round, n);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = m.encode();
        for n in [
            &nodes[0],
            &nodes[SERVED_CACHE / 2],
            &nodes[SERVED_CACHE + 19],
        ] {
            for status in [200, 201, 202] {
                let line = format!(
                    "pair_requests_total{{route=\"/api/chat\",status=\"{status}\",node=\"{n}\"}} 2\n"
                );
                assert!(text.contains(&line), "no {line}");
            }
        }
        assert!(m.served.load().len() <= SERVED_CACHE);
    }
}
