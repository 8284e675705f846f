//! How a request ends when no answer is committed: the client's error in
//! its API's shape, the route receipt, the job record and the metrics.
//! Each path is taken only when something failed: `#[cold]` keeps them
//! out of [`crate::pipeline::execute`]'s code.

use axum::body::Body;
use http::StatusCode;
use pair_core::{ClusterSnapshot, JobStatus, NodeId, RequestProfile};
use pair_http::{Extra, Reply};
use pair_identity::keys::KeyRecord;
use pair_link::header::MADE_HEADER;
use pair_scheduler::{Failover, GiveUp};
use serde_json::json;

use crate::attempt::{Attempts, Held, Inference, Plan};
use crate::error::json_error;
use crate::job::{PendingJob, millis};
use crate::receipt::{self, Receipt};
use crate::state::ProxyState;

/// One dispatch and how it ended, for receipts and error bodies.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Attempt {
    pub node: NodeId,
    pub name: String,
    /// An HTTP status or a transport class (`connect`, `first-byte-timeout`).
    pub outcome: String,
}

/// A node's name from the snapshot (its short id if it has left).
pub(crate) fn name_of(cluster: &ClusterSnapshot, node: NodeId) -> String {
    cluster
        .node(node)
        .map_or_else(|| node.short(), |n| n.name.clone())
}

/// A request that is not well formed (its body, its deadline): 400 in
/// the client's shape, saying what is wrong.
#[cold]
#[inline(never)]
pub(crate) fn bad_request(st: &ProxyState, req: &Inference, plan: Plan, why: &str) -> Reply {
    if plan == Plan::Cluster {
        st.metrics.count_request(req.route.path(), 400, "none");
    }
    json_error(
        StatusCode::BAD_REQUEST,
        req.flavor,
        "invalid_request",
        why,
        None,
    )
    .into()
}

/// A relayed request for a model this node does not hold: the origin's
/// view was stale, and a 404 from an advertised owner sends it on to its
/// next candidate.
#[cold]
#[inline(never)]
pub(crate) fn model_not_here(st: &ProxyState, req: &Inference, profile: &RequestProfile) -> Reply {
    let mut reply: Reply = json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{}' not found on node {}",
            profile.model, st.node.name
        ),
        None,
    )
    .into();
    reply
        .extra
        .push((MADE_HEADER, http::HeaderValue::from_static("1")));
    reply
}

/// The refusal of a relayed request that may only take a free slot, while
/// every slot of this node's engine is taken: at once, before any engine
/// sees it, with the class its sender waits on.
pub(crate) fn slots_full_here(st: &ProxyState, req: &Inference) -> Reply {
    let mut reply: Reply = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        req.flavor,
        "slots_full",
        &format!(
            "every slot of node {}'s engine is taken; the node that sent this holds it at the cluster",
            st.node.name
        ),
        None,
    )
    .into();
    reply
        .extra
        .push((MADE_HEADER, http::HeaderValue::from_static("1")));
    reply.extra.push((
        pair_link::FAILED_HEADER,
        http::HeaderValue::from_static(crate::attempt::SLOTS_FULL),
    ));
    reply
}

impl Attempts<'_> {
    /// The request ends with nothing committed: the last answer a node
    /// gave, or the proxy's own error naming what each node did; recorded.
    #[cold]
    #[inline(never)]
    pub(crate) fn gave_up(
        &self,
        pending: &mut PendingJob,
        failover: &Failover,
        why: GiveUp,
        held: Option<Held>,
    ) -> Reply {
        let (st, req, profile, job) = (&**self.st, self.req, self.profile, self.job);
        let plan = self.plan();
        let cluster = &*st.cluster();
        let attempts: Vec<Attempt> = failover
            .failed()
            .iter()
            .map(|a| Attempt {
                node: a.node,
                name: name_of(cluster, a.node),
                outcome: a.outcome.label().into_owned(),
            })
            .collect();
        let kept_engine_answer = held.is_some() && matches!(why, GiveUp::Exhausted { .. });
        let (reply, error): (Reply, &'static str) = match (why, held) {
            (GiveUp::NoCandidate, _) => {
                // Nothing was tried: no job to record.
                pending.take();
                return no_eligible_node(st, req, profile, cluster);
            }
            (GiveUp::Deadline, _) => {
                let d = failover.deadline().unwrap_or_default();
                let tried: Vec<String> = attempts
                    .iter()
                    .map(|a| format!("{} ({})", a.name, a.outcome))
                    .collect();
                let resp = json_error(
                    StatusCode::GATEWAY_TIMEOUT,
                    req.flavor,
                    "deadline_exceeded",
                    &format!(
                        "x-pair-deadline of {} s passed before any node answered '{}'{}",
                        d.as_secs_f64(),
                        profile.model,
                        if tried.is_empty() {
                            String::new()
                        } else {
                            format!(" (before that: {})", tried.join(", "))
                        }
                    ),
                    Some(
                        json!({ "attempts": attempts, "job": job, "deadline_s": d.as_secs_f64() }),
                    ),
                );
                (resp.into(), "deadline passed")
            }
            (GiveUp::OwnersGone, _) => {
                let mut resp = json_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    req.flavor,
                    "no_owner_up",
                    &format!(
                        "every node that serves '{}' is down (its engine unhealthy or the node out of routing), and none came back within {} s",
                        profile.model,
                        req.received.elapsed().as_secs()
                    ),
                    Some(json!({ "attempts": attempts })),
                );
                resp.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static("5"),
                );
                (resp.into(), "no owner up")
            }
            (GiveUp::Exhausted { .. }, Some(held)) => {
                // The engine's own answer, as it gave it, with the receipt.
                let name = name_of(cluster, held.node);
                let mut reply = Reply {
                    status: held.status,
                    headers: held.headers,
                    extra: Extra::new(),
                    body: Body::from(held.body),
                };
                if plan == Plan::Cluster {
                    reply.extra = Receipt {
                        node: crate::state::node_receipt(&name, held.node),
                        attempts: failover.dispatched(),
                        policy: st.policy().as_str(),
                        job,
                        why: None,
                        model: None,
                    }
                    .into_extra();
                }
                (reply, "every attempt failed")
            }
            (GiveUp::Exhausted { stalled }, None) => {
                let status = if stalled {
                    StatusCode::GATEWAY_TIMEOUT
                } else {
                    StatusCode::BAD_GATEWAY
                };
                let tried: Vec<String> = attempts
                    .iter()
                    .map(|a| format!("{} ({})", a.name, a.outcome))
                    .collect();
                let mut resp = json_error(
                    status,
                    req.flavor,
                    "all_attempts_failed",
                    &format!(
                        "every node that serves '{}' failed before answering: {}",
                        profile.model,
                        tried.join(", ")
                    ),
                    Some(json!({ "attempts": attempts, "job": job })),
                );
                resp.headers_mut().insert(
                    pair_link::header::ATTEMPTS_HEADER,
                    receipt::attempts_value(attempts.len()),
                );
                (resp.into(), "all attempts failed")
            }
        };
        if plan == Plan::Cluster {
            st.metrics
                .count_request(req.route.path(), reply.status.as_u16(), "none");
        }
        let mut reply = reply;
        if !kept_engine_answer {
            reply
                .extra
                .push((MADE_HEADER, http::HeaderValue::from_static("1")));
            // To a relaying node or edge client: the class of the failure,
            // so it treats the attempt as one on its own engine.
            if let Plan::ThisNode { .. } = plan
                && let Some(class) = failure_class_of(why, failover)
            {
                reply.extra.push((
                    pair_link::FAILED_HEADER,
                    http::HeaderValue::from_static(class.label),
                ));
            }
        }
        if let Some(mut record) = pending.take() {
            record.waited = self.waited();
            record.attempts = u8::try_from(failover.dispatched()).unwrap_or(u8::MAX);
            record.status = JobStatus::Failed;
            record.http_status = Some(reply.status.as_u16());
            record.duration_ms = Some(millis(req.received.elapsed()));
            record.error = Some(error.into());
            st.finish_job(record);
        }
        reply
    }
}

/// The class of a request's failure when it gave up with nothing from an
/// engine: its last attempt's (a stall, a refused connection), or why it
/// stopped waiting.
fn failure_class_of(why: GiveUp, failover: &Failover) -> Option<&'static pair_core::FailureClass> {
    match why {
        GiveUp::Deadline => pair_core::failure_class("deadline"),
        GiveUp::OwnersGone => pair_core::failure_class("owners-down"),
        GiveUp::NoCandidate => None,
        GiveUp::Exhausted { .. } => failover
            .failed()
            .last()
            .and_then(|a| pair_core::failure_class(&a.outcome.label())),
    }
}

/// A key limited to some models asked for another: 404, as if the model
/// were not there (the key's holder sees only what it may use).
#[cold]
#[inline(never)]
pub(crate) fn key_refuses_model(
    st: &ProxyState,
    req: &Inference,
    key: &KeyRecord,
    model: &str,
) -> Reply {
    st.metrics.count_request(req.route.path(), 404, "none");
    json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{model}' not found for API key '{}': it may use {}",
            key.name,
            key.models.join(", ")
        ),
        None,
    )
    .into()
}

#[cold]
#[inline(never)]
pub(crate) fn no_eligible_node(
    st: &ProxyState,
    req: &Inference,
    profile: &RequestProfile,
    cluster: &ClusterSnapshot,
) -> Reply {
    // No node holds it (an owner that is down is waited for): the
    // client's 404, in its own shape, naming what the cluster holds.
    st.metrics.count_request(req.route.path(), 404, "none");
    let models = cluster.model_names();
    json_error(
        StatusCode::NOT_FOUND,
        req.flavor,
        "model_not_found",
        &format!(
            "model '{}' not found: no node in the cluster holds it (nor an alias for it); the cluster holds: {}",
            profile.model,
            if models.is_empty() {
                "no models".to_owned()
            } else {
                models.join(", ")
            }
        ),
        Some(json!({ "model": profile.model, "nodes": cluster.len(), "models": models })),
    )
    .into()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! How the pipeline ends a request nothing was committed for, from
    //! what the failover driver ([`pair_scheduler::drive`]) made of a fake
    //! hop's scripted answers: the client's status and error shape, the
    //! receipt, and the job record.

    use super::*;
    use crate::attempt::Reach;
    use crate::job::new_record;
    use crate::route::{InferenceRoute, Work};
    use bytes::Bytes;
    use http::uri::PathAndQuery;
    use http::{Method, header};
    use http_body_util::BodyExt;
    use pair_core::{ApiFlavor, JobId};
    use pair_http::RequestHead;
    use pair_http::h1::Headers;
    use pair_scheduler::FailoverConfig;
    use pair_scheduler::drive::Driven;
    use pair_testkit::hop::{Does, FakeHop};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    fn node(i: u128) -> NodeId {
        NodeId::from_u128(i)
    }

    /// What the client got and what was recorded, for a request of
    /// `flavor` whose attempts went as `nodes` do.
    async fn ended(
        flavor: ApiFlavor,
        nodes: Vec<(NodeId, Does)>,
        config: FailoverConfig,
        owners_down: bool,
    ) -> (
        StatusCode,
        http::HeaderMap,
        serde_json::Value,
        Option<pair_core::JobRecord>,
    ) {
        let jobs = Arc::new(pair_jobs::JobLog::in_memory());
        let st = crate::state::tests::state(
            pair_runtime::runtime::EventLoops::single(),
            Arc::clone(&jobs),
        );
        let route = match flavor {
            ApiFlavor::Ollama => InferenceRoute::OllamaChat,
            _ => InferenceRoute::OpenAiChat,
        };
        let path = route.path();
        let req = Inference {
            head: RequestHead {
                method: Method::POST,
                path_and_query: PathAndQuery::from_static(path),
                headers: Headers::Map(http::HeaderMap::new()),
            },
            body: Bytes::from_static(br#"{"model":"m","messages":[]}"#),
            flavor,
            work: Work::Generate,
            route,
            received: Instant::now(),
            key: None,
        };
        let profile = RequestProfile::new("m", flavor);
        let job = JobId::from_uuid(uuid::Uuid::from_u128(7));
        let record = new_record(
            job,
            flavor,
            route.path(),
            &profile,
            st.node.id,
            st.node.id,
            0,
        );
        let mut pending = PendingJob::new(&st, record, req.received);
        let mut hop = FakeHop::new(req.received, nodes);
        if owners_down {
            hop = hop.owners_down();
        }
        let mut failover = Failover::new(config);
        let Driven::GaveUp { why, kept } = hop.run(&mut failover).await else {
            panic!("the script commits nothing");
        };
        let kept = kept.map(|k| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Held {
                node: k.node,
                status: StatusCode::from_u16(k.status).unwrap(),
                headers: Headers::Map(headers),
                body: Bytes::from(k.body),
            }
        });
        let attempts = Attempts {
            st: &st,
            req: &req,
            profile: &profile,
            job,
            reach: Reach::Plan(Plan::Cluster),
            explain: false,
            alone_since: Default::default(),
            queued: None,
            free_slot: false,
            claim: None,
            hold: Default::default(),
            batch: None,
        };
        let reply = attempts.gave_up(&mut pending, &failover, why, kept);
        drop(pending);
        let status = reply.status;
        let resp = reply.into_response();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, headers, body, jobs.get(job))
    }

    fn quick() -> FailoverConfig {
        FailoverConfig {
            stall_floor: Duration::from_secs(2),
            patience: Duration::from_secs(20),
            ..FailoverConfig::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_engine_answer_is_the_clients_with_its_receipt() {
        let (status, headers, body, rec) = ended(
            ApiFlavor::OpenAi,
            vec![(node(2), Does::Refuses), (node(3), Does::Answers(503))],
            quick(),
            false,
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body["error"], "the engine said 503",
            "the engine's own body"
        );
        assert!(headers.get(MADE_HEADER).is_none(), "the engine made it");
        assert!(headers.contains_key("x-pair-node"), "{headers:?}");
        let rec = rec.unwrap();
        assert_eq!(rec.status, JobStatus::Failed);
        assert_eq!(rec.http_status, Some(503));
        assert!(rec.attempts >= 2, "{rec:?}");
        assert_eq!(rec.error.as_deref(), Some("every attempt failed"));
    }

    #[tokio::test(start_paused = true)]
    async fn hung_nodes_end_in_a_504_naming_each_attempt_in_the_clients_shape() {
        for flavor in [ApiFlavor::Ollama, ApiFlavor::OpenAi] {
            let (status, headers, body, rec) = ended(
                flavor,
                vec![(node(2), Does::Hangs), (node(3), Does::Refuses)],
                quick(),
                false,
            )
            .await;
            assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{flavor:?}: {body}");
            let message = match flavor {
                ApiFlavor::Ollama => body["error"].as_str(),
                _ => body["error"]["message"].as_str(),
            }
            .unwrap();
            assert!(message.contains("(first-byte-timeout)"), "{message}");
            assert!(message.contains("(connect)"), "{message}");
            assert!(headers.contains_key(MADE_HEADER), "pair made it");
            let tried = body["pair"]["attempts"].as_array().unwrap();
            assert!(tried.len() >= 2, "{body}");
            assert_eq!(rec.unwrap().status, JobStatus::Failed);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_ends_in_a_504_that_says_so() {
        let (status, _, body, rec) = ended(
            ApiFlavor::OpenAi,
            vec![(node(2), Does::Hangs)],
            FailoverConfig {
                deadline: Some(Duration::from_millis(1500)),
                ..quick()
            },
            false,
        )
        .await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
        assert_eq!(body["pair"]["deadline_s"], 1.5);
        assert_eq!(rec.unwrap().error.as_deref(), Some("deadline passed"));
    }

    #[tokio::test(start_paused = true)]
    async fn owners_that_stay_down_end_in_a_503_with_retry_after() {
        let (status, headers, body, rec) = ended(
            ApiFlavor::Ollama,
            vec![(node(2), Does::Refuses)],
            FailoverConfig {
                patience: Duration::from_secs(3),
                ..quick()
            },
            true,
        )
        .await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(headers.get(header::RETRY_AFTER).unwrap(), "5");
        assert!(
            body["error"].as_str().unwrap().contains("is down"),
            "{body}"
        );
        assert_eq!(rec.unwrap().error.as_deref(), Some("no owner up"));
    }
}
