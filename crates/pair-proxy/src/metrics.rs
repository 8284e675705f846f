//! Prometheus metrics of the request path, served at `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use arc_swap::ArcSwap;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use pair_runtime::per_loop::PerLoop;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub route: &'static str,
    pub status: u16,
    /// Node that served it, or "none".
    pub node: String,
}

impl RequestLabels {
    fn is(&self, route: &str, status: u16, node: &str) -> bool {
        self.status == status && self.route == route && self.node == node
    }
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
    pub ttft: LoopHistogram,
    pub duration: LoopHistogram,
    pub attempts: LoopHistogram,
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

type HistogramFamily = Family<RouteLabels, LoopHistogram, fn() -> LoopHistogram>;

fn latency_histogram() -> LoopHistogram {
    // 1 ms .. ~65 s
    LoopHistogram::new(latency_bounds())
}

fn latency_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// Dispatches per request: at most five attempts.
const ATTEMPT_BOUNDS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

fn attempts_histogram() -> LoopHistogram {
    LoopHistogram::new(ATTEMPT_BOUNDS)
}

/// A Prometheus counter kept per event loop ([`PerLoop`]) and added up
/// when scraped: prometheus-client's `Counter` is one atomic both loops
/// would write on every request. Clones count into the same slots.
#[derive(Clone, Debug, Default)]
pub struct LoopCounter(Arc<PerLoop<AtomicU64>>);

impl LoopCounter {
    pub fn inc(&self) {
        self.0.local().fetch_add(1, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.iter().map(|c| c.load(Relaxed)).sum()
    }
}

impl TypedMetric for LoopCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for LoopCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Bucket bounds of the longest histogram (17 latency bounds and +Inf).
const MAX_BUCKETS: usize = 18;

/// A Prometheus histogram kept per event loop ([`PerLoop`]) and added up
/// when scraped: prometheus-client's `Histogram` takes a mutex on every
/// observation, a lock (and its data) both loops would write on every
/// request. Encodes exactly as that histogram does (a test holds the two
/// together). Clones observe into the same slots.
#[derive(Clone, Debug)]
pub struct LoopHistogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    /// Upper bounds, increasing, the last +Inf.
    bounds: Box<[f64]>,
    slots: PerLoop<HistogramSlot>,
}

/// One loop's observations. Its counts are not read as one snapshot: a
/// scrape racing an observation may see the count before the bucket, as
/// Prometheus's own client libraries may.
#[derive(Debug, Default)]
struct HistogramSlot {
    /// `f64` bits.
    sum: AtomicU64,
    count: AtomicU64,
    /// Observations per bucket (not cumulative), in `bounds`' order.
    buckets: [AtomicU64; MAX_BUCKETS],
}

impl LoopHistogram {
    /// Buckets with these finite upper bounds and +Inf (at most
    /// 18 buckets in all; bounds past that are dropped).
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds
            .into_iter()
            .filter(|b| b.is_finite())
            .take(MAX_BUCKETS - 1)
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        Self(Arc::new(HistogramInner {
            bounds,
            slots: PerLoop::default(),
        }))
    }

    pub fn observe(&self, v: f64) {
        let h = &*self.0;
        let slot = h.slots.local();
        // The first bucket that holds `v`; NaN goes to +Inf, as in
        // prometheus-client.
        let i = h
            .bounds
            .iter()
            .position(|&b| b >= v)
            .unwrap_or(h.bounds.len() - 1);
        slot.buckets[i].fetch_add(1, Relaxed);
        slot.count.fetch_add(1, Relaxed);
        // Only this loop adds to its slot's sum, so this rarely retries.
        let _ = slot.sum.fetch_update(Relaxed, Relaxed, |bits| {
            Some((f64::from_bits(bits) + v).to_bits())
        });
    }

    /// Sum, count and per-bucket counts over every loop.
    fn totals(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let h = &*self.0;
        let mut buckets: Vec<(f64, u64)> = h.bounds.iter().map(|&b| (b, 0)).collect();
        let (mut sum, mut count) = (0.0, 0);
        for slot in h.slots.iter() {
            sum += f64::from_bits(slot.sum.load(Relaxed));
            count += slot.count.load(Relaxed);
            for (total, n) in buckets.iter_mut().zip(&slot.buckets) {
                total.1 += n.load(Relaxed);
            }
        }
        (sum, count, buckets)
    }
}

impl TypedMetric for LoopHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LoopHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, LoopCounter>,
    pub ttft: HistogramFamily,
    pub duration: HistogramFamily,
    pub attempts: HistogramFamily,
    pub failovers: Family<FailoverLabels, Counter>,
    pub relayed_in: LoopCounter,
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
    served: ArcSwap<Vec<(RequestLabels, LoopCounter)>>,
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
        let requests = Family::<RequestLabels, LoopCounter>::default();
        let ttft =
            HistogramFamily::new_with_constructor(latency_histogram as fn() -> LoopHistogram);
        let duration =
            HistogramFamily::new_with_constructor(latency_histogram as fn() -> LoopHistogram);
        let attempts =
            HistogramFamily::new_with_constructor(attempts_histogram as fn() -> LoopHistogram);
        let failovers = Family::<FailoverLabels, Counter>::default();
        let relayed_in = LoopCounter::default();
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
        if let Some((_, c)) = self
            .served
            .load()
            .iter()
            .find(|(k, _)| k.is(route, status, node))
        {
            c.inc();
            return;
        }
        self.count_new_request(route, status, node);
    }

    /// A label set's first request (rare): the family makes its counter,
    /// and the served list is copied with the new entry (`rcu` copies again
    /// if another one landed meanwhile).
    #[cold]
    #[inline(never)]
    fn count_new_request(&self, route: &'static str, status: u16, node: &str) {
        let labels = RequestLabels {
            route,
            status,
            node: node.to_owned(),
        };
        let c = self.requests.get_or_create(&labels).clone();
        c.inc();
        self.served.rcu(|served| {
            let mut next = Vec::clone(served);
            if next.len() < SERVED_CACHE && !next.iter().any(|(k, _)| k.is(route, status, node)) {
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

    fn encode_one(
        name: &str,
        m: impl EncodeMetric + Send + Sync + std::fmt::Debug + 'static,
    ) -> String {
        let mut r = Registry::default();
        r.register(name, "h", m);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    use proptest::prelude::*;

    proptest! {
        /// The per-loop histogram encodes exactly what prometheus-client's
        /// own histogram encodes for the same observations: bounds hit
        /// exactly, below the first, past the last, negative, NaN.
        #[test]
        fn a_loop_histogram_encodes_as_prometheus_clients(
            picks in proptest::collection::vec(
                prop_oneof![
                    (0usize..17).prop_map(|i| latency_bounds().nth(i).unwrap()),
                    0.0f64..100.0,
                    proptest::num::f64::ANY,
                ],
                0..200,
            ),
        ) {
            let ours = latency_histogram();
            let theirs = prometheus_client::metrics::histogram::Histogram::new(latency_bounds());
            for &v in &picks {
                ours.observe(v);
                theirs.observe(v);
            }
            prop_assert_eq!(encode_one("h", ours), encode_one("h", theirs));
        }
    }

    /// Observations and counts made on three event loops (two threads of
    /// their own, and this runtime's) add up to what one histogram and one
    /// counter given them all hold.
    #[tokio::test]
    async fn loop_metrics_add_up_over_the_loops() {
        let ours = attempts_histogram();
        let counter = LoopCounter::default();
        let loops = pair_runtime::runtime::EventLoops::start(3).unwrap();
        for i in 0..9u32 {
            let (h, c) = (ours.clone(), counter.clone());
            let task = loops.spawn_on(usize::try_from(i).unwrap(), async move {
                for _ in 0..100 {
                    h.observe(f64::from(i % 6) + 0.5);
                    c.inc();
                }
            });
            task.await.unwrap();
        }
        loops.shutdown(std::time::Duration::from_secs(5)).await;
        let theirs = prometheus_client::metrics::histogram::Histogram::new(ATTEMPT_BOUNDS);
        for i in 0..9u32 {
            for _ in 0..100 {
                theirs.observe(f64::from(i % 6) + 0.5);
            }
        }
        assert_eq!(counter.get(), 900);
        let used = ours
            .0
            .slots
            .iter()
            .filter(|s| s.count.load(Relaxed) > 0)
            .count();
        assert!(
            used > 1 || pair_runtime::per_loop::slots() == 1,
            "every observation landed in one slot"
        );
        assert_eq!(encode_one("a", ours), encode_one("a", theirs));
    }
}
