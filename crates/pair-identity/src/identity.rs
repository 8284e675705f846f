//! This machine's identity (UUID, Ed25519 key, self-signed certificate) and
//! reading a peer's identity back out of its certificate.

use std::fmt;
use std::path::{Path, PathBuf};

use pair_core::{NodeId, Role};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, PKCS_ED25519, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;

/// Years a certificate is valid. Trust comes from the pin, not from dates:
/// verifiers ignore validity, and a key is rotated by pairing again.
const VALIDITY_YEARS: i64 = 20;

/// The URI SAN that names a certificate's role.
pub fn role_urn(role: Role) -> &'static str {
    match role {
        Role::Node => "urn:pair:role:node",
        Role::Client => "urn:pair:role:client",
    }
}

/// This machine's identity: who it is and the key that proves it.
#[derive(Clone)]
pub struct Identity {
    id: NodeId,
    role: Role,
    cert: CertificateDer<'static>,
    key: std::sync::Arc<PrivatePkcs8KeyDer<'static>>,
    fingerprint: Fingerprint,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key stays out of logs.
        f.debug_struct("Identity")
            .field("id", &self.id)
            .field("role", &self.role)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Where an identity lives under a state directory.
#[derive(Clone, Debug)]
pub struct IdentityPaths {
    pub key: PathBuf,
    pub cert: PathBuf,
}

impl IdentityPaths {
    pub fn under(state_dir: &Path) -> Self {
        let dir = state_dir.join("identity");
        Self {
            key: dir.join("key.pem"),
            cert: dir.join("cert.pem"),
        }
    }
}

impl Identity {
    /// Loads the identity under `state_dir`, creating it on first start
    /// (key file mode 0600). An identity stored with another role is an error:
    /// a node's state directory must not silently become a client's.
    pub fn load_or_create(state_dir: &Path, role: Role) -> Result<Self> {
        let paths = IdentityPaths::under(state_dir);
        let key_pem = pair_fs::read_optional(&paths.key)?;
        let cert_pem = pair_fs::read_optional(&paths.cert)?;
        match (key_pem, cert_pem) {
            (Some(key), Some(cert)) => {
                let identity = Self::from_pem(&key, &cert, &paths)?;
                if identity.role != role {
                    return Err(Error::RoleMismatch {
                        path: paths.cert,
                        stored: identity.role,
                        wanted: role,
                    });
                }
                Ok(identity)
            }
            (None, cert) => {
                if cert.is_some() {
                    // The key is written last, so a certificate without a key
                    // is a crash during first start (or a lost key): either
                    // way that identity can never prove itself again.
                    tracing::warn!(path = %paths.cert.display(), "certificate without a key: creating a new identity");
                }
                let identity = Self::generate(role)?;
                let dir = paths
                    .key
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default();
                pair_fs::ensure_private_dir(&dir)?;
                pair_fs::write_atomic(&paths.cert, identity.cert_pem().as_bytes(), 0o644)?;
                // The key's rename commits the identity.
                pair_fs::write_atomic(&paths.key, identity.key_pem().as_bytes(), 0o600)?;
                tracing::info!(id = %identity.id, fingerprint = %identity.fingerprint, "created a new identity");
                Ok(identity)
            }
            // Never overwrite a key: it may be the only copy of a paired identity.
            (Some(_), None) => Err(Error::Damaged {
                path: paths.cert,
                reason: "missing while the key exists (restore it, or move the key away to start as a new identity)".into(),
            }),
        }
    }

    /// A fresh identity in memory (tests, emulated clusters, first start).
    pub fn generate(role: Role) -> Result<Self> {
        let id = NodeId::from_uuid(uuid::Builder::from_random_bytes(rand::random()).into_uuid());
        Self::generate_with_id(id, role)
    }

    /// A fresh key and certificate for a given id.
    pub fn generate_with_id(id: NodeId, role: Role) -> Result<Self> {
        let key = KeyPair::generate_for(&PKCS_ED25519).map_err(Error::CertGen)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, id.to_string());
        params.distinguished_name = dn;
        let san = |s: String| {
            s.try_into()
                .map(SanType::URI)
                .map_err(|_| Error::BadCertificate {
                    reason: "URN is not IA5",
                })
        };
        params.subject_alt_names = vec![san(id.urn())?, san(role_urn(role).to_owned())?];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let now = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
        params.not_before = now - time_days(1);
        params.not_after = now + time_days(365 * VALIDITY_YEARS);
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f; // positive INTEGER
        serial[0] |= 0x01; // and no leading zero byte
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let cert = params.self_signed(&key).map_err(Error::CertGen)?;
        let cert = cert.der().clone();
        let key = std::sync::Arc::new(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok(Self {
            id,
            role,
            fingerprint: Fingerprint::of(&cert),
            cert,
            key,
        })
    }

    fn from_pem(key_pem: &[u8], cert_pem: &[u8], paths: &IdentityPaths) -> Result<Self> {
        let damaged = |path: &Path, reason: &str| Error::Damaged {
            path: path.to_path_buf(),
            reason: reason.to_owned(),
        };
        let key = PrivatePkcs8KeyDer::from_pem_slice(key_pem)
            .map_err(|_| damaged(&paths.key, "not a PKCS#8 PEM private key"))?;
        let cert = CertificateDer::from_pem_slice(cert_pem)
            .map_err(|_| damaged(&paths.cert, "not a PEM certificate"))?;
        let info = PeerCertInfo::parse(&cert)
            .map_err(|_| damaged(&paths.cert, "not a pair identity certificate"))?;
        let pair =
            KeyPair::try_from(&key).map_err(|_| damaged(&paths.key, "unreadable Ed25519 key"))?;
        if pair.public_key_raw() != info.public_key.as_slice() {
            return Err(damaged(&paths.key, "key does not match the certificate"));
        }
        Ok(Self {
            id: info.id,
            role: info.role,
            fingerprint: info.fingerprint,
            cert,
            key: std::sync::Arc::new(key),
        })
    }

    pub fn id(&self) -> NodeId {
        self.id
    }
    pub fn role(&self) -> Role {
        self.role
    }
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert
    }
    /// The private key, for building TLS configs.
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key.clone_key())
    }
    pub fn cert_pem(&self) -> String {
        pem_block("CERTIFICATE", &self.cert)
    }
    fn key_pem(&self) -> String {
        pem_block("PRIVATE KEY", self.key.secret_pkcs8_der())
    }
}

fn time_days(days: i64) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from(days).unwrap_or(0) * 86_400)
}

fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Who a certificate says it is. Only meaningful for a pinned certificate:
/// anyone can mint a certificate claiming any id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCertInfo {
    pub id: NodeId,
    pub role: Role,
    pub fingerprint: Fingerprint,
    /// The raw subject public key (32 bytes for Ed25519).
    pub public_key: Vec<u8>,
}

impl PeerCertInfo {
    /// Reads a pair certificate: CN = UUID, URI SAN `urn:pair:node:<uuid>`
    /// naming the same UUID, and optionally `urn:pair:role:<role>` (absent
    /// means node).
    pub fn parse(der: &[u8]) -> Result<Self> {
        let bad = |reason| Error::BadCertificate { reason };
        let (rest, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|_| bad("not DER X.509"))?;
        if !rest.is_empty() {
            return Err(bad("trailing bytes after the certificate"));
        }
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .ok_or(bad("no common name"))?;
        let uuid = Uuid::parse_str(cn).map_err(|_| bad("common name is not a UUID"))?;
        let id = NodeId::from_uuid(uuid);
        let urn = id.urn();
        let sans = cert
            .subject_alternative_name()
            .map_err(|_| bad("invalid subject alternative names"))?
            .ok_or(bad("no subject alternative names"))?;
        let mut has_node_urn = false;
        let mut role = None;
        for name in &sans.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                if *uri == urn {
                    has_node_urn = true;
                } else if uri.starts_with("urn:pair:node:") {
                    return Err(bad("node URN does not match the common name"));
                } else if *uri == role_urn(Role::Node) || *uri == role_urn(Role::Client) {
                    let this = if *uri == role_urn(Role::Client) {
                        Role::Client
                    } else {
                        Role::Node
                    };
                    if role.is_some_and(|r| r != this) {
                        return Err(bad("conflicting role URNs"));
                    }
                    role = Some(this);
                }
            }
        }
        if !has_node_urn {
            return Err(bad("no urn:pair:node SAN"));
        }
        Ok(Self {
            id,
            role: role.unwrap_or(Role::Node),
            fingerprint: Fingerprint::of(der),
            public_key: cert.public_key().subject_public_key.data.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificate_carries_id_role_and_ekus() {
        for role in [Role::Node, Role::Client] {
            let me = Identity::generate(role).unwrap();
            let info = PeerCertInfo::parse(me.cert_der()).unwrap();
            assert_eq!(info.id, me.id());
            assert_eq!(info.role, role);
            assert_eq!(info.fingerprint, me.fingerprint());
            let (_, cert) = x509_parser::parse_x509_certificate(me.cert_der()).unwrap();
            let eku = cert.extended_key_usage().unwrap().unwrap().value;
            assert!(eku.server_auth && eku.client_auth);
            assert!(
                cert.validity().not_after.timestamp()
                    > cert.validity().not_before.timestamp() + 10 * 365 * 86_400
            );
        }
    }

    #[test]
    fn identity_is_created_once_then_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let a = Identity::load_or_create(dir.path(), Role::Node).unwrap();
        let b = Identity::load_or_create(dir.path(), Role::Node).unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a.fingerprint(), b.fingerprint());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(IdentityPaths::under(dir.path()).key)
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let err = Identity::load_or_create(dir.path(), Role::Client).unwrap_err();
        assert!(matches!(
            err,
            Error::RoleMismatch {
                stored: Role::Node,
                ..
            }
        ));
    }

    #[test]
    fn damaged_identity_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_create(dir.path(), Role::Node).unwrap();
        let paths = IdentityPaths::under(dir.path());
        std::fs::write(&paths.key, "garbage").unwrap();
        let err = Identity::load_or_create(dir.path(), Role::Node).unwrap_err();
        assert!(
            matches!(&err, Error::Damaged { path, .. } if *path == paths.key),
            "{err}"
        );
        assert!(err.to_string().contains("key.pem"));
    }

    #[test]
    fn a_crash_during_first_start_is_recovered_and_a_lone_key_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = Identity::load_or_create(dir.path(), Role::Node).unwrap();
        let paths = IdentityPaths::under(dir.path());
        // Crash after the certificate, before the key: start over.
        std::fs::remove_file(&paths.key).unwrap();
        let second = Identity::load_or_create(dir.path(), Role::Node).unwrap();
        assert_ne!(first.id(), second.id());
        assert_eq!(
            Identity::load_or_create(dir.path(), Role::Node)
                .unwrap()
                .id(),
            second.id()
        );
        // A key without its certificate is never overwritten.
        std::fs::remove_file(&paths.cert).unwrap();
        let key_before = std::fs::read(&paths.key).unwrap();
        let err = Identity::load_or_create(dir.path(), Role::Node).unwrap_err();
        assert!(
            matches!(&err, Error::Damaged { path, .. } if *path == paths.cert),
            "{err}"
        );
        assert_eq!(std::fs::read(&paths.key).unwrap(), key_before);
    }

    #[test]
    fn a_foreign_key_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        Identity::load_or_create(dir.path(), Role::Node).unwrap();
        let other = tempfile::tempdir().unwrap();
        Identity::load_or_create(other.path(), Role::Node).unwrap();
        let paths = IdentityPaths::under(dir.path());
        std::fs::copy(IdentityPaths::under(other.path()).key, &paths.key).unwrap();
        let err = Identity::load_or_create(dir.path(), Role::Node).unwrap_err();
        assert!(matches!(err, Error::Damaged { .. }));
    }
}
