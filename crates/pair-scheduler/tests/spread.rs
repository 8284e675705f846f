//! Reservations made at the same instant do not race: N simultaneous equal
//! requests over M equal idle nodes spread within one of even, whatever the
//! interleaving of the rankings with the peers' reports and with the
//! relayed requests reaching their nodes.
//!
//! The model is deterministic and steps one event at a time, so every
//! interleaving proptest draws is one a node can meet: a router ranks and
//! counts each request in one turn (the node's dispatch turn); a relayed
//! request reaches its node some events later; a peer's report, made at any
//! moment, reaches the router some events later still. Nothing finishes
//! (the requests are simultaneous and long).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use pair_scheduler::pair_core::{
    Admitted, ApiFlavor, ClusterSnapshot, EngineKind, EngineSnapshot, ModelEntry, ModelName,
    ModelPerf, NodeId, NodeSnapshot, RequestProfile, Workload,
};
use pair_scheduler::{Policy, Ranking, ReservationId, Reservations, Scheduler, SchedulerConfig};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

const MODEL: &str = "llama3.2:3b";
const BOOT: u64 = 7;

fn id(i: usize) -> NodeId {
    NodeId::from_u128(i as u128 + 1)
}

/// An equal node: one slot, the same speed, the model loaded.
fn node(i: usize, slots: u16) -> NodeSnapshot {
    let mut n = NodeSnapshot::new(id(i), format!("node-{i}"));
    n.rtt_us = 1_000;
    n.engines.push(EngineSnapshot {
        kind: EngineKind::Ollama,
        healthy: true,
        silent: false,
        continues_chat: None,
        slots,
        models: vec![ModelEntry {
            name: ModelName::new(MODEL).unwrap(),
            size_bytes: Some(2_000_000_000),
            loaded: true,
            perf: Some(ModelPerf {
                prefill_tps: 2_000.0,
                decode_tps: 60.0,
                load_ms: 1_500,
                overhead_ms: 15,
                batch_exponent: None,
            }),
            learned: false,
        }],
    });
    n
}

fn request() -> RequestProfile {
    let mut r = RequestProfile::new(MODEL, ApiFlavor::Ollama);
    r.prompt_tokens = 40;
    r.max_output_tokens = 200;
    r
}

/// One node as the world sees it: what runs on it, and the newest
/// reservation of each router it has counted.
#[derive(Clone, Default)]
struct Truth {
    running: u32,
    admitted: Vec<Admitted>,
}

/// A request on its way to a peer.
struct Relay {
    from: usize,
    to: usize,
    rid: ReservationId,
}

/// One router (a node whose faces took requests): its scheduler and
/// reservations, and its view of each peer (the last report it got).
struct Router {
    me: usize,
    scheduler: Scheduler,
    reservations: Reservations,
    view: Vec<NodeSnapshot>,
    ranking: Ranking,
}

/// The world: its nodes, the routers among them, the relays in flight and
/// the reports made but not yet delivered.
struct World {
    truth: Vec<Truth>,
    routers: Vec<Router>,
    relays: Vec<Relay>,
    reports: Vec<(usize, usize, NodeSnapshot)>,
    now: u64,
    counting: bool,
    slots: u16,
}

impl World {
    fn new(nodes: usize, routers: usize, counting: bool, slots: u16) -> Self {
        let view: Vec<NodeSnapshot> = (0..nodes)
            .map(|i| {
                let mut n = node(i, slots);
                n.reported_at_ms = 1;
                n
            })
            .collect();
        World {
            truth: vec![Truth::default(); nodes],
            routers: (0..routers)
                .map(|me| {
                    let mut reservations = Reservations::new();
                    if counting {
                        reservations.set_origin(id(me), BOOT);
                    }
                    let mut view = view.clone();
                    view[me].rtt_us = 0;
                    Router {
                        me,
                        scheduler: Scheduler::new(SchedulerConfig::new(Policy::PredictedLatency)),
                        reservations,
                        view,
                        ranking: Ranking::with_capacity(nodes),
                    }
                })
                .collect(),
            relays: Vec::new(),
            reports: Vec::new(),
            now: 10,
            counting,
            slots,
        }
    }

    /// Router `r` ranks one request and counts it where it goes (its own
    /// engine live, a peer by a reservation), in one turn.
    fn route(&mut self, r: usize) {
        let now = self.now;
        let router = &mut self.routers[r];
        let me = router.me;
        let cluster = ClusterSnapshot::new(now, now, router.view.clone());
        let live = Workload {
            running: self.truth[me].running.min(u32::from(self.slots)),
            queued: self.truth[me].running.saturating_sub(u32::from(self.slots)),
            prefill_tokens: u64::from(self.truth[me].running) * 40,
            decode_tokens: u64::from(self.truth[me].running) * 200,
        };
        router.reservations.set_live(Some((id(me), live)));
        let mut rng = ChaCha8Rng::seed_from_u64(now);
        router.scheduler.rank_into(
            &mut router.ranking,
            &cluster,
            &request(),
            &router.reservations,
            now,
            &mut rng,
        );
        let to = router.ranking.iter().next().expect("a candidate").node;
        let to = (0..self.truth.len()).find(|&i| id(i) == to).unwrap();
        if to == me {
            self.truth[me].running += 1;
        } else {
            let rid = router.reservations.reserve(id(to), &request(), now);
            self.relays.push(Relay { from: me, to, rid });
        }
    }

    /// The `k`-th relay in flight reaches its node, which counts it (and,
    /// counting, says which reservation it was).
    fn arrive(&mut self, k: usize) {
        if self.relays.is_empty() {
            return;
        }
        let relay = self.relays.remove(k % self.relays.len());
        let t = &mut self.truth[relay.to];
        t.running += 1;
        if self.counting {
            let from = id(relay.from);
            let seq = relay.rid.wire_seq();
            match t.admitted.iter_mut().find(|a| a.from == from) {
                Some(a) => a.admit(seq),
                None => t.admitted.push(Admitted::first(from, BOOT, seq)),
            }
        }
    }

    /// Node `from` makes its report now, for router `to` (delivered later).
    fn report(&mut self, from: usize, to: usize) {
        if to >= self.routers.len() || self.routers[to].me == from {
            return;
        }
        let t = &self.truth[from];
        let mut n = node(from, self.slots);
        n.workload = Workload {
            running: t.running.min(u32::from(self.slots)),
            queued: t.running.saturating_sub(u32::from(self.slots)),
            prefill_tokens: u64::from(t.running) * 40,
            decode_tokens: u64::from(t.running) * 200,
        };
        n.reported_at_ms = self.now;
        n.admitted.clone_from(&t.admitted);
        if self.routers[to].me == from {
            n.rtt_us = 0;
        }
        self.reports.push((from, to, n));
    }

    /// The `k`-th report made reaches its router.
    fn deliver(&mut self, k: usize) {
        if self.reports.is_empty() {
            return;
        }
        let (from, to, n) = self.reports.remove(k % self.reports.len());
        let router = &mut self.routers[to];
        // Reports of one node reach a router in order: an older one
        // delivered late is one the router already has a newer one of.
        if router.view[from].reported_at_ms > n.reported_at_ms {
            return;
        }
        router.view[from] = n;
        let cluster = ClusterSnapshot::new(self.now, self.now, router.view.clone());
        router.reservations.sync(&cluster);
    }

    fn counts(&mut self) -> Vec<u32> {
        while !self.relays.is_empty() {
            self.arrive(0);
        }
        self.truth.iter().map(|t| t.running).collect()
    }
}

/// What happens next: a request ranked by a router, a relay arriving, a
/// report made, a report delivered.
#[derive(Clone, Copy, Debug)]
enum Event {
    Route(usize),
    Arrive(usize),
    Report(usize, usize),
    Deliver(usize),
}

fn event(nodes: usize, routers: usize) -> impl Strategy<Value = Event> {
    prop_oneof![
        (0..routers).prop_map(Event::Route),
        (0usize..8).prop_map(Event::Arrive),
        (0..nodes, 0..routers).prop_map(|(f, t)| Event::Report(f, t)),
        (0usize..8).prop_map(Event::Deliver),
    ]
}

/// Runs `events` until every router has ranked its share of `per_router`
/// requests (the routes past that are skipped; missing ones are made at
/// the end), and returns how many requests each node runs.
///
/// `immediate`: each relay reaches its node before anything else happens.
fn run(
    nodes: usize,
    per_router: &[usize],
    events: &[Event],
    counting: bool,
    slots: u16,
    immediate: bool,
) -> Vec<u32> {
    let mut w = World::new(nodes, per_router.len(), counting, slots);
    let mut left = per_router.to_vec();
    for e in events {
        w.now += 1;
        match *e {
            Event::Route(r) if left[r] > 0 => {
                left[r] -= 1;
                w.route(r);
                if immediate {
                    w.arrive(0);
                }
            }
            Event::Route(_) => {}
            Event::Arrive(k) => w.arrive(k),
            Event::Report(from, to) => w.report(from, to),
            Event::Deliver(k) => w.deliver(k),
        }
    }
    for (r, n) in left.iter().enumerate() {
        for _ in 0..*n {
            w.now += 1;
            w.route(r);
            if immediate {
                w.arrive(0);
            }
        }
    }
    w.counts()
}

fn even(counts: &[u32]) -> bool {
    counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4_000))]

    /// One router (both faces of one node share its turn and its
    /// reservations): any number of requests over 2 to 4 nodes.
    #[test]
    fn one_router_spreads_within_one_of_even(
        nodes in 2usize..5,
        n in 2usize..10,
        slots in 1u16..3,
        events in proptest::collection::vec(event(4, 1), 0..40),
    ) {
        let events: Vec<Event> = events
            .into_iter()
            .map(|e| match e {
                Event::Report(f, t) => Event::Report(f % nodes, t),
                e => e,
            })
            .collect();
        let counts = run(nodes, &[n], &events, true, slots, false);
        prop_assert!(even(&counts), "{counts:?} after {events:?}");
    }
}

/// The race this guards against, step by step: a report made after a
/// request was dispatched but before it reached its node does not count
/// it. Covered by that report's time, the reservation is dropped and the
/// node looks idle again (3/1); covered by what the node says it counted,
/// it stays (2/2).
#[test]
fn a_report_made_while_a_request_is_on_its_way_does_not_cover_it() {
    let events = [
        Event::Route(0),     // to node 0 (its own engine)
        Event::Route(0),     // to node 1: a reservation
        Event::Report(1, 0), // node 1 reports: the request is not there yet
        Event::Deliver(0),
        Event::Route(0),     // node 0 (1 running) or node 1 (idle, reserved)?
        Event::Report(1, 0), // again, before the relays arrive
        Event::Deliver(0),
        Event::Route(0),
    ];
    assert_eq!(run(2, &[4], &events, true, 1, false), vec![2, 2]);
    assert_eq!(
        run(2, &[4], &events, false, 1, false),
        vec![1, 3],
        "covered by time, the reservations vanished before their requests arrived"
    );
}
