//! Reads what routing needs from a request body (the top-level `model`,
//! whether it streams, how many tokens it may produce) without building a
//! tree of the whole JSON document: unknown fields are skipped by serde.

use std::borrow::Cow;

use pair_core::{ApiFlavor, RequestProfile};
use serde::Deserialize;

use crate::route::Work;

/// Why a body could not be routed; each is the client's fault (400).
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("request body has no \"model\" field")]
    MissingModel,
    #[error("request body must be a JSON object")]
    NotAnObject,
    #[error("request body is not valid UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("invalid \"model\": {0}")]
    BadModel(#[source] pair_core::CoreError),
}

#[derive(Deserialize)]
struct Facts<'a> {
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    options: Option<Options>,
}

#[derive(Deserialize)]
struct Options {
    #[serde(default)]
    num_predict: Option<i64>,
}

/// What the proxy learned from a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestFacts {
    pub model: String,
    pub streaming: bool,
    pub max_output_tokens: Option<u32>,
}

/// Bodies above this are scanned off the event loop, so one large request
/// does not stall every stream in flight.
pub const INLINE_SCAN_MAX: usize = 1 << 20;

/// [`extract`] for the request path: bodies over [`INLINE_SCAN_MAX`] are
/// scanned on the blocking pool.
pub async fn extract_off_loop(
    body: &bytes::Bytes,
    flavor: ApiFlavor,
    work: Work,
) -> Result<RequestFacts, BodyError> {
    if body.len() <= INLINE_SCAN_MAX {
        return extract(body, flavor, work);
    }
    let b = body.clone();
    match tokio::task::spawn_blocking(move || extract(&b, flavor, work)).await {
        Ok(r) => r,
        // The blocking pool is gone (shutting down): scan here.
        Err(_) => extract(body, flavor, work),
    }
}

/// Extracts the routing facts. `stream` defaults follow each API: Ollama's
/// generate and chat stream unless told not to; OpenAI and Anthropic don't.
pub fn extract(body: &[u8], flavor: ApiFlavor, work: Work) -> Result<RequestFacts, BodyError> {
    // serde skips unknown fields without checking their UTF-8, and a derived
    // struct also accepts a JSON array by position: check both up front.
    let text = std::str::from_utf8(body).map_err(BodyError::NotUtf8)?;
    if !text.trim_start().starts_with('{') {
        return Err(match serde_json::from_str::<serde::de::IgnoredAny>(text) {
            Err(e) => BodyError::Json(e),
            Ok(_) => BodyError::NotAnObject,
        });
    }
    let facts: Facts<'_> = serde_json::from_str(text).map_err(BodyError::Json)?;
    let model = facts.model.ok_or(BodyError::MissingModel)?;
    let model = pair_core::ModelName::new(model.into_owned()).map_err(BodyError::BadModel)?;
    let default_stream = flavor == ApiFlavor::Ollama && work == Work::Generate;
    let streaming = work == Work::Generate && facts.stream.unwrap_or(default_stream);
    let max_output_tokens = facts
        .max_completion_tokens
        .or(facts.max_tokens)
        .or_else(|| {
            facts
                .options
                .and_then(|o| o.num_predict)
                .and_then(|n| u64::try_from(n).ok())
        })
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    Ok(RequestFacts {
        model: model.into(),
        streaming,
        max_output_tokens,
    })
}

impl RequestFacts {
    /// The scheduler's view of this request.
    pub fn profile(&self, flavor: ApiFlavor, work: Work, body_len: usize) -> RequestProfile {
        let mut p = RequestProfile::new(self.model.clone(), flavor);
        p.streaming = self.streaming;
        p.prompt_tokens = RequestProfile::estimate_tokens_from_bytes(body_len);
        p.max_output_tokens = match work {
            Work::Generate => self
                .max_output_tokens
                .unwrap_or(RequestProfile::DEFAULT_OUTPUT_TOKENS),
            Work::Embed | Work::Show => 0,
        };
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_model_stream_and_limits() {
        let f = extract(
            br#"{"messages":[{"role":"user","content":"hi"}],"model":"llama3","options":{"num_predict":7}}"#,
            ApiFlavor::Ollama,
            Work::Generate,
        )
        .unwrap();
        assert_eq!(f.model, "llama3");
        assert!(f.streaming, "ollama chat streams by default");
        assert_eq!(f.max_output_tokens, Some(7));

        let f = extract(
            br#"{"model":"gpt\u002d4o","max_tokens":12}"#,
            ApiFlavor::OpenAi,
            Work::Generate,
        )
        .unwrap();
        assert_eq!(f.model, "gpt-4o", "escapes are decoded");
        assert!(!f.streaming);
        assert_eq!(f.max_output_tokens, Some(12));

        let f = extract(
            br#"{"model":"e","stream":true}"#,
            ApiFlavor::Ollama,
            Work::Embed,
        )
        .unwrap();
        assert!(!f.streaming, "embeddings never stream");
    }

    #[test]
    fn client_errors_are_clear() {
        assert!(matches!(
            extract(b"{not json", ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::Json(_))
        ));
        assert!(matches!(
            extract(br#"{"messages":[]}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::MissingModel)
        ));
        assert!(matches!(
            extract(br#"{"model":""}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::BadModel(_))
        ));
        assert!(matches!(
            extract(br#"{"model":42}"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::Json(_))
        ));
        assert!(matches!(
            extract(br#"[1,2]"#, ApiFlavor::OpenAi, Work::Generate),
            Err(BodyError::NotAnObject)
        ));
        // Found by fuzzing: an array read by position, and bad UTF-8 in a
        // skipped key.
        assert!(matches!(
            extract(br#"["llama3", true]"#, ApiFlavor::Ollama, Work::Generate),
            Err(BodyError::NotAnObject)
        ));
        assert!(matches!(
            extract(
                b"{\"model\":\"m\",\"messages\":[{\"\xE3ontent\":\"x\"}]}",
                ApiFlavor::Ollama,
                Work::Generate
            ),
            Err(BodyError::NotUtf8(_))
        ));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = extract(&bytes, ApiFlavor::Ollama, Work::Generate);
        }

        #[test]
        fn finds_the_model_among_other_fields(model in "[a-zA-Z0-9:/._-]{1,40}", pad in "[a-z]{0,20}") {
            let body = serde_json::json!({"prompt": pad, "model": model, "nested": {"model": "other"}});
            let f = extract(body.to_string().as_bytes(), ApiFlavor::OpenAi, Work::Generate).unwrap();
            prop_assert_eq!(f.model, model);
        }
    }
}
