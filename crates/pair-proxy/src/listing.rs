//! Model listings merged across the cluster, de-duplicated, in the engine's
//! own envelope: `{"models":[...]}` for Ollama, `{"object":"list","data":[...]}`
//! for OpenAI. When engines were asked and none answered, the listing is a
//! 503 in the API's error shape, so a client can tell "down" from "no
//! models". The merge and that decision are pure ([`merge`], [`answer`]);
//! the fan-out to this node's engines and its peers is below them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures_util::future::join_all;
use http::{HeaderValue, Method, StatusCode, header};
use pair_core::{ApiFlavor, EngineKind, ModelName};
use pair_http::h1::Headers;
use pair_http::{Reply, RequestHead};
use serde_json::{Map, Value};

use crate::dispatch::{self, Hop};
use crate::error::json_error;
use crate::route::Listing;
use crate::state::ProxyState;

/// Merges listing documents (each one engine's or one node's answer) into
/// one. Unparseable documents are skipped: one broken node must not break
/// the cluster's listing. The first copy of a model wins, so callers pass the
/// local node's answer first.
pub fn merge(kind: Listing, docs: &[Value]) -> Value {
    let (array_key, id_key) = match kind {
        Listing::OllamaTags | Listing::OllamaPs => ("models", "name"),
        Listing::OpenAiModels => ("data", "id"),
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for doc in docs {
        let Some(items) = doc.get(array_key).and_then(Value::as_array) else {
            continue;
        };
        for item in items {
            let Some(id) = item
                .get(id_key)
                .or_else(|| item.get("model"))
                .and_then(Value::as_str)
            else {
                continue;
            };
            if seen.insert(dedup_key(id)) {
                out.push(item.clone());
            }
        }
    }
    let mut envelope = Map::new();
    if kind == Listing::OpenAiModels {
        envelope.insert("object".into(), Value::from("list"));
    }
    envelope.insert(array_key.into(), Value::Array(out));
    Value::Object(envelope)
}

/// One name rule for every API's listing: a model an Ollama engine lists
/// as `shared:latest` and an OpenAI-compatible one as `shared` is the one
/// model a request for `shared` reaches, so it is listed once (in
/// `/v1/models` as in `/api/tags`).
fn dedup_key(id: &str) -> String {
    match ModelName::new(id) {
        Ok(m) => m.canonical(EngineKind::Ollama).to_ascii_lowercase(),
        Err(_) => id.to_owned(),
    }
}

/// Which engines answer a listing: Ollama's native listings come only from
/// Ollama; every engine kind answers `/v1/models`.
pub fn engine_answers(kind: Listing, engine: EngineKind) -> bool {
    match kind {
        Listing::OllamaTags | Listing::OllamaPs => engine == EngineKind::Ollama,
        Listing::OpenAiModels => true,
    }
}

/// What the sources of one listing (engines, peers) said.
#[derive(Debug, Default)]
pub struct Answers {
    /// One document per source that answered.
    pub docs: Vec<Value>,
    /// Sources asked that gave no usable answer (unreachable, an error
    /// status, not JSON, too slow).
    pub silent: usize,
}

impl Answers {
    fn add(&mut self, doc: Option<Value>) {
        match doc {
            Some(doc) => self.docs.push(doc),
            None => self.silent += 1,
        }
    }

    fn extend(&mut self, docs: impl IntoIterator<Item = Option<Value>>) {
        for doc in docs {
            self.add(doc);
        }
    }
}

/// The listing's answer: the merged documents, or a 503 in `kind`'s API
/// shape when sources were asked and none answered (an empty list would
/// say "no models" when the truth is "no engine could be asked"). Nothing
/// asked at all (no engine serves `kind` and no peer is routable) is an
/// empty list: nothing is down.
pub fn answer(kind: Listing, answers: &Answers) -> Reply {
    if answers.docs.is_empty() && answers.silent > 0 {
        let flavor = match kind {
            Listing::OllamaTags | Listing::OllamaPs => ApiFlavor::Ollama,
            Listing::OpenAiModels => ApiFlavor::OpenAi,
        };
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            flavor,
            "no_engine_answered",
            "no engine could be asked for its models: neither this node's engines nor any \
             peer answered (is the engine running?)",
            None,
        )
        .into();
    }
    json_reply(&merge(kind, &answers.docs))
}

/// This node's own listing: one answer per engine. An engine with no
/// listing of `kind`'s own (Ollama's, from an OpenAI-compatible engine) is
/// listed in that shape from what this node knows of it, since its
/// models are served in that API too (through translation).
pub async fn own(st: &ProxyState, kind: Listing) -> Answers {
    let engines = st.engines();
    let calls = engines
        .iter()
        .filter(|e| engine_answers(kind, e.kind))
        .map(|e| {
            let hop = e.hop();
            async move { fetch_json(st, &hop, kind).await }
        });
    let mut answers = Answers::default();
    answers.extend(join_all(calls).await);
    let cluster = st.cluster();
    if let Some(me) = cluster.node(st.node.id) {
        for e in engines.iter().filter(|e| !engine_answers(kind, e.kind)) {
            if let Some(snap) = me.engines.iter().find(|s| s.kind == e.kind && s.healthy) {
                answers.add(Some(translated_listing(kind, snap)));
            }
        }
    }
    answers
}

/// An Ollama listing of an engine that has none (`/api/ps`: its loaded
/// models).
fn translated_listing(kind: Listing, engine: &pair_core::EngineSnapshot) -> Value {
    let running = kind == Listing::OllamaPs;
    let models = engine
        .models
        .iter()
        .filter(|m| !running || m.loaded)
        .map(|m| pair_translate::ollama::listing_entry(m.name.as_str(), m.size_bytes, running))
        .collect();
    let mut doc = Map::new();
    doc.insert("models".into(), Value::Array(models));
    Value::Object(doc)
}

/// The cluster's listing: this node's and every routable peer's, merged.
/// A peer whose engines are all down answers 503 and counts as silent.
pub async fn cluster(st: &Arc<ProxyState>, kind: Listing) -> Reply {
    let mut answers = own(st, kind).await;
    let cluster = st.cluster();
    let peers = st.peer_links();
    let remote = cluster
        .nodes()
        .iter()
        .filter(|n| n.id != st.node.id && n.liveness.is_routable())
        .filter_map(|n| peers.get(&n.id).cloned())
        .map(|link| {
            let st = Arc::clone(st);
            async move { fetch_json(&st, &Hop::Peer(Box::new(link)), kind).await }
        });
    answers.extend(join_all(remote).await);
    answer(kind, &answers)
}

/// This node's own listing, merged (what a peer's fan-out asks for).
pub async fn node(st: &ProxyState, kind: Listing) -> Reply {
    answer(kind, &own(st, kind).await)
}

fn json_reply(doc: &Value) -> Reply {
    let mut resp = http::Response::new(Body::from(doc.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.into()
}

const LISTING_DEADLINE: Duration = Duration::from_secs(3);

async fn fetch_json(st: &ProxyState, hop: &Hop, kind: Listing) -> Option<Value> {
    use http_body_util::BodyExt;
    let path = match kind {
        Listing::OllamaTags => "/api/tags",
        Listing::OllamaPs => "/api/ps",
        Listing::OpenAiModels => "/v1/models",
    };
    let head = RequestHead {
        method: Method::GET,
        path_and_query: http::uri::PathAndQuery::from_static(path),
        headers: Headers::Map(http::HeaderMap::new()),
    };
    let mut timeouts = st.timeouts;
    timeouts.first_byte = LISTING_DEADLINE;
    let fut = async {
        let resp = dispatch::send(st.local_pool(), hop, &head, Bytes::new(), timeouts)
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        serde_json::from_slice(&bytes).ok()
    };
    tokio::time::timeout(LISTING_DEADLINE, fut)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ollama_tags_dedup_by_canonical_name() {
        let a = json!({"models":[{"name":"llama3:latest","size":1},{"name":"qwen:0.5b"}]});
        let b = json!({"models":[{"name":"llama3","size":2},{"name":"phi3"}]});
        let m = merge(
            Listing::OllamaTags,
            &[a, b, json!("garbage"), json!({"models":3})],
        );
        let names: Vec<_> = m["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["llama3:latest", "qwen:0.5b", "phi3"]);
        assert_eq!(m["models"][0]["size"], 1, "first copy wins");
        assert!(m.get("object").is_none());
    }

    #[test]
    fn openai_models_keep_the_list_envelope() {
        let a = json!({"object":"list","data":[{"id":"m1","object":"model"}]});
        let b = json!({"object":"list","data":[{"id":"m1"},{"id":"m2"}]});
        let m = merge(Listing::OpenAiModels, &[a, b]);
        assert_eq!(m["object"], "list");
        assert_eq!(m["data"].as_array().unwrap().len(), 2);
        // The name rule of every listing: `m1` and `m1:latest` (two
        // engines naming one model with and without its tag) are one.
        let c = json!({"data":[{"id":"m1:latest"},{"id":"m3"}]});
        let m = merge(Listing::OpenAiModels, &[m, c]);
        let ids: Vec<&str> = m["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["m1", "m2", "m3"]);
    }

    #[test]
    fn empty_cluster_gives_an_empty_envelope() {
        assert_eq!(merge(Listing::OllamaPs, &[]), json!({"models":[]}));
        assert_eq!(
            merge(Listing::OpenAiModels, &[]),
            json!({"object":"list","data":[]})
        );
    }

    #[test]
    fn two_sources_with_one_model_list_it_once() {
        // Two engines (or two nodes) holding the same model.
        let one = json!({"object":"list","data":[{"id":"llama3.2:3b","object":"model"}]});
        let m = merge(Listing::OpenAiModels, &[one.clone(), one]);
        assert_eq!(m["data"], json!([{"id":"llama3.2:3b","object":"model"}]));
        let tags = json!({"models":[{"name":"llama3.2:3b"}]});
        let other = json!({"models":[{"name":"LLAMA3.2:3b"},{"model":"llama3.2:3b"}]});
        let m = merge(Listing::OllamaTags, &[tags, other]);
        assert_eq!(m["models"].as_array().unwrap().len(), 1, "{m}");
    }

    async fn reply_json(reply: Reply) -> (StatusCode, Value) {
        use http_body_util::BodyExt;
        let bytes = reply.body.collect().await.unwrap().to_bytes();
        (reply.status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn nobody_answering_is_503_in_the_apis_shape() {
        let down = Answers {
            docs: vec![],
            silent: 2,
        };
        let (status, v) = reply_json(answer(Listing::OllamaTags, &down)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("no engine could be asked"),
            "{v}"
        );
        let (status, v) = reply_json(answer(Listing::OpenAiModels, &down)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["error"]["code"], "no_engine_answered");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("no engine"),
            "{v}"
        );
    }

    #[tokio::test]
    async fn one_answer_is_enough_and_an_empty_one_is_a_list() {
        // One source down, one holding nothing: an honest empty list.
        let some = Answers {
            docs: vec![json!({"models":[]})],
            silent: 1,
        };
        let (status, v) = reply_json(answer(Listing::OllamaTags, &some)).await;
        assert_eq!((status, v), (StatusCode::OK, json!({"models":[]})));
        // Nothing to ask (no engine of this kind, no peer): nothing is down.
        let (status, v) = reply_json(answer(Listing::OpenAiModels, &Answers::default())).await;
        assert_eq!(
            (status, v),
            (StatusCode::OK, json!({"object":"list","data":[]}))
        );
        let mut answers = Answers::default();
        answers.extend([None, Some(json!({"data":[{"id":"m"}]})), None]);
        assert_eq!((answers.docs.len(), answers.silent), (1, 2));
        let (status, v) = reply_json(answer(Listing::OpenAiModels, &answers)).await;
        assert_eq!(
            (status, v["data"][0]["id"].clone()),
            (StatusCode::OK, json!("m"))
        );
    }
}
