//! Fuzz target: the pairing `error_reply` decoder
//! (`pair_identity::wire::decode_error_reply`) on untrusted bytes; see common.rs
//! for the properties.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use pair_identity::wire::decode_error_reply;

fuzz_target!(|data: &[u8]| common::check(data, decode_error_reply));
