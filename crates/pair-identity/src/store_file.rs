//! The stores' files (`trust.json`, `keys.json`): one JSON document with a
//! format version `v`, written whole and atomically (mode 0600, the
//! directory made private if missing), read back whole. A damaged file is
//! an error naming it, never an empty store (that would silently forget a
//! trust removal or a revocation).

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};

/// The only format version the stores read and write.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// A store's file: what its format version is.
pub(crate) trait Versioned {
    fn version(&self) -> u32;
}

/// The file at `path`, `None` when there is none; what a crashed write
/// left beside it is removed first.
pub(crate) fn load<F: DeserializeOwned + Versioned>(path: &Path) -> Result<Option<F>> {
    pair_fs::clean_leftovers(path);
    let Some(bytes) = pair_fs::read_optional(path)? else {
        return Ok(None);
    };
    let file: F = serde_json::from_slice(&bytes).map_err(|source| Error::DamagedJson {
        path: path.to_path_buf(),
        source,
    })?;
    if file.version() != FORMAT_VERSION {
        return Err(damaged(
            path,
            format!("unsupported format version {}", file.version()),
        ));
    }
    Ok(Some(file))
}

/// Writes `file` to `path`, replacing what was there.
pub(crate) fn save(path: &Path, file: &impl Serialize) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(file).map_err(|source| Error::DamagedJson {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        pair_fs::ensure_private_dir(dir)?;
    }
    pair_fs::write_atomic(path, &bytes, 0o600)?;
    Ok(())
}

/// The error for a file whose records do not hold together.
pub(crate) fn damaged(path: &Path, reason: String) -> Error {
    Error::Damaged {
        path: path.to_path_buf(),
        reason,
    }
}
