//! The pairing shell: an axum router the node mounts on its cluster port
//! (inviter side) and the `join` client the CLI calls (joiner side). Both
//! only move bytes; the protocol lives in [`crate::protocol`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use crate::addr::PeerAddr;
use crate::error::{Error, Refusal, Result};
use crate::identity::Identity;
use crate::protocol::{FailureLedger, InviteStatus, Inviter, Joiner, Limits, LocalParty, Pin};
use crate::trust::{PeerRecord, TrustStore};
use crate::wire::{
    ErrorReply, InviterDone, InviterHello, JoinerConfirm, JoinerHello, MAX_MESSAGE_BYTES, Message,
};

/// Path of the first round trip.
pub const START_PATH: &str = "/pair/v1/start";
/// Path of the second round trip.
pub const CONFIRM_PATH: &str = "/pair/v1/confirm";
/// The failure ledger's file name under the state directory.
pub const LEDGER_FILE: &str = "pairing-failures.json";
/// How long the joiner waits for each answer.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Inner {
    inviter: Mutex<Inviter>,
    trust: TrustStore,
    ledger_path: PathBuf,
}

/// The inviter side of pairing. Cheap to clone; all clones share one invite.
#[derive(Clone, Debug)]
pub struct PairingService {
    inner: Arc<Inner>,
}

impl PairingService {
    /// Builds the service for this identity. The failure ledger is read from
    /// (and kept in) `state_dir`, so the hourly failure cap survives restarts.
    pub fn new(
        identity: &Identity,
        name: &str,
        trust: TrustStore,
        state_dir: &Path,
        limits: Limits,
    ) -> Result<Self> {
        let ledger_path = state_dir.join(LEDGER_FILE);
        pair_fs::clean_leftovers(&ledger_path);
        let ledger = match pair_fs::read_optional(&ledger_path)? {
            None => FailureLedger::default(),
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|source| Error::DamagedJson {
                path: ledger_path.clone(),
                source,
            })?,
        };
        let me = LocalParty::new(identity, name)?;
        Ok(Self {
            inner: Arc::new(Inner {
                inviter: Mutex::new(Inviter::new(me, limits, ledger)),
                trust,
                ledger_path,
            }),
        })
    }

    pub fn trust(&self) -> &TrustStore {
        &self.inner.trust
    }

    /// Opens a fresh invite (closing any open one) and returns its PIN for
    /// the user to read out. Refused while locked out.
    pub fn open_invite(&self, now: SystemTime) -> Result<Pin> {
        self.with_inviter(|inv| inv.open_invite(now, &mut rand::rng()))
    }

    pub fn close_invite(&self) {
        let _ = self.with_inviter(|inv| {
            inv.close_invite();
            Ok(())
        });
    }

    pub fn invite_status(&self, now: SystemTime) -> Option<InviteStatus> {
        self.with_inviter(|inv| Ok(inv.invite_status(now)))
            .ok()
            .flatten()
    }

    /// Failures counted in the current window (for status displays).
    pub fn recent_failures(&self, now: SystemTime) -> usize {
        self.with_inviter(|inv| Ok(inv.ledger().count(now, inv.limits())))
            .unwrap_or(0)
    }

    /// The routes under `/pair/v1/`, to merge into the cluster-port router.
    pub fn router(&self) -> Router {
        Router::new()
            .route(START_PATH, post(start))
            .route(CONFIRM_PATH, post(confirm))
            .layer(DefaultBodyLimit::max(MAX_MESSAGE_BYTES))
            .with_state(self.clone())
    }

    /// Runs one step of the state machine under the lock, persisting the
    /// ledger before the answer leaves, so a crash right after cannot forget
    /// a failure.
    fn with_inviter<T>(&self, step: impl FnOnce(&mut Inviter) -> Result<T>) -> Result<T> {
        let mut inviter = self
            .inner
            .inviter
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = step(&mut inviter);
        if inviter.take_ledger_changed() {
            let bytes =
                serde_json::to_vec(inviter.ledger()).map_err(|source| Error::DamagedJson {
                    path: self.inner.ledger_path.clone(),
                    source,
                })?;
            pair_fs::write_atomic(&self.inner.ledger_path, &bytes, 0o600)?;
        }
        out
    }
}

async fn start(State(svc): State<PairingService>, body: Bytes) -> Response {
    let hello = match JoinerHello::decode(&body) {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(step = "start", error = %e, "pairing attempt failed: bad message");
            return refusal_response(e.refusal(), None);
        }
    };
    if conflicts(&svc.inner.trust, &hello.joiner) {
        tracing::warn!(step = "start", peer = %hello.joiner.id, "pairing attempt failed: id already paired with another certificate");
        return refusal_response(Refusal::ConflictingPin, None);
    }
    match svc.with_inviter(|inv| inv.on_joiner_hello(&hello, SystemTime::now(), &mut rand::rng())) {
        Ok(reply) => message_response(&reply),
        Err(e) => error_response(&e),
    }
}

async fn confirm(State(svc): State<PairingService>, body: Bytes) -> Response {
    let msg = match JoinerConfirm::decode(&body) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(step = "confirm", error = %e, "pairing attempt failed: bad message");
            return refusal_response(e.refusal(), None);
        }
    };
    let (done, record) =
        match svc.with_inviter(|inv| inv.on_joiner_confirm(&msg, SystemTime::now())) {
            Ok(out) => out,
            Err(e) => return error_response(&e),
        };
    if let Err(e) = svc.inner.trust.insert(record) {
        tracing::error!(error = %e, "cannot write the trust store after pairing");
        return internal_error();
    }
    message_response(&done)
}

fn message_response<M: Message>(m: &M) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        m.encode(),
    )
        .into_response()
}

fn error_response(e: &Error) -> Response {
    match e {
        Error::Pairing {
            refusal,
            retry_after_secs,
        } => refusal_response(*refusal, *retry_after_secs),
        other => {
            tracing::error!(error = %other, "pairing failed on the inviter side");
            internal_error()
        }
    }
}

fn internal_error() -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, "pairing is unavailable").into_response()
}

/// The HTTP status for each refusal.
pub fn refusal_status(refusal: Refusal) -> StatusCode {
    match refusal {
        Refusal::ConfirmationFailed => StatusCode::FORBIDDEN,
        Refusal::NoInvite | Refusal::UnknownSession => StatusCode::NOT_FOUND,
        Refusal::InviteExpired | Refusal::InviteClosed | Refusal::SessionExpired => {
            StatusCode::GONE
        }
        Refusal::LockedOut => StatusCode::TOO_MANY_REQUESTS,
        Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
        Refusal::BadMessage
        | Refusal::UnsupportedVersion
        | Refusal::IdentityMismatch
        | Refusal::SelfPairing => StatusCode::BAD_REQUEST,
        Refusal::ConflictingPin => StatusCode::CONFLICT,
    }
}

fn refusal_response(refusal: Refusal, retry_after_secs: Option<u64>) -> Response {
    let body = ErrorReply {
        refusal,
        retry_after_secs,
    };
    let mut resp = (refusal_status(refusal), body.encode()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(secs) = retry_after_secs {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

/// Where the joiner sends its two round trips.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairingTarget {
    /// `http://host:port`, without a trailing slash.
    pub base_url: String,
    /// An address a URL cannot name (IPv6 with a zone): the client resolves
    /// [`ZONED_HOST`] in `base_url` to it.
    pub dial: Option<std::net::SocketAddr>,
}

/// The stand-in host name of a zoned IPv6 inviter: URLs have no syntax for
/// a zone, so the client is told to resolve this name to the scoped address.
/// The cluster port does not look at `Host`.
pub const ZONED_HOST: &str = "zoned-peer.pair.invalid";

/// The inviter given as `host:port`, `[fe80::1%eth0]:port` or
/// `http://host:port`.
pub fn pairing_target(addr: &str) -> Result<PairingTarget> {
    let trimmed = addr.trim();
    let bad = || Error::BadAddress {
        input: addr.to_owned(),
    };
    let authority = match trimmed.get(..7) {
        // Pairing is plain HTTP by design (the PAKE protects it).
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &trimmed[7..],
        _ if trimmed.contains("://") => return Err(bad()),
        _ => trimmed,
    };
    let authority = authority.strip_suffix('/').unwrap_or(authority);
    let peer = PeerAddr::parse(authority).map_err(|e| match e {
        Error::BadAddress { .. } => bad(),
        other => other,
    })?;
    Ok(if peer.is_scoped() {
        PairingTarget {
            base_url: format!("http://{ZONED_HOST}:{}", peer.port()),
            dial: peer.socket_addr(),
        }
    } else {
        PairingTarget {
            base_url: format!("http://{peer}"),
            dial: None,
        }
    })
}

/// Joins the cluster of the node at `addr` with the PIN its user read out.
/// On success both sides have pinned each other and the inviter's record is
/// in `trust`. On failure nothing was written.
pub async fn join(
    addr: &str,
    pin: &Pin,
    identity: &Identity,
    trust: &TrustStore,
    name: &str,
) -> Result<PeerRecord> {
    crate::tls::install_crypto_provider();
    let target = pairing_target(addr)?;
    let base = &target.base_url;
    let me = LocalParty::new(identity, name)?;
    let mut http = reqwest::Client::builder().no_proxy().timeout(JOIN_TIMEOUT);
    if let Some(dial) = target.dial {
        http = http.resolve(ZONED_HOST, dial);
    }
    let http = http.build().map_err(Error::HttpClient)?;
    let (joiner, hello) = Joiner::start(&me, pin, &mut rand::rng());
    // Errors name the address as given, not the stand-in host.
    let shown = target
        .dial
        .map_or_else(|| base.clone(), |a| format!("http://{a}"));
    let url = |path| (format!("{base}{path}"), format!("{shown}{path}"));
    let reply: InviterHello = exchange(&http, url(START_PATH), &hello).await?;
    if conflicts(trust, &reply.inviter) {
        tracing::warn!(peer = %reply.inviter.id, "pairing refused: id already paired with another certificate");
        return Err(Error::refused(Refusal::ConflictingPin));
    }
    let (confirmed, confirm) = joiner.on_inviter_hello(&reply, SystemTime::now())?;
    let done: InviterDone = exchange(&http, url(CONFIRM_PATH), &confirm).await?;
    let record = confirmed.on_inviter_done(&done)?;
    trust.insert(record.clone())?;
    Ok(record)
}

/// Whether `party` claims an id we pinned with another certificate.
fn conflicts(trust: &TrustStore, party: &crate::wire::Party) -> bool {
    trust
        .get(party.id)
        .is_some_and(|r| r.fingerprint != crate::Fingerprint::of(party.cert.as_slice()))
}

/// One round trip: POST a message, decode the answer or the refusal.
/// `url` is (where to send, how to name it in errors).
async fn exchange<Req: Message, Resp: Message>(
    http: &reqwest::Client,
    (url, shown): (String, String),
    req: &Req,
) -> Result<Resp> {
    let http_err = |source| Error::Http {
        url: shown.clone(),
        source,
    };
    let resp = http
        .post(&url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(req.encode())
        .send()
        .await
        .map_err(http_err)?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(http_err)?;
    if status.is_success() {
        return Ok(Resp::decode(&body)?);
    }
    match ErrorReply::decode(&body) {
        Ok(reply) => Err(Error::Pairing {
            refusal: reply.refusal,
            retry_after_secs: reply.retry_after_secs,
        }),
        Err(_) => Err(Error::UnexpectedStatus {
            status: status.as_u16(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let url = |a: &str| pairing_target(a).map(|t| t.base_url);
        assert_eq!(url("10.0.0.2:14318").unwrap(), "http://10.0.0.2:14318");
        assert_eq!(url("http://host:1/").unwrap(), "http://host:1");
        assert_eq!(url("HTTP://[fd00::2]:1").unwrap(), "http://[fd00::2]:1");
        assert!(url("https://host:1").is_err());
        assert!(url("").is_err());
        assert!(url("host:1/path").is_err());
    }

    #[test]
    fn a_zoned_inviter_is_dialled_by_its_scoped_address() {
        let t = pairing_target("[fe80::1%3]:14318").unwrap();
        assert_eq!(t.base_url, format!("http://{ZONED_HOST}:14318"));
        let dial = t.dial.unwrap();
        assert_eq!(dial.to_string(), "[fe80::1%3]:14318");
        assert!(
            pairing_target("http://[fe80::1%3]:14318/")
                .unwrap()
                .dial
                .is_some()
        );
        assert!(pairing_target("10.0.0.2:1").unwrap().dial.is_none());
        assert!(matches!(
            pairing_target("[fe80::1%no such]:1"),
            Err(Error::BadZone { .. })
        ));
    }
}
