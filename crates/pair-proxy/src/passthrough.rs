//! Requests no route claims (model management, version, the engine's own
//! extras) go to this node's engine unchanged: the face's own kind of
//! engine first. An error the engine answers in plain text (Ollama's
//! `404 page not found`) becomes the face's JSON error shape: a client of
//! that API parses every error it gets.

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
        Ok(resp) if plain_error(&resp) => {
            let status = resp.status();
            let text = read_some(resp.into_body()).await;
            json_error(
                status,
                face.flavor(),
                if status == StatusCode::NOT_FOUND {
                    "not_found"
                } else {
                    "engine_error"
                },
                &format!(
                    "{} {}: the engine answered {status}: {}",
                    head.method,
                    head.path_and_query,
                    String::from_utf8_lossy(&text).trim()
                ),
                None,
            )
            .into()
        }
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

/// An error answer whose body is not JSON.
fn plain_error<B>(resp: &http::Response<B>) -> bool {
    let json = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"));
    (resp.status().is_client_error() || resp.status().is_server_error()) && !json
}

/// The start of an error's body (enough to say what went wrong).
async fn read_some(mut body: dispatch::UpBody) -> Bytes {
    dispatch::read_prefix(&mut body, 1024, std::time::Duration::from_secs(2)).await
}
