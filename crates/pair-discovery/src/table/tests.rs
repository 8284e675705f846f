//! Tests of the peer table: transitions with explicit time, and properties
//! over random event sequences.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const MS: Duration = Duration::from_millis(1);

fn id(n: u128) -> NodeId {
    NodeId::from_u128(n)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// `ip` on the cluster port of these tests.
fn sa(s: &str) -> SocketAddr {
    SocketAddr::new(ip(s), 14318)
}

fn rec(n: u128, addr: &str) -> TxtRecord {
    TxtRecord {
        id: id(n),
        cluster_port: 14318,
        addrs: vec![ip(addr)],
    }
}

fn inst(n: u128) -> String {
    format!("{}._pair-node._tcp.local.", id(n))
}

fn ok(n: u128, addr: &str) -> Result<ProbeOk, ProbeFailure> {
    Ok(ProbeOk {
        id: id(n),
        name: format!("node{n}"),
        addr: sa(addr),
        port: 14318,
        rtt_us: 250,
        info: None,
    })
}

fn table() -> PeerTable {
    PeerTable::new(id(0), LivenessConfig::default())
}

/// Announces peer `n` at `t` and verifies it with one probe.
fn join(t: &mut PeerTable, now: Duration, n: u128, addr: &str) {
    t.on_announce(now, &inst(n), &rec(n, addr), &[]);
    let due = t.tick(now);
    assert!(due.iter().any(|r| r.id == id(n)));
    t.on_probe_result(now, id(n), ok(n, addr));
}

/// Drives `t` from `from` to `to` in 100 ms ticks, answering every probe
/// with `answer(id)`.
fn run(
    t: &mut PeerTable,
    from: Duration,
    to: Duration,
    answer: impl Fn(NodeId) -> Result<ProbeOk, ProbeFailure>,
) {
    let mut now = from;
    while now <= to {
        for req in t.tick(now) {
            t.on_probe_result(now, req.id, answer(req.id));
        }
        now += 100 * MS;
    }
}

#[test]
fn announced_peer_is_routable_only_after_its_identity_probe() {
    let mut t = table();
    let now = Duration::from_secs(1);
    let two = TxtRecord {
        addrs: vec![ip("10.0.0.1"), ip("10.0.0.9")],
        ..rec(1, "10.0.0.1")
    };
    t.on_announce(now, &inst(1), &two, &[ip("10.0.0.77")]);
    t.on_announce(
        now,
        &inst(5),
        &TxtRecord {
            addrs: vec![],
            ..rec(5, "10.0.0.5")
        },
        &[ip("10.0.0.5")],
    );
    assert_eq!(t.state(id(1)), Some(PeerState::Unverified));
    assert!(!t.is_routable(id(1)));
    let due = t.tick(now);
    // TXT addresses win; A records only stand in when TXT has none.
    assert_eq!(
        due,
        vec![
            ProbeRequest {
                id: id(1),
                addrs: vec![sa("10.0.0.1"), sa("10.0.0.9")],
                port: 14318
            },
            ProbeRequest {
                id: id(5),
                addrs: vec![sa("10.0.0.5")],
                port: 14318
            }
        ]
    );
    // In flight: not handed out twice.
    assert!(t.tick(now + 600 * MS).is_empty());
    t.on_probe_result(now + 2 * MS, id(1), ok(1, "10.0.0.9"));
    assert!(t.is_routable(id(1)));
    let v = t.view(now + 2 * MS, 10_000);
    let p = v.get(id(1)).unwrap();
    assert_eq!(p.state, PeerState::Alive);
    assert_eq!(p.liveness, Liveness::Alive);
    assert_eq!(p.name.as_deref(), Some("node1"));
    assert_eq!(p.rtt_us, Some(250));
    assert_eq!(p.last_seen_ms, 10_000);
    // The address that answered leads.
    assert_eq!(p.addrs, vec![ip("10.0.0.9"), ip("10.0.0.1")]);
    assert!(p.via_mdns && !p.via_static);
}

#[test]
fn own_announcements_are_ignored() {
    let mut t = table();
    t.on_announce(Duration::ZERO, &inst(0), &rec(0, "10.0.0.1"), &[]);
    assert!(t.view(Duration::ZERO, 0).peers.is_empty());
}

#[test]
fn killed_peer_is_suspect_then_out_of_the_routing_set_within_3_s() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    run(&mut t, Duration::ZERO, Duration::from_secs(5), |n| {
        ok(1, "10.0.0.1").map(|o| ProbeOk { id: n, ..o })
    });
    assert_eq!(t.state(id(1)), Some(PeerState::Alive));
    // Killed at 5 s: every probe from now on fails.
    let killed = Duration::from_secs(5) + 50 * MS;
    let mut now = killed;
    let mut suspect_at = None;
    let mut dead_at = None;
    while now < killed + Duration::from_secs(4) {
        for req in t.tick(now) {
            t.on_probe_result(now, req.id, Err(ProbeFailure::Unreachable));
        }
        match t.state(id(1)) {
            Some(PeerState::Suspect) if suspect_at.is_none() => suspect_at = Some(now),
            Some(PeerState::Dead) if dead_at.is_none() => dead_at = Some(now),
            _ => {}
        }
        now += 100 * MS;
    }
    let suspect_at = suspect_at.unwrap();
    let dead_at = dead_at.unwrap();
    assert!(
        suspect_at - killed <= Duration::from_millis(600),
        "{suspect_at:?}"
    );
    assert!(
        dead_at - killed < Duration::from_secs(3),
        "evicted after {:?}",
        dead_at - killed
    );
    assert!(
        dead_at - killed >= Duration::from_millis(1_400),
        "not before the misses add up"
    );
    assert!(!t.is_routable(id(1)));
    assert_eq!(t.view(now, 0).get(id(1)).unwrap().liveness, Liveness::Dead);
}

#[test]
fn a_hung_peer_answering_with_timeouts_is_evicted_like_a_dead_one() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    run(&mut t, 100 * MS, Duration::from_secs(3), |_| {
        Err(ProbeFailure::Unreachable)
    });
    assert_eq!(t.state(id(1)), Some(PeerState::Dead));
}

#[test]
fn one_good_probe_clears_suspicion() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    run(&mut t, 500 * MS, 900 * MS, |_| {
        Err(ProbeFailure::Unreachable)
    });
    assert_eq!(t.state(id(1)), Some(PeerState::Suspect));
    assert!(t.is_routable(id(1)), "suspect peers stay routable");
    run(
        &mut t,
        Duration::from_secs(1),
        Duration::from_secs(1),
        |_| ok(1, "10.0.0.1"),
    );
    assert_eq!(t.state(id(1)), Some(PeerState::Alive));
}

#[test]
fn goodbye_removes_at_once() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    assert_eq!(t.on_goodbye(MS, &inst(1)), Some(id(1)));
    assert_eq!(t.state(id(1)), None);
    assert_eq!(t.on_goodbye(MS, &inst(1)), None);
    assert_eq!(t.on_goodbye(MS, "unknown._pair-node._tcp.local."), None);
}

#[test]
fn goodbye_of_a_static_peer_keeps_it_known_as_dead() {
    let mut t = table();
    t.on_static_found(Duration::ZERO, &ok(1, "10.0.0.1").unwrap());
    t.on_announce(MS, &inst(1), &rec(1, "10.0.0.1"), &[]);
    assert_eq!(t.on_goodbye(2 * MS, &inst(1)), Some(id(1)));
    assert_eq!(t.state(id(1)), Some(PeerState::Dead));
    let v = t.view(2 * MS, 0);
    let p = v.get(id(1)).unwrap();
    assert!(p.via_static && !p.via_mdns);
    // Still probed (slowly), and back when it answers.
    assert!(t.tick(Duration::from_secs(1)).is_empty());
    let due = t.tick(Duration::from_secs(6));
    assert_eq!(due.len(), 1);
    t.on_probe_result(Duration::from_secs(6), id(1), ok(1, "10.0.0.1"));
    assert_eq!(t.state(id(1)), Some(PeerState::Alive));
}

#[test]
fn renamed_host_stays_the_same_peer() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    // New host name and instance, same UUID, new address.
    t.on_announce(
        MS,
        "renamed._pair-node._tcp.local.",
        &rec(1, "10.0.0.2"),
        &[],
    );
    let v = t.view(MS, 0);
    assert_eq!(v.peers.len(), 1);
    let p = v.get(id(1)).unwrap();
    assert_eq!(p.state, PeerState::Alive);
    assert_eq!(p.addrs, vec![ip("10.0.0.2")]);
    // The old instance's expiry no longer touches it.
    assert_eq!(t.on_goodbye(2 * MS, &inst(1)), None);
    assert!(t.is_routable(id(1)));
}

#[test]
fn new_uuid_at_an_old_address_needs_an_identity_check() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    // Machine re-installed: a new UUID announces from the same address.
    t.on_announce(100 * MS, &inst(2), &rec(2, "10.0.0.1"), &[]);
    assert!(!t.is_routable(id(2)));
    // The old UUID's probe now meets the new identity: a failure for it.
    let now = 500 * MS;
    for req in t.tick(now) {
        let answer = if req.id == id(1) {
            Err(ProbeFailure::WrongIdentity(id(2)))
        } else {
            ok(2, "10.0.0.1")
        };
        t.on_probe_result(now, req.id, answer);
    }
    assert!(t.is_routable(id(2)));
    assert_eq!(t.state(id(1)), Some(PeerState::Suspect));
    // A probe answering with the wrong UUID never verifies a peer.
    t.on_announce(now, &inst(3), &rec(3, "10.0.0.3"), &[]);
    for req in t.tick(now) {
        if req.id == id(3) {
            t.on_probe_result(now, req.id, ok(4, "10.0.0.3"));
        }
    }
    assert_eq!(t.state(id(3)), Some(PeerState::Unverified));
}

#[test]
fn when_every_peer_vanishes_at_once_we_suspect_our_own_network() {
    let mut t = table();
    for n in 1..=3 {
        join(&mut t, Duration::ZERO, n, &format!("10.0.0.{n}"));
    }
    // Our cable is pulled at 1 s: every probe fails.
    run(
        &mut t,
        Duration::from_secs(1),
        Duration::from_secs(8),
        |_| Err(ProbeFailure::Unreachable),
    );
    assert!(t.own_network_suspect());
    for n in 1..=3 {
        assert_eq!(
            t.state(id(n)),
            Some(PeerState::Suspect),
            "peer {n} held, not evicted"
        );
    }
    // After the grace period they go.
    run(
        &mut t,
        Duration::from_secs(8) + 100 * MS,
        Duration::from_secs(14),
        |_| Err(ProbeFailure::Unreachable),
    );
    for n in 1..=3 {
        assert_eq!(t.state(id(n)), Some(PeerState::Dead));
    }
    assert!(!t.own_network_suspect());
}

#[test]
fn when_one_peer_still_answers_the_others_are_evicted_on_time() {
    let mut t = table();
    for n in 1..=3 {
        join(&mut t, Duration::ZERO, n, &format!("10.0.0.{n}"));
    }
    run(
        &mut t,
        Duration::from_secs(1),
        Duration::from_secs(4),
        |n| {
            if n == id(3) {
                ok(3, "10.0.0.3")
            } else {
                Err(ProbeFailure::Unreachable)
            }
        },
    );
    assert_eq!(t.state(id(1)), Some(PeerState::Dead));
    assert_eq!(t.state(id(2)), Some(PeerState::Dead));
    assert_eq!(t.state(id(3)), Some(PeerState::Alive));
    assert!(!t.own_network_suspect());
}

#[test]
fn network_comes_back_during_the_grace_period() {
    let mut t = table();
    for n in 1..=2 {
        join(&mut t, Duration::ZERO, n, &format!("10.0.0.{n}"));
    }
    run(
        &mut t,
        Duration::from_secs(1),
        Duration::from_secs(5),
        |_| Err(ProbeFailure::Unreachable),
    );
    assert!(t.own_network_suspect());
    run(
        &mut t,
        Duration::from_secs(5) + 100 * MS,
        Duration::from_secs(6),
        |n| ok(1, "10.0.0.1").map(|o| ProbeOk { id: n, ..o }),
    );
    assert!(!t.own_network_suspect());
    assert!(t.is_routable(id(1)) && t.is_routable(id(2)));
}

#[test]
fn exchange_failure_triggers_an_immediate_probe() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    assert!(t.tick(100 * MS).is_empty());
    t.on_exchange_failed(100 * MS, id(1));
    assert_eq!(t.tick(100 * MS).len(), 1);
}

#[test]
fn restarted_peer_announcing_again_is_probed_at_once() {
    let mut t = table();
    join(&mut t, Duration::ZERO, 1, "10.0.0.1");
    run(&mut t, 100 * MS, Duration::from_secs(3), |_| {
        Err(ProbeFailure::Unreachable)
    });
    assert_eq!(t.state(id(1)), Some(PeerState::Dead));
    let now = Duration::from_secs(3) + 50 * MS;
    t.on_announce(now, &inst(1), &rec(1, "10.0.0.1"), &[]);
    let due = t.tick(now);
    assert_eq!(due.len(), 1);
    t.on_probe_result(now, id(1), ok(1, "10.0.0.1"));
    assert_eq!(t.state(id(1)), Some(PeerState::Alive));
}

#[test]
fn never_verified_and_dead_mdns_peers_are_forgotten() {
    let mut t = table();
    t.on_announce(Duration::ZERO, &inst(1), &rec(1, "10.0.0.1"), &[]);
    join(&mut t, Duration::ZERO, 2, "10.0.0.2");
    t.on_static_found(Duration::ZERO, &ok(3, "10.0.0.3").unwrap());
    run(&mut t, 100 * MS, Duration::from_secs(700), |_| {
        Err(ProbeFailure::Unreachable)
    });
    assert_eq!(t.state(id(1)), None);
    assert_eq!(t.state(id(2)), None);
    assert_eq!(
        t.state(id(3)),
        Some(PeerState::Dead),
        "static peers are kept"
    );
}

#[test]
fn static_peer_found_merges_with_its_mdns_entry() {
    let mut t = table();
    t.on_announce(Duration::ZERO, &inst(1), &rec(1, "10.0.0.1"), &[]);
    t.on_static_found(MS, &ok(1, "192.168.5.1").unwrap());
    let v = t.view(MS, 0);
    assert_eq!(v.peers.len(), 1);
    let p = &v.peers[0];
    assert_eq!(p.state, PeerState::Alive);
    assert!(p.via_mdns && p.via_static);
    assert_eq!(p.addrs, vec![ip("192.168.5.1"), ip("10.0.0.1")]);
}

#[derive(Clone, Debug)]
enum Ev {
    Announce(u8, u8),
    Goodbye(u8),
    Static(u8),
    Advance(u16),
    ExchangeFailed(u8),
}

fn arb_ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (0u8..5, 0u8..4).prop_map(|(n, a)| Ev::Announce(n, a)),
        (0u8..5).prop_map(Ev::Goodbye),
        (0u8..5).prop_map(Ev::Static),
        (1u16..3_000).prop_map(Ev::Advance),
        (0u8..5).prop_map(Ev::ExchangeFailed),
    ]
}

proptest! {
    /// Over random histories: a routable peer always had a probe return its
    /// own UUID; no probe is handed out twice while in flight; an evicted
    /// peer had failures since its last success; the view is sorted by id.
    #[test]
    fn invariants_hold_over_random_histories(
        events in proptest::collection::vec(arb_ev(), 1..80),
        answers in proptest::collection::vec(0u8..4, 80),
    ) {
        let mut t = table();
        let mut now = Duration::ZERO;
        let mut verified: BTreeSet<NodeId> = BTreeSet::new();
        let mut failures_since_ok: BTreeMap<NodeId, u32> = BTreeMap::new();
        let mut in_flight: BTreeSet<NodeId> = BTreeSet::new();
        let mut pending: Vec<ProbeRequest> = Vec::new();
        let mut k = 0usize;
        for ev in events {
            match ev {
                Ev::Announce(n, a) => {
                    let n = u128::from(n) + 1;
                    t.on_announce(now, &inst(n), &rec(n, &format!("10.0.0.{a}")), &[]);
                }
                Ev::Goodbye(n) => { t.on_goodbye(now, &inst(u128::from(n) + 1)); }
                Ev::Static(n) => {
                    let n = u128::from(n) + 1;
                    t.on_static_found(now, &ok(n, "10.1.0.1").unwrap());
                    verified.insert(id(n));
                    failures_since_ok.insert(id(n), 0);
                }
                Ev::ExchangeFailed(n) => t.on_exchange_failed(now, id(u128::from(n) + 1)),
                Ev::Advance(ms) => {
                    now += Duration::from_millis(u64::from(ms));
                    // Answer what was asked last round, then ask again.
                    for req in pending.drain(..) {
                        in_flight.remove(&req.id);
                        let answer = answers[k % answers.len()];
                        k += 1;
                        let result = match answer {
                            0 => ok(0, "10.0.0.0").map(|o| ProbeOk { id: req.id, ..o }),
                            1 => Err(ProbeFailure::WrongIdentity(id(99))),
                            _ => Err(ProbeFailure::Unreachable),
                        };
                        if result.is_ok() {
                            verified.insert(req.id);
                            failures_since_ok.insert(req.id, 0);
                        } else {
                            *failures_since_ok.entry(req.id).or_default() += 1;
                        }
                        t.on_probe_result(now, req.id, result);
                    }
                    for req in t.tick(now) {
                        prop_assert!(in_flight.insert(req.id), "probe of {} handed out twice", req.id);
                        pending.push(req);
                    }
                }
            }
            let view = t.view(now, 0);
            prop_assert!(view.peers.windows(2).all(|w| w[0].id < w[1].id));
            for p in &view.peers {
                prop_assert!(p.id != id(0), "never ourselves");
                if p.liveness.is_routable() {
                    prop_assert!(verified.contains(&p.id), "{} routable without identity check", p.id);
                }
                if p.state == PeerState::Dead && !p.via_static {
                    prop_assert!(failures_since_ok.get(&p.id).copied().unwrap_or(0) >= 1);
                }
            }
        }
    }
}

/// `[fe80::1%scope_id]:14318`.
fn link_local(scope_id: u32) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(ip6("fe80::1"), 14318, 0, scope_id))
}

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn a_link_local_static_peer_keeps_its_interface() {
    let mut t = table();
    let found = ProbeOk {
        addr: link_local(7),
        ..ok(1, "10.0.0.1").unwrap()
    };
    t.on_static_found(Duration::ZERO, &found);
    let v = t.view(Duration::ZERO, 0);
    let p = v.get(id(1)).unwrap();
    assert_eq!(p.addrs, vec![ip("fe80::1")]);
    assert_eq!(p.scope_ids, BTreeMap::from([(ip6("fe80::1"), 7)]));
    // What the cluster's links dial: the address with its interface.
    let dial: Vec<SocketAddr> = p.socket_addrs().collect();
    assert_eq!(dial, vec![link_local(7)]);
    assert!(matches!(dial[0], SocketAddr::V6(a) if a.scope_id() == 7));
    assert_eq!(p.socket_addr(ip("fe80::1")), link_local(7));

    // Its liveness probes dial it through the interface too.
    let later = LivenessConfig::default().probe_interval;
    let due = t.tick(later);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].addrs, vec![link_local(7)]);
    t.on_probe_result(later, id(1), Ok(found.clone()));
    let v = t.view(later, 0);
    assert_eq!(
        v.get(id(1)).unwrap().scope_ids.get(&ip6("fe80::1")),
        Some(&7)
    );
}

#[test]
fn scoped_and_plain_addresses_mix_and_stale_scopes_go() {
    let mut t = table();
    t.on_announce(Duration::ZERO, &inst(1), &rec(1, "10.0.0.1"), &[]);
    let found = ProbeOk {
        addr: link_local(3),
        ..ok(1, "10.0.0.1").unwrap()
    };
    t.on_static_found(MS, &found);
    let v = t.view(MS, 0);
    let p = v.get(id(1)).unwrap();
    assert_eq!(p.addrs, vec![ip("fe80::1"), ip("10.0.0.1")]);
    assert_eq!(
        p.socket_addrs().collect::<Vec<_>>(),
        vec![link_local(3), sa("10.0.0.1")]
    );
    // A global IPv6 address without a scope dials as before.
    assert_eq!(p.socket_addr(ip("fd00::2")), sa("fd00::2"));
    // A new announcement replaces the addresses: the scope of the one that
    // left goes with it.
    t.on_announce(2 * MS, &inst(1), &rec(1, "10.0.0.2"), &[]);
    let v = t.view(2 * MS, 0);
    let p = v.get(id(1)).unwrap();
    assert_eq!(p.addrs, vec![ip("10.0.0.2")]);
    assert!(p.scope_ids.is_empty());
}

#[test]
fn scope_ids_survive_json_and_old_documents_still_read() {
    let mut t = table();
    let found = ProbeOk {
        addr: link_local(5),
        ..ok(1, "10.0.0.1").unwrap()
    };
    t.on_static_found(Duration::ZERO, &found);
    let set = t.view(Duration::ZERO, 0);
    let json = serde_json::to_string(&set).unwrap();
    assert!(json.contains(r#""scope_ids":{"fe80::1":5}"#), "{json}");
    let back: PeerSet = serde_json::from_str(&json).unwrap();
    assert_eq!(back, set);
    assert_eq!(
        back.get(id(1)).unwrap().socket_addrs().next(),
        Some(link_local(5))
    );
    // Unscoped peers write no field, and a document without it reads.
    join(&mut t, Duration::ZERO, 2, "10.0.0.2");
    let set = t.view(Duration::ZERO, 0);
    let json = serde_json::to_value(set.get(id(2)).unwrap()).unwrap();
    assert!(json.get("scope_ids").is_none(), "{json}");
    let back: PeerView = serde_json::from_value(json).unwrap();
    assert!(back.scope_ids.is_empty());
}
