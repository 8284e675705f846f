//! What the LAN face adds to a request before the pipeline: the door's
//! rules ([`pair_proxy::lan::Lan::admit`]: `Host`, the address's record of
//! wrong keys, the key's hash looked up, the key's rate).
//!
//! `cargo bench -p pair-proxy --bench lan -- --warm-up-time 1 --measurement-time 3`

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, HeaderValue, Method};
use pair_core::NodeId;
use pair_http::h1::Headers;
use pair_identity::keys::KeyStore;
use pair_proxy::lan::{Admitted, Lan, LanConfig};

fn bench(c: &mut Criterion) {
    let keys = KeyStore::in_memory();
    let node = NodeId::from_u128(1);
    let mut rng = rand::rng();
    // A few hundred keys: the lookup is by hash, not a scan.
    for i in 0..300 {
        keys.add(
            &format!("k{i}"),
            pair_identity::keys::KeyTerms {
                models: Vec::new(),
                rate_per_min: None,
                ..pair_identity::keys::KeyTerms::default()
            },
            1,
            node,
            &mut rng,
        )
        .unwrap();
    }
    let (_, plain) = keys
        .add(
            "plain",
            pair_identity::keys::KeyTerms {
                models: Vec::new(),
                rate_per_min: None,
                ..pair_identity::keys::KeyTerms::default()
            },
            1,
            node,
            &mut rng,
        )
        .unwrap();
    let (_, rated) = keys
        .add(
            "rated",
            pair_identity::keys::KeyTerms {
                models: Vec::new(),
                rate_per_min: std::num::NonZeroU32::new(1_000_000_000),
                ..pair_identity::keys::KeyTerms::default()
            },
            1,
            node,
            &mut rng,
        )
        .unwrap();
    let lan = Lan::new(LanConfig {
        keys,
        hosts: vec!["gpu-box.lan".into()],
        origins: Vec::new(),
        per_address: 32,
    });
    let ip: IpAddr = "192.168.1.20".parse().unwrap();
    for (name, secret) in [("admit a key", plain), ("admit a key with a rate", rated)] {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("gpu-box.lan:8443"));
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {}", secret.expose())).unwrap(),
        );
        let headers = Headers::Map(h);
        c.bench_function(name, |b| {
            b.iter(|| {
                let a = lan.admit(ip, &Method::POST, "/v1/chat/completions", &headers);
                assert!(matches!(a, Admitted::Key(..)));
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
