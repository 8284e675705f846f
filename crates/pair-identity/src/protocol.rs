//! The pairing state machines, sans-IO: messages in, messages out; the clock
//! (`now`) and the randomness (`rng`) are arguments. The HTTP shell in
//! [`crate::service`] only moves bytes and persists the failure ledger.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac as _};
use pair_core::{NodeId, Role};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use spake2::{Ed25519Group, Identity as SpakeId, Password, Spake2};
use zeroize::Zeroizing;

use crate::error::{Error, Refusal, Result};
use crate::fingerprint::Fingerprint;
use crate::identity::{Identity, PeerCertInfo};
use crate::trust::PeerRecord;
use crate::wire::{
    Bytes, CertBytes, InviterDone, InviterHello, JoinerConfirm, JoinerHello, Mac, Nonce, Party,
    PeerName, SessionId,
};

type HmacSha256 = Hmac<Sha256>;

const SPAKE_ID_JOINER: &[u8] = b"pair/v1 joiner";
const SPAKE_ID_INVITER: &[u8] = b"pair/v1 inviter";
const TRANSCRIPT_LABEL: &[u8] = b"pair/v1 transcript";
const KEY_LABEL_INVITER: &[u8] = b"pair/v1 confirm inviter";
const KEY_LABEL_JOINER: &[u8] = b"pair/v1 confirm joiner";

/// The limits of pairing (after Matter and HomeKit).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long an invite stays open.
    pub invite_ttl: Duration,
    /// Attempts one invite allows; every attempt counts until it confirms,
    /// so five wrong PINs close the invite.
    pub attempts_per_invite: u32,
    /// Failures allowed in a sliding window before invites are refused.
    pub failures_per_window: u32,
    /// The sliding window (one hour).
    pub failure_window: Duration,
    /// Longest time between `start` and `confirm`.
    pub session_ttl: Duration,
    /// Unauthenticated sessions held at once.
    pub max_sessions: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            invite_ttl: Duration::from_secs(5 * 60),
            attempts_per_invite: 5,
            failures_per_window: 20,
            failure_window: Duration::from_secs(60 * 60),
            session_ttl: Duration::from_secs(30),
            max_sessions: 64,
        }
    }
}

/// A 6-digit PIN. Its `Debug` hides the digits and it is wiped on drop, so it
/// does not end up in logs or core dumps by accident; [`Pin::reveal`] is the
/// one way to show it (on the inviter's screen).
#[derive(Clone, PartialEq, Eq)]
pub struct Pin(Zeroizing<[u8; 6]>);

impl Pin {
    /// A uniformly random PIN from a cryptographic RNG.
    pub fn generate<R: rand::CryptoRng>(rng: &mut R) -> Self {
        let n = rand::Rng::random_range(rng, 0..1_000_000u32);
        let mut digits = [b'0'; 6];
        let mut rest = n;
        for d in digits.iter_mut().rev() {
            // `rest % 10` is below 10, so the cast is exact.
            *d = b'0' + u8::try_from(rest % 10).unwrap_or(0);
            rest /= 10;
        }
        Self(Zeroizing::new(digits))
    }

    /// The six digits, for the inviter's display.
    pub fn reveal(&self) -> &str {
        std::str::from_utf8(&self.0[..]).unwrap_or("")
    }
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pin(******)")
    }
}

impl FromStr for Pin {
    type Err = Error;
    /// Accepts six digits, with spaces or dashes anywhere (`123 456`, `123-456`).
    fn from_str(s: &str) -> Result<Self> {
        let mut digits = Zeroizing::new([0u8; 6]);
        let mut n = 0;
        for c in s.trim().bytes() {
            match c {
                b'0'..=b'9' => {
                    if n == 6 {
                        return Err(Error::BadPin);
                    }
                    digits[n] = c;
                    n += 1;
                }
                b' ' | b'-' => {}
                _ => return Err(Error::BadPin),
            }
        }
        if n != 6 {
            return Err(Error::BadPin);
        }
        Ok(Self(digits))
    }
}

/// What this side tells the other about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalParty {
    pub id: NodeId,
    pub role: Role,
    pub name: PeerName,
    pub cert: CertBytes,
}

impl LocalParty {
    pub fn new(identity: &Identity, name: &str) -> Result<Self> {
        Ok(Self {
            id: identity.id(),
            role: identity.role(),
            name: PeerName::try_from(name)?,
            cert: CertBytes::new(identity.cert_der().to_vec()).ok_or(Error::BadCertificate {
                reason: "own certificate too large",
            })?,
        })
    }

    fn party(&self) -> Party {
        Party {
            id: self.id,
            role: self.role,
            name: self.name.clone(),
            cert: self.cert.clone(),
        }
    }
}

/// Failures of the last window, persisted across restarts by the shell.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureLedger {
    /// Unix seconds of each failure (or attempt not yet confirmed).
    failures: Vec<u64>,
}

impl FailureLedger {
    /// Whether a failure at `t` counts at `now`: inside the window, or in
    /// the future by less than a window (the clock stepped back; counting it
    /// fails closed). Entries further ahead are garbage and ignored.
    fn counts(t: u64, now: u64, limits: &Limits) -> bool {
        let window = limits.failure_window.as_secs();
        t > now.saturating_sub(window) && t <= now.saturating_add(window)
    }

    fn prune(&mut self, now: u64, limits: &Limits) {
        self.failures.retain(|&t| Self::counts(t, now, limits));
    }

    /// Seconds until pairing is allowed again, when locked out.
    pub fn locked_for(&self, now: SystemTime, limits: &Limits) -> Option<u64> {
        let now = unix(now);
        let mut recent: Vec<u64> = self
            .failures
            .iter()
            .copied()
            .filter(|&t| Self::counts(t, now, limits))
            .collect();
        let cap = usize::try_from(limits.failures_per_window).unwrap_or(usize::MAX);
        if recent.len() < cap {
            return None;
        }
        // Allowed again once enough failures age out of the window.
        recent.sort_unstable();
        let window = limits.failure_window.as_secs();
        let freeing = recent.get(recent.len() - cap).copied().unwrap_or(now);
        Some(
            freeing
                .saturating_add(window)
                .saturating_sub(now)
                .clamp(1, window.max(1)),
        )
    }

    /// Failures counted in the current window.
    pub fn count(&self, now: SystemTime, limits: &Limits) -> usize {
        let now = unix(now);
        self.failures
            .iter()
            .filter(|&&t| Self::counts(t, now, limits))
            .count()
    }

    fn record(&mut self, at: u64, limits: &Limits) {
        self.prune(at, limits);
        self.failures.push(at);
    }

    fn refund(&mut self, at: u64) {
        if let Some(i) = self.failures.iter().position(|&t| t == at) {
            self.failures.swap_remove(i);
        }
    }
}

/// The open invite, as the inviter's UI shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InviteStatus {
    pub expires_at: SystemTime,
    pub attempts_left: u32,
}

struct Invite {
    pin: Pin,
    expires_at: SystemTime,
    attempts: u32,
}

struct Session {
    joiner: Party,
    joiner_fp: Fingerprint,
    transcript: [u8; 32],
    joiner_key: Zeroizing<[u8; 32]>,
    expires_at: SystemTime,
    counted_at: u64,
}

/// The inviting side: holds at most one invite and its pending sessions.
pub struct Inviter {
    me: LocalParty,
    limits: Limits,
    invite: Option<Invite>,
    sessions: HashMap<[u8; 16], Session>,
    ledger: FailureLedger,
    ledger_changed: bool,
}

impl fmt::Debug for Inviter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inviter")
            .field("me", &self.me.id)
            .field("invite_open", &self.invite.is_some())
            .field("sessions", &self.sessions.len())
            .finish_non_exhaustive()
    }
}

impl Inviter {
    pub fn new(me: LocalParty, limits: Limits, ledger: FailureLedger) -> Self {
        Self {
            me,
            limits,
            invite: None,
            sessions: HashMap::new(),
            ledger,
            ledger_changed: false,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Opens a fresh invite, replacing any open one (one invite at a time).
    /// Refused while locked out.
    pub fn open_invite<R: rand::CryptoRng>(&mut self, now: SystemTime, rng: &mut R) -> Result<Pin> {
        self.sessions.clear();
        self.invite = None;
        if let Some(secs) = self.ledger.locked_for(now, &self.limits) {
            tracing::warn!(
                retry_after_secs = secs,
                "invite refused: too many pairing failures in the last hour"
            );
            return Err(Error::Pairing {
                refusal: Refusal::LockedOut,
                retry_after_secs: Some(secs),
            });
        }
        let pin = Pin::generate(rng);
        self.invite = Some(Invite {
            pin: pin.clone(),
            expires_at: now + self.limits.invite_ttl,
            attempts: 0,
        });
        Ok(pin)
    }

    /// Closes the open invite, if any.
    pub fn close_invite(&mut self) {
        self.invite = None;
        self.sessions.clear();
    }

    pub fn invite_status(&self, now: SystemTime) -> Option<InviteStatus> {
        let invite = self.invite.as_ref()?;
        let left = self
            .limits
            .attempts_per_invite
            .saturating_sub(invite.attempts);
        (now < invite.expires_at && left > 0).then_some(InviteStatus {
            expires_at: invite.expires_at,
            attempts_left: left,
        })
    }

    pub fn ledger(&self) -> &FailureLedger {
        &self.ledger
    }

    /// Whether the ledger changed since the last call; the shell persists it
    /// before answering, so a restart cannot reset the failure count.
    pub fn take_ledger_changed(&mut self) -> bool {
        std::mem::take(&mut self.ledger_changed)
    }

    fn expire_sessions(&mut self, now: SystemTime) {
        self.sessions.retain(|_, s| now <= s.expires_at);
    }

    /// Step 1: a joiner's hello. Counts as one attempt (and one failure in
    /// the ledger) until its confirmation arrives, so an attacker who walks
    /// away after learning the inviter's MAC still spends a guess.
    pub fn on_joiner_hello<R: rand::CryptoRng>(
        &mut self,
        hello: &JoinerHello,
        now: SystemTime,
        rng: &mut R,
    ) -> Result<InviterHello> {
        let joiner = hello.joiner.id;
        self.joiner_hello(hello, now, rng)
            .inspect_err(|e| log_failure("start", joiner, e))
    }

    fn joiner_hello<R: rand::CryptoRng>(
        &mut self,
        hello: &JoinerHello,
        now: SystemTime,
        rng: &mut R,
    ) -> Result<InviterHello> {
        self.expire_sessions(now);
        if let Some(secs) = self.ledger.locked_for(now, &self.limits) {
            self.invite = None;
            self.sessions.clear();
            return Err(Error::Pairing {
                refusal: Refusal::LockedOut,
                retry_after_secs: Some(secs),
            });
        }
        let max_attempts = self.limits.attempts_per_invite;
        let invite = self
            .invite
            .as_mut()
            .ok_or(Error::refused(Refusal::NoInvite))?;
        if now >= invite.expires_at {
            self.invite = None;
            self.sessions.clear();
            return Err(Error::refused(Refusal::InviteExpired));
        }
        if invite.attempts >= max_attempts {
            return Err(Error::refused(Refusal::InviteClosed));
        }
        if self.sessions.len() >= self.limits.max_sessions {
            return Err(Error::refused(Refusal::Busy));
        }
        let joiner_fp = check_party(&hello.joiner, self.me.id)?;

        // From here on the attempt costs a guess.
        invite.attempts += 1;
        let counted_at = unix(now);
        self.ledger.record(counted_at, &self.limits);
        self.ledger_changed = true;

        let (spake, pake_b) = Spake2::<Ed25519Group>::start_b_with_rng(
            &Password::new(invite.pin.reveal()),
            &SpakeId::new(SPAKE_ID_JOINER),
            &SpakeId::new(SPAKE_ID_INVITER),
            Rng06(rng),
        );
        let key = Zeroizing::new(
            spake
                .finish(&hello.pake.0)
                .map_err(|_| Error::refused(Refusal::BadMessage))?,
        );
        let pake_b = pake_message(&pake_b)?;
        let session: SessionId = Bytes(random_bytes(rng));
        let nonce: Nonce = Bytes(random_bytes(rng));
        let me = self.me.party();
        let me_fp = Fingerprint::of(me.cert.as_slice());
        let transcript = transcript(
            &session,
            (&hello.joiner, &joiner_fp, &hello.nonce, &hello.pake),
            (&me, &me_fp, &nonce, &pake_b),
        );
        let (inviter_key, joiner_key) = confirm_keys(&key, &transcript);
        let confirm = mac(&inviter_key, &transcript);
        self.sessions.insert(
            session.0,
            Session {
                joiner: hello.joiner.clone(),
                joiner_fp,
                transcript,
                joiner_key,
                expires_at: now + self.limits.session_ttl,
                counted_at,
            },
        );
        Ok(InviterHello {
            session,
            inviter: me,
            nonce,
            pake: pake_b,
            confirm,
        })
    }

    /// Step 2: the joiner's confirmation. On success the invite is used up
    /// and the returned record is what the shell pins.
    pub fn on_joiner_confirm(
        &mut self,
        msg: &JoinerConfirm,
        now: SystemTime,
    ) -> Result<(InviterDone, PeerRecord)> {
        let joiner = self.sessions.get(&msg.session.0).map(|s| s.joiner.id);
        let result = self.joiner_confirm(msg, now);
        if let (Err(e), Some(id)) = (&result, joiner) {
            log_failure("confirm", id, e);
        } else if let Err(e) = &result {
            tracing::warn!(step = "confirm", refusal = ?e.refusal(), "pairing attempt failed (no such session)");
        }
        result
    }

    fn joiner_confirm(
        &mut self,
        msg: &JoinerConfirm,
        now: SystemTime,
    ) -> Result<(InviterDone, PeerRecord)> {
        // Single use: whatever happens next, this session is gone, so a
        // replayed confirmation finds nothing.
        let session = self
            .sessions
            .remove(&msg.session.0)
            .ok_or(Error::refused(Refusal::UnknownSession))?;
        if now > session.expires_at {
            return Err(Error::refused(Refusal::SessionExpired));
        }
        if !verify_mac(&session.joiner_key, &session.transcript, &msg.confirm) {
            if let Some(invite) = &self.invite
                && invite.attempts >= self.limits.attempts_per_invite
            {
                tracing::warn!("invite closed after {} failed attempts", invite.attempts);
                self.invite = None;
                self.sessions.clear();
            }
            return Err(Error::refused(Refusal::ConfirmationFailed));
        }
        // Confirmed: the attempt was not a failure after all.
        self.ledger.refund(session.counted_at);
        self.ledger_changed = true;
        self.invite = None;
        self.sessions.clear();
        let record = PeerRecord {
            id: session.joiner.id,
            name: session.joiner.name.into_string(),
            role: session.joiner.role,
            cert_der: session.joiner.cert.as_slice().to_vec(),
            fingerprint: session.joiner_fp,
            paired_at: unix(now),
            vouched_by: None,
        };
        tracing::info!(peer = %record.id, name = %record.name, fingerprint = %record.fingerprint, "paired");
        Ok((
            InviterDone {
                session: msg.session,
            },
            record,
        ))
    }
}

/// The joining side, after sending its hello.
pub struct Joiner {
    me: Party,
    hello: JoinerHello,
    spake: Spake2<Ed25519Group>,
}

impl fmt::Debug for Joiner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Joiner")
            .field("me", &self.me.id)
            .finish_non_exhaustive()
    }
}

/// The joiner after it verified the inviter, waiting for `InviterDone`.
#[derive(Debug)]
pub struct JoinerConfirmed {
    session: SessionId,
    record: PeerRecord,
}

impl Joiner {
    /// Step 0: the joiner's hello, from the PIN the user typed.
    pub fn start<R: rand::CryptoRng>(
        me: &LocalParty,
        pin: &Pin,
        rng: &mut R,
    ) -> (Self, JoinerHello) {
        let (spake, pake_a) = Spake2::<Ed25519Group>::start_a_with_rng(
            &Password::new(pin.reveal()),
            &SpakeId::new(SPAKE_ID_JOINER),
            &SpakeId::new(SPAKE_ID_INVITER),
            Rng06(rng),
        );
        let mut pake = [0u8; crate::wire::PAKE_MESSAGE_BYTES];
        // SPAKE2/Ed25519 messages are always 33 bytes.
        if pake_a.len() == pake.len() {
            pake.copy_from_slice(&pake_a);
        }
        let hello = JoinerHello {
            joiner: me.party(),
            nonce: Bytes(random_bytes(rng)),
            pake: Bytes(pake),
        };
        (
            Self {
                me: me.party(),
                hello: hello.clone(),
                spake,
            },
            hello,
        )
    }

    /// Step 1': checks the inviter's confirmation MAC; only then answers with
    /// our own. A wrong PIN or a swapped certificate fails here.
    pub fn on_inviter_hello(
        self,
        reply: &InviterHello,
        now: SystemTime,
    ) -> Result<(JoinerConfirmed, JoinerConfirm)> {
        let inviter = reply.inviter.id;
        self.inviter_hello(reply, now)
            .inspect_err(|e| log_failure("inviter_hello", inviter, e))
    }

    fn inviter_hello(
        self,
        reply: &InviterHello,
        now: SystemTime,
    ) -> Result<(JoinerConfirmed, JoinerConfirm)> {
        let inviter_fp = check_party(&reply.inviter, self.me.id)?;
        let key = Zeroizing::new(
            self.spake
                .finish(&reply.pake.0)
                .map_err(|_| Error::refused(Refusal::BadMessage))?,
        );
        let me_fp = Fingerprint::of(self.me.cert.as_slice());
        let transcript = transcript(
            &reply.session,
            (&self.me, &me_fp, &self.hello.nonce, &self.hello.pake),
            (&reply.inviter, &inviter_fp, &reply.nonce, &reply.pake),
        );
        let (inviter_key, joiner_key) = confirm_keys(&key, &transcript);
        if !verify_mac(&inviter_key, &transcript, &reply.confirm) {
            return Err(Error::refused(Refusal::ConfirmationFailed));
        }
        let record = PeerRecord {
            id: reply.inviter.id,
            name: reply.inviter.name.as_str().to_owned(),
            role: reply.inviter.role,
            cert_der: reply.inviter.cert.as_slice().to_vec(),
            fingerprint: inviter_fp,
            paired_at: unix(now),
            vouched_by: None,
        };
        let confirm = JoinerConfirm {
            session: reply.session,
            confirm: mac(&joiner_key, &transcript),
        };
        Ok((
            JoinerConfirmed {
                session: reply.session,
                record,
            },
            confirm,
        ))
    }
}

impl JoinerConfirmed {
    /// Step 2': the inviter pinned us; now we pin it.
    pub fn on_inviter_done(self, done: &InviterDone) -> Result<PeerRecord> {
        if done.session != self.session {
            return Err(Error::refused(Refusal::UnknownSession));
        }
        tracing::info!(peer = %self.record.id, name = %self.record.name, fingerprint = %self.record.fingerprint, "paired");
        Ok(self.record)
    }

    /// The peer as it will be pinned.
    pub fn peer(&self) -> &PeerRecord {
        &self.record
    }
}

fn log_failure(step: &'static str, peer: NodeId, e: &Error) {
    // Never the PIN: only who, where, and the refusal code.
    tracing::warn!(step, peer = %peer, refusal = ?e.refusal(), "pairing attempt failed");
}

/// The certificate must carry exactly the id and role the party claims.
fn check_party(party: &Party, me: NodeId) -> Result<Fingerprint> {
    if party.id == me {
        return Err(Error::refused(Refusal::SelfPairing));
    }
    let info = PeerCertInfo::parse(party.cert.as_slice())
        .map_err(|_| Error::refused(Refusal::IdentityMismatch))?;
    if info.id != party.id || info.role != party.role {
        return Err(Error::refused(Refusal::IdentityMismatch));
    }
    Ok(info.fingerprint)
}

type Side<'a> = (
    &'a Party,
    &'a Fingerprint,
    &'a Nonce,
    &'a crate::wire::PakeMessage,
);

/// SHA-256 over every field both sides must agree on, each length-prefixed
/// so no two different transcripts serialise alike.
fn transcript(session: &SessionId, joiner: Side<'_>, inviter: Side<'_>) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update(u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        h.update(bytes);
    };
    field(TRANSCRIPT_LABEL);
    field(&session.0);
    for (party, fp, nonce, pake) in [joiner, inviter] {
        field(party.id.as_uuid().as_bytes());
        field(match party.role {
            Role::Node => b"node",
            Role::Client => b"client",
        });
        field(party.name.as_str().as_bytes());
        field(fp.as_bytes());
        field(&nonce.0);
        field(&pake.0);
    }
    h.finalize().into()
}

/// Separate keys per direction, so a MAC cannot be reflected back.
fn confirm_keys(key: &[u8], transcript: &[u8; 32]) -> (Zeroizing<[u8; 32]>, Zeroizing<[u8; 32]>) {
    let hk = hkdf::Hkdf::<Sha256>::new(Some(transcript), key);
    let mut inviter = Zeroizing::new([0u8; 32]);
    let mut joiner = Zeroizing::new([0u8; 32]);
    // 32 bytes is far below HKDF-SHA256's output limit; expand cannot fail.
    let _ = hk.expand(KEY_LABEL_INVITER, &mut inviter[..]);
    let _ = hk.expand(KEY_LABEL_JOINER, &mut joiner[..]);
    (inviter, joiner)
}

fn mac(key: &[u8; 32], transcript: &[u8; 32]) -> Mac {
    let mut m = mac_state(key);
    m.update(transcript);
    Bytes(m.finalize().into_bytes().into())
}

fn verify_mac(key: &[u8; 32], transcript: &[u8; 32], tag: &Mac) -> bool {
    let mut m = mac_state(key);
    m.update(transcript);
    // Constant time.
    m.verify_slice(&tag.0).is_ok()
}

fn mac_state(key: &[u8; 32]) -> HmacSha256 {
    // HMAC zero-pads short keys to the block size, so padding here gives the
    // same MAC and makes construction infallible.
    let mut block = Zeroizing::new([0u8; 64]);
    block[..32].copy_from_slice(key);
    <HmacSha256 as hmac::digest::KeyInit>::new(&(*block).into())
}

fn pake_message(bytes: &[u8]) -> Result<crate::wire::PakeMessage> {
    let arr: [u8; crate::wire::PAKE_MESSAGE_BYTES] = bytes
        .try_into()
        .map_err(|_| Error::refused(Refusal::BadMessage))?;
    Ok(Bytes(arr))
}

fn random_bytes<const N: usize, R: rand::CryptoRng>(rng: &mut R) -> [u8; N] {
    let mut out = [0u8; N];
    rng.fill_bytes(&mut out);
    out
}

pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Bridges a rand 0.9 RNG to the rand_core 0.6 traits spake2 0.4 expects.
struct Rng06<'a, R: ?Sized>(&'a mut R);

impl<R: rand::RngCore + ?Sized> rand_core_06::RngCore for Rng06<'_, R> {
    fn next_u32(&mut self) -> u32 {
        self.0.next_u32()
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.0.fill_bytes(dest);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> std::result::Result<(), rand_core_06::Error> {
        self.0.fill_bytes(dest);
        Ok(())
    }
}

impl<R: rand::CryptoRng + ?Sized> rand_core_06::CryptoRng for Rng06<'_, R> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    struct World {
        inviter: Inviter,
        joiner_me: LocalParty,
        rng: StdRng,
    }

    fn world(limits: Limits) -> World {
        let inv = Identity::generate(Role::Node).unwrap();
        let joi = Identity::generate(Role::Client).unwrap();
        World {
            inviter: Inviter::new(
                LocalParty::new(&inv, "big-box").unwrap(),
                limits,
                FailureLedger::default(),
            ),
            joiner_me: LocalParty::new(&joi, "laptop").unwrap(),
            rng: StdRng::seed_from_u64(42),
        }
    }

    fn refusal<T: fmt::Debug>(r: Result<T>) -> Refusal {
        r.unwrap_err().refusal().unwrap()
    }

    #[test]
    fn matching_pins_pair_and_both_sides_agree() {
        let mut w = world(Limits::default());
        let pin = w.inviter.open_invite(t(0), &mut w.rng).unwrap();
        let (joiner, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        let reply = w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
        assert!(w.inviter.take_ledger_changed());
        assert_eq!(w.inviter.ledger().count(t(1), &Limits::default()), 1);
        let (confirmed, confirm) = joiner.on_inviter_hello(&reply, t(2)).unwrap();
        let (done, joiner_record) = w.inviter.on_joiner_confirm(&confirm, t(3)).unwrap();
        let inviter_record = confirmed.on_inviter_done(&done).unwrap();
        assert_eq!(joiner_record.id, w.joiner_me.id);
        assert_eq!(joiner_record.role, Role::Client);
        assert_eq!(
            joiner_record.fingerprint,
            Fingerprint::of(w.joiner_me.cert.as_slice())
        );
        assert_eq!(inviter_record.id, w.inviter.me.id);
        assert_eq!(inviter_record.name, "big-box");
        // Success refunds the provisional failure and uses the invite up.
        assert_eq!(w.inviter.ledger().count(t(3), &Limits::default()), 0);
        assert!(w.inviter.invite_status(t(3)).is_none());
        // The confirmation cannot be replayed.
        assert_eq!(
            refusal(w.inviter.on_joiner_confirm(&confirm, t(4))),
            Refusal::UnknownSession
        );
    }

    #[test]
    fn replay_against_a_new_invite_with_the_same_pin_fails() {
        let mut w = world(Limits::default());
        // The worst case: the new invite happens to have the same PIN.
        let pin = w
            .inviter
            .open_invite(t(0), &mut StdRng::seed_from_u64(7))
            .unwrap();
        let (joiner, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        let reply = w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
        let (_, confirm) = joiner.on_inviter_hello(&reply, t(2)).unwrap();
        w.inviter.on_joiner_confirm(&confirm, t(3)).unwrap();

        let again = w
            .inviter
            .open_invite(t(10), &mut StdRng::seed_from_u64(7))
            .unwrap();
        assert_eq!(again, pin);
        // Replayed hello: the inviter answers with a fresh session and share...
        let fresh = w
            .inviter
            .on_joiner_hello(&hello, t(11), &mut w.rng)
            .unwrap();
        assert_ne!(fresh.session, reply.session);
        assert_ne!(fresh.nonce, reply.nonce);
        // ...so the recorded confirmation, re-targeted, does not verify.
        let forged = JoinerConfirm {
            session: fresh.session,
            confirm: confirm.confirm,
        };
        assert_eq!(
            refusal(w.inviter.on_joiner_confirm(&forged, t(12))),
            Refusal::ConfirmationFailed
        );

        // A recorded inviter reply replayed to a new joiner fails too.
        let (joiner2, _) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        assert_eq!(
            refusal(joiner2.on_inviter_hello(&reply, t(13))),
            Refusal::ConfirmationFailed
        );
    }

    #[test]
    fn a_mac_reflected_back_does_not_verify() {
        let mut w = world(Limits::default());
        let pin = w.inviter.open_invite(t(0), &mut w.rng).unwrap();
        let (_joiner, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        let reply = w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
        let reflected = JoinerConfirm {
            session: reply.session,
            confirm: reply.confirm,
        };
        assert_eq!(
            refusal(w.inviter.on_joiner_confirm(&reflected, t(2))),
            Refusal::ConfirmationFailed
        );
    }

    #[test]
    fn five_failures_close_the_invite() {
        let mut w = world(Limits::default());
        let pin = w.inviter.open_invite(t(0), &mut w.rng).unwrap();
        let wrong: Pin = if pin.reveal() == "111111" {
            "222222"
        } else {
            "111111"
        }
        .parse()
        .unwrap();
        for i in 0..5 {
            let (joiner, hello) = Joiner::start(&w.joiner_me, &wrong, &mut w.rng);
            let reply = w.inviter.on_joiner_hello(&hello, t(i), &mut w.rng).unwrap();
            assert_eq!(
                refusal(joiner.on_inviter_hello(&reply, t(i))),
                Refusal::ConfirmationFailed
            );
        }
        let (_, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&hello, t(6), &mut w.rng)),
            Refusal::InviteClosed
        );
        assert_eq!(w.inviter.ledger().count(t(6), &Limits::default()), 5);
    }

    #[test]
    fn invites_and_sessions_expire() {
        let mut w = world(Limits::default());
        let pin = w.inviter.open_invite(t(0), &mut w.rng).unwrap();
        assert_eq!(w.inviter.invite_status(t(1)).unwrap().attempts_left, 5);
        let (joiner, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        let reply = w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
        let (_, confirm) = joiner.on_inviter_hello(&reply, t(2)).unwrap();
        // 30 s session timeout.
        assert_eq!(
            refusal(w.inviter.on_joiner_confirm(&confirm, t(40))),
            Refusal::SessionExpired
        );
        // 5 min invite.
        assert!(w.inviter.invite_status(t(301)).is_none());
        let (_, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&hello, t(301), &mut w.rng)),
            Refusal::InviteExpired
        );
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&hello, t(302), &mut w.rng)),
            Refusal::NoInvite
        );
    }

    #[test]
    fn session_cap_and_identity_checks() {
        let limits = Limits {
            attempts_per_invite: 100,
            failures_per_window: 100,
            max_sessions: 2,
            ..Limits::default()
        };
        let mut w = world(limits);
        let pin = w.inviter.open_invite(t(0), &mut w.rng).unwrap();
        for _ in 0..2 {
            let (_, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
            w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
        }
        let (_, hello) = Joiner::start(&w.joiner_me, &pin, &mut w.rng);
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng)),
            Refusal::Busy
        );
        // Sessions time out, freeing room.
        w.inviter
            .on_joiner_hello(&hello, t(40), &mut w.rng)
            .unwrap();

        // A claimed id that is not the certificate's.
        let mut lying = hello.clone();
        lying.joiner.id = NodeId::from_u128(9);
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&lying, t(41), &mut w.rng)),
            Refusal::IdentityMismatch
        );
        let mut wrong_role = hello.clone();
        wrong_role.joiner.role = Role::Node;
        assert_eq!(
            refusal(w.inviter.on_joiner_hello(&wrong_role, t(41), &mut w.rng)),
            Refusal::IdentityMismatch
        );
    }

    #[test]
    fn lockout_after_twenty_failures_an_hour() {
        let limits = Limits::default();
        let mut w = world(limits.clone());
        for round in 0..4 {
            let pin = w.inviter.open_invite(t(round * 10), &mut w.rng).unwrap();
            let wrong: Pin = if pin.reveal() == "111111" {
                "222222"
            } else {
                "111111"
            }
            .parse()
            .unwrap();
            for _ in 0..5 {
                let (_, hello) = Joiner::start(&w.joiner_me, &wrong, &mut w.rng);
                w.inviter
                    .on_joiner_hello(&hello, t(round * 10 + 1), &mut w.rng)
                    .unwrap();
            }
        }
        let err = w.inviter.open_invite(t(100), &mut w.rng).unwrap_err();
        assert!(
            matches!(err, Error::Pairing { refusal: Refusal::LockedOut, retry_after_secs: Some(s) } if s > 3000)
        );
        // After the oldest failures leave the window, invites are allowed again.
        w.inviter.open_invite(t(3602), &mut w.rng).unwrap();
    }

    #[test]
    fn pin_parsing_and_redaction() {
        assert_eq!("123 456".parse::<Pin>().unwrap().reveal(), "123456");
        assert_eq!("123-456".parse::<Pin>().unwrap().reveal(), "123456");
        for bad in ["12345", "1234567", "12a456", ""] {
            assert!(bad.parse::<Pin>().is_err(), "{bad}");
        }
        let pin: Pin = "987654".parse().unwrap();
        assert!(!format!("{pin:?}").contains("987654"));
    }

    proptest! {
        #[test]
        fn generated_pins_are_six_digits_and_parse_back(seed in any::<u64>()) {
            let pin = Pin::generate(&mut StdRng::seed_from_u64(seed));
            prop_assert_eq!(pin.reveal().len(), 6);
            prop_assert!(pin.reveal().bytes().all(|b| b.is_ascii_digit()));
            prop_assert_eq!(pin.reveal().parse::<Pin>().unwrap(), pin);
        }

        #[test]
        fn ledger_locks_exactly_at_the_cap(offsets in proptest::collection::vec(0u64..7200, 0..40), now in 0u64..7200) {
            let limits = Limits::default();
            let mut ledger = FailureLedger::default();
            for &o in &offsets {
                ledger.failures.push(1_800_000_000 + o);
            }
            let now_t = t(now);
            let in_window = offsets.iter().filter(|&&o| o + 3600 > now && o <= now + 3600).count();
            let locked = ledger.locked_for(now_t, &limits);
            prop_assert_eq!(locked.is_some(), in_window >= 20);
            if let Some(s) = locked {
                prop_assert!((1..=3600).contains(&s));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(12))]
        #[test]
        fn pairing_succeeds_iff_the_pins_match(a in 0u32..1_000_000, same in any::<bool>(), seed in any::<u64>()) {
            let mut w = world(Limits::default());
            let pin = w.inviter.open_invite(t(0), &mut StdRng::seed_from_u64(seed)).unwrap();
            let typed: Pin = if same { pin.clone() } else { format!("{a:06}").parse().unwrap() };
            let (joiner, hello) = Joiner::start(&w.joiner_me, &typed, &mut w.rng);
            let reply = w.inviter.on_joiner_hello(&hello, t(1), &mut w.rng).unwrap();
            let result = joiner.on_inviter_hello(&reply, t(2));
            prop_assert_eq!(result.is_ok(), typed == pin);
            if let Ok((_, confirm)) = result {
                prop_assert!(w.inviter.on_joiner_confirm(&confirm, t(3)).is_ok());
            }
        }
    }
}
