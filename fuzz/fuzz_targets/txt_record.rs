//! Fuzz target: the mDNS TXT record decoder (`pair_discovery::decode_txt_wire`)
//! on raw RDATA from the network. Never panics; whatever it accepts is in
//! range and round-trips: encoding the record (as wire bytes or as key/value
//! pairs) decodes to the same record, and the encoding is canonical.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_discovery::{MAX_ADDRS, decode_txt, decode_txt_wire, encode_txt, encode_txt_wire};

fuzz_target!(|data: &[u8]| {
    let Ok(record) = decode_txt_wire(data) else {
        return;
    };
    assert_ne!(record.cluster_port, 0);
    assert!(record.addrs.len() <= MAX_ADDRS);
    for ip in &record.addrs {
        assert!(!ip.is_unspecified() && !ip.is_multicast(), "accepted {ip}");
    }

    let wire = encode_txt_wire(&record);
    assert_eq!(decode_txt_wire(&wire).as_ref(), Ok(&record), "wire round trip");

    let pairs = encode_txt(&record);
    let entries = pairs.iter().map(|(k, v)| (k.as_str(), Some(v.as_bytes())));
    assert_eq!(decode_txt(entries).as_ref(), Ok(&record), "pairs round trip");

    // Canonical: one record, one encoding.
    if let Ok(again) = decode_txt_wire(&wire) {
        assert_eq!(encode_txt_wire(&again), wire);
    }
});
