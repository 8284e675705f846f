//! Fuzz target: the pairing `inviter_hello` decoder
//! (`pair_identity::wire::decode_inviter_hello`) on untrusted bytes; see common.rs
//! for the properties.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use pair_identity::wire::decode_inviter_hello;

fuzz_target!(|data: &[u8]| common::check(data, decode_inviter_hello));
