//! What every route shares: the parsed body, the model it names, waiting
//! for a job to finish, and the unit Ollama reports durations in.

use axum::response::Response;
use serde_json::{Map, Value};

use super::errors::{Shape, bad_request, shape_for, unknown_model};
use crate::JobTiming;
use crate::http::App;
use crate::http::driver::JobGuard;

/// A parsed JSON object body, or the engine's 400.
pub(super) fn parse(app: &App, path: &str, body: &[u8]) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(bad_request(app, path, "request body must be a JSON object")),
        Err(e) => Err(bad_request(app, path, &format!("invalid JSON: {e}"))),
    }
}

/// The model a request names, resolved, or the engine's 400/404.
pub(super) fn model_of(
    app: &App,
    path: &str,
    req: &Map<String, Value>,
) -> Result<(usize, String), Response> {
    let name = req
        .get("model")
        .or_else(|| req.get("name"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let Some(name) = name else {
        let msg = match shape_for(app, path) {
            Shape::Ollama => "model is required",
            Shape::OpenAi => "you must provide a model parameter",
        };
        return Err(bad_request(app, path, msg));
    };
    match app.resolve(name) {
        Some(i) => Ok((i, name.to_owned())),
        None => Err(unknown_model(app, path, name)),
    }
}

/// Waits until a job is done; `None` if the engine shut down first.
pub(super) async fn wait_done(app: &App, guard: &mut JobGuard) -> Option<JobTiming> {
    loop {
        if let Some(t) = guard.progress.borrow_and_update().done {
            return Some(t);
        }
        tokio::select! {
            r = guard.progress.changed() => {
                if r.is_err() {
                    return guard.progress.borrow().done;
                }
            }
            () = app.shutdown.cancelled() => return None,
        }
    }
}

/// Ollama reports durations in nanoseconds on its own clock; the model
/// keeps modelled microseconds, which last `time_scale` as long on the wall.
pub(super) fn wall_ns(us: u64, time_scale: f64) -> u64 {
    (us as f64 * time_scale * 1_000.0) as u64
}
