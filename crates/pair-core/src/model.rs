//! Model names, with Ollama's rule that an untagged name means `:latest`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{CoreError, EngineKind};

/// Longest model name accepted. Real names are far shorter; the cap keeps a
/// hostile request from making every comparison expensive.
pub const MAX_MODEL_NAME_LEN: usize = 512;

/// A model name as an engine reports it or a request names it.
///
/// The text is kept exactly as given; comparison is engine-aware through
/// [`ModelName::matches`], so no allocation happens on the routing path.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ModelName(String);

impl ModelName {
    pub fn new(raw: impl Into<String>) -> Result<Self, CoreError> {
        let raw = raw.into();
        let reason = if raw.trim().is_empty() {
            Some("empty")
        } else if raw.len() > MAX_MODEL_NAME_LEN {
            Some("longer than 512 bytes")
        } else if raw.chars().any(char::is_control) {
            Some("contains control characters")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(CoreError::BadModelName { input: raw, reason }),
            None => Ok(Self(raw)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a request for `requested` can be served by this model on an
    /// engine of `kind`. Ollama: `llama3` and `llama3:latest` are the same
    /// model (and names compare case-insensitively, as Ollama does); other
    /// engines: exact match.
    pub fn matches(&self, requested: &str, kind: EngineKind) -> bool {
        if kind.has_implicit_latest_tag() {
            let (a_base, a_tag) = split_tag(&self.0);
            let (b_base, b_tag) = split_tag(requested);
            a_base.eq_ignore_ascii_case(b_base) && a_tag.eq_ignore_ascii_case(b_tag)
        } else {
            self.0 == requested
        }
    }

    /// The name with its tag spelled out where the engine implies one
    /// (`llama3` -> `llama3:latest` on Ollama). Used to de-duplicate listings.
    pub fn canonical(&self, kind: EngineKind) -> String {
        if kind.has_implicit_latest_tag() {
            let (base, tag) = split_tag(&self.0);
            format!("{base}:{tag}")
        } else {
            self.0.clone()
        }
    }
}

/// Splits `namespace/model:tag` into (`namespace/model`, `tag`), with `latest`
/// when no tag is given. A colon before the last slash belongs to a registry
/// host (`host:5000/model`), not to a tag. Ollama's rule, which
/// [`ModelName::matches`] applies to both names; public so a router that
/// pre-filters candidates (pair-scheduler's matcher) splits the same way.
pub fn split_tag(name: &str) -> (&str, &str) {
    let after_slash = name.rfind('/').map_or(0, |i| i + 1);
    match name[after_slash..].rfind(':') {
        Some(i) if after_slash + i + 1 < name.len() => {
            (&name[..after_slash + i], &name[after_slash + i + 1..])
        }
        Some(i) => (&name[..after_slash + i], "latest"),
        None => (name, "latest"),
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelName({:?})", self.0)
    }
}

impl TryFrom<String> for ModelName {
    type Error = CoreError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<ModelName> for String {
    fn from(m: ModelName) -> String {
        m.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(s: &str) -> ModelName {
        ModelName::new(s).unwrap()
    }

    #[test]
    fn ollama_untagged_means_latest() {
        let o = EngineKind::Ollama;
        assert!(m("llama3:latest").matches("llama3", o));
        assert!(m("llama3").matches("llama3:latest", o));
        assert!(m("llama3").matches("LLaMA3", o));
        assert!(!m("llama3:8b").matches("llama3", o));
        assert!(m("library/qwen2.5:0.5b").matches("library/qwen2.5:0.5b", o));
        assert!(m("host:5000/ns/model").matches("host:5000/ns/model:latest", o));
        assert_eq!(
            m("host:5000/ns/model").canonical(o),
            "host:5000/ns/model:latest"
        );
        assert_eq!(m("a:").canonical(o), "a:latest");
    }

    #[test]
    fn other_engines_match_exactly() {
        for k in [EngineKind::LmStudio, EngineKind::OpenAiCompat] {
            assert!(m("smollm2").matches("smollm2", k));
            assert!(!m("smollm2").matches("smollm2:latest", k));
            assert!(!m("smollm2").matches("SmolLM2", k));
        }
    }

    #[test]
    fn rejects_empty_long_and_control() {
        assert!(ModelName::new("").is_err());
        assert!(ModelName::new("  ").is_err());
        assert!(ModelName::new("a\nb").is_err());
        assert!(ModelName::new("x".repeat(513)).is_err());
        assert!(serde_json::from_str::<ModelName>("\"\"").is_err());
    }

    proptest! {
        #[test]
        fn matching_is_symmetric_and_reflexive(a in "[a-z0-9/:._-]{1,24}", b in "[a-z0-9/:._-]{1,24}") {
            for k in EngineKind::ALL {
                let ma = m(&a);
                let mb = m(&b);
                prop_assert!(ma.matches(&a, k));
                prop_assert_eq!(ma.matches(&b, k), mb.matches(&a, k));
                if ma.matches(&b, k) {
                    prop_assert_eq!(ma.canonical(k).to_lowercase(), mb.canonical(k).to_lowercase());
                }
            }
        }
    }
}
