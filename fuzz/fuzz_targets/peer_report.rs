//! Fuzz target: a peer's workload report, the `pair_core::NodeSnapshot` a
//! paired node posts as JSON to `/pair/v1/report` (decoded by the route
//! with serde_json, as here). Never panics; what decodes is in range (a
//! pressure band 0..=3, valid model names), every model a healthy engine
//! lists is found for each flavour it speaks, and it round-trips:
//! `decode(encode(s)) == s`, and the encoding is canonical (a speed past
//! f32's range, or negative, is refused at decoding). The free VRAM sum
//! never overflows. The routed prompts it carries (each naming the earlier
//! entry it extends) decode within their caps, however the bases point.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_core::{ApiFlavor, ModelName, ModelPerf, NodeSnapshot};

fuzz_target!(|data: &[u8]| {
    let Ok(report) = serde_json::from_slice::<NodeSnapshot>(data) else {
        return;
    };
    assert!(
        report.pressure.band() <= 3,
        "pressure {:?}",
        report.pressure
    );
    for engine in &report.engines {
        for m in &engine.models {
            assert!(
                ModelName::new(m.name.as_str()).is_ok(),
                "accepted model name {:?}",
                m.name.as_str()
            );
        }
    }
    // What the scheduler reads from a report: every model a healthy engine
    // lists is found, on each flavour the engine speaks.
    let _ = report.slots();
    let _ = report.vram_free_bytes();
    for engine in report.engines.iter().filter(|e| e.healthy) {
        for flavor in [ApiFlavor::Ollama, ApiFlavor::OpenAi, ApiFlavor::Anthropic] {
            if !engine.kind.serves(flavor) {
                continue;
            }
            for m in &engine.models {
                let name = m.name.as_str();
                assert!(
                    report.find_model(name, flavor).is_some(),
                    "{name:?} not found"
                );
                assert_eq!(
                    report.is_eligible(name, flavor),
                    report.liveness.is_routable()
                );
            }
        }
    }

    assert!(report.routed.len() <= pair_core::prompt::MAX_ROUTED);
    for r in &report.routed {
        assert!(r.prefix.len() <= pair_core::prompt::MAX_BLOCKS);
    }

    assert!(speeds_finite(&report), "a decoded speed is not finite");
    let wire = serde_json::to_vec(&report).expect("a decoded report encodes");
    let again: NodeSnapshot =
        serde_json::from_slice(&wire).unwrap_or_else(|e| panic!("re-encoded report refused: {e}"));
    assert_eq!(again, report, "round trip");
    assert_eq!(serde_json::to_vec(&again).unwrap(), wire, "not canonical");
});

fn speeds_finite(report: &NodeSnapshot) -> bool {
    let finite = |p: &ModelPerf| p.prefill_tps.is_finite() && p.decode_tps.is_finite();
    report.base_perf.as_ref().is_none_or(finite)
        && report
            .engines
            .iter()
            .flat_map(|e| &e.models)
            .all(|m| m.perf.as_ref().is_none_or(finite))
}
