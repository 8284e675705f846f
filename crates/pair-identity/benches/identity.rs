//! Costs of pairing and of the pinned-certificate checks that run on every
//! peer handshake. Numbers and the command live in docs/benchmarks/pair-identity.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use pair_core::{NodeId, Role};
use pair_identity::wire::{JoinerHello, Message};
use pair_identity::{
    Expect, FailureLedger, Fingerprint, Identity, Inviter, Joiner, Limits, LocalParty, PeerRecord,
    TrustStore, client_config, server_config,
};
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn record_of(identity: &Identity) -> PeerRecord {
    PeerRecord {
        id: identity.id(),
        name: "peer".into(),
        role: identity.role(),
        cert_der: identity.cert_der().to_vec(),
        fingerprint: identity.fingerprint(),
        paired_at: 0,
        vouched_by: None,
    }
}

fn pairing(c: &mut Criterion) {
    let inviter_id = Identity::generate(Role::Node).expect("identity");
    let joiner_id = Identity::generate(Role::Node).expect("identity");
    let inviter_me = LocalParty::new(&inviter_id, "inviter").expect("party");
    let joiner_me = LocalParty::new(&joiner_id, "joiner").expect("party");
    let mut rng = StdRng::seed_from_u64(1);
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    c.bench_function("pairing/full_exchange_in_memory", |b| {
        b.iter(|| {
            let mut inviter = Inviter::new(
                inviter_me.clone(),
                Limits::default(),
                FailureLedger::default(),
            );
            let pin = inviter.open_invite(now, &mut rng).expect("invite");
            let (joiner, hello) = Joiner::start(&joiner_me, &pin, &mut rng);
            let reply = inviter
                .on_joiner_hello(&hello, now, &mut rng)
                .expect("hello");
            let (confirmed, confirm) = joiner.on_inviter_hello(&reply, now).expect("reply");
            let (done, record) = inviter.on_joiner_confirm(&confirm, now).expect("confirm");
            black_box((confirmed.on_inviter_done(&done).expect("done"), record))
        });
    });

    let pin = "123456".parse().expect("pin");
    let (_, hello) = Joiner::start(&joiner_me, &pin, &mut rng);
    let bytes = hello.encode();
    c.bench_function("wire/decode_joiner_hello", |b| {
        b.iter(|| black_box(JoinerHello::decode(black_box(&bytes)).expect("decode")));
    });
}

fn pinning(c: &mut Criterion) {
    let peer = Identity::generate(Role::Node).expect("identity");
    let store = TrustStore::in_memory();
    for i in 0..99u128 {
        let cert = format!("other-{i}").into_bytes();
        store
            .insert(PeerRecord {
                id: NodeId::from_u128(i),
                name: "x".into(),
                role: Role::Node,
                fingerprint: Fingerprint::of(&cert),
                cert_der: cert,
                paired_at: 0,
                vouched_by: None,
            })
            .expect("insert");
    }
    store.insert(record_of(&peer)).expect("insert");
    let der = peer.cert_der().to_vec();
    c.bench_function("trust/pinned_lookup_100_peers", |b| {
        b.iter(|| black_box(store.pinned(black_box(&der))));
    });
}

fn handshake(c: &mut Criterion) {
    pair_identity::install_crypto_provider();
    let server = Identity::generate(Role::Node).expect("identity");
    let client = Identity::generate(Role::Node).expect("identity");
    let server_trust = TrustStore::in_memory();
    let client_trust = TrustStore::in_memory();
    server_trust.insert(record_of(&client)).expect("pin");
    client_trust.insert(record_of(&server)).expect("pin");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(
        server_config(&server, &server_trust).expect("server config"),
    ));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(
        client_config(&client, &client_trust, Expect::Peer(server.id())).expect("client config"),
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let _ = SystemTime::now();
    c.bench_function("tls/mutual_handshake_in_memory_pipe", |b| {
        b.iter(|| {
            rt.block_on(async {
                let (a, z) = tokio::io::duplex(64 * 1024);
                let accept = async {
                    let mut s = acceptor.accept(z).await.expect("accept");
                    let mut buf = [0u8; 1];
                    s.read_exact(&mut buf).await.expect("read");
                };
                let connect = async {
                    let mut s = connector
                        .connect(pair_identity::server_name(), a)
                        .await
                        .expect("connect");
                    s.write_all(b"x").await.expect("write");
                    s.flush().await.expect("flush");
                    s
                };
                let (_, s) = tokio::join!(accept, connect);
                black_box(s)
            })
        });
    });
}

criterion_group!(benches, pairing, pinning, handshake);
criterion_main!(benches);
