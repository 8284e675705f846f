//! Finding the model entry that serves a request, fast: the same answer as
//! `NodeSnapshot::find_model`, with a length pre-filter so that most
//! non-matching entries are rejected without splitting their names.

use pair_core::model::split_tag;
use pair_core::{ApiFlavor, EngineSnapshot, ModelEntry, NodeSnapshot};

/// The requested model, split once per ranking.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wanted<'a> {
    name: &'a str,
    flavor: ApiFlavor,
    /// Byte lengths an Ollama-style name matching `name` can have:
    /// `base:tag`, and when the tag is `latest`, `base` and `base:`.
    tagged_len: usize,
    base_len: Option<usize>,
}

impl<'a> Wanted<'a> {
    pub(crate) fn new(name: &'a str, flavor: ApiFlavor) -> Self {
        let (base, tag) = split_tag(name);
        Self {
            name,
            flavor,
            tagged_len: base.len() + 1 + tag.len(),
            base_len: tag.eq_ignore_ascii_case("latest").then_some(base.len()),
        }
    }

    /// Could `entry` match at all? Never false for a name that matches.
    fn may_match(&self, entry: &str, implicit_latest: bool) -> bool {
        let n = entry.len();
        if implicit_latest {
            n == self.tagged_len || self.base_len.is_some_and(|b| n == b || n == b + 1)
        } else {
            n == self.name.len()
        }
    }

    fn find_in<'e>(&self, engine: &'e EngineSnapshot) -> Option<&'e ModelEntry> {
        if !engine.healthy || !engine.kind.serves(self.flavor) {
            return None;
        }
        let implicit = engine.kind.has_implicit_latest_tag();
        // Byte-equal names match under every engine's rule; the common case
        // (a client naming the model as the inventory does) stops there.
        engine.models.iter().find(|m| {
            let name = m.name.as_str();
            name == self.name
                || (self.may_match(name, implicit) && m.name.matches(self.name, engine.kind))
        })
    }

    /// `node.find_model(name, flavor)`: the first match in each engine,
    /// the preferred copy across engines
    /// ([`EngineSnapshot::preferred_over`]).
    pub(crate) fn find<'n>(
        &self,
        node: &'n NodeSnapshot,
    ) -> Option<(&'n EngineSnapshot, &'n ModelEntry)> {
        let mut best: Option<(&EngineSnapshot, &ModelEntry)> = None;
        for engine in &node.engines {
            if let Some(entry) = self.find_in(engine)
                && best.is_none_or(|(e, b)| engine.preferred_over(entry, e, b))
            {
                best = Some((engine, entry));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pair_core::{EngineKind, ModelName, NodeId};
    use proptest::prelude::*;

    /// (kind, healthy, [(model name, loaded)]) per engine.
    type EngineSpec = (EngineKind, bool, Vec<(String, bool)>);

    fn node(engines: Vec<EngineSpec>) -> NodeSnapshot {
        let mut n = NodeSnapshot::new(NodeId::from_u128(1), "n");
        for (kind, healthy, models) in engines {
            n.engines.push(EngineSnapshot {
                kind,
                healthy,
                silent: false,
                continues_chat: None,
                slots: 1,
                models: models
                    .into_iter()
                    .filter_map(|(name, loaded)| {
                        Some(ModelEntry {
                            name: ModelName::new(name).ok()?,
                            size_bytes: None,
                            loaded,
                            perf: None,
                            learned: false,
                        })
                    })
                    .collect(),
            });
        }
        n
    }

    const NAME: &str = "(reg:5000/)?(ns/)?[lLqQ]{1,3}(:|:latest|:LATEST|:7b|:)?";

    proptest! {
        #[test]
        fn agrees_with_pair_core_find_model(
            engines in prop::collection::vec(
                (
                    prop::sample::select(&EngineKind::ALL[..]),
                    prop::bool::weighted(0.9),
                    prop::collection::vec((NAME, any::<bool>()), 0..4),
                ),
                0..3,
            ),
            requested in NAME,
            flavor in prop::sample::select(&[ApiFlavor::Ollama, ApiFlavor::OpenAi, ApiFlavor::Anthropic][..]),
        ) {
            let n = node(engines);
            let want = n.find_model(&requested, flavor).map(|(_, e)| e as *const ModelEntry);
            let got = Wanted::new(&requested, flavor).find(&n).map(|(_, e)| e as *const ModelEntry);
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn ollama_latest_forms_pass_the_length_filter() {
        let w = Wanted::new("llama3", ApiFlavor::Ollama);
        for entry in ["llama3", "llama3:", "LLAMA3:latest"] {
            assert!(w.may_match(entry, true), "{entry}");
        }
        assert!(!w.may_match("llama3:8b", true));
        assert!(!w.may_match("llama3:latest", false));
    }
}
