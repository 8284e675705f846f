//! Node info on the cluster port: the router serving `GET
//! /pair/v1/node-info` from the sampler's latest reading. The document
//! itself ([`NodeInfo`]) is a pair-core value, re-exported here; format
//! documented in docs/node-info.md.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
pub use pair_core::node_info::{NODE_INFO_PATH, NODE_INFO_VERSION, NodeInfo, NodeInfoConfig};
use tokio::sync::watch;

use crate::pressure::Telemetry;
use crate::sampler::epoch_ms;

#[derive(Clone)]
struct NodeInfoState {
    node: std::sync::Arc<NodeInfoConfig>,
    telemetry: watch::Receiver<Telemetry>,
}

/// A router serving [`NODE_INFO_PATH`]; merge it into the cluster-port app.
pub fn node_info_router(node: NodeInfoConfig, telemetry: watch::Receiver<Telemetry>) -> Router {
    let state = NodeInfoState {
        node: std::sync::Arc::new(node),
        telemetry,
    };
    Router::new()
        .route(NODE_INFO_PATH, get(serve_node_info))
        .with_state(state)
}

async fn serve_node_info(State(state): State<NodeInfoState>) -> impl IntoResponse {
    let info = {
        let t = state.telemetry.borrow();
        NodeInfo::new(&state.node, &t, epoch_ms())
    };
    ([(header::CACHE_CONTROL, "no-store")], Json(info))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pressure::ComputeSource;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use pair_core::{GpuDevice, NodeId, Pressure, Role};
    use tower::ServiceExt;

    fn node() -> NodeInfoConfig {
        NodeInfoConfig {
            id: NodeId::from_u128(42),
            name: "box".into(),
            role: Role::Node,
            cluster_port: 14318,
        }
    }

    #[tokio::test]
    async fn serves_json_without_models_or_jobs() {
        let t = Telemetry {
            taken_at_ms: epoch_ms(),
            gpus: vec![GpuDevice {
                index: 0,
                name: "RTX".into(),
                utilisation_pct: 50,
                vram_used_bytes: 3,
                vram_total_bytes: 10,
            }],
            compute: ComputeSource::Gpu,
            pressure: Pressure::MAX,
            ..Telemetry::default()
        };
        let (_tx, rx) = watch::channel(t);
        let resp = node_info_router(node(), rx)
            .oneshot(Request::get(NODE_INFO_PATH).body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["id"], "00000000-0000-0000-0000-00000000002a");
        assert_eq!(v["format"], 1);
        assert_eq!(v["role"], "node");
        assert_eq!(v["cluster_port"], 14318);
        assert_eq!(v["pressure"], 3);
        assert_eq!(v["vram_free_bytes"], 7);
        assert_eq!(v["gpus"][0]["name"], "RTX");
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert!(
            !keys
                .iter()
                .any(|k| k.contains("model") || k.contains("job")),
            "{keys:?}"
        );
        let back: NodeInfo = serde_json::from_slice(&body).unwrap();
        assert_eq!(back.id, NodeId::from_u128(42));
    }

    #[tokio::test]
    async fn never_sampled_reports_unknown_pressure() {
        let (_tx, rx) = watch::channel(Telemetry::default());
        let resp = node_info_router(node(), rx)
            .oneshot(Request::get(NODE_INFO_PATH).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let info: NodeInfo = serde_json::from_slice(&body).unwrap();
        assert_eq!(info.pressure, Pressure::UNKNOWN);
        assert_eq!(info.vram_free_bytes, None);
        assert!(info.gpus.is_empty());
    }

    #[tokio::test]
    async fn other_paths_are_not_found() {
        let (_tx, rx) = watch::channel(Telemetry::default());
        let resp = node_info_router(node(), rx)
            .oneshot(Request::get("/pair/v1/models").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}
