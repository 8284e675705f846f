//! Fuzz target: an API key as a LAN client presents it (`Authorization:
//! Bearer ...` or `x-api-key`), read by `pair_identity::keys::parse_presented`
//! and checked by `KeyStore::verify` against a store holding one key.
//! Never panics; only text of the key's exact format is taken apart, and
//! only the key's own secret (alone or after `Bearer `) verifies.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pair_core::NodeId;
use pair_identity::keys::{KeyStore, parse_presented};

fn store() -> &'static (KeyStore, String) {
    static STORE: OnceLock<(KeyStore, String)> = OnceLock::new();
    STORE.get_or_init(|| {
        let keys = KeyStore::in_memory();
        let (_, secret) = keys
            .add(
                "fuzz",
                pair_identity::keys::KeyTerms::default(),
                1,
                NodeId::from_u128(1),
                &mut rand::rng(),
            )
            .expect("a key");
        let secret = secret.expose().to_owned();
        (keys, secret)
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (keys, secret) = store();
    if let Some(parsed) = parse_presented(text) {
        assert!(parsed.starts_with("pair-sk-"), "{parsed:?}");
    }
    let verified = keys.verify(text);
    let is_secret = parse_presented(text) == Some(secret.as_str());
    assert_eq!(verified.is_some(), is_secret, "{text:?}");
});
