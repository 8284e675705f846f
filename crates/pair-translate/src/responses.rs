//! OpenAI's Responses API (`POST /v1/responses`, what Codex and
//! `client.responses.create` speak) on any engine's chat completions.
//! STUB: to be written.

use serde_json::{Map, Value};

use crate::{TranslateError, Translated};

pub(crate) fn request(
    _req: Map<String, Value>,
    _created_at: &str,
) -> Result<Translated, TranslateError> {
    Err(TranslateError::new("body", "not yet"))
}

/// A chat completion on its way to a Responses client.
#[derive(Debug)]
pub struct Answer {
    streaming: bool,
    done: bool,
}

impl Answer {
    pub fn content_type(&self) -> &'static str {
        if self.streaming {
            "text/event-stream"
        } else {
            "application/json"
        }
    }

    pub fn streaming(&self) -> bool {
        self.streaming
    }

    pub fn done(&self) -> bool {
        self.done
    }

    pub fn whole(&self, _status: u16, _body: &[u8]) -> Vec<u8> {
        Vec::new()
    }

    pub fn push(&mut self, _bytes: &[u8], _out: &mut Vec<u8>) {}

    pub fn finish(&mut self, _out: &mut Vec<u8>) {}

    pub fn error_event(&self, _message: &str) -> Vec<u8> {
        Vec::new()
    }
}

/// An error body in OpenAI's shape.
pub fn error_body(status: u16, message: &str) -> Vec<u8> {
    let _ = status;
    serde_json::to_vec(&serde_json::json!({"error": {"message": message}})).unwrap_or_default()
}
