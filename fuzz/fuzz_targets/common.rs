//! Shared property for the pairing message targets: decoding untrusted bytes
//! never panics, and whatever decodes re-encodes to bytes that decode to the
//! same message, canonically, and only as their own kind.

use std::fmt::Debug;

use pair_identity::wire::{
    DecodeError, MAX_MESSAGE_BYTES, Message, decode_error_reply, decode_inviter_done,
    decode_inviter_hello, decode_joiner_confirm, decode_joiner_hello,
};

pub fn check<M: Message + PartialEq + Debug>(
    data: &[u8],
    decode: fn(&[u8]) -> Result<M, DecodeError>,
) {
    let decoded = decode(data);
    if data.len() > MAX_MESSAGE_BYTES {
        assert!(matches!(decoded, Err(DecodeError::TooLarge)), "size cap not enforced");
    }
    let Ok(message) = decoded else {
        return;
    };
    let bytes = message.encode();
    let again = decode(&bytes).unwrap_or_else(|e| {
        panic!(
            "our own encoding does not decode ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(again, message, "round trip changed the message");
    assert_eq!(again.encode(), bytes, "encoding is not canonical");

    // A message is never mistaken for another kind.
    let accepted = [
        decode_joiner_hello(&bytes).is_ok(),
        decode_inviter_hello(&bytes).is_ok(),
        decode_joiner_confirm(&bytes).is_ok(),
        decode_inviter_done(&bytes).is_ok(),
        decode_error_reply(&bytes).is_ok(),
    ];
    assert_eq!(accepted.iter().filter(|a| **a).count(), 1, "{accepted:?}");
}
