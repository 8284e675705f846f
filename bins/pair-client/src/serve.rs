//! `pair-client serve`: the node's faces and pipeline with no engine of
//! their own. Every request is routed to a node of the cluster over the
//! client's mTLS links, ranked on the client's probe of the nodes (its own
//! round trips included) by the same scheduler and failover core as a
//! node's; no node hops it again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use pair_cluster::{LocalLoad, Peers};
use pair_http::Timeouts;
use pair_http::conns::ClientDeadlines;
use pair_jobs::JobLog;
use pair_proxy::face::{self, Face};
use pair_proxy::gate::FaceGate;
use pair_proxy::state::{DEFAULT_BODY_CAP, NodeIdentity, ProxyConfig, ProxyState, now_ms};
use pair_runtime::runtime::EventLoops;
use pair_scheduler::SchedulerConfig;
use pair_sdk::Client;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where the faces listen.
#[derive(Clone, Debug)]
pub struct Faces {
    pub ollama: Option<SocketAddr>,
    pub openai: Option<SocketAddr>,
    /// Extra `Host` names the faces accept (behind a reverse proxy).
    pub allowed_hosts: Vec<String>,
}

/// Running faces.
#[derive(Debug)]
pub struct Serving {
    pub ollama: Option<SocketAddr>,
    pub openai: Option<SocketAddr>,
    pub state: Arc<ProxyState>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Serving {
    /// Stops the faces, lets answers in flight finish, then stops.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tasks.close();
        let _ =
            tokio::time::timeout(pair_http::hyper_conn::SHUTDOWN_GRACE, self.tasks.wait()).await;
        self.state.loops.shutdown(Duration::from_secs(2)).await;
    }
}

/// How often the faces take the client's latest ranking and links.
const SYNC_EVERY: Duration = Duration::from_millis(250);

/// Probes the cluster, binds the faces and serves until [`Serving::stop`].
pub async fn start(client: Client, faces: Faces, name: &str) -> Result<Serving> {
    let first = client.cluster().await.context("probing the cluster")?;
    let state_dir = client.config().state_dir.clone();
    let jobs = Arc::new(JobLog::open(&state_dir, now_ms()).context("opening the job log")?);
    let loops = EventLoops::start(2).context("starting the event loops")?;
    let peers = Peers::new();
    peers.set(client.links());
    let nofile = pair_os::open_file_cap();
    let st = ProxyState::new(
        ProxyConfig {
            node: NodeIdentity {
                id: client.id(),
                name: name.to_owned(),
            },
            scheduler: SchedulerConfig::new(client.config().policy),
            timeouts: Timeouts {
                connect: client.config().connect_timeout,
                first_byte: client.config().failover.stall_floor,
            },
            resume: pair_proxy::resume::ResumePolicy::default(),
            body_cap: DEFAULT_BODY_CAP,
            engines: Vec::new(),
            loops,
            gate: FaceGate::new(&faces.allowed_hosts),
            max_connections: pair_http::conns::cap_for_fd_limit(nofile),
            deadlines: ClientDeadlines::default(),
            body_budget: 64 << 20,
            http_stack: pair_http::client::HttpStack::default(),
            peers: Arc::clone(&peers),
            load: LocalLoad::new(),
            // No node reports for this client: its bindings stay its own.
            bindings: Arc::default(),
            queue: None,
        },
        jobs,
    );
    st.publish((*first).clone());

    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    let mut bound = (None, None);
    for (addr, face, slot) in [
        (faces.ollama, Face::Ollama, &mut bound.0),
        (faces.openai, Face::OpenAi, &mut bound.1),
    ] {
        let Some(addr) = addr else { continue };
        let listener = pair_os::bind_tcp(addr)
            .and_then(TcpListener::from_std)
            .with_context(|| format!("cannot listen on {addr}"))?;
        *slot = Some(listener.local_addr()?);
        tasks.spawn(face::serve(
            listener,
            Arc::clone(&st),
            face,
            Router::new(),
            stop.clone(),
        ));
    }
    // The faces rank on the client's latest view; a stale one is probed
    // again in the background, never on a request.
    let (sync_st, sync_stop) = (Arc::clone(&st), stop.clone());
    let ttl = client.config().cache_ttl;
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(SYNC_EVERY);
        let mut generation = first.generation;
        let mut last_round = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = sync_stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if last_round.elapsed() >= ttl {
                last_round = tokio::time::Instant::now();
                if let Err(e) = client.refresh().await {
                    tracing::warn!(error = %e, "probe round failed; keeping the last ranking");
                }
            }
            // Published every tick, changed or not: a node takes a long
            // silence for a pause of its own process.
            if let Some(cluster) = client.cached_cluster() {
                if cluster.generation != generation {
                    generation = cluster.generation;
                    peers.set(client.links());
                }
                sync_st.publish((*cluster).clone());
            }
        }
    });
    Ok(Serving {
        ollama: bound.0,
        openai: bound.1,
        state: st,
        stop,
        tasks,
    })
}
