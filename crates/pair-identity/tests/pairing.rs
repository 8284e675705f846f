//! Pairing end to end over real HTTP on 127.0.0.1: success, wrong PINs,
//! invite closing, a certificate-swapping relay, replays, and the
//! persisted hourly failure cap.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use pair_core::Role;
use pair_identity::wire::{CertBytes, InviterHello, JoinerHello, Message, PeerName};
use pair_identity::{Error, Identity, Limits, PairingService, Pin, Refusal, TrustStore, join};
use tokio::task::JoinSet;

use common::{inviter, inviter_in, joiner, plain_http, refusal, serve, wrong};

#[tokio::test]
async fn two_identities_pair_and_both_stores_hold_each_other() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    for role in [Role::Node, Role::Client] {
        let (me, my_trust) = joiner(role);
        let pin = inv.service.open_invite(SystemTime::now()).unwrap();
        let typed: Pin = format!("{}-{}", &pin.reveal()[..3], &pin.reveal()[3..])
            .parse()
            .unwrap();
        let record = join(&inv.addr, &typed, &me, &my_trust, "laptop")
            .await
            .unwrap();

        assert_eq!(record.id, inv.identity.id());
        assert_eq!(record.role, Role::Node);
        assert_eq!(record.name, "inviter");
        assert_eq!(record.fingerprint, inv.identity.fingerprint());
        assert_eq!(my_trust.get(inv.identity.id()), Some(record));

        let theirs = inv.trust.get(me.id()).expect("inviter pinned the joiner");
        assert_eq!(theirs.role, role);
        assert_eq!(theirs.name, "laptop");
        assert_eq!(theirs.fingerprint, me.fingerprint());
        assert_eq!(theirs.cert_der, me.cert_der().to_vec());
        // The invite is used up.
        assert!(inv.service.invite_status(SystemTime::now()).is_none());
        assert_eq!(inv.service.recent_failures(SystemTime::now()), 0);
    }
    // Persisted: a restart of the inviter still trusts both.
    let reopened = TrustStore::open(inv.trust.path().unwrap()).unwrap();
    assert_eq!(reopened.peers().len(), 2);
}

#[tokio::test]
async fn wrong_pin_fails_clearly_and_writes_no_trust() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    let err = join(&inv.addr, &wrong(&pin), &me, &my_trust, "laptop")
        .await
        .unwrap_err();
    assert_eq!(err.refusal(), Some(Refusal::ConfirmationFailed));
    assert!(err.to_string().contains("PIN did not match"), "{err}");
    assert!(!err.to_string().contains(pin.reveal()));
    assert!(my_trust.is_empty());
    assert!(inv.trust.is_empty());
    assert_eq!(inv.service.recent_failures(SystemTime::now()), 1);
    // The invite is still open with one attempt spent, and the right PIN works.
    assert_eq!(
        inv.service
            .invite_status(SystemTime::now())
            .unwrap()
            .attempts_left,
        4
    );
    join(&inv.addr, &pin, &me, &my_trust, "laptop")
        .await
        .unwrap();
}

#[tokio::test]
async fn five_wrong_pins_close_the_invite_and_the_sixth_right_pin_is_refused() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    for _ in 0..5 {
        let r = join(&inv.addr, &wrong(&pin), &me, &my_trust, "laptop").await;
        assert_eq!(refusal(r), Refusal::ConfirmationFailed);
    }
    let r = join(&inv.addr, &pin, &me, &my_trust, "laptop").await;
    let refused = refusal(r);
    assert!(
        matches!(refused, Refusal::InviteClosed | Refusal::NoInvite),
        "{refused:?}"
    );
    assert!(inv.trust.is_empty() && my_trust.is_empty());
    assert_eq!(inv.service.recent_failures(SystemTime::now()), 5);
}

#[tokio::test]
async fn no_invite_and_bad_messages_are_refused() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin: Pin = "000000".parse().unwrap();
    assert_eq!(
        refusal(join(&inv.addr, &pin, &me, &my_trust, "x").await),
        Refusal::NoInvite
    );

    let http = plain_http();
    let resp = http
        .post(format!("http://{}/pair/v1/start", inv.addr))
        .body("{\"v\":9,\"kind\":\"joiner_hello\",\"body\":{}}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let reply = pair_identity::wire::ErrorReply::decode(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(reply.refusal, Refusal::UnsupportedVersion);

    // Pairing with oneself is refused.
    let _pin = inv.service.open_invite(SystemTime::now()).unwrap();
    let r = join(&inv.addr, &_pin, &inv.identity, &my_trust, "self").await;
    assert_eq!(refusal(r), Refusal::SelfPairing);
}

/// What the relay rewrites, and what it saw.
#[derive(Clone)]
struct Relay {
    upstream: String,
    http: reqwest::Client,
    /// Replaces the joiner's identity in `start` (and the inviter's in the reply).
    swap_to: Option<(Identity, Identity)>,
    seen: Arc<Mutex<Vec<(String, Bytes)>>>,
}

async fn relay(State(relay): State<Relay>, uri: axum::http::Uri, body: Bytes) -> Response {
    let path = uri.path().to_owned();
    relay
        .seen
        .lock()
        .unwrap()
        .push((path.clone(), body.clone()));
    let mut body = body;
    if let (Some((fake_joiner, _)), "/pair/v1/start") = (&relay.swap_to, path.as_str()) {
        let mut hello = JoinerHello::decode(&body).unwrap();
        hello.joiner.id = fake_joiner.id();
        hello.joiner.cert = CertBytes::new(fake_joiner.cert_der().to_vec()).unwrap();
        body = hello.encode().into();
    }
    let resp = relay
        .http
        .post(format!("http://{}{path}", relay.upstream))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let mut out = resp.bytes().await.unwrap();
    if let (Some((_, fake_inviter)), "/pair/v1/start", true) =
        (&relay.swap_to, path.as_str(), status.is_success())
    {
        let mut reply = InviterHello::decode(&out).unwrap();
        reply.inviter.id = fake_inviter.id();
        reply.inviter.cert = CertBytes::new(fake_inviter.cert_der().to_vec()).unwrap();
        reply.inviter.name = PeerName::try_from("inviter").unwrap();
        out = reply.encode().into();
    }
    (status, out).into_response()
}

async fn start_relay(
    upstream: &str,
    swap_to: Option<(Identity, Identity)>,
    tasks: &mut JoinSet<()>,
) -> (String, Relay) {
    let state = Relay {
        upstream: upstream.to_owned(),
        http: plain_http(),
        swap_to,
        seen: Arc::default(),
    };
    let router = Router::new()
        .route("/pair/v1/{step}", post(relay))
        .with_state(state.clone());
    (serve(router, tasks).await, state)
}

#[tokio::test]
async fn a_relay_that_swaps_certificates_fails_confirmation() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let mallory_a = Identity::generate(Role::Node).unwrap();
    let mallory_b = Identity::generate(Role::Node).unwrap();
    let (relay_addr, _) = start_relay(
        &inv.addr,
        Some((mallory_a.clone(), mallory_b.clone())),
        &mut tasks,
    )
    .await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    // Even with the right PIN, the swapped certificates break the MACs.
    let r = join(&relay_addr, &pin, &me, &my_trust, "laptop").await;
    assert_eq!(refusal(r), Refusal::ConfirmationFailed);
    assert!(my_trust.is_empty());
    assert!(inv.trust.is_empty());
    assert!(inv.trust.get(mallory_a.id()).is_none());

    // The same relay without rewriting is harmless: pairing works through it.
    let (honest, _) = start_relay(&inv.addr, None, &mut tasks).await;
    join(&honest, &pin, &me, &my_trust, "laptop").await.unwrap();
    assert_eq!(
        inv.trust.get(me.id()).unwrap().fingerprint,
        me.fingerprint()
    );
}

#[tokio::test]
async fn a_replayed_exchange_fails() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (recorder, state) = start_relay(&inv.addr, None, &mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    join(&recorder, &pin, &me, &my_trust, "laptop")
        .await
        .unwrap();
    let seen = state.seen.lock().unwrap().clone();
    let (start, confirm) = (seen[0].1.clone(), seen[1].1.clone());
    inv.trust.remove(me.id()).unwrap();

    // The attacker replays the recorded messages against a new invite.
    let _new_pin = inv.service.open_invite(SystemTime::now()).unwrap();
    let http = plain_http();
    let post = |path: &'static str, body: Bytes| {
        let http = http.clone();
        let url = format!("http://{}{path}", inv.addr);
        async move { http.post(url).body(body).send().await.unwrap() }
    };
    // The old confirmation names a finished session.
    let resp = post("/pair/v1/confirm", confirm.clone()).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // A replayed hello opens a fresh session (new nonce, new SPAKE2 share);
    // the old confirmation MAC re-targeted at it does not verify.
    let resp = post("/pair/v1/start", start).await;
    assert!(resp.status().is_success());
    let fresh = InviterHello::decode(&resp.bytes().await.unwrap()).unwrap();
    let mut forged = pair_identity::wire::JoinerConfirm::decode(&confirm).unwrap();
    forged.session = fresh.session;
    let resp = post("/pair/v1/confirm", forged.encode().into()).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(inv.trust.get(me.id()).is_none());
}

#[tokio::test]
async fn the_hourly_failure_cap_persists_across_restart() {
    let mut tasks = JoinSet::new();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_path_buf();
    let (me, my_trust) = joiner(Role::Node);
    {
        let inv = inviter_in(tempfile::TempDir::new_in(&state).unwrap(), &mut tasks).await;
        for _ in 0..4 {
            let pin = inv.service.open_invite(SystemTime::now()).unwrap();
            for _ in 0..5 {
                let r = join(&inv.addr, &wrong(&pin), &me, &my_trust, "laptop").await;
                assert_eq!(refusal(r), Refusal::ConfirmationFailed);
            }
        }
        let err = inv.service.open_invite(SystemTime::now()).unwrap_err();
        assert_eq!(err.refusal(), Some(Refusal::LockedOut));
        // Restart: a new service over the same state directory.
        let again = PairingService::new(
            &inv.identity,
            "inviter",
            inv.trust.clone(),
            inv.dir.path(),
            Limits::default(),
        )
        .unwrap();
        let err = again.open_invite(SystemTime::now()).unwrap_err();
        let Error::Pairing {
            refusal,
            retry_after_secs,
        } = err
        else {
            panic!("expected a refusal");
        };
        assert_eq!(refusal, Refusal::LockedOut);
        assert!(retry_after_secs.is_some_and(|s| s > 0 && s <= 3600));
        // An hour later it is allowed again.
        let later = SystemTime::now() + std::time::Duration::from_secs(3601);
        again.open_invite(later).unwrap();
    }
}

#[tokio::test]
async fn a_new_certificate_for_a_pinned_id_is_refused_until_unpaired() {
    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    join(&inv.addr, &pin, &me, &my_trust, "laptop")
        .await
        .unwrap();

    // Someone mints a certificate claiming the same id.
    let impostor = Identity::generate_with_id(me.id(), Role::Node).unwrap();
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    let r = join(
        &inv.addr,
        &pin,
        &impostor,
        &TrustStore::in_memory(),
        "laptop",
    )
    .await;
    assert_eq!(refusal(r), Refusal::ConflictingPin);
    assert_eq!(
        inv.trust.get(me.id()).unwrap().fingerprint,
        me.fingerprint()
    );

    // Re-pairing with the same certificate is fine (it refreshes the name).
    join(&inv.addr, &pin, &me, &my_trust, "renamed")
        .await
        .unwrap();
    assert_eq!(inv.trust.get(me.id()).unwrap().name, "renamed");

    // After an explicit unpair, a new certificate may pair.
    inv.trust.remove(me.id()).unwrap();
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    join(
        &inv.addr,
        &pin,
        &impostor,
        &TrustStore::in_memory(),
        "laptop",
    )
    .await
    .unwrap();
    assert_eq!(
        inv.trust.get(me.id()).unwrap().fingerprint,
        impostor.fingerprint()
    );
}
