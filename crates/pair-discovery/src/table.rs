//! The peer table and its liveness state machine: a pure core.
//!
//! Keyed by node UUID, never by hostname or address. Time comes in as `now`
//! (a monotonic [`Duration`] since the shell started), so every transition is
//! tested without a clock. The shell feeds it mDNS records, goodbyes and
//! probe results and asks [`PeerTable::tick`] which probes to run.
//!
//! Liveness (PAIR waits 3 missed 5 s scans before probing and ~60 s before
//! evicting; we probe continuously so crashes and hangs are caught in
//! seconds):
//! - a newly announced UUID is `Unverified` and not routable until one probe
//!   returns that UUID from node info (so a new UUID at an old address is a
//!   new peer only after an identity check);
//! - verified peers are probed every `probe_interval`; one failed probe makes
//!   a peer `Suspect` (still routable, ranked last), and `evict_min_failures`
//!   failures with no success for `evict_after` make it `Dead` (out of the
//!   routing set);
//! - a goodbye (TTL 0) removes a peer at once;
//! - if every verified peer (two or more) is failing at the moment one would
//!   be evicted, our own network is the likelier culprit: evictions wait for
//!   `outage_grace` or for any probe to succeed.
//!
//! Addresses are `IpAddr`, which has no room for an IPv6 scope id, so each
//! peer keeps the scope id (interface index) of its scoped IPv6 addresses
//! beside them: a link-local static peer (`[fe80::1%eth0]:port`) is only
//! reachable through its interface, and every dial (probes, the cluster's
//! links through [`PeerView::socket_addrs`]) gets it back.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::Duration;

use pair_core::{Liveness, NodeId, NodeInfo};
use serde::{Deserialize, Serialize};

use crate::txt::TxtRecord;

/// Timings of the liveness machine. Defaults meet the targets: a new node is
/// verified one probe round trip after its announcement arrives (well under
/// 2 s) and a killed node is out of the routing set 2.0-2.5 s after it died.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LivenessConfig {
    /// Period of the active probe of each verified peer.
    pub probe_interval: Duration,
    /// Consecutive failures that make a peer suspect.
    pub suspect_after: u32,
    /// Time without a successful probe before eviction...
    pub evict_after: Duration,
    /// ...and the consecutive failures it also needs.
    pub evict_min_failures: u32,
    /// Period of the probe of dead (evicted) peers, to notice them back.
    pub dead_probe_interval: Duration,
    /// Dead or never-verified mDNS peers are dropped from the table after
    /// this long without a sign of life. Static peers are never dropped.
    pub forget_after: Duration,
    /// How long evictions wait when every peer fails at once.
    pub outage_grace: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            probe_interval: Duration::from_millis(500),
            suspect_after: 1,
            evict_after: Duration::from_secs(2),
            evict_min_failures: 3,
            dead_probe_interval: Duration::from_secs(5),
            forget_after: Duration::from_secs(600),
            outage_grace: Duration::from_secs(10),
        }
    }
}

/// Where a peer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// Announced, identity not yet confirmed by a probe: not routable.
    Unverified,
    Alive,
    /// Failing probes; still routable, ranked last.
    Suspect,
    /// Evicted: not routable; re-probed slowly in case it comes back.
    Dead,
}

impl PeerState {
    /// The routing view: unverified peers are not routable either.
    pub fn liveness(self) -> Liveness {
        match self {
            PeerState::Alive => Liveness::Alive,
            PeerState::Suspect => Liveness::Suspect,
            PeerState::Unverified | PeerState::Dead => Liveness::Dead,
        }
    }
}

/// What a successful probe learned.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeOk {
    /// The UUID node info answered with.
    pub id: NodeId,
    /// The node's display name from node info.
    pub name: String,
    /// The address that answered, with its scope id when it had one.
    pub addr: SocketAddr,
    /// `addr`'s port: the peer's cluster port.
    pub port: u16,
    /// TCP connect time, microseconds.
    pub rtt_us: u32,
    /// The whole node-info document, when it parsed (the peer's telemetry:
    /// pressure, GPUs, free VRAM), so nobody needs to poll it again.
    pub info: Option<Box<NodeInfo>>,
}

/// Why a probe failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeFailure {
    /// No TCP connection or no valid answer within the timeout.
    Unreachable,
    /// Something answered, but with another identity.
    WrongIdentity(NodeId),
}

/// A probe the shell should run now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRequest {
    pub id: NodeId,
    /// Addresses to try, best first: the peer's addresses on `port`, each
    /// scoped IPv6 one with its scope id.
    pub addrs: Vec<SocketAddr>,
    /// The peer's cluster port.
    pub port: u16,
}

/// One peer as published to the rest of the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerView {
    pub id: NodeId,
    /// Display name from node info (`None` until verified).
    pub name: Option<String>,
    /// Best first; the address that last answered a probe leads. Dial
    /// [`PeerView::socket_addrs`], which adds the scope ids.
    pub addrs: Vec<IpAddr>,
    /// The scope id (interface index) of each IPv6 address in `addrs` that
    /// has one: a link-local address is ambiguous without it. Only static
    /// peers given with a zone (`[fe80::1%eth0]:port`) have any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scope_ids: BTreeMap<Ipv6Addr, u32>,
    pub cluster_port: u16,
    pub state: PeerState,
    /// Routing view of `state` (unverified counts as not routable).
    pub liveness: Liveness,
    /// Last sign of life (announcement or successful probe), ms since the
    /// Unix epoch.
    pub last_seen_ms: u64,
    /// TCP connect time of the last successful probe, microseconds.
    pub rtt_us: Option<u32>,
    pub via_mdns: bool,
    pub via_static: bool,
    /// The peer's node-info document from the last successful probe (at
    /// most one probe period old while the peer is alive). Its
    /// `taken_at_ms` is on the peer's clock.
    pub info: Option<Box<NodeInfo>>,
}

impl PeerView {
    /// `ip` on the peer's cluster port, with its scope id when it has one.
    pub fn socket_addr(&self, ip: IpAddr) -> SocketAddr {
        scoped(ip, self.cluster_port, &self.scope_ids)
    }

    /// The addresses to dial, best first: [`PeerView::addrs`] on the
    /// cluster port, scoped where they need it.
    pub fn socket_addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.addrs.iter().map(|ip| self.socket_addr(*ip))
    }
}

/// `ip` on `port`, with the scope id `scope_ids` has for it.
fn scoped(ip: IpAddr, port: u16, scope_ids: &BTreeMap<Ipv6Addr, u32>) -> SocketAddr {
    match ip {
        IpAddr::V6(v6) => {
            let scope_id = scope_ids.get(&v6).copied().unwrap_or(0);
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope_id))
        }
        IpAddr::V4(_) => SocketAddr::new(ip, port),
    }
}

/// The published table: every known peer, sorted by id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerSet {
    /// Increases with every publication.
    pub generation: u64,
    /// Every verified peer is failing at once: we suspect our own network
    /// and hold evictions.
    pub own_network_suspect: bool,
    pub peers: Vec<PeerView>,
}

impl PeerSet {
    pub fn get(&self, id: NodeId) -> Option<&PeerView> {
        self.peers
            .binary_search_by_key(&id, |p| p.id)
            .ok()
            .map(|i| &self.peers[i])
    }
    /// Peers that may be routed to (alive or suspect).
    pub fn routable(&self) -> impl Iterator<Item = &PeerView> {
        self.peers.iter().filter(|p| p.liveness.is_routable())
    }
}

#[derive(Clone, Debug)]
struct Peer {
    name: Option<String>,
    addrs: Vec<IpAddr>,
    /// Scope ids of the IPv6 addresses in `addrs` that have one.
    scope_ids: BTreeMap<Ipv6Addr, u32>,
    port: u16,
    state: PeerState,
    /// mDNS instance name, when announced (goodbyes name the instance).
    instance: Option<String>,
    via_static: bool,
    last_seen: Duration,
    last_ok: Option<Duration>,
    failures: u32,
    rtt_us: Option<u32>,
    info: Option<Box<NodeInfo>>,
    in_flight: bool,
    /// When the probe in flight (or the last one) was handed out: the next
    /// is due one period after it started, so a timeout does not stretch
    /// the period.
    probe_started: Duration,
    next_probe: Duration,
}

impl Peer {
    fn socket_addrs(&self) -> Vec<SocketAddr> {
        self.addrs
            .iter()
            .map(|ip| scoped(*ip, self.port, &self.scope_ids))
            .collect()
    }

    /// Drops the scope ids of addresses no longer in `addrs`.
    fn forget_stale_scopes(&mut self) {
        let addrs = &self.addrs;
        self.scope_ids
            .retain(|ip, _| addrs.contains(&IpAddr::V6(*ip)));
    }
}

/// The peer table of one node.
#[derive(Clone, Debug)]
pub struct PeerTable {
    me: NodeId,
    config: LivenessConfig,
    peers: BTreeMap<NodeId, Peer>,
    outage_since: Option<Duration>,
    generation: u64,
}

impl PeerTable {
    pub fn new(me: NodeId, config: LivenessConfig) -> Self {
        Self {
            me,
            config,
            peers: BTreeMap::new(),
            outage_since: None,
            generation: 0,
        }
    }

    /// An mDNS announcement resolved to `record` under `instance`.
    /// The ranked TXT addresses are authoritative; `resolved` (the A/AAAA
    /// records that came with it) are used only when TXT lists none.
    pub fn on_announce(
        &mut self,
        now: Duration,
        instance: &str,
        record: &TxtRecord,
        resolved: &[IpAddr],
    ) {
        if record.id == self.me {
            return;
        }
        let addrs = if record.addrs.is_empty() {
            resolved.to_vec()
        } else {
            record.addrs.clone()
        };
        // Another UUID announced under this instance name before: that entry
        // no longer owns the instance (a host re-installed with a new UUID).
        for (id, p) in self.peers.iter_mut() {
            if *id != record.id && p.instance.as_deref() == Some(instance) {
                p.instance = None;
            }
        }
        let peer = self.peers.entry(record.id).or_insert_with(|| Peer {
            name: None,
            addrs: Vec::new(),
            scope_ids: BTreeMap::new(),
            port: record.cluster_port,
            state: PeerState::Unverified,
            instance: None,
            via_static: false,
            last_seen: now,
            last_ok: None,
            failures: 0,
            rtt_us: None,
            info: None,
            in_flight: false,
            probe_started: now,
            next_probe: now,
        });
        peer.instance = Some(instance.to_owned());
        peer.port = record.cluster_port;
        if !addrs.is_empty() {
            peer.addrs = addrs;
            peer.forget_stale_scopes();
        }
        peer.last_seen = now;
        // A fresh announcement from a failing or evicted peer (say, it
        // restarted): check it now instead of at the next slow probe.
        if peer.state != PeerState::Alive {
            peer.next_probe = now;
        }
    }

    /// An mDNS goodbye (TTL 0) or expiry for `instance`: the peer leaves at
    /// once. Static peers stay known, as dead, and keep being probed.
    pub fn on_goodbye(&mut self, now: Duration, instance: &str) -> Option<NodeId> {
        let id = self
            .peers
            .iter()
            .find(|(_, p)| p.instance.as_deref() == Some(instance))
            .map(|(id, _)| *id)?;
        let remove = match self.peers.get_mut(&id) {
            Some(p) if p.via_static => {
                p.instance = None;
                p.state = PeerState::Dead;
                p.next_probe = now + self.config.dead_probe_interval;
                false
            }
            Some(_) => true,
            None => false,
        };
        if remove {
            self.peers.remove(&id);
        }
        Some(id)
    }

    /// A probe of a static peer address answered with `ok`: the peer joins
    /// (or is merged into) the table, verified.
    pub fn on_static_found(&mut self, now: Duration, ok: &ProbeOk) {
        if ok.id == self.me {
            return;
        }
        let peer = self.peers.entry(ok.id).or_insert_with(|| Peer {
            name: None,
            addrs: Vec::new(),
            scope_ids: BTreeMap::new(),
            port: ok.port,
            state: PeerState::Unverified,
            instance: None,
            via_static: true,
            last_seen: now,
            last_ok: None,
            failures: 0,
            rtt_us: None,
            info: None,
            in_flight: false,
            probe_started: now,
            next_probe: now,
        });
        peer.via_static = true;
        let ip = ok.addr.ip();
        if peer.port == ok.port && !peer.addrs.contains(&ip) {
            peer.addrs.push(ip);
        }
        if peer.addrs.is_empty() || peer.port != ok.port {
            // The static address is the only one we know that works.
            peer.addrs = vec![ip];
            peer.port = ok.port;
            peer.forget_stale_scopes();
        }
        // (`apply_ok` records the scope id of the address that answered.)
        let in_flight = peer.in_flight;
        self.apply_ok(now, ok);
        if let Some(p) = self.peers.get_mut(&ok.id) {
            p.in_flight = in_flight;
        }
    }

    /// The result of a probe started from a [`ProbeRequest`] for `id`.
    pub fn on_probe_result(
        &mut self,
        now: Duration,
        id: NodeId,
        result: Result<ProbeOk, ProbeFailure>,
    ) {
        let Some(peer) = self.peers.get_mut(&id) else {
            return; // removed meanwhile (goodbye)
        };
        peer.in_flight = false;
        if let Ok(ok) = &result
            && ok.id == id
        {
            self.apply_ok(now, ok);
            // Any success means our network works.
            self.outage_since = None;
            return;
        }
        let (suspect_after, interval, dead_interval) = (
            self.config.suspect_after,
            self.config.probe_interval,
            self.config.dead_probe_interval,
        );
        if let Some(peer) = self.peers.get_mut(&id) {
            peer.failures = peer.failures.saturating_add(1);
            if peer.state == PeerState::Alive && peer.failures >= suspect_after {
                peer.state = PeerState::Suspect;
            }
            peer.next_probe = peer.probe_started
                + if peer.state == PeerState::Dead {
                    dead_interval
                } else {
                    interval
                };
        }
    }

    /// Something else (a relayed request, a workload exchange) failed
    /// against `id`: probe it at once rather than at the next period.
    pub fn on_exchange_failed(&mut self, now: Duration, id: NodeId) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.next_probe = p.next_probe.min(now);
        }
    }

    /// Advances time: applies evictions and forgets, and returns the probes
    /// due now (each is marked in flight until its result comes back).
    pub fn tick(&mut self, now: Duration) -> Vec<ProbeRequest> {
        self.evict(now);
        let forget = self.config.forget_after;
        self.peers.retain(|_, p| {
            p.via_static
                || !matches!(p.state, PeerState::Dead | PeerState::Unverified)
                || now.saturating_sub(p.last_seen) < forget
        });
        let mut due = Vec::new();
        for (id, p) in self.peers.iter_mut() {
            if !p.in_flight && p.next_probe <= now && !p.addrs.is_empty() {
                p.in_flight = true;
                p.probe_started = now;
                due.push(ProbeRequest {
                    id: *id,
                    addrs: p.socket_addrs(),
                    port: p.port,
                });
            }
        }
        due
    }

    /// Whether `id` is known and verified alive or suspect.
    pub fn is_routable(&self, id: NodeId) -> bool {
        self.peers
            .get(&id)
            .is_some_and(|p| p.state.liveness().is_routable())
    }

    pub fn state(&self, id: NodeId) -> Option<PeerState> {
        self.peers.get(&id).map(|p| p.state)
    }

    pub fn own_network_suspect(&self) -> bool {
        self.outage_since.is_some()
    }

    /// The published view. `now` and `now_epoch_ms` are the same instant on
    /// the monotonic and the wall clock.
    pub fn view(&mut self, now: Duration, now_epoch_ms: u64) -> PeerSet {
        self.generation += 1;
        PeerSet {
            generation: self.generation,
            own_network_suspect: self.outage_since.is_some(),
            peers: self
                .peers
                .iter()
                .map(|(id, p)| {
                    let ago = u64::try_from(now.saturating_sub(p.last_seen).as_millis())
                        .unwrap_or(u64::MAX);
                    PeerView {
                        id: *id,
                        name: p.name.clone(),
                        addrs: p.addrs.clone(),
                        scope_ids: p.scope_ids.clone(),
                        cluster_port: p.port,
                        state: p.state,
                        liveness: p.state.liveness(),
                        last_seen_ms: now_epoch_ms.saturating_sub(ago),
                        rtt_us: p.rtt_us,
                        via_mdns: p.instance.is_some(),
                        via_static: p.via_static,
                        info: p.info.clone(),
                    }
                })
                .collect(),
        }
    }

    fn apply_ok(&mut self, now: Duration, ok: &ProbeOk) {
        let interval = self.config.probe_interval;
        let Some(peer) = self.peers.get_mut(&ok.id) else {
            return;
        };
        peer.state = PeerState::Alive;
        peer.failures = 0;
        peer.last_ok = Some(now);
        peer.last_seen = now;
        peer.rtt_us = Some(ok.rtt_us);
        peer.name = Some(ok.name.clone());
        if ok.info.is_some() {
            peer.info = ok.info.clone();
        }
        // The address that answered goes first (PAIR ranks addresses a peer
        // actually reached first too), with the scope id it answered on.
        if let Some(i) = peer.addrs.iter().position(|a| *a == ok.addr.ip()) {
            let a = peer.addrs.remove(i);
            peer.addrs.insert(0, a);
            if let SocketAddr::V6(v6) = ok.addr {
                match v6.scope_id() {
                    0 => peer.scope_ids.remove(v6.ip()),
                    scope_id => peer.scope_ids.insert(*v6.ip(), scope_id),
                };
            }
        }
        peer.next_probe = peer.probe_started.max(now.saturating_sub(interval)) + interval;
    }

    fn evict(&mut self, now: Duration) {
        let cfg = self.config;
        let evictable = |p: &Peer| {
            matches!(p.state, PeerState::Alive | PeerState::Suspect)
                && p.failures >= cfg.evict_min_failures
                && p.last_ok
                    .is_none_or(|t| now.saturating_sub(t) >= cfg.evict_after)
        };
        let verified: Vec<&Peer> = self
            .peers
            .values()
            .filter(|p| matches!(p.state, PeerState::Alive | PeerState::Suspect))
            .collect();
        let any_evictable = verified.iter().any(|p| evictable(p));
        if !any_evictable {
            return;
        }
        let all_failing = verified.len() >= 2 && verified.iter().all(|p| p.failures > 0);
        if all_failing {
            let since = *self.outage_since.get_or_insert(now);
            if now.saturating_sub(since) < cfg.outage_grace {
                return;
            }
        }
        for p in self.peers.values_mut() {
            if evictable(p) {
                p.state = PeerState::Dead;
                p.next_probe = now + cfg.dead_probe_interval;
            }
        }
        if !self
            .peers
            .values()
            .any(|p| matches!(p.state, PeerState::Alive | PeerState::Suspect))
        {
            self.outage_since = None;
        }
    }
}

#[cfg(test)]
mod tests;
