//! The client's logic on its own: the prompt chain and aliases of a
//! request, and how a request ends, from what the failover driver
//! ([`pair_scheduler::drive`]) made of a fake hop's scripted nodes
//! ([`pair_testkit::hop`], the one a node's outcome tests use) with the
//! SDK's own errors: which attempts move on, and the caller's error.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Mutex;

use pair_link::ClusterError;
use pair_scheduler::drive::{Classified, Driven};
use pair_scheduler::{Failover, FailoverConfig, GiveUp};
use pair_testkit::hop::{Does, FakeHop, Refused};

use super::send::{self, Roster, SendError};
use super::*;

#[test]
fn the_prompt_chain_is_the_fields_bytes_in_engine_order() {
    // Anthropic's shape: the turns first in the body, system and tools
    // after; the engine's context (and the chain) has them the other
    // way round.
    let body = br#"{"model":"m","messages":[{"role":"user","content":"fix it"}],"max_tokens":9,"tools":[{"name":"Bash"}],"system":"be an agent"}"#;
    let mut expected = ChainBuilder::new();
    expected
        .bytes(br#""be an agent""#)
        .bytes(br#"[{"name":"Bash"}]"#)
        .bytes(br#"[{"role":"user","content":"fix it"}]"#);
    assert_eq!(prompt_chain(body), expected.finish());
    // A body that is not a JSON object has no prompt to cache.
    assert!(prompt_chain(b"not json").is_empty());
    assert!(prompt_chain(br#"{"model":"m"}"#).is_empty());
}

/// A view of one node that holds no model and advertises `alias`.
fn aliasing(alias: &str) -> View {
    let id = NodeId::from_u128(1);
    let mut snapshot = pair_core::NodeSnapshot::new(id, "n1");
    snapshot.aliases = vec![alias.parse().unwrap()];
    let node = crate::view::NodeView {
        id,
        name: "n1".to_owned(),
        addr: SocketAddr::from(([127, 0, 0, 1], 14_001)),
        rtt_us: 100,
        snapshot,
        models: Vec::new(),
    };
    View::new([(id, node)].into(), BTreeMap::new(), 0)
}

fn aliased_json(view: &View, body: &'static str) -> Result<(Request, RequestProfile)> {
    let req = Request::json("/v1/chat/completions", Bytes::from_static(body.as_bytes()))?;
    let profile = req.profile().unwrap();
    aliased(view, req, profile)
}

#[test]
fn an_alias_is_spliced_in_as_a_node_splices_it() {
    let view = aliasing("claude-*=qwen2.5:7b");
    let body =
        "{ \"messages\": [{\"model\": \"claude-x\"}],\n  \"model\" : \"claude-x\", \"n\": 1.50 }";
    let (req, profile) = aliased_json(&view, body).unwrap();
    assert_eq!(
        req.body,
        body.replacen(": \"claude-x\", \"n\"", ": \"qwen2.5:7b\", \"n\"", 1),
        "the rest of the body byte for byte"
    );
    assert_eq!(req.model.as_deref(), Some("qwen2.5:7b"));
    assert_eq!(profile.model, "qwen2.5:7b");
    // A model no alias covers goes as it came.
    let (req, profile) = aliased_json(&view, r#"{"model":"llama"}"#).unwrap();
    assert_eq!(
        (&req.body[..], profile.model.as_str()),
        (&br#"{"model":"llama"}"#[..], "llama")
    );
    // A body that names its model twice has no one place to put the target.
    assert!(matches!(
        aliased_json(&view, r#"{"model":"claude-x","model":"claude-x"}"#),
        Err(Error::InvalidRequest(_))
    ));
}

/// A refused connection, as the SDK's link reports it.
impl From<Refused> for SendError {
    fn from(_: Refused) -> Self {
        SendError::Link(io_failure(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    }
}

fn io_failure(source: std::io::Error) -> ClusterError {
    ClusterError::Tls(pair_identity::Error::Io {
        action: "connect to",
        path: PathBuf::new(),
        source,
    })
}

/// A node that refused this client's certificate.
fn tls_refused() -> SendError {
    SendError::Link(io_failure(std::io::Error::other(rustls::Error::General(
        "unknown certificate".to_owned(),
    ))))
}

/// The error of a node that gave up before its engine answered, saying
/// why in `x-pair-failed`.
fn gave_up_with(class: &'static str) -> SendError {
    let mut headers = http::HeaderMap::new();
    headers.insert(pair_link::FAILED_HEADER, HeaderValue::from_static(class));
    send::node_gave_up(&headers).unwrap()
}

#[test]
fn the_sdks_failures_classify_as_a_nodes_do() {
    let class = |e: SendError| (e.class(), e.advice().may_retry(), e.transient());
    assert_eq!(class(Refused.into()), ("connect", true, true));
    assert_eq!(class(tls_refused()), (pair_link::TLS_REFUSED, true, false));
    assert_eq!(class(SendError::Invalid), ("bad-request", false, false));
    assert_eq!(class(gave_up_with("reset")), ("reset", true, true));
    assert_eq!(
        class(gave_up_with("bad-request")),
        ("bad-request", false, false)
    );
    assert_eq!(
        class(gave_up_with("not-a-class")),
        ("transport", true, false),
        "a class the client does not know is a transport failure"
    );
    assert!(send::node_gave_up(&http::HeaderMap::new()).is_none());
}

/// The client as ending a request sees it: nodes named by their short id.
#[derive(Default)]
struct FakeRoster {
    /// Nodes known to refuse this client (the link marks them).
    refused: Mutex<BTreeSet<NodeId>>,
    /// Nodes a probe finds refusing this client.
    refuse_probes: BTreeSet<NodeId>,
    /// The nodes each probe round asked about.
    probes: Mutex<Vec<Vec<NodeId>>>,
}

impl FakeRoster {
    fn refusing(refused: &[NodeId], refuse_probes: &[NodeId]) -> Self {
        Self {
            refused: Mutex::new(refused.iter().copied().collect()),
            refuse_probes: refuse_probes.iter().copied().collect(),
            probes: Mutex::default(),
        }
    }

    fn probes(&self) -> Vec<Vec<NodeId>> {
        self.probes.lock().unwrap().clone()
    }
}

impl Roster for FakeRoster {
    fn name(&self, node: NodeId) -> String {
        node.short()
    }

    fn refuses(&self, node: NodeId) -> bool {
        self.refused.lock().unwrap().contains(&node)
    }

    fn probed(&self) -> usize {
        3
    }

    async fn reprobe(&self, nodes: Vec<NodeId>) {
        let mut refused = self.refused.lock().unwrap();
        refused.extend(nodes.iter().filter(|n| self.refuse_probes.contains(n)));
        self.probes.lock().unwrap().push(nodes);
    }
}

/// Node `i`, its short id `i` too.
fn node(i: u128) -> NodeId {
    NodeId::from_u128(i << 96 | i)
}

/// How the caller's request went, and the nodes it was sent to.
struct Ended {
    outcome: std::result::Result<(NodeId, u16), Error>,
    sent: Vec<NodeId>,
}

/// A request for `model` (`-`: a listing) whose attempts went as `hop`'s
/// nodes do; `invalid`: what sending found wrong with it.
async fn ended(
    hop: FakeHop<SendError>,
    model: &str,
    invalid: Option<&str>,
    roster: &FakeRoster,
) -> Ended {
    let mut failover = Failover::new(FailoverConfig {
        stall_floor: Duration::from_secs(2),
        patience: Duration::from_secs(20),
        ..FailoverConfig::default()
    });
    let outcome = match hop.run(&mut failover).await {
        Driven::Committed { answer, .. } => Ok(answer),
        Driven::GaveUp { why, kept } => {
            let gave_up = send::GaveUp {
                why,
                kept: kept.map(|k| (k.node, k.status, Bytes::from(k.body))),
                invalid: invalid.map(str::to_owned),
                refused: None,
            };
            Err(gave_up.error(roster, model, &failover).await)
        }
    };
    Ended {
        outcome,
        sent: hop.sent(),
    }
}

fn hop(nodes: Vec<(NodeId, Does<SendError>)>) -> FakeHop<SendError> {
    FakeHop::new(Instant::now(), nodes)
}

fn what(attempts: &crate::error::Attempts) -> Vec<(NodeId, &str)> {
    attempts
        .0
        .iter()
        .map(|t| (t.node, t.what.as_str()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_refused_node_is_gone_around() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![
            (node(2), Does::Refuses),
            (node(3), Does::Answers(200)),
        ]),
        "m",
        None,
        &roster,
    )
    .await;
    assert_eq!(e.outcome.unwrap(), (node(3), 200));
    assert_eq!(e.sent, [node(2), node(3)]);
    assert!(roster.probes().is_empty(), "no refusal: nothing to confirm");
}

#[tokio::test(start_paused = true)]
async fn a_client_error_comes_back_and_is_tried_nowhere_else() {
    let roster = FakeRoster::default();
    for status in [400, 401, 422] {
        let e = ended(
            hop(vec![
                (node(2), Does::Answers(status)),
                (node(3), Does::Answers(200)),
            ]),
            "m",
            None,
            &roster,
        )
        .await;
        assert_eq!(e.outcome.unwrap(), (node(2), status));
        assert_eq!(e.sent, [node(2)]);
    }
    // A 404 from a node that advertised the model moves on.
    let e = ended(
        hop(vec![
            (node(2), Does::Answers(404)),
            (node(3), Does::Answers(200)),
        ]),
        "m",
        None,
        &roster,
    )
    .await;
    assert_eq!(e.outcome.unwrap(), (node(3), 200));
}

#[tokio::test(start_paused = true)]
async fn a_request_no_relay_takes_is_never_retried() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![
            (node(2), Does::Fails(|| SendError::Invalid)),
            (node(3), Does::Answers(200)),
        ]),
        "m",
        Some("path \"/x y\": invalid uri"),
        &roster,
    )
    .await;
    assert_eq!(e.sent, [node(2)]);
    let Err(Error::InvalidRequest(why)) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert!(why.contains("invalid uri"), "{why}");
}

#[tokio::test(start_paused = true)]
async fn a_node_that_gave_up_is_read_by_the_class_it_names() {
    let roster = FakeRoster::default();
    // The client's fault on the node: nowhere else either.
    let e = ended(
        hop(vec![
            (node(2), Does::Fails(|| gave_up_with("bad-request"))),
            (node(3), Does::Answers(200)),
        ]),
        "m",
        None,
        &roster,
    )
    .await;
    assert_eq!(e.sent, [node(2)]);
    let Err(Error::Exhausted { attempts, .. }) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert_eq!(what(&attempts), [(node(2), "bad-request")]);
    // Its engine's connection was reset, or a class the client does not
    // know: the next node takes it.
    for class in [(|| gave_up_with("reset")) as fn() -> SendError, || {
        gave_up_with("engine-on-fire")
    }] {
        let e = ended(
            hop(vec![
                (node(2), Does::Fails(class)),
                (node(3), Does::Answers(200)),
            ]),
            "m",
            None,
            &roster,
        )
        .await;
        assert_eq!(e.outcome.unwrap(), (node(3), 200));
        assert_eq!(e.sent, [node(2), node(3)]);
    }
}

#[tokio::test(start_paused = true)]
async fn the_last_answer_is_the_callers_error_with_every_attempt() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![
            (node(2), Does::Fails(|| gave_up_with("connect-timeout"))),
            (node(3), Does::Answers(502)),
        ]),
        "m",
        None,
        &roster,
    )
    .await;
    let Err(Error::Status {
        model,
        node: name,
        status,
        body,
        attempts,
    }) = e.outcome
    else {
        panic!("{:?}", e.outcome);
    };
    assert_eq!((model.as_str(), status), ("m", 502));
    assert_eq!(name, node(3).short());
    assert_eq!(body, r#"{"error":"the engine said 502"}"#);
    assert_eq!(
        what(&attempts),
        [(node(2), "connect-timeout"), (node(3), "502")]
    );
}

#[tokio::test(start_paused = true)]
async fn hung_nodes_exhaust_the_request() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![(node(2), Does::Hangs), (node(3), Does::Hangs)]),
        "m",
        None,
        &roster,
    )
    .await;
    let Err(Error::Exhausted { attempts, .. }) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert!(
        attempts.0.iter().all(|t| t.what == "first-byte-timeout"),
        "{attempts}"
    );
    assert!(attempts.0.len() >= 2, "{attempts}");
}

#[tokio::test(start_paused = true)]
async fn owners_that_stay_down_are_gone_and_no_owner_is_no_node_serving() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![(node(2), Does::Answers(200))]).owners_down(),
        "m",
        None,
        &roster,
    )
    .await;
    assert!(
        matches!(e.outcome, Err(Error::OwnersGone { .. })),
        "{:?}",
        e.outcome
    );
    assert!(e.sent.is_empty());
    let e = ended(hop(Vec::new()), "m", None, &roster).await;
    assert!(
        matches!(e.outcome, Err(Error::NoNodeServes { ref model, probed: 3 }) if model == "m"),
        "{:?}",
        e.outcome
    );
    // A listing with no node to go to has no model to name.
    let e = ended(hop(Vec::new()), "-", None, &roster).await;
    assert!(
        matches!(e.outcome, Err(Error::Exhausted { .. })),
        "{:?}",
        e.outcome
    );
}

#[tokio::test(start_paused = true)]
async fn nodes_that_all_refused_the_certificate_are_a_refusal() {
    let roster = FakeRoster::default();
    let e = ended(
        hop(vec![
            (node(2), Does::Fails(tls_refused)),
            (node(3), Does::Fails(tls_refused)),
        ]),
        "m",
        None,
        &roster,
    )
    .await;
    let Err(Error::Refused { nodes, .. }) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert_eq!(nodes, [node(2).short(), node(3).short()]);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_confirmed_by_probing_the_others_that_failed() {
    let nodes = || {
        vec![
            (node(2), Does::Fails(tls_refused)),
            (node(3), Does::Fails(|| gave_up_with("transport"))),
        ]
    };
    // Node 2's link marked it refusing; a probe finds node 3 refuses too
    // (its alert was lost with the connection).
    let roster = FakeRoster::refusing(&[node(2)], &[node(3)]);
    let e = ended(hop(nodes()), "m", None, &roster).await;
    assert_eq!(roster.probes(), [vec![node(3)]]);
    let Err(Error::Refused { nodes: names, .. }) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert_eq!(names, [node(2).short(), node(3).short()]);
    // A probe that finds node 3 lets the client in: it failed on its own.
    let roster = FakeRoster::refusing(&[node(2)], &[]);
    let e = ended(hop(nodes()), "m", None, &roster).await;
    assert_eq!(roster.probes(), [vec![node(3)]]);
    let Err(Error::Exhausted { attempts, .. }) = e.outcome else {
        panic!("{:?}", e.outcome);
    };
    assert_eq!(
        what(&attempts),
        [(node(2), pair_link::TLS_REFUSED), (node(3), "transport")]
    );
}

#[tokio::test]
async fn owners_refusing_before_any_attempt_are_a_refusal_unprobed() {
    let roster = FakeRoster::default();
    let gave_up = send::GaveUp {
        why: GiveUp::NoCandidate,
        kept: None,
        invalid: None,
        refused: Some(vec!["n1".to_owned(), "n2".to_owned()]),
    };
    let failover = Failover::new(FailoverConfig::default());
    let e = gave_up.error(&roster, "m", &failover).await;
    assert!(
        matches!(&e, Error::Refused { model, nodes } if model == "m" && nodes == &["n1", "n2"]),
        "{e:?}"
    );
    assert!(roster.probes().is_empty());
}
