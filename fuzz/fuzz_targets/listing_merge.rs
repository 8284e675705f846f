//! Fuzz target: cluster listing merge (`pair_proxy::listing::merge`) on
//! arbitrary JSON documents, as peers send them. The first byte picks the
//! listing; the rest is a stream of JSON documents (parsed with serde_json,
//! stopping at the first invalid one). Checks: the envelope is the engine's
//! own; every listed model is the first copy of its name in the input; no
//! name is listed twice or lost; merging is idempotent.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use pair_core::{EngineKind, ModelName};
use pair_proxy::listing::merge;
use pair_proxy::route::Listing;
use serde_json::Value;

/// More documents than any cluster answers with; keeps each run fast.
const MAX_DOCS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let kind = match selector % 3 {
        0 => Listing::OllamaTags,
        1 => Listing::OllamaPs,
        _ => Listing::OpenAiModels,
    };
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(rest)
        .into_iter::<Value>()
        .map_while(Result::ok)
        .take(MAX_DOCS)
        .collect();
    let out = merge(kind, &docs);

    let (array_key, id_key) = match kind {
        Listing::OllamaTags | Listing::OllamaPs => ("models", "name"),
        Listing::OpenAiModels => ("data", "id"),
    };
    let envelope = out.as_object().unwrap_or_else(|| panic!("not an object: {out}"));
    let expected_keys = if kind == Listing::OpenAiModels { 2 } else { 1 };
    assert_eq!(envelope.len(), expected_keys, "{out}");
    if kind == Listing::OpenAiModels {
        assert_eq!(envelope.get("object").and_then(Value::as_str), Some("list"));
    }
    let listed = envelope
        .get(array_key)
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("no {array_key:?} array: {out}"));

    // The first input copy of each name, in input order.
    let mut first: HashMap<String, &Value> = HashMap::new();
    for doc in &docs {
        for item in doc.get(array_key).and_then(Value::as_array).into_iter().flatten() {
            if let Some(id) = id_of(item, id_key) {
                first.entry(dedup_key(id)).or_insert(item);
            }
        }
    }
    let mut seen = HashMap::new();
    for item in listed {
        let id = id_of(item, id_key).unwrap_or_else(|| panic!("listed item without id: {item}"));
        let key = dedup_key(id);
        assert!(seen.insert(key.clone(), ()).is_none(), "{key:?} listed twice");
        assert_eq!(first.get(&key), Some(&item), "{key:?} is not its first copy");
    }
    assert_eq!(seen.len(), first.len(), "a model was lost");

    assert_eq!(merge(kind, std::slice::from_ref(&out)), out, "not idempotent");
    let doubled: Vec<Value> = docs.iter().chain(&docs).cloned().collect();
    assert_eq!(merge(kind, &doubled), out, "repeated answers changed the listing");
});

fn id_of<'a>(item: &'a Value, id_key: &str) -> Option<&'a str> {
    item.get(id_key).or_else(|| item.get("model")).and_then(Value::as_str)
}

/// The identity of a model in a listing, one rule for every API (the
/// merge's): names compare with Ollama's implicit `:latest` tag and
/// case-insensitively, so `shared:latest` from an Ollama engine and
/// `Shared` from an OpenAI-compatible one are the one model a request
/// for `shared` reaches; a name that is not a model name compares exactly.
fn dedup_key(id: &str) -> String {
    match ModelName::new(id) {
        Ok(m) => m.canonical(EngineKind::Ollama).to_ascii_lowercase(),
        Err(_) => id.to_owned(),
    }
}
