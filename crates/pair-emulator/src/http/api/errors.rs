//! Error answers in each engine's own words and body shape: bad requests,
//! unknown models, a full queue, injected faults, unknown routes.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::http::{App, Flavor, json_response};

/// Which error body shape a route answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// `{"error":"..."}`
    Ollama,
    /// `{"error":{"message","type","param","code"}}`
    OpenAi,
}

pub(super) fn shape_for(app: &App, path: &str) -> Shape {
    if app.cfg.flavor == Flavor::Ollama && path.starts_with("/api/") {
        Shape::Ollama
    } else {
        Shape::OpenAi
    }
}

fn error(
    shape: Shape,
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    let body = match shape {
        Shape::Ollama => json!({ "error": message }),
        Shape::OpenAi => json!({
            "error": { "message": message, "type": kind, "param": param, "code": code }
        }),
    };
    json_response(status, &body)
}

pub(crate) fn bad_request(app: &App, path: &str, message: &str) -> Response {
    error(
        shape_for(app, path),
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        None,
        None,
    )
}

pub(super) fn unknown_model(app: &App, path: &str, model: &str) -> Response {
    match (shape_for(app, path), app.cfg.flavor) {
        (Shape::Ollama, _) => error(
            Shape::Ollama,
            StatusCode::NOT_FOUND,
            &format!("model '{model}' not found"),
            "",
            None,
            None,
        ),
        // Ollama's OpenAI layer wraps its own message in the OpenAI shape.
        (Shape::OpenAi, Flavor::Ollama) => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("model \"{model}\" not found, try pulling it first"),
            "api_error",
            None,
            None,
        ),
        (Shape::OpenAi, _) => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("The model `{model}` does not exist or you do not have access to it."),
            "invalid_request_error",
            Some("model"),
            Some("model_not_found"),
        ),
    }
}

/// The response to an injected status fault.
pub(crate) fn fault_status(app: &App, path: &str, code: u16, model: Option<&str>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status == StatusCode::NOT_FOUND
        && let Some(m) = model
    {
        return unknown_model(app, path, m);
    }
    let kind = match code {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let mut resp = error(
        shape_for(app, path),
        status,
        &format!("emulated fault: HTTP {code}"),
        kind,
        None,
        None,
    );
    if code == 429 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

/// The engine would not take the job (its queue is full).
pub(super) fn refused(app: &App, path: &str, e: &crate::EmulatorError) -> Response {
    let message = match e {
        // Ollama's own words (server/sched.go ErrMaxQueue).
        crate::EmulatorError::QueueFull { .. } => {
            "server busy, please try again.  maximum pending requests exceeded".to_owned()
        }
        other => other.to_string(),
    };
    error(
        shape_for(app, path),
        StatusCode::SERVICE_UNAVAILABLE,
        &message,
        "server_error",
        None,
        None,
    )
}

pub(crate) async fn not_found(State(app): State<App>, uri: Uri) -> Response {
    match app.cfg.flavor {
        // Go's net/http default.
        Flavor::Ollama => (StatusCode::NOT_FOUND, "404 page not found").into_response(),
        _ => error(
            Shape::OpenAi,
            StatusCode::NOT_FOUND,
            &format!("Unexpected endpoint or method. ({})", uri.path()),
            "invalid_request_error",
            None,
            None,
        ),
    }
}

pub(super) fn shutting_down() -> Response {
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}
