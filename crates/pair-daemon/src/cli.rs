//! The CLI's client side: `pair-node status | peers | jobs | unpair | pair`
//! talk to the running local daemon through its loopback control API.

use anyhow::{Context, Result, bail};
use pair_core::JobRecord;
use pair_identity::ControlToken;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::control::{self, Invite, JoinRequest, Joined, PeerRow, Status, UnpairRequest};

/// A client of the local daemon's control API.
#[derive(Debug, Clone)]
pub struct ControlClient {
    base: String,
    http: reqwest::Client,
    /// The owner's token, for the calls that change the node.
    token: Option<ControlToken>,
}

impl ControlClient {
    /// `base` is a face URL, e.g. `http://127.0.0.1:11434`.
    pub fn new(base: &str) -> Result<Self> {
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .no_proxy()
                .timeout(std::time::Duration::from_secs(30))
                .build()?,
            token: None,
        })
    }

    /// Sends `token` with the calls that change the node (invite, join,
    /// unpair).
    #[must_use]
    pub fn with_token(mut self, token: ControlToken) -> Self {
        self.token = Some(token);
        self
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .with_context(|| format!("is pair-node running at {}?", self.base))?;
        decode(resp).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T> {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(body);
        if let Some(t) = &self.token {
            req = req.header(reqwest::header::AUTHORIZATION, t.bearer());
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("is pair-node running at {}?", self.base))?;
        decode(resp).await
    }

    pub async fn status(&self) -> Result<Status> {
        self.get(control::STATUS).await
    }
    pub async fn peers(&self) -> Result<Vec<PeerRow>> {
        self.get(control::PEERS).await
    }
    pub async fn jobs(&self, limit: usize) -> Result<Vec<JobRecord>> {
        self.get(&format!("{}?limit={limit}", control::JOBS)).await
    }
    pub async fn invite(&self) -> Result<Invite> {
        self.post(control::INVITE, &serde_json::json!({})).await
    }
    pub async fn join(&self, addr: &str, pin: &str) -> Result<Joined> {
        self.post(
            control::JOIN,
            &JoinRequest {
                addr: addr.to_owned(),
                pin: pin.to_owned(),
            },
        )
        .await
    }
    pub async fn add_key(&self, key: &control::NewKey) -> Result<control::MadeKey> {
        self.post(control::KEYS, key).await
    }
    pub async fn keys(&self) -> Result<Vec<control::KeyRow>> {
        self.get(control::KEYS).await
    }
    pub async fn revoke_key(&self, name: &str) -> Result<Vec<control::KeyRow>> {
        self.post(
            control::KEYS_REVOKE,
            &control::RevokeKey {
                name: name.to_owned(),
            },
        )
        .await
    }
    pub async fn unpair(&self, node: &str) -> Result<Value> {
        self.post(
            control::UNPAIR,
            &UnpairRequest {
                node: node.to_owned(),
            },
        )
        .await
    }
}

async fn decode<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T> {
    let status = resp.status();
    let bytes = resp.bytes().await?;
    if !status.is_success() {
        let msg = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        bail!("{msg} (HTTP {status})");
    }
    serde_json::from_slice(&bytes).context("unexpected answer from pair-node")
}

/// Human tables for the listings (`--json` prints the raw documents).
pub fn print_peers(rows: &[PeerRow]) {
    if rows.is_empty() {
        println!("no paired peers (pair one: pair-node pair invite / pair-node pair join)");
        return;
    }
    println!(
        "{:<24} {:<10} {:<8} {:<22} {:>7} {:>4} {:>8}  models",
        "name", "id", "role", "address", "state", "pend", "rtt"
    );
    for r in rows {
        println!(
            "{:<24} {:<10} {:<8} {:<22} {:>7} {:>4} {:>6.1}ms  {}",
            r.name,
            r.id.short(),
            match r.vouched_by {
                Some(_) => format!("{:?}*", r.role).to_lowercase(),
                None => format!("{:?}", r.role).to_lowercase(),
            },
            r.addr.as_deref().unwrap_or("-"),
            r.liveness,
            r.pending,
            f64::from(r.rtt_us) / 1000.0,
            r.models.join(", ")
        );
    }
    if rows.iter().any(|r| r.vouched_by.is_some()) {
        println!("* paired on another node of the cluster, which vouches for it");
    }
}

pub fn print_jobs(jobs: &[JobRecord]) {
    println!(
        "{:<10} {:<22} {:<22} {:<10} {:<10} {:>3} {:<10} {:>8} {:>8}",
        "job", "model", "route", "sent to", "ran on", "try", "status", "ttft", "total"
    );
    for j in jobs {
        println!(
            "{:<10} {:<22} {:<22} {:<10} {:<10} {:>3} {:<10} {:>6}ms {:>6}ms",
            &j.id.to_string()[..8],
            j.model,
            j.route,
            j.origin.short(),
            j.ran_on.map_or_else(|| "-".to_owned(), |n| n.short()),
            j.attempts,
            format!("{:?}", j.status).to_lowercase(),
            j.ttft_ms.map_or_else(|| "-".to_owned(), |v| v.to_string()),
            j.duration_ms
                .map_or_else(|| "-".to_owned(), |v| v.to_string()),
        );
        if let Some(w) = j.waited {
            println!(
                "{:<10} {} ({:.1} s)",
                "",
                w.why.describe(),
                f64::from(w.ms) / 1000.0
            );
        }
    }
}

pub fn print_status(s: &Status) {
    println!("node        {} ({})", s.name, s.id);
    println!("fingerprint {}", s.fingerprint);
    println!("cluster     {}", s.cluster_addr);
    println!("policy      {}", s.policy);
    println!(
        "peers       {} paired, {} node(s) routable",
        s.paired_peers, s.routable_nodes
    );
    println!(
        "requests    {} in flight, {} served, {} job records",
        s.in_flight, s.served, s.jobs_logged
    );
    if s.invite_open {
        println!("invite      open");
    }
    if s.engines.is_empty() {
        println!("engines     none");
    }
    for (i, e) in s.engines.iter().enumerate() {
        println!(
            "{:<12}{}",
            if i == 0 { "engines" } else { "" },
            engine_line(e)
        );
    }
    for (i, a) in s.aliases.iter().enumerate() {
        let by = if a.node == s.name {
            "this node".to_owned()
        } else {
            format!("from {}", a.node)
        };
        println!(
            "{:<12}{} ({by})",
            if i == 0 { "aliases" } else { "" },
            a.alias
        );
    }
}

/// `ollama http://127.0.0.1:11435 up, 1 slot: llama3.2:3b (loaded), qwen2.5:7b`
fn engine_line(e: &control::EngineStatus) -> String {
    let health = match (&e.healthy, &e.failure) {
        (true, _) => "up".to_owned(),
        (false, Some(f)) => format!("down ({f})"),
        (false, None) => "not polled yet".to_owned(),
    };
    let models = if e.models.is_empty() {
        "no models".to_owned()
    } else {
        e.models
            .iter()
            .map(|m| {
                if m.loaded {
                    format!("{} (loaded)", m.name)
                } else {
                    m.name.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let slots = if e.slots == 1 { "slot" } else { "slots" };
    format!(
        "{} {} {health}, {} {slots}: {models}",
        e.kind, e.url, e.slots
    )
}
