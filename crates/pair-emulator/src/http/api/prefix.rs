//! A request's prompt as the engine's prompt cache sees it: a
//! [`PromptChain`] cut from the JSON bytes of its prompt-bearing fields in
//! the order the engine renders them (system, tools, then each message; or
//! the prompt), so every turn that re-sends a conversation shares the
//! earlier turn's blocks. Its blocks are finer than the routers' (16
//! tokens, not 64): llama.cpp reuses a common prefix to the token, and a
//! cached prompt that appends a few tokens would otherwise re-evaluate up
//! to a router's block more than the real engine does
//! (docs/engine-figures.md §5, calibration).

use pair_core::{ChainBuilder, PromptChain};
use serde_json::{Map, Value};

/// Tokens in a block of the emulated engine's own chains (a chain holds at
/// most `pair_core::prompt::MAX_BLOCKS`: 65k tokens at this size).
pub(crate) const ENGINE_BLOCK_TOKENS: u32 = 16;

/// Which fields carry the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shape {
    /// Chat: `system`, `tools`, then `messages` one by one.
    Chat,
    /// Ollama's templated generate: `system`, then `prompt`.
    Templated,
    /// A raw prompt (completions, raw generate): `prompt` alone.
    Raw,
}

/// Feeds one field's JSON; values are re-serialised, so the same value
/// gives the same bytes whatever spacing the client sent.
fn feed(b: &mut ChainBuilder, v: Option<&Value>) {
    if let Some(v) = v.filter(|v| !v.is_null())
        && let Ok(bytes) = serde_json::to_vec(v)
    {
        b.bytes(&bytes);
    }
}

/// The chain of `req`. Its tokens (four bytes of JSON each) run a little
/// past the text the engine tokenises (keys, quoting); the engine counts
/// at least as many prompt tokens, so a hit never exceeds the prompt.
pub(super) fn chain_of(req: &Map<String, Value>, shape: Shape) -> PromptChain {
    let mut b = ChainBuilder::with_block_tokens(ENGINE_BLOCK_TOKENS);
    match shape {
        Shape::Chat => {
            feed(&mut b, req.get("system"));
            feed(&mut b, req.get("tools"));
            for m in req
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                feed(&mut b, Some(m));
            }
        }
        Shape::Templated => {
            feed(&mut b, req.get("system"));
            feed(&mut b, req.get("prompt"));
        }
        Shape::Raw => feed(&mut b, req.get("prompt")),
    }
    b.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_later_turn_shares_the_earlier_turns_blocks() {
        let system = "you are a careful coding agent ".repeat(100);
        let tools = json!([{ "type": "function", "function": { "name": "Bash" } }]);
        let turn1 = obj(json!({
            "tools": tools,
            "messages": [
                { "role": "system", "content": system },
                { "role": "user", "content": "list the files ".repeat(30) },
            ]
        }));
        let mut turn2 = turn1.clone();
        turn2["messages"].as_array_mut().unwrap().extend([
            json!({ "role": "assistant", "content": "done" }),
            json!({ "role": "user", "content": "now the tests" }),
        ]);
        let (c1, c2) = (chain_of(&turn1, Shape::Chat), chain_of(&turn2, Shape::Chat));
        assert!(c2.tokens() > c1.tokens());
        // Every whole block of turn 1 is one of turn 2.
        assert_eq!(c2.common_blocks(c1.blocks()), c1.len() - 1);
        // Another conversation with the same system prompt shares its
        // blocks (those before the first user message).
        let other = obj(json!({
            "tools": tools,
            "messages": [
                { "role": "system", "content": system },
                { "role": "user", "content": "fix the bug" },
            ]
        }));
        let shared = chain_of(&other, Shape::Chat).common_blocks(c1.blocks());
        assert!(shared >= system.len() / 256, "{shared}");
        // Different tools: nothing shared.
        let mut no_tools = turn1.clone();
        no_tools.remove("tools");
        assert_eq!(
            chain_of(&no_tools, Shape::Chat).common_blocks(c1.blocks()),
            0
        );
    }

    #[test]
    fn generate_prompts_chain_their_own_fields() {
        let a = obj(json!({ "system": "be brief", "prompt": "x".repeat(600) }));
        let raw = chain_of(&a, Shape::Raw);
        let templated = chain_of(&a, Shape::Templated);
        // 600 bytes and two quotes.
        assert_eq!(raw.tokens(), 151);
        assert_eq!(templated.common_blocks(raw.blocks()), 0);
        assert_eq!(chain_of(&obj(json!({})), Shape::Raw), PromptChain::EMPTY);
    }
}
