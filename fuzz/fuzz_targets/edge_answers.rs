//! Fuzz target: what a node tells an edge client over mTLS, decoded by the
//! SDK with serde_json as here: the probe answer
//! (`pair_link::edge::ProbeAnswer`, `GET /pair/v1/probe`) and the pins
//! a node vouches for (`Vec<VouchedPin>`, `GET /pair/v1/members`). The
//! first byte picks which. Never panics; what decodes round-trips, and a
//! vouched pin whose fingerprint is not its certificate's is never taken
//! by a trust store.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pair_link::edge::{ProbeAnswer, VouchedPin};
use pair_core::{NodeId, Role};

fuzz_target!(|data: &[u8]| {
    let Some((&which, json)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        let Ok(answer) = serde_json::from_slice::<ProbeAnswer>(json) else {
            return;
        };
        let wire = serde_json::to_vec(&answer).expect("a decoded answer encodes");
        let again: ProbeAnswer = serde_json::from_slice(&wire).expect("re-encoded answer decodes");
        assert_eq!(again, answer, "round trip");
    } else {
        let Ok(pins) = serde_json::from_slice::<Vec<VouchedPin>>(json) else {
            return;
        };
        let wire = serde_json::to_vec(&pins).expect("encodes");
        let again: Vec<VouchedPin> = serde_json::from_slice(&wire).expect("decodes");
        assert_eq!(again, pins, "round trip");
        let store = pair_identity::TrustStore::in_memory();
        let records: Vec<_> = pins.into_iter().map(|p| p.record).collect();
        let voucher = NodeId::from_u128(u128::MAX);
        let _ = store.reconcile_vouched(voucher, Role::Client, &records);
        for pinned in store.peers() {
            assert_eq!(
                pair_identity::Fingerprint::of(&pinned.cert_der),
                pinned.fingerprint,
                "a pin whose fingerprint is not its certificate's"
            );
            assert_eq!(pinned.vouched_by, Some(voucher));
            assert_eq!(pinned.role, Role::Client);
        }
    }
});
