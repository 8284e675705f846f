//! The owner's token for a node's control calls (invite, join, unpair).
//!
//! The faces admit anything that connects from this machine, which
//! includes pages in the user's browser; a secret that only the node's
//! owner can read keeps those calls theirs. The daemon writes a fresh
//! token at every start (`control.token` in the state directory, mode
//! 0600, atomically), and the CLI reads it from there and sends it as
//! `Authorization: Bearer <token>`.

use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

use crate::error::{Error, Result};

/// The token file's name in the state directory.
pub const CONTROL_TOKEN_FILE: &str = "control.token";

/// A control token: 32 random bytes, hex.
#[derive(Clone, PartialEq, Eq)]
pub struct ControlToken(String);

impl std::fmt::Debug for ControlToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlToken(..)")
    }
}

impl ControlToken {
    /// Where the token lives under `state_dir`.
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(CONTROL_TOKEN_FILE)
    }

    /// Makes a new token and writes it for the CLI (mode 0600), replacing
    /// the last one.
    pub fn create(state_dir: &Path) -> Result<Self> {
        let bytes: [u8; 32] = rand::random();
        let token = Self(hex::encode(bytes));
        pair_fs::write_atomic(&Self::path(state_dir), token.0.as_bytes(), 0o600)?;
        Ok(token)
    }

    /// The token the running daemon wrote.
    pub fn read(state_dir: &Path) -> Result<Self> {
        let path = Self::path(state_dir);
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::Damaged {
                path,
                reason: "not a control token (restart pair-node to write a new one)".into(),
            });
        }
        Ok(Self(text.to_owned()))
    }

    /// The value to send: `Bearer <token>`.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether an `Authorization` header value carries this token
    /// (compared in constant time).
    pub fn authorizes(&self, authorization: &[u8]) -> bool {
        let Some(presented) = authorization
            .strip_prefix(b"Bearer ")
            .or_else(|| authorization.strip_prefix(b"bearer "))
        else {
            return false;
        };
        bool::from(presented.trim_ascii().ct_eq(self.0.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_private_read_back_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let t = ControlToken::create(dir.path()).unwrap();
        let read = ControlToken::read(dir.path()).unwrap();
        assert_eq!(t, read);
        assert!(t.authorizes(t.bearer().as_bytes()));
        assert!(!t.authorizes(b"Bearer 00"));
        assert!(!t.authorizes(t.0.as_bytes()), "the scheme is required");
        assert!(!format!("{t:?}").contains(&t.0), "Debug hides the token");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(ControlToken::path(dir.path()))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A new start, a new token: the old one stops working.
        let next = ControlToken::create(dir.path()).unwrap();
        assert!(!next.authorizes(t.bearer().as_bytes()));
    }

    #[test]
    fn a_missing_or_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = ControlToken::read(dir.path()).unwrap_err();
        assert!(e.to_string().contains(CONTROL_TOKEN_FILE), "{e}");
        std::fs::write(ControlToken::path(dir.path()), "x").unwrap();
        let e = ControlToken::read(dir.path()).unwrap_err();
        assert!(matches!(e, Error::Damaged { .. }), "{e}");
    }
}
