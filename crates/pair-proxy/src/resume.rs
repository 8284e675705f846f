//! Mid-stream continuation on a node: a stream this node routed, cut after
//! its first byte (the node killed, its engine crashed, the link cut),
//! goes on from another owner of the model. The stream's state and the
//! continuation request are pair-translate's
//! ([`pair_translate::resume::Stitcher`]), the body that moves is
//! pair-link's ([`pair_link::resume::Resuming`], the edge SDK wraps
//! its streams in the same); here is how a node sends the continuation
//! (the pipeline's `continue_on`: the same driver and attempts, the nodes
//! the stream was cut on left out) and records each move in the job.
//!
//! It works below translation, on the stream the engine speaks: an
//! Anthropic or Responses client's stream is translated from the spliced
//! one, so it continues the same way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use pair_core::{ApiFlavor, JobId, NodeId, RequestProfile, Resumption};
use pair_http::h1::Headers;
use pair_http::request::RequestHead;
use pair_link::resume::{Dead, Mover, Resuming};
pub(crate) use pair_translate::resume::Api;
use pair_translate::resume::Stitcher;
use serde_json::{Value, json};

use crate::dispatch::{BoxedBody, UpBody, UpBodyError};
use crate::route::{InferenceRoute, Work};
use crate::state::ProxyState;

pub use crate::state::ResumePolicy;

/// The flavour a continuation in `api` is sent as.
pub(crate) fn flavor(api: Api) -> ApiFlavor {
    if api.is_openai() {
        ApiFlavor::OpenAi
    } else {
        ApiFlavor::Ollama
    }
}

/// What the node records of an answer's moves, shared by the stream that
/// moves and the job's watcher.
#[derive(Debug, Default)]
pub(crate) struct ResumeLog {
    moved: AtomicBool,
    moves: std::sync::Mutex<Vec<Resumption>>,
}

impl ResumeLog {
    /// Whether the answer has left the node it began on.
    pub(crate) fn moved(&self) -> bool {
        self.moved.load(Ordering::Relaxed)
    }

    pub(crate) fn moves(&self) -> Vec<Resumption> {
        self.moves.lock().map(|m| m.clone()).unwrap_or_default()
    }

    fn push(&self, r: Resumption) {
        if let Ok(mut m) = self.moves.lock() {
            m.push(r);
        }
        self.moved.store(true, Ordering::Relaxed);
    }
}

/// Everything a continuation needs: the request as it went to the engine
/// (after any translation; its body is the stitcher's) and where it may go.
pub(crate) struct Continuation {
    pub st: Arc<ProxyState>,
    pub head: RequestHead,
    pub api: Api,
    pub work: Work,
    /// The route the client called.
    pub route: InferenceRoute,
    pub profile: RequestProfile,
    pub job: JobId,
    pub log: Arc<ResumeLog>,
    /// The answer as batch work that may be cut for interactive work
    /// (`--queue preempt`).
    pub preempt: Option<Arc<crate::preempt::Job>>,
    /// Sends a continuation, on its route, to the best owner of the model
    /// not cut on, answering with its stream once committed (the
    /// attempts' `continue_on`).
    pub send: fn(Arc<Continuation>, Continued) -> Sending,
}

/// A continuation on its way to [`Continuation::send`]: its head, the
/// route it goes on, its body and the nodes the stream was cut on.
pub(crate) struct Continued {
    pub head: RequestHead,
    pub route: InferenceRoute,
    pub body: Bytes,
    pub dead: Dead,
}

/// A continuation under way.
pub(crate) type Sending = Pin<Box<dyn Future<Output = Option<Moved>> + Send>>;

/// An answer continued on another node.
pub(crate) type Moved = pair_link::resume::Moved<UpBody>;

impl Mover for Continuation {
    type Body = UpBody;

    fn send(self: Arc<Self>, request: Bytes, route: InferenceRoute, dead: Dead) -> Sending {
        let mut headers = self.head.headers.clone().into_map(1);
        headers.insert(CONTENT_LENGTH, http::HeaderValue::from(request.len()));
        let path_and_query = if route.continues() == Some(self.api) {
            self.head.path_and_query.clone()
        } else {
            http::uri::PathAndQuery::from_static(route.path())
        };
        let head = RequestHead {
            method: self.head.method.clone(),
            path_and_query,
            headers: Headers::Map(headers),
        };
        let continued = Continued {
            head,
            route,
            body: request,
            dead,
        };
        (self.send)(Arc::clone(&self), continued)
    }

    fn moved(&self, node: NodeId, at_token: u32) -> Value {
        self.log.push(Resumption { node, at_token });
        if let Some(job) = &self.preempt {
            job.moved();
        }
        let name = self
            .st
            .cluster()
            .node(node)
            .map_or_else(|| node.short(), |n| n.name.clone());
        tracing::info!(job = %self.job, node = %name, at_token, "a cut stream moved");
        json!({ "node": name, "node_id": node, "at_token": at_token })
    }

    /// A cut to give the node's slot to interactive work: the node is
    /// healthy, and the continuation may go back to it.
    fn yielded(&self, cut: &UpBodyError) -> bool {
        matches!(cut, UpBodyError::Preempted)
    }

    fn stopped(&self, why: &'static str) {
        tracing::info!(job = %self.job, why, "a cut stream cannot go on");
    }
}

/// `body`, begun on `began_on`, moving on a cut: `request` is its body as
/// the engine got it.
pub(crate) fn resuming(
    body: UpBody,
    cont: Continuation,
    request: Bytes,
    began_on: NodeId,
) -> UpBody {
    let limit = if cont.preempt.is_some() {
        crate::preempt::moves_allowed(cont.st.resume.limit)
    } else {
        cont.st.resume.limit
    };
    let stitch = Stitcher::new(cont.api, request, cont.profile.model.clone(), limit);
    UpBody::Translated(BoxedBody(Box::pin(Resuming::new(
        body, None, stitch, cont, began_on,
    ))))
}

/// Whether `node`'s engine for `model` can continue an answer in `api`
/// ([`pair_core::NodeSnapshot::continues`]).
pub(crate) fn continues(
    cluster: &pair_core::ClusterSnapshot,
    node: NodeId,
    model: &str,
    api: Api,
) -> bool {
    cluster
        .node(node)
        .is_some_and(|n| n.continues(model, flavor(api), api.is_chat()))
}
