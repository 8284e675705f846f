//! The async shell: runs the mDNS daemon (advertise + browse) on the
//! configured interfaces only, the active probes and the static peers, feeds
//! the pure [`PeerTable`], and publishes it through `tokio::sync::watch`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::time::{Duration, SystemTime};

use mdns_sd::{IfKind, IfPredicate, ServiceDaemon, ServiceEvent, ServiceInfo};
use pair_core::NodeId;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::DiscoveryError;
use crate::addrs::{
    Interfaces, advertised_addrs, is_link_local, is_virtual_interface, local_addrs,
};
use crate::config::{DiscoveryConfig, StaticPeer};
use crate::probe::probe;
use crate::table::{PeerSet, PeerTable, ProbeFailure, ProbeOk};
use crate::txt::{TxtRecord, decode_txt, encode_txt};

/// The mDNS service type of pair nodes.
pub const SERVICE_TYPE: &str = "_pair-node._tcp.local.";

/// How long shutdown waits for the mDNS daemon to send goodbyes and stop.
const DAEMON_STOP_WAIT: Duration = Duration::from_secs(2);

/// Running discovery: owns the mDNS daemon and the event-loop task.
pub struct Discovery {
    peers: watch::Receiver<PeerSet>,
    commands: mpsc::UnboundedSender<Command>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    daemon: Option<ServiceDaemon>,
    instance: Option<String>,
    advertised: Vec<IpAddr>,
}

impl Drop for Discovery {
    /// Dropped without [`Discovery::shutdown`]: stop the loop and the
    /// daemon anyway (the daemon still sends its goodbyes as it exits).
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(d) = self.daemon.take() {
            let _ = d.shutdown();
        }
    }
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("instance", &self.instance)
            .field("advertised", &self.advertised)
            .field("mdns", &self.daemon.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
enum Command {
    ExchangeFailed(NodeId),
}

impl Discovery {
    /// Starts the mDNS daemon on the chosen interfaces, announces this node
    /// (when `advertise`), browses for peers and starts probing. Stops when
    /// `cancel` fires (without waiting: call [`Discovery::shutdown`] for the
    /// goodbye).
    pub async fn start(
        config: DiscoveryConfig,
        cancel: CancellationToken,
    ) -> Result<Discovery, DiscoveryError> {
        let local = local_addrs().map_err(DiscoveryError::Interfaces)?;
        let advertised = advertised_addrs(&config.interfaces, &local);
        let mut daemon = None;
        let mut instance = None;
        let mut browse = None;
        if config.mdns {
            if config.advertise && advertised.is_empty() {
                return Err(DiscoveryError::NoAddress(config.interfaces.clone()));
            }
            let d = ServiceDaemon::new_with_port(config.mdns_port).map_err(DiscoveryError::Mdns)?;
            let setup = || -> Result<_, DiscoveryError> {
                select_interfaces(&d, &config.interfaces)?;
                let mut name = None;
                if config.advertise {
                    let info = service_info(&config, &advertised)?;
                    name = Some(info.get_fullname().to_owned());
                    d.register(info).map_err(DiscoveryError::Mdns)?;
                }
                let rx = d.browse(SERVICE_TYPE).map_err(DiscoveryError::Mdns)?;
                Ok((name, rx))
            };
            match setup() {
                Ok((name, rx)) => {
                    instance = name;
                    browse = Some(rx);
                    daemon = Some(d);
                }
                Err(err) => {
                    // The daemon thread would outlive us otherwise.
                    let _ = d.shutdown();
                    return Err(err);
                }
            }
        }
        tracing::info!(
            id = %config.node_id, interfaces = ?config.interfaces, advertised = ?advertised,
            mdns_port = config.mdns_port, static_peers = config.static_peers.len(),
            "discovery started"
        );

        let (peers_tx, peers_rx) = watch::channel(PeerSet::default());
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let cancel = cancel.child_token();
        let tracker = TaskTracker::new();
        let event_loop = EventLoop {
            table: PeerTable::new(config.node_id, config.liveness),
            config,
            started: Instant::now(),
            peers_tx,
            static_ids: Vec::new(),
            static_in_flight: Vec::new(),
        };
        tracker.spawn(event_loop.run(browse, cmd_rx, cancel.clone()));
        tracker.close();
        Ok(Discovery {
            peers: peers_rx,
            commands: cmd_tx,
            cancel,
            tracker,
            daemon,
            instance,
            advertised,
        })
    }

    /// The live peer table.
    pub fn peers(&self) -> watch::Receiver<PeerSet> {
        self.peers.clone()
    }

    /// The addresses this node advertises in TXT, best first.
    pub fn advertised_addrs(&self) -> &[IpAddr] {
        &self.advertised
    }

    /// Another component's exchange with `id` failed: probe it now.
    pub fn report_exchange_failed(&self, id: NodeId) {
        // The loop is gone only during shutdown, when nobody cares.
        let _ = self.commands.send(Command::ExchangeFailed(id));
    }

    /// Graceful stop: goodbye (TTL 0) so peers drop us at once, then stop
    /// the daemon and wait for the event loop.
    pub async fn shutdown(mut self) {
        if let (Some(d), Some(name)) = (&self.daemon, &self.instance) {
            match d.unregister(name) {
                Ok(rx) => {
                    let _ = tokio::time::timeout(DAEMON_STOP_WAIT, rx.recv_async()).await;
                }
                Err(err) => tracing::warn!(error = %err, "mDNS goodbye failed"),
            }
        }
        self.stop().await;
    }

    /// Stops without a goodbye, as a crash would: peers must notice through
    /// their probes. For tests and fault injection.
    pub async fn abort(mut self) {
        if let Some(d) = &self.daemon {
            // With no interface left, the daemon has nowhere to send goodbyes.
            let _ = d.disable_interface(IfKind::All);
        }
        self.instance = None;
        self.stop().await;
    }

    async fn stop(&mut self) {
        self.cancel.cancel();
        self.tracker.wait().await;
        if let Some(d) = self.daemon.take() {
            match d.shutdown() {
                Ok(rx) => {
                    let _ = tokio::time::timeout(DAEMON_STOP_WAIT, rx.recv_async()).await;
                }
                Err(err) => tracing::debug!(error = %err, "mDNS daemon already stopped"),
            }
        }
    }
}

/// Restricts the daemon to the configured interfaces: everything is
/// disabled first, then only the selection is enabled, so multicast never
/// touches an interface nobody chose.
fn select_interfaces(d: &ServiceDaemon, interfaces: &Interfaces) -> Result<(), DiscoveryError> {
    d.disable_interface(IfKind::All)
        .map_err(DiscoveryError::Mdns)?;
    let enable: Vec<IfKind> = match interfaces {
        Interfaces::LoopbackOnly => vec![IfKind::LoopbackV4],
        Interfaces::Named(names) => names.iter().map(|n| IfKind::Name(n.clone())).collect(),
        Interfaces::AllExceptVirtual => vec![IfKind::Predicate(IfPredicate::new(|i| {
            !i.is_loopback() && !is_virtual_interface(&i.name) && !is_link_local(i.ip())
        }))],
    };
    d.enable_interface(enable).map_err(DiscoveryError::Mdns)
}

/// The mDNS record of this node. The instance name is the node UUID, so it
/// never conflicts and survives renames; the host name carries the whole id
/// too, because two machines (or namespaces) may share a hostname and their
/// address records would otherwise merge.
fn service_info(
    config: &DiscoveryConfig,
    advertised: &[IpAddr],
) -> Result<ServiceInfo, DiscoveryError> {
    let record = TxtRecord {
        id: config.node_id,
        cluster_port: config.cluster_port,
        addrs: advertised.to_vec(),
    };
    let txt = encode_txt(&record);
    let host = format!(
        "{}-{}.local.",
        dns_label(&config.node_name),
        config.node_id.as_uuid().simple()
    );
    let mut info = ServiceInfo::new(
        SERVICE_TYPE,
        &config.node_id.to_string(),
        &host,
        advertised,
        config.cluster_port,
        txt.as_slice(),
    )
    .map_err(DiscoveryError::Mdns)?;
    // The UUID instance name cannot collide: announce at once (discovery
    // within 2 s needs it; probing would add ~750 ms).
    info.set_requires_probe(false);
    Ok(info)
}

/// `name` reduced to a DNS label: lowercase letters, digits and dashes.
fn dns_label(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(20)
        .collect();
    s = s.trim_matches('-').to_owned();
    if s.is_empty() { "pair".to_owned() } else { s }
}

fn epoch_ms() -> u64 {
    pair_core::unix_ms(SystemTime::now())
}

enum ProbeDone {
    Peer(NodeId, Result<ProbeOk, ProbeFailure>),
    Static(usize, Option<ProbeOk>),
}

struct EventLoop {
    config: DiscoveryConfig,
    table: PeerTable,
    started: Instant,
    peers_tx: watch::Sender<PeerSet>,
    static_ids: Vec<Option<NodeId>>,
    static_in_flight: Vec<bool>,
}

impl EventLoop {
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    async fn run(
        mut self,
        browse: Option<mdns_sd::Receiver<ServiceEvent>>,
        mut commands: mpsc::UnboundedReceiver<Command>,
        cancel: CancellationToken,
    ) {
        let mut probes: JoinSet<ProbeDone> = JoinSet::new();
        let mut tick = tokio::time::interval(self.config.tick.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut static_tick =
            tokio::time::interval(self.config.static_interval.max(Duration::from_millis(100)));
        static_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.static_ids = vec![None; self.config.static_peers.len()];
        self.static_in_flight = vec![false; self.config.static_peers.len()];
        let mut browsing = browse.is_some();
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                ev = recv_event(browse.as_ref()), if browsing => match ev {
                    Some(ev) => self.on_mdns(ev),
                    None => {
                        tracing::warn!("mDNS browse channel closed; continuing with probes only");
                        browsing = false;
                    }
                },
                Some(done) = probes.join_next(), if !probes.is_empty() => match done {
                    Ok(done) => self.on_probe_done(done),
                    Err(err) => tracing::warn!(error = %err, "probe task failed"),
                },
                _ = tick.tick() => {}
                _ = static_tick.tick() => self.probe_static_peers(&mut probes),
                Some(cmd) = commands.recv() => match cmd {
                    Command::ExchangeFailed(id) => self.table.on_exchange_failed(self.now(), id),
                },
            }
            // After every event, not only on ticks: a fresh announcement or
            // a failed exchange is probed at once.
            self.start_due_probes(&mut probes);
            self.publish();
        }
        probes.shutdown().await;
    }

    fn start_due_probes(&mut self, probes: &mut JoinSet<ProbeDone>) {
        let timeout = self.config.probe_timeout;
        for req in self.table.tick(self.now()) {
            probes.spawn(async move {
                let result = match probe(&req.addrs, timeout).await {
                    Ok(ok) if ok.id == req.id => Ok(ok),
                    Ok(ok) => Err(ProbeFailure::WrongIdentity(ok.id)),
                    Err(err) => {
                        tracing::debug!(peer = %req.id, error = %err, "probe failed");
                        Err(ProbeFailure::Unreachable)
                    }
                };
                ProbeDone::Peer(req.id, result)
            });
        }
    }

    fn publish(&mut self) {
        let view = self.table.view(self.now(), epoch_ms());
        self.peers_tx.send_if_modified(|cur| {
            // Only last-seen stamps moved: not worth waking every reader.
            let changed = cur.own_network_suspect != view.own_network_suspect
                || cur.peers.len() != view.peers.len()
                || cur.peers.iter().zip(&view.peers).any(|(a, b)| {
                    a.id != b.id
                        || a.state != b.state
                        || a.addrs != b.addrs
                        || a.scope_ids != b.scope_ids
                        || a.cluster_port != b.cluster_port
                        || a.name != b.name
                        || a.rtt_us != b.rtt_us
                        || a.via_mdns != b.via_mdns
                        || a.via_static != b.via_static
                        || a.info != b.info
                });
            if changed {
                *cur = view;
            }
            changed
        });
    }

    fn on_mdns(&mut self, ev: ServiceEvent) {
        let now = self.now();
        match ev {
            ServiceEvent::ServiceResolved(svc) => {
                let entries = svc.txt_properties.iter().map(|p| (p.key(), p.val()));
                match decode_txt(entries) {
                    Ok(record) => {
                        let resolved: Vec<IpAddr> =
                            svc.addresses.iter().map(|a| a.to_ip_addr()).collect();
                        tracing::debug!(peer = %record.id, instance = %svc.fullname, "mDNS resolved");
                        self.table
                            .on_announce(now, &svc.fullname, &record, &resolved);
                    }
                    Err(err) => {
                        tracing::debug!(instance = %svc.fullname, error = %err, "ignoring malformed TXT")
                    }
                }
            }
            ServiceEvent::ServiceRemoved(_, fullname) => {
                if let Some(id) = self.table.on_goodbye(now, &fullname) {
                    tracing::info!(peer = %id, "peer said goodbye");
                }
            }
            _ => {}
        }
    }

    fn on_probe_done(&mut self, done: ProbeDone) {
        let now = self.now();
        match done {
            ProbeDone::Peer(id, result) => self.table.on_probe_result(now, id, result),
            ProbeDone::Static(i, found) => {
                if let Some(flag) = self.static_in_flight.get_mut(i) {
                    *flag = false;
                }
                if let Some(ok) = found {
                    if let Some(slot) = self.static_ids.get_mut(i) {
                        *slot = Some(ok.id);
                    }
                    self.table.on_static_found(now, &ok);
                }
            }
        }
    }

    /// Static peer addresses whose node is unknown or evicted are probed
    /// (resolving the host name each time: DHCP may have moved it). A
    /// zone's scope id rides along into the probe and the table.
    fn probe_static_peers(&mut self, probes: &mut JoinSet<ProbeDone>) {
        for (i, target) in self.config.static_peers.iter().enumerate() {
            let known_live = self.static_ids[i].is_some_and(|id| self.table.is_routable(id));
            if known_live || self.static_in_flight[i] {
                continue;
            }
            self.static_in_flight[i] = true;
            let target: StaticPeer = target.clone();
            let timeout = self.config.probe_timeout;
            probes.spawn(async move {
                let addrs = match resolve_static(&target).await {
                    Ok(addrs) => addrs,
                    Err(err) => {
                        tracing::debug!(peer = %target, error = %err, "static peer did not resolve");
                        return ProbeDone::Static(i, None);
                    }
                };
                match probe(&addrs, timeout).await {
                    Ok(ok) => ProbeDone::Static(i, Some(ok)),
                    Err(err) => {
                        tracing::debug!(peer = %target, error = %err, "static peer probe failed");
                        ProbeDone::Static(i, None)
                    }
                }
            });
        }
    }
}

/// The addresses of a static peer. An IPv6 literal with a zone is that
/// address with the zone's interface index as its scope id (std's parser
/// has no zones; the C library's takes an interface name on a link-local
/// address only); anything else goes to the system resolver.
async fn resolve_static(target: &StaticPeer) -> std::io::Result<Vec<SocketAddr>> {
    if let Some((ip, zone)) = target.host.split_once('%')
        && let Ok(ip) = ip.parse::<Ipv6Addr>()
    {
        let scope_id = match zone.parse::<u32>() {
            Ok(index) => index,
            Err(_) => interface_index(zone).await?,
        };
        let addr = SocketAddrV6::new(ip, target.port, 0, scope_id);
        return Ok(vec![SocketAddr::V6(addr)]);
    }
    let addrs = tokio::net::lookup_host((target.host.as_str(), target.port)).await?;
    Ok(addrs.collect())
}

/// The index of the interface named `name`. std has no `if_nametoindex`
/// and `unsafe` is forbidden here, so the C library's parser of a zoned
/// link-local literal looks it up; the literal is numeric and the name
/// checked by [`StaticPeer`]'s parser, so nothing reaches DNS.
async fn interface_index(name: &str) -> std::io::Result<u32> {
    tokio::net::lookup_host((format!("fe80::1%{name}"), 0))
        .await?
        .find_map(|a| match a {
            SocketAddr::V6(v6) if v6.scope_id() != 0 => Some(v6.scope_id()),
            _ => None,
        })
        .ok_or_else(|| std::io::ErrorKind::NotFound.into())
}

async fn recv_event(rx: Option<&mdns_sd::Receiver<ServiceEvent>>) -> Option<ServiceEvent> {
    match rx {
        Some(rx) => rx.recv_async().await.ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::PeerView;

    #[test]
    fn dns_labels_are_safe() {
        assert_eq!(dns_label("My Box_1"), "my-box-1");
        assert_eq!(dns_label("..."), "pair");
        assert_eq!(dns_label(&"x".repeat(100)).len(), 20);
    }

    fn scope_of(addr: SocketAddr) -> u32 {
        match addr {
            SocketAddr::V6(a) => a.scope_id(),
            SocketAddr::V4(_) => panic!("{addr}: not IPv6"),
        }
    }

    /// The index `if-addrs` gives the interface named `name`.
    fn index_of(name: &str) -> Option<u32> {
        if_addrs::get_if_addrs()
            .ok()?
            .into_iter()
            .find(|i| i.name == name)
            .and_then(|i| i.index)
    }

    #[tokio::test]
    async fn zoned_static_peers_resolve_to_their_scope_id() {
        let peer = |s: &str| s.parse::<StaticPeer>().unwrap();
        let addrs = resolve_static(&peer("[fe80::1%5]:9")).await.unwrap();
        assert_eq!(addrs, vec!["[fe80::1%5]:9".parse::<SocketAddr>().unwrap()]);
        assert_eq!(scope_of(addrs[0]), 5);
        let addrs = resolve_static(&peer("[fd00::2]:9")).await.unwrap();
        assert_eq!(addrs, vec!["[fd00::2]:9".parse::<SocketAddr>().unwrap()]);
        // An interface name becomes its index, on any IPv6 address.
        if let Some(lo) = index_of("lo") {
            for p in ["[fe80::1%lo]:9", "[::1%lo]:9"] {
                let addrs = resolve_static(&peer(p)).await.unwrap();
                assert_eq!(
                    addrs.iter().map(|a| scope_of(*a)).collect::<Vec<_>>(),
                    [lo],
                    "{p}"
                );
            }
        }
        assert!(
            resolve_static(&peer("[fe80::1%nosuchif0]:9"))
                .await
                .is_err()
        );
    }

    /// Serves node info (`id`, named "far") on `listener` until dropped.
    fn serve_node_info(
        listener: tokio::net::TcpListener,
        id: NodeId,
    ) -> tokio::task::JoinHandle<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tokio::spawn(async move {
            let body = serde_json::json!({ "id": id, "name": "far" }).to_string();
            while let Ok((mut conn, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(resp.as_bytes()).await;
                });
            }
        })
    }

    /// Runs discovery with `peer` (written with `{port}` for the port
    /// `bind` got) as its only static peer, and returns what it found.
    async fn found_through_static_probe(bind: SocketAddr, peer: &str) -> Option<PeerView> {
        let listener = match tokio::net::TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(err) => {
                eprintln!("skipped: cannot listen on {bind}: {err}");
                return None;
            }
        };
        let port = listener.local_addr().unwrap().port();
        let far = NodeId::from_u128(0xfa2);
        let server = serve_node_info(listener, far);
        let mut config =
            DiscoveryConfig::new(NodeId::from_u128(1), "near", 1, Interfaces::LoopbackOnly);
        config.mdns = false;
        config.advertise = false;
        config.static_interval = Duration::from_millis(100);
        config.probe_timeout = Duration::from_secs(2);
        config.static_peers = vec![peer.replace("{port}", &port.to_string()).parse().unwrap()];
        let discovery = Discovery::start(config, CancellationToken::new())
            .await
            .unwrap();
        let mut peers = discovery.peers();
        let found = tokio::time::timeout(
            Duration::from_secs(10),
            peers.wait_for(|s| {
                s.get(far)
                    .is_some_and(|p| p.state == crate::PeerState::Alive)
            }),
        )
        .await
        .expect("the static peer was not found in time")
        .unwrap()
        .get(far)
        .cloned();
        discovery.shutdown().await;
        server.abort();
        found
    }

    #[tokio::test]
    async fn a_zoned_static_peer_is_probed_and_dialled_through_its_interface() {
        // Loopback takes (and ignores) a scope id: the test is that the
        // zone makes it through the probe into the entry.
        let Some(lo) = index_of("lo") else {
            eprintln!("skipped: no interface named lo");
            return;
        };
        let bind: SocketAddr = "[::1]:0".parse().unwrap();
        let Some(p) = found_through_static_probe(bind, &format!("[::1%{lo}]:{{port}}")).await
        else {
            return;
        };
        assert!(p.via_static);
        assert_eq!(p.addrs, vec![IpAddr::from(Ipv6Addr::LOCALHOST)]);
        let dial = p.socket_addrs().next().unwrap();
        assert_eq!((dial.ip(), scope_of(dial)), (p.addrs[0], lo));
        // By name, as people write it.
        let p = found_through_static_probe(bind, "[::1%lo]:{port}")
            .await
            .unwrap();
        assert_eq!(scope_of(p.socket_addrs().next().unwrap()), lo);
    }

    #[tokio::test]
    async fn a_link_local_static_peer_is_reached_on_its_link() {
        // A real link-local address needs its scope id to be dialled at all
        // (connect fails without one). Only where some interface has one.
        let link_local = if_addrs::get_if_addrs().ok().and_then(|ifs| {
            ifs.into_iter().find_map(|i| match (i.ip(), i.index) {
                (IpAddr::V6(ip), Some(index)) if crate::addrs::is_link_local(IpAddr::V6(ip)) => {
                    Some((ip, index, i.name))
                }
                _ => None,
            })
        });
        let Some((ip, index, name)) = link_local else {
            eprintln!("skipped: no link-local IPv6 address here");
            return;
        };
        let bind = SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, index));
        let Some(p) = found_through_static_probe(bind, &format!("[{ip}%{name}]:{{port}}")).await
        else {
            return;
        };
        assert_eq!(p.addrs, vec![IpAddr::V6(ip)]);
        assert_eq!(scope_of(p.socket_addrs().next().unwrap()), index);
    }
}
