//! The one error type of pair-identity, and the pairing refusal codes carried as data.

use std::path::PathBuf;

use pair_core::NodeId;
use serde::{Deserialize, Serialize};

/// Why a pairing attempt was refused or failed. This is data, not text: it
/// crosses the wire in error replies, so the joiner's CLI can say exactly what
/// went wrong and whether trying again can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// Key confirmation failed: the PIN was wrong, or someone in the middle
    /// changed the exchange. The two cannot be told apart, by design.
    ConfirmationFailed,
    /// The inviter has no open invite.
    NoInvite,
    /// The invite's five minutes are over.
    InviteExpired,
    /// The invite was closed after too many failed attempts.
    InviteClosed,
    /// Too many failures in the last hour: the inviter refuses invites for a while.
    LockedOut,
    /// Too many unauthenticated pairing sessions at once.
    Busy,
    /// The session id is unknown (never issued, already finished, or replayed).
    UnknownSession,
    /// The session took too long between its two round trips.
    SessionExpired,
    /// The message could not be decoded.
    BadMessage,
    /// The peer speaks a protocol version we do not.
    UnsupportedVersion,
    /// The certificate does not carry the identity the peer claimed.
    IdentityMismatch,
    /// A node tried to pair with itself.
    SelfPairing,
    /// This id is already paired with a different certificate: unpair it
    /// first (anyone can mint a certificate claiming any id, so a new
    /// certificate never silently replaces a pin).
    ConflictingPin,
}

impl Refusal {
    /// A sentence for humans. Never includes the PIN.
    pub fn describe(self) -> &'static str {
        match self {
            Refusal::ConfirmationFailed => {
                "the PIN did not match, or someone tampered with the exchange"
            }
            Refusal::NoInvite => {
                "the other machine has no open invite (run `pair-node pair invite` there)"
            }
            Refusal::InviteExpired => "the invite has expired (invites last 5 minutes)",
            Refusal::InviteClosed => {
                "the invite was closed after too many wrong PINs; open a new one"
            }
            Refusal::LockedOut => {
                "too many failed pairing attempts in the last hour; pairing is refused for a while"
            }
            Refusal::Busy => "too many pairing attempts in progress; try again shortly",
            Refusal::UnknownSession => "unknown pairing session (finished, expired or replayed)",
            Refusal::SessionExpired => "the pairing session timed out",
            Refusal::BadMessage => "malformed pairing message",
            Refusal::UnsupportedVersion => "unsupported pairing protocol version",
            Refusal::IdentityMismatch => {
                "the peer's certificate does not match the identity it claimed"
            }
            Refusal::SelfPairing => "a machine cannot pair with itself",
            Refusal::ConflictingPin => {
                "this machine id is already paired with a different certificate; unpair it first"
            }
        }
    }

    /// Whether the same attempt (same PIN, same invite) may succeed later.
    pub fn may_retry(self) -> bool {
        matches!(self, Refusal::Busy)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Errors of pair-identity.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is damaged: {reason}")]
    Damaged { path: PathBuf, reason: String },
    #[error("{path} is damaged: invalid JSON")]
    DamagedJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} holds a {stored:?} identity, but this program runs as a {wanted:?}")]
    RoleMismatch {
        path: PathBuf,
        stored: pair_core::Role,
        wanted: pair_core::Role,
    },
    #[error("cannot create the certificate")]
    CertGen(#[source] rcgen::Error),
    #[error("invalid certificate: {reason}")]
    BadCertificate { reason: &'static str },
    #[error("pairing failed: {refusal}{}", retry_after_secs.map(|s| format!(" (retry after {s} s)")).unwrap_or_default())]
    Pairing {
        refusal: Refusal,
        retry_after_secs: Option<u64>,
    },
    #[error("invalid PIN: expected 6 digits")]
    BadPin,
    #[error("invalid peer name: {reason}")]
    BadName { reason: &'static str },
    #[error("invalid address {input:?}: expected HOST:PORT, IP:PORT or [IPv6%ZONE]:PORT")]
    BadAddress { input: String },
    #[error("invalid address {input:?}: {reason}")]
    BadZone { input: String, reason: &'static str },
    #[error("invalid address {input:?}: no network interface named {name:?} on this machine")]
    NoSuchInterface {
        input: String,
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pairing request to {url} failed")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("pairing peer answered HTTP {status} without a pairing error body")]
    UnexpectedStatus { status: u16 },
    #[error("malformed pairing message")]
    Decode(#[from] DecodeError),
    #[error("TLS configuration failed")]
    Tls(#[from] rustls::Error),
    #[error("cannot build the HTTP client")]
    HttpClient(#[source] reqwest::Error),
    #[error("peer {0} is not paired")]
    NotPaired(NodeId),
    #[error("peer presented no certificate")]
    NoPeerCertificate,
    #[error("invalid key name {name:?}: {reason}")]
    BadKeyName { name: String, reason: &'static str },
    #[error("invalid model pattern {pattern:?}: {reason}")]
    BadModelPattern {
        pattern: String,
        reason: &'static str,
    },
    #[error("a live key is already named {name:?}: revoke it first or pick another name")]
    KeyNameTaken { name: String },
    #[error("no live key is named {name:?}")]
    NoSuchKey { name: String },
    #[error("the random source repeated a key id")]
    RepeatedKeyId,
}

impl Error {
    pub(crate) fn refused(refusal: Refusal) -> Self {
        Error::Pairing {
            refusal,
            retry_after_secs: None,
        }
    }

    /// The pairing refusal, when this error is one.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Pairing { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why bytes were not a valid message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("message larger than the 16 KiB a pairing message may take")]
    TooLarge,
    #[error("invalid JSON")]
    Json(#[source] serde_json::Error),
    #[error("unsupported protocol version {0}")]
    Version(u32),
    #[error("expected a {expected} message, got {got:?}")]
    Kind { expected: &'static str, got: String },
}

impl DecodeError {
    /// The refusal an inviter answers with.
    pub fn refusal(&self) -> Refusal {
        match self {
            DecodeError::Version(_) => Refusal::UnsupportedVersion,
            _ => Refusal::BadMessage,
        }
    }
}

impl From<pair_fs::FsError> for Error {
    fn from(e: pair_fs::FsError) -> Self {
        Error::Io {
            action: e.action,
            path: e.path,
            source: e.source,
        }
    }
}
