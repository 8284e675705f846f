//! Prompt caching, as llama.cpp's and Ollama's slots do it: each slot keeps
//! the context of the last conversation it served, so the next turn of that
//! conversation prefills only what is new. A conversation is named by its
//! messages up to the first user message (every turn re-sends them); the
//! least recently used entry gives way when all slots hold one.

use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use serde_json::{Map, Value};

/// The cached contexts, one per slot at most.
#[derive(Debug)]
pub(crate) struct PromptCache {
    capacity: usize,
    /// (conversation, context tokens, last use).
    entries: Mutex<Vec<(u64, u32, u64)>>,
}

impl PromptCache {
    pub(crate) fn new(slots: u32) -> Self {
        Self {
            capacity: slots.max(1) as usize,
            entries: Mutex::new(Vec::new()),
        }
    }

    /// A turn of `conversation` with `prompt_tokens` of context asks for
    /// `output_tokens`: how many of its prompt tokens are cached (at least
    /// one is always prefilled). The context the answer leaves is cached.
    pub(crate) fn turn(&self, conversation: u64, prompt_tokens: u32, output_tokens: u32) -> u32 {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let clock = entries.iter().map(|e| e.2).max().unwrap_or(0) + 1;
        let context = prompt_tokens.saturating_add(output_tokens);
        match entries.iter_mut().find(|e| e.0 == conversation) {
            Some(e) => {
                let hit = e.1.min(prompt_tokens.saturating_sub(1));
                *e = (conversation, context, clock);
                hit
            }
            None => {
                if entries.len() >= self.capacity
                    && let Some(oldest) = entries
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, e)| e.2)
                        .map(|(k, _)| k)
                {
                    entries.swap_remove(oldest);
                }
                entries.push((conversation, context, clock));
                0
            }
        }
    }
}

/// The conversation of a chat request: its model and messages up to the
/// first user message. `None` without a user message.
pub(crate) fn conversation(model: &str, req: &Map<String, Value>) -> Option<u64> {
    let messages = req.get("messages")?.as_array()?;
    let first_user = messages
        .iter()
        .position(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    model.hash(&mut h);
    for m in &messages[..=first_user] {
        m.get("role").and_then(Value::as_str).hash(&mut h);
        m.get("content").map(Value::to_string).hash(&mut h);
    }
    Some(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_later_turn_prefills_only_what_is_new() {
        let c = PromptCache::new(2);
        assert_eq!(c.turn(1, 300, 100), 0);
        // The next turn re-sends the 400 tokens of context and 50 new ones.
        assert_eq!(c.turn(1, 450, 100), 400);
        // Two other conversations push the first out of both slots.
        assert_eq!(c.turn(2, 100, 10), 0);
        assert_eq!(c.turn(3, 100, 10), 0);
        assert_eq!(c.turn(1, 600, 10), 0);
        // A re-sent prompt no longer than the cache still prefills a token.
        assert_eq!(c.turn(1, 600, 10), 599);
    }

    #[test]
    fn every_turn_names_the_same_conversation() {
        let first = json!({ "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": "plan a trip" },
        ]});
        let later = json!({ "messages": [
            { "role": "system", "content": "be brief" },
            { "role": "user", "content": "plan a trip" },
            { "role": "assistant", "content": "where to?" },
            { "role": "user", "content": "Oslo" },
        ]});
        let other = json!({ "messages": [{ "role": "user", "content": "hi" }]});
        let of = |v: &Value| conversation("m", v.as_object().unwrap());
        assert_eq!(of(&first), of(&later));
        assert_ne!(of(&first), of(&other));
        assert_ne!(of(&first), conversation("n", first.as_object().unwrap()));
        assert_eq!(of(&json!({ "messages": [] })), None);
    }
}
