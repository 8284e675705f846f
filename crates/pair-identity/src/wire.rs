//! The pairing wire format: small versioned JSON messages with pure
//! `encode`/`decode` functions (the fuzz targets call exactly these).
//!
//! Every message is one JSON object `{"v":1,"kind":"<kind>","body":{...}}`.
//! Binary fields are standard base64. Decoding checks, in order: size cap,
//! JSON syntax, version, kind, then the body's fields (exact lengths, bounded
//! names and certificates, no unknown fields). A message of another version
//! is refused as such, so a future v2 can answer a v1 peer clearly.

use pair_core::{NodeId, Role};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::Refusal;

/// The protocol version this crate speaks.
pub const VERSION: u32 = 1;
/// Largest message accepted, in bytes (a certificate is ~400 bytes).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Largest certificate accepted.
pub const MAX_CERT_BYTES: usize = 4096;
/// Longest peer name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// SPAKE2 (Ed25519 group) message length: one side byte and a point.
pub const PAKE_MESSAGE_BYTES: usize = 33;

pub use crate::error::DecodeError;

/// Random bytes of a fixed length, base64 on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bytes<const N: usize>(pub [u8; N]);

impl<const N: usize> std::fmt::Debug for Bytes<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", hex::encode(self.0))
    }
}

impl<const N: usize> Serialize for Bytes<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        b64::serialize(&self.0, s)
    }
}

impl<'de, const N: usize> Deserialize<'de> for Bytes<N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = b64::deserialize(d)?;
        let arr: [u8; N] = v.try_into().map_err(|v: Vec<u8>| {
            serde::de::Error::invalid_length(v.len(), &"a fixed-size field")
        })?;
        Ok(Self(arr))
    }
}

/// A pairing session id, chosen by the inviter.
pub type SessionId = Bytes<16>;
/// A fresh per-attempt nonce.
pub type Nonce = Bytes<32>;
/// An HMAC-SHA256 key-confirmation tag.
pub type Mac = Bytes<32>;
/// A SPAKE2 message.
pub type PakeMessage = Bytes<PAKE_MESSAGE_BYTES>;

/// A human-readable machine name: 1..=64 characters, no control characters.
#[derive(Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct PeerName(String);

impl PeerName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Debug for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

impl std::fmt::Display for PeerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for PeerName {
    type Error = crate::Error;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        let n = s.chars().count();
        if n == 0 {
            return Err(crate::Error::BadName { reason: "empty" });
        }
        if n > MAX_NAME_CHARS {
            return Err(crate::Error::BadName {
                reason: "longer than 64 characters",
            });
        }
        if s.chars().any(char::is_control) {
            return Err(crate::Error::BadName {
                reason: "contains control characters",
            });
        }
        Ok(Self(s))
    }
}

impl TryFrom<&str> for PeerName {
    type Error = crate::Error;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::try_from(s.to_owned())
    }
}

impl<'de> Deserialize<'de> for PeerName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::try_from(s).map_err(serde::de::Error::custom)
    }
}

/// A DER certificate of bounded size (its content is checked by the state
/// machine, which parses it and compares it with the claimed identity).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CertBytes(Vec<u8>);

impl CertBytes {
    pub fn new(der: Vec<u8>) -> Option<Self> {
        (!der.is_empty() && der.len() <= MAX_CERT_BYTES).then_some(Self(der))
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for CertBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CertBytes({} bytes)", self.0.len())
    }
}

impl Serialize for CertBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        b64::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for CertBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = b64::deserialize(d)?;
        Self::new(v).ok_or_else(|| serde::de::Error::custom("certificate empty or too large"))
    }
}

/// Who one side says it is. Everything here is bound into the transcript
/// that both key-confirmation MACs cover.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Party {
    pub id: NodeId,
    pub role: Role,
    pub name: PeerName,
    pub cert: CertBytes,
}

/// Joiner -> inviter, `POST /pair/v1/start`: my identity, a fresh nonce, and
/// SPAKE2 message A.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinerHello {
    pub joiner: Party,
    pub nonce: Nonce,
    pub pake: PakeMessage,
}

/// Inviter -> joiner, the answer to `start`: the session id, the inviter's
/// identity, nonce, SPAKE2 message B, and the inviter's confirmation MAC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviterHello {
    pub session: SessionId,
    pub inviter: Party,
    pub nonce: Nonce,
    pub pake: PakeMessage,
    pub confirm: Mac,
}

/// Joiner -> inviter, `POST /pair/v1/confirm`: the joiner's confirmation MAC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinerConfirm {
    pub session: SessionId,
    pub confirm: Mac,
}

/// Inviter -> joiner, the answer to `confirm`: the joiner is pinned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InviterDone {
    pub session: SessionId,
}

/// Inviter -> joiner on any failure (with a 4xx/5xx status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    pub refusal: Refusal,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// A pairing message: its kind tag and the pure codec.
pub trait Message: Serialize + DeserializeOwned {
    const KIND: &'static str;

    /// The message's bytes on the wire.
    fn encode(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Envelope<'a, T> {
            v: u32,
            kind: &'static str,
            body: &'a T,
        }
        // Serialising these plain structs cannot fail; an empty body would be
        // refused by the peer's decoder anyway.
        serde_json::to_vec(&Envelope {
            v: VERSION,
            kind: Self::KIND,
            body: self,
        })
        .unwrap_or_default()
    }

    /// Parses a message from untrusted bytes. Total: never panics.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Envelope {
            v: u32,
            kind: String,
            body: serde_json::Value,
        }
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(DecodeError::TooLarge);
        }
        let env: Envelope = serde_json::from_slice(bytes).map_err(DecodeError::Json)?;
        if env.v != VERSION {
            return Err(DecodeError::Version(env.v));
        }
        if env.kind != Self::KIND {
            return Err(DecodeError::Kind {
                expected: Self::KIND,
                got: env.kind.chars().take(32).collect(),
            });
        }
        serde_json::from_value(env.body).map_err(DecodeError::Json)
    }
}

impl Message for JoinerHello {
    const KIND: &'static str = "joiner_hello";
}
impl Message for InviterHello {
    const KIND: &'static str = "inviter_hello";
}
impl Message for JoinerConfirm {
    const KIND: &'static str = "joiner_confirm";
}
impl Message for InviterDone {
    const KIND: &'static str = "inviter_done";
}
impl Message for ErrorReply {
    const KIND: &'static str = "error";
}

/// Decoders as plain functions, one per message, for fuzz targets.
pub fn decode_joiner_hello(bytes: &[u8]) -> Result<JoinerHello, DecodeError> {
    JoinerHello::decode(bytes)
}
pub fn decode_inviter_hello(bytes: &[u8]) -> Result<InviterHello, DecodeError> {
    InviterHello::decode(bytes)
}
pub fn decode_joiner_confirm(bytes: &[u8]) -> Result<JoinerConfirm, DecodeError> {
    JoinerConfirm::decode(bytes)
}
pub fn decode_inviter_done(bytes: &[u8]) -> Result<InviterDone, DecodeError> {
    InviterDone::decode(bytes)
}
pub fn decode_error_reply(bytes: &[u8]) -> Result<ErrorReply, DecodeError> {
    ErrorReply::decode(bytes)
}

/// Serde helpers: bytes as standard base64 strings.
pub mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes<const N: usize>() -> impl Strategy<Value = Bytes<N>> {
        proptest::collection::vec(any::<u8>(), N).prop_map(|v| {
            let mut a = [0u8; N];
            a.copy_from_slice(&v);
            Bytes(a)
        })
    }

    fn party() -> impl Strategy<Value = Party> {
        (
            any::<u128>(),
            prop_oneof![Just(Role::Node), Just(Role::Client)],
            "[^\\p{Cc}]{1,64}",
            proptest::collection::vec(any::<u8>(), 1..=MAX_CERT_BYTES),
        )
            .prop_map(|(id, role, name, cert)| Party {
                id: NodeId::from_u128(id),
                role,
                name: PeerName::try_from(name).unwrap(),
                cert: CertBytes::new(cert).unwrap(),
            })
    }

    fn refusal() -> impl Strategy<Value = Refusal> {
        prop_oneof![
            Just(Refusal::ConfirmationFailed),
            Just(Refusal::NoInvite),
            Just(Refusal::InviteExpired),
            Just(Refusal::InviteClosed),
            Just(Refusal::LockedOut),
            Just(Refusal::Busy),
            Just(Refusal::UnknownSession),
            Just(Refusal::SessionExpired),
            Just(Refusal::BadMessage),
            Just(Refusal::UnsupportedVersion),
            Just(Refusal::IdentityMismatch),
            Just(Refusal::SelfPairing),
            Just(Refusal::ConflictingPin),
        ]
    }

    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(m: &M) {
        let bytes = m.encode();
        assert_eq!(&M::decode(&bytes).unwrap(), m);
    }

    proptest! {
        #[test]
        fn joiner_hello_round_trips(joiner in party(), nonce in bytes::<32>(), pake in bytes::<33>()) {
            round_trip(&JoinerHello { joiner, nonce, pake });
        }

        #[test]
        fn inviter_hello_round_trips(session in bytes::<16>(), inviter in party(), nonce in bytes::<32>(),
                                     pake in bytes::<33>(), confirm in bytes::<32>()) {
            round_trip(&InviterHello { session, inviter, nonce, pake, confirm });
        }

        #[test]
        fn joiner_confirm_round_trips(session in bytes::<16>(), confirm in bytes::<32>()) {
            round_trip(&JoinerConfirm { session, confirm });
        }

        #[test]
        fn inviter_done_round_trips(session in bytes::<16>()) {
            round_trip(&InviterDone { session });
        }

        #[test]
        fn error_reply_round_trips(refusal in refusal(), retry_after_secs in proptest::option::of(any::<u64>())) {
            round_trip(&ErrorReply { refusal, retry_after_secs });
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_joiner_hello(&data);
            let _ = decode_inviter_hello(&data);
            let _ = decode_joiner_confirm(&data);
            let _ = decode_inviter_done(&data);
            let _ = decode_error_reply(&data);
        }
    }

    #[test]
    fn wrong_version_kind_and_lengths_are_refused() {
        let m = InviterDone {
            session: Bytes([7; 16]),
        };
        let text = String::from_utf8(m.encode()).unwrap();
        let v2 = text.replace("\"v\":1", "\"v\":2");
        assert!(matches!(
            InviterDone::decode(v2.as_bytes()),
            Err(DecodeError::Version(2))
        ));
        assert!(matches!(
            JoinerConfirm::decode(text.as_bytes()),
            Err(DecodeError::Kind { .. })
        ));
        let short = r#"{"v":1,"kind":"inviter_done","body":{"session":"AAAA"}}"#;
        assert!(InviterDone::decode(short.as_bytes()).is_err());
        let extra =
            r#"{"v":1,"kind":"inviter_done","body":{"session":"BwcHBwcHBwcHBwcHBwcHBw==","x":1}}"#;
        assert!(InviterDone::decode(extra.as_bytes()).is_err());
        assert!(InviterDone::decode(&vec![b' '; MAX_MESSAGE_BYTES + 1]).is_err());
        assert!(PeerName::try_from("bad\nname").is_err());
        assert!(PeerName::try_from("").is_err());
        assert!(PeerName::try_from("x".repeat(65)).is_err());
    }
}
