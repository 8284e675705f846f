//! Errors the proxy answers itself, in the JSON shape of the API the client
//! speaks, so SDKs raise them with a readable message.

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use pair_core::ApiFlavor;
use serde_json::{Value, json};

/// Builds an error response. `code` is a stable machine-readable class
/// (`no_eligible_node`, `all_attempts_failed`, ...); `extra` (the attempts
/// made, say) is attached under `pair`.
pub fn json_error(
    status: StatusCode,
    flavor: ApiFlavor,
    code: &str,
    message: &str,
    extra: Option<Value>,
) -> Response<Body> {
    let mut v = error_value(status, flavor, code, message);
    if let (Some(extra), Some(obj)) = (extra, v.as_object_mut()) {
        obj.insert("pair".into(), extra);
    }
    let mut resp = Response::new(Body::from(v.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The error body alone, with its content type.
pub fn error_body(
    status: StatusCode,
    flavor: ApiFlavor,
    code: &str,
    message: &str,
) -> (&'static str, bytes::Bytes) {
    (
        "application/json",
        error_value(status, flavor, code, message)
            .to_string()
            .into(),
    )
}

fn error_value(status: StatusCode, flavor: ApiFlavor, code: &str, message: &str) -> Value {
    match flavor {
        ApiFlavor::Ollama => json!({ "error": message }),
        ApiFlavor::OpenAi | ApiFlavor::Responses => json!({
            "error": { "message": message, "type": error_type(status), "code": code }
        }),
        ApiFlavor::Anthropic => json!({
            "type": "error",
            "error": { "type": error_type(status), "message": message }
        }),
    }
}

fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_json(resp: Response<Body>) -> Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn shapes_follow_the_flavour() {
        let r = json_error(
            StatusCode::BAD_GATEWAY,
            ApiFlavor::Ollama,
            "x",
            "no node",
            None,
        );
        assert_eq!(r.status(), 502);
        assert_eq!(body_json(r).await, json!({"error":"no node"}));

        let r = json_error(
            StatusCode::BAD_GATEWAY,
            ApiFlavor::OpenAi,
            "no_eligible_node",
            "no node",
            Some(json!([1])),
        );
        let v = body_json(r).await;
        assert_eq!(v["error"]["code"], "no_eligible_node");
        assert_eq!(v["pair"], json!([1]));

        let r = json_error(StatusCode::FORBIDDEN, ApiFlavor::Anthropic, "x", "no", None);
        assert_eq!(body_json(r).await["error"]["type"], "permission_error");
    }
}
