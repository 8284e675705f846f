//! Fuzz target: model names (`pair_core::ModelName`), which arrive in every
//! request body and every peer's listing. `new` never panics and accepts only
//! non-empty, bounded names without control characters; `matches` is
//! reflexive and symmetric, agrees with `canonical`, and is exact equality on
//! engines without an implicit tag; `canonical` is idempotent.
//!
//! Input: two names separated by the first NUL byte (or one name twice).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_core::{EngineKind, ModelName, model::MAX_MODEL_NAME_LEN};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (a, b) = text.split_once('\0').unwrap_or((&text, &text));
    let (Some(ma), mb) = (check_new(a), check_new(b)) else {
        return;
    };
    for kind in EngineKind::ALL {
        assert!(ma.matches(a, kind), "{a:?} does not match itself on {kind:?}");
        let canon = ma.canonical(kind);
        if let Ok(mc) = ModelName::new(canon.as_str()) {
            assert_eq!(mc.canonical(kind), canon, "canonical not idempotent");
            assert!(ma.matches(&canon, kind), "{a:?} does not match {canon:?}");
        }
        let Some(mb) = &mb else { continue };
        let ab = ma.matches(b, kind);
        assert_eq!(ab, mb.matches(a, kind), "matches is not symmetric: {a:?} {b:?} {kind:?}");
        if kind.has_implicit_latest_tag() {
            let same = canon.eq_ignore_ascii_case(&mb.canonical(kind));
            assert_eq!(ab, same, "matches and canonical disagree: {a:?} {b:?}");
        } else {
            assert_eq!(ab, a == b, "{kind:?} compares exactly");
        }
    }
});

fn check_new(raw: &str) -> Option<ModelName> {
    let ok = ModelName::new(raw).ok()?;
    assert_eq!(ok.as_str(), raw, "the name is kept as given");
    assert!(!raw.trim().is_empty());
    assert!(raw.len() <= MAX_MODEL_NAME_LEN);
    assert!(!raw.chars().any(char::is_control));
    Some(ok)
}
