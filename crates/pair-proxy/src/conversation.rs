//! Which conversation a chat request belongs to, without a client header:
//! every turn of a chat re-sends the conversation from its start, so the
//! model, the system prompt and the first user message name it. A first
//! turn binds that name to the node that serves it; a later turn (one that
//! carries an assistant message) is routed by it, so a multi-turn chat
//! stays where its prompt cache is. Two first turns that happen to be
//! identical do not pull each other anywhere: only continuations follow a
//! binding.

use std::borrow::Cow;

use pair_core::SessionKey;
use serde::Deserialize;
use serde_json::value::RawValue;

/// A chat request's conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub key: SessionKey,
    /// The request carries an earlier answer: a later turn.
    pub continues: bool,
}

#[derive(Deserialize)]
struct Chat<'a> {
    #[serde(borrow)]
    model: Cow<'a, str>,
    /// Anthropic's system prompt is beside the messages.
    #[serde(default, borrow)]
    system: Option<&'a RawValue>,
    #[serde(borrow)]
    messages: Vec<Message<'a>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// The conversation of a chat body (Ollama's `/api/chat`, OpenAI's chat
/// completions, Anthropic's messages), if it has a user message. Content is
/// compared as the client wrote it: SDKs write a message the same way each
/// turn.
pub fn of(body: &[u8]) -> Option<Conversation> {
    let chat: Chat<'_> = serde_json::from_slice(body).ok()?;
    let first_user = chat.messages.iter().position(|m| m.role == "user")?;
    let mut name = Vec::with_capacity(256);
    name.extend_from_slice(chat.model.as_bytes());
    if let Some(system) = chat.system {
        name.push(0);
        name.extend_from_slice(system.get().as_bytes());
    }
    for m in &chat.messages[..=first_user] {
        name.push(0);
        name.extend_from_slice(m.role.as_bytes());
        name.push(0);
        name.extend_from_slice(m.content.map_or("", |c| c.get()).as_bytes());
    }
    Some(Conversation {
        key: SessionKey::of(&name),
        continues: chat.messages[first_user..]
            .iter()
            .any(|m| m.role == "assistant"),
    })
}

/// [`of`] for the request path: bodies over
/// [`crate::body::INLINE_SCAN_MAX`] are read on the blocking pool, as their
/// routing fields are.
pub async fn of_off_loop(body: &bytes::Bytes) -> Option<Conversation> {
    if body.len() <= crate::body::INLINE_SCAN_MAX {
        return of(body);
    }
    let b = body.clone();
    match tokio::task::spawn_blocking(move || of(&b)).await {
        Ok(c) => c,
        // The blocking pool is gone (shutting down): read it here.
        Err(_) => of(body),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn conv(v: &Value) -> Option<Conversation> {
        of(&serde_json::to_vec(v).unwrap())
    }

    #[test]
    fn every_turn_of_a_chat_names_the_same_conversation() {
        let sys = json!({"role": "system", "content": "be brief"});
        let u1 = json!({"role": "user", "content": "plan a trip"});
        let a1 = json!({"role": "assistant", "content": "where to?"});
        let u2 = json!({"role": "user", "content": "Oslo"});
        let first = conv(&json!({"model": "m", "messages": [sys, u1]})).unwrap();
        let second = conv(&json!({"model": "m", "messages": [sys, u1, a1, u2]})).unwrap();
        assert_eq!(first.key, second.key);
        assert!(!first.continues && second.continues);
        // Another first message, system prompt or model is another chat.
        for other in [
            json!({"model": "m", "messages": [sys, {"role": "user", "content": "plan a party"}]}),
            json!({"model": "m", "messages": [u1]}),
            json!({"model": "m2", "messages": [sys, u1]}),
        ] {
            assert_ne!(conv(&other).unwrap().key, first.key, "{other}");
        }
        // Anthropic: the system prompt beside the messages, content blocks.
        let blocks = json!([{"type": "text", "text": "hi"}]);
        let a = conv(&json!({"model": "c", "system": "s", "max_tokens": 9,
                             "messages": [{"role": "user", "content": blocks}]}))
        .unwrap();
        let b = conv(&json!({"model": "c", "system": "t", "max_tokens": 9,
                             "messages": [{"role": "user", "content": blocks}]}))
        .unwrap();
        assert_ne!(a.key, b.key);
        // No user message, no messages, not JSON: no conversation.
        assert_eq!(conv(&json!({"model": "m", "messages": [sys]})), None);
        assert_eq!(conv(&json!({"model": "m", "prompt": "x"})), None);
        assert_eq!(of(b"{"), None);
    }

    proptest! {
        /// However long a chat grows, each turn names the conversation its
        /// first turn named, and only later turns continue it.
        #[test]
        fn a_growing_chat_keeps_its_name(
            first in "[a-z ]{1,40}",
            turns in prop::collection::vec(("[a-z ]{0,40}", "[a-z ]{1,40}"), 1..6),
        ) {
            let mut messages = vec![json!({"role": "user", "content": first})];
            let start = conv(&json!({"model": "m", "messages": messages})).unwrap();
            prop_assert!(!start.continues);
            for (answer, next) in turns {
                messages.push(json!({"role": "assistant", "content": answer}));
                messages.push(json!({"role": "user", "content": next}));
                let turn = conv(&json!({"model": "m", "stream": true, "messages": messages})).unwrap();
                prop_assert_eq!(turn.key, start.key);
                prop_assert!(turn.continues);
            }
        }
    }
}
