//! Model listings merged across the cluster, de-duplicated, in the engine's
//! own envelope: `{"models":[...]}` for Ollama, `{"object":"list","data":[...]}`
//! for OpenAI. The merge is pure; the fan-out lives in the face.

use std::collections::HashSet;

use pair_core::{EngineKind, ModelName};
use serde_json::{Map, Value};

use crate::route::Listing;

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
            if seen.insert(dedup_key(kind, id)) {
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

fn dedup_key(kind: Listing, id: &str) -> String {
    match (kind, ModelName::new(id)) {
        (Listing::OllamaTags | Listing::OllamaPs, Ok(m)) => {
            m.canonical(EngineKind::Ollama).to_ascii_lowercase()
        }
        _ => id.to_owned(),
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
        // Exact match for OpenAI ids: a tag makes a different model.
        let c = json!({"data":[{"id":"m1:latest"}]});
        let m = merge(Listing::OpenAiModels, &[m, c]);
        assert_eq!(m["data"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn empty_cluster_gives_an_empty_envelope() {
        assert_eq!(merge(Listing::OllamaPs, &[]), json!({"models":[]}));
        assert_eq!(
            merge(Listing::OpenAiModels, &[]),
            json!({"object":"list","data":[]})
        );
    }
}
