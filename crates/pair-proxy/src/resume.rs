//! Mid-stream continuation on a node: a stream this node routed, cut after
//! its first byte (the node killed, its engine crashed, the link cut),
//! goes on from another owner of the model. The stream's state and the
//! continuation request are pair-translate's
//! ([`pair_translate::resume::Stitcher`]), the body that moves is
//! pair-cluster's ([`pair_cluster::resume::Resuming`], the edge SDK wraps
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
use pair_cluster::resume::{Dead, Mover, Resuming};
use pair_core::{ApiFlavor, JobId, NodeId, RequestProfile, Resumption};
use pair_http::h1::Headers;
use pair_http::request::RequestHead;
pub(crate) use pair_translate::resume::Api;
use pair_translate::resume::Stitcher;
use serde_json::{Value, json};

use crate::dispatch::{BoxedBody, UpBody};
use crate::route::Work;
use crate::state::ProxyState;

pub use crate::state::ResumePolicy;

/// The API of a request sent to `path`, where its stream can be continued
/// (the routes are named here, on the request path, not in the crates
/// below it; the edge SDK keeps its own table of the same four).
pub(crate) fn api_of(path: &str) -> Option<Api> {
    Some(match path {
        "/v1/chat/completions" => Api::OpenAiChat,
        "/v1/completions" => Api::OpenAiCompletion,
        "/api/chat" => Api::OllamaChat,
        "/api/generate" => Api::OllamaGenerate,
        _ => return None,
    })
}

/// The engine path of a continuation in `api`.
pub(crate) fn path_of(api: Api) -> &'static str {
    match api {
        Api::OpenAiChat => "/v1/chat/completions",
        Api::OpenAiCompletion => "/v1/completions",
        Api::OllamaChat => "/api/chat",
        Api::OllamaGenerate => "/api/generate",
    }
}

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
    pub route: &'static str,
    pub profile: RequestProfile,
    pub job: JobId,
    pub log: Arc<ResumeLog>,
    /// Sends a continuation to the best owner not cut on
    /// (the pipeline's `continue_on`).
    pub send: Send,
}

/// How a continuation is sent: to the best owner of the model outside
/// `dead`, answering with its stream once committed.
pub(crate) type Send = fn(
    Arc<Continuation>,
    RequestHead,
    Bytes,
    Dead,
) -> Pin<Box<dyn Future<Output = Option<Moved>> + std::marker::Send>>;

/// An answer continued on another node.
pub(crate) type Moved = pair_cluster::resume::Moved<UpBody>;

impl Mover for Continuation {
    type Body = UpBody;

    fn send(
        self: Arc<Self>,
        request: Bytes,
        api: Api,
        dead: Dead,
    ) -> Pin<Box<dyn Future<Output = Option<Moved>> + std::marker::Send>> {
        let mut headers = self.head.headers.clone().into_map(1);
        headers.insert(CONTENT_LENGTH, http::HeaderValue::from(request.len()));
        let path_and_query = if api == self.api {
            self.head.path_and_query.clone()
        } else {
            http::uri::PathAndQuery::from_static(path_of(api))
        };
        let head = RequestHead {
            method: self.head.method.clone(),
            path_and_query,
            headers: Headers::Map(headers),
        };
        (self.send)(Arc::clone(&self), head, request, dead)
    }

    fn moved(&self, node: NodeId, at_token: u32) -> Value {
        self.log.push(Resumption { node, at_token });
        let name = self
            .st
            .cluster()
            .node(node)
            .map_or_else(|| node.short(), |n| n.name.clone());
        tracing::info!(job = %self.job, node = %name, at_token, "a cut stream moved");
        json!({ "node": name, "node_id": node, "at_token": at_token })
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
    let stitch = Stitcher::new(
        cont.api,
        request,
        cont.profile.model.clone(),
        cont.st.resume.limit,
    );
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
