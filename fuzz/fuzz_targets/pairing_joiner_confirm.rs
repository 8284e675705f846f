//! Fuzz target: the pairing `joiner_confirm` decoder
//! (`pair_identity::wire::decode_joiner_confirm`) on untrusted bytes; see common.rs
//! for the properties.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use pair_identity::wire::decode_joiner_confirm;

fuzz_target!(|data: &[u8]| common::check(data, decode_joiner_confirm));
