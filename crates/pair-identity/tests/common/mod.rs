//! Fixtures shared by the pairing integration tests: an inviter serving the
//! pairing router on 127.0.0.1:0, joiner identities, PIN helpers.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use axum::Router;
use pair_core::Role;
use pair_identity::{
    Error, Identity, Limits, PairingService, PeerRecord, Pin, Refusal, TrustStore,
};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// reqwest (rustls-no-provider) panics without a process-wide provider.
pub fn plain_http() -> reqwest::Client {
    pair_identity::install_crypto_provider();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

pub struct Inviter {
    pub identity: Identity,
    pub trust: TrustStore,
    pub service: PairingService,
    pub addr: String,
    pub dir: tempfile::TempDir,
}

pub async fn serve(router: Router, tasks: &mut JoinSet<()>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tasks.spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    addr
}

pub async fn inviter(tasks: &mut JoinSet<()>) -> Inviter {
    let dir = tempfile::tempdir().unwrap();
    inviter_in(dir, tasks).await
}

pub async fn inviter_in(dir: tempfile::TempDir, tasks: &mut JoinSet<()>) -> Inviter {
    let identity = Identity::load_or_create(dir.path(), Role::Node).unwrap();
    let trust = TrustStore::open(TrustStore::default_path(dir.path())).unwrap();
    let service = PairingService::new(
        &identity,
        "inviter",
        trust.clone(),
        dir.path(),
        Limits::default(),
    )
    .unwrap();
    let addr = serve(service.router(), tasks).await;
    Inviter {
        identity,
        trust,
        service,
        addr,
        dir,
    }
}

pub fn joiner(role: Role) -> (Identity, TrustStore) {
    (Identity::generate(role).unwrap(), TrustStore::in_memory())
}

/// A PIN guaranteed to differ from `pin`.
pub fn wrong(pin: &Pin) -> Pin {
    let digits: String = pin
        .reveal()
        .bytes()
        .map(|b| char::from(b'0' + (b - b'0' + 1) % 10))
        .collect();
    digits.parse().unwrap()
}

pub fn refusal(result: Result<PeerRecord, Error>) -> Refusal {
    match result {
        Err(e) => e
            .refusal()
            .unwrap_or_else(|| panic!("not a refusal: {e:?}")),
        Ok(r) => panic!("pairing unexpectedly succeeded with {}", r.id),
    }
}
