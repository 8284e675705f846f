//! Benchmarks of discovery's pure cores: the TXT codec (run for every mDNS
//! answer) and the peer table's tick and view (run on every event).

#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use pair_core::NodeId;
use pair_discovery::{
    LivenessConfig, PeerTable, ProbeOk, TxtRecord, decode_txt_wire, encode_txt_wire,
};

fn record() -> TxtRecord {
    TxtRecord {
        id: NodeId::from_u128(0x6f1c_1d8e_3f5e_4b8a_9f55_2f1f_4f0e_9a11),
        cluster_port: 14318,
        addrs: ["192.168.1.20", "10.0.0.7", "fd00::7", "2001:db8::5"]
            .iter()
            .map(|s| s.parse::<IpAddr>().unwrap())
            .collect(),
    }
}

fn txt(c: &mut Criterion) {
    let r = record();
    let wire = encode_txt_wire(&r);
    c.bench_function("txt/decode_wire_4_addrs", |b| {
        b.iter(|| decode_txt_wire(black_box(&wire)).unwrap())
    });
    c.bench_function("txt/encode_wire_4_addrs", |b| {
        b.iter(|| encode_txt_wire(black_box(&r)))
    });
}

fn table(c: &mut Criterion) {
    const PEERS: u128 = 256;
    let mut t = PeerTable::new(NodeId::from_u128(0), LivenessConfig::default());
    let now = Duration::from_secs(1);
    for n in 1..=PEERS {
        let mut r = record();
        r.id = NodeId::from_u128(n);
        t.on_announce(now, &format!("{n}._pair-node._tcp.local."), &r, &[]);
    }
    for req in t.tick(now) {
        let ok = ProbeOk {
            id: req.id,
            name: "n".into(),
            addr: req.addrs[0],
            port: req.port,
            rtt_us: 200,
            info: None,
        };
        t.on_probe_result(now, req.id, Ok(ok));
    }
    c.bench_function("table/tick_256_peers_none_due", |b| {
        b.iter(|| black_box(t.tick(now + Duration::from_millis(100))))
    });
    c.bench_function("table/view_256_peers", |b| {
        b.iter(|| black_box(t.view(now, 1_000)))
    });
}

criterion_group!(benches, txt, table);
criterion_main!(benches);
