//! Fuzz target: request model extraction (`pair_proxy::body::extract`), the
//! first thing the proxy does with a client's body, for every API flavor and
//! kind of work. It must never panic; when it accepts a body, the model is a
//! valid, non-empty `ModelName` and is the body's top-level `"model"` string.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_core::{ApiFlavor, ModelName};
use pair_proxy::body::{RequestFacts, extract};
use pair_proxy::route::Work;

const FLAVORS: [ApiFlavor; 3] = [ApiFlavor::Ollama, ApiFlavor::OpenAi, ApiFlavor::Anthropic];
const WORKS: [Work; 3] = [Work::Generate, Work::Embed, Work::Show];

fuzz_target!(|data: &[u8]| {
    // Whether a body is accepted, and which model it names, must not depend
    // on the route it arrived on.
    let mut verdict: Option<Option<String>> = None;
    for flavor in FLAVORS {
        for work in WORKS {
            let result = extract(data, flavor, work);
            let model = result.as_ref().ok().map(|f| f.model.clone());
            match &verdict {
                None => verdict = Some(model),
                Some(first) => assert_eq!(first, &model, "{flavor:?}/{work:?} disagrees"),
            }
            if let Ok(facts) = result {
                check_accepted(data, flavor, work, &facts);
            }
        }
    }
});

fn check_accepted(data: &[u8], flavor: ApiFlavor, work: Work, facts: &RequestFacts) {
    assert!(!facts.model.trim().is_empty(), "accepted an empty model");
    assert!(
        ModelName::new(facts.model.as_str()).is_ok(),
        "accepted an invalid model name {:?}",
        facts.model
    );
    if work != Work::Generate {
        assert!(!facts.streaming, "{work:?} never streams");
    }
    // The same bytes read as a plain JSON document are an object naming
    // the same model (extract refuses bad UTF-8 and non-objects; both were
    // found by this target, see docs/fuzzing.md).
    // Two exceptions, in values extract skips: a lone surrogate escape
    // (`"\ud800"`) and a number past f64's range (`1e999`) are valid JSON
    // syntax (RFC 8259 §8.2 and §6; Python's json takes both) that
    // serde_json refuses to decode (as an engine may; its answer then says
    // why).
    let doc: serde_json::Value = match serde_json::from_slice(data) {
        Ok(doc) => doc,
        Err(e)
            if ["surrogate", "number out of range"]
                .iter()
                .any(|m| e.to_string().contains(m)) =>
        {
            return;
        }
        Err(e) => panic!("extract accepted non-JSON: {e}"),
    };
    assert!(doc.is_object(), "extract accepted a non-object");
    assert_eq!(
        doc.get("model").and_then(serde_json::Value::as_str),
        Some(facts.model.as_str())
    );
    let profile = facts.clone().profile(flavor, work, data.len());
    assert_eq!(profile.streaming, facts.streaming);
    if work != Work::Generate {
        assert_eq!(profile.max_output_tokens, 0);
    }
}
