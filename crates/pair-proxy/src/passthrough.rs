//! Requests no route claims (model management, version, the engine's own
//! extras) go to this node's engine unchanged: the face's own kind of
//! engine first.

use axum::body::Body;
use bytes::Bytes;
use http::StatusCode;
use pair_http::{Reply, RequestHead};

use crate::dispatch;
use crate::error::json_error;
use crate::route::Face;
use crate::state::ProxyState;

/// Sends a request no route claims to this node's engine for the face.
pub async fn to_engine(st: &ProxyState, face: Face, head: RequestHead, body: Bytes) -> Reply {
    let engines = st.engines();
    let Some(engine) = face
        .passthrough_kinds()
        .iter()
        .find_map(|k| engines.iter().find(|e| e.kind == *k))
    else {
        return json_error(
            StatusCode::BAD_GATEWAY,
            face.flavor(),
            "no_local_engine",
            &format!(
                "{} is not a routed path and this node has no local engine to pass it to",
                head.path_and_query
            ),
            None,
        )
        .into();
    };
    let hop = engine.hop();
    match dispatch::send(st.local_pool(), &hop, &head, body, st.timeouts).await {
        Ok(resp) => resp.map(Body::new).into(),
        Err(e) => json_error(
            StatusCode::BAD_GATEWAY,
            face.flavor(),
            "engine_unreachable",
            &format!("the local engine did not answer: {}", e.detail()),
            None,
        )
        .into(),
    }
}
