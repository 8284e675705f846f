//! Crash-safe state files: every file a node or client keeps in its state
//! dir (identity, trust store, keys, pairing ledger, control token, job
//! log compaction, the SDK's ranking cache) is replaced through
//! [`write_atomic`]: temp file, fsync, rename, fsync the directory. A crash
//! at any point leaves the old file or the new one, never a mix, and once
//! it returns the new one survives a power cut.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What failed, on which path.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}", path.display())]
pub struct FsError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> Self {
        std::io::Error::new(e.source.kind(), e)
    }
}

const TEMP_MARK: &str = ".tmp-";

/// Replaces `path` with `bytes`; see [`write_atomic_with`].
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    write_atomic_with(path, mode, |f| f.write_all(bytes))
}

/// Replaces `path` with what `write` writes, so that a crash at any point
/// leaves either the old file or the new one, and the new one is on disk
/// (file and directory entry) when this returns. `mode` is applied to the
/// temp file before any byte is written, so secrets are never
/// world-readable, even briefly.
pub fn write_atomic_with(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> Result<(), FsError> {
    let dir = parent(path);
    let tmp = temp_path(path);
    let err = |action, p: &Path| {
        let p = p.to_path_buf();
        move |source| FsError {
            action,
            path: p,
            source,
        }
    };
    let mut file = open_new(&tmp, mode).map_err(err("create", &tmp))?;
    let written = write(&mut file)
        .and_then(|()| file.sync_all())
        .map_err(err("write", &tmp));
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(err("replace", path)(e));
    }
    sync_dir(&dir);
    Ok(())
}

/// Removes temp files a crash left next to `path`. They are never read: the
/// rename is the commit point, so a leftover temp file is by definition an
/// uncommitted write.
pub fn clean_leftovers(path: &Path) {
    let dir = parent(path);
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let prefix = format!("{name}{TEMP_MARK}");
    let Ok(entries) = fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            let leftover = entry.path();
            tracing::info!(path = %leftover.display(), "removing leftover temp file of an interrupted write");
            let _ = fs::remove_file(leftover);
        }
    }
}

/// Creates `dir` (and parents) with owner-only permissions (a Unix mode,
/// or on Windows an owner-only ACL; see `pair_os::secrets`).
pub fn ensure_private_dir(dir: &Path) -> Result<(), FsError> {
    let err = |source| FsError {
        action: "create directory",
        path: dir.to_path_buf(),
        source,
    };
    pair_os::secrets::dir_builder(0o700)
        .create(dir)
        .map_err(err)?;
    pair_os::secrets::protect(dir, 0o700, true).map_err(err)
}

/// Reads a file, `Ok(None)` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FsError {
            action: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// A fresh temp file name next to `path`, which [`clean_leftovers`] knows.
pub fn temp_path(path: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    parent(path).join(format!("{name}{TEMP_MARK}{}-{n:016x}", std::process::id()))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new file, protected as `mode` says before any byte is written (the
/// mode at creation on Unix; the owner-only ACL on Windows).
fn open_new(path: &Path, mode: u32) -> std::io::Result<fs::File> {
    let file = pair_os::secrets::create_new(mode).open(path)?;
    if let Err(e) = pair_os::secrets::protect(path, mode, false) {
        drop(file);
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

fn sync_dir(dir: &Path) {
    // Durability of the rename itself; best effort (not every platform can
    // open a directory for syncing).
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leftovers_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let leftover = temp_path(&path);
        fs::write(&leftover, b"half").unwrap();
        clean_leftovers(&path);
        assert!(!leftover.exists());
        assert_eq!(fs::read(&path).unwrap(), b"two");
        // Unix modes where the host has them (not in the portable
        // fallback, `--cfg pair_portable`).
        #[cfg(all(unix, not(pair_portable)))]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            ensure_private_dir(&dir.path().join("a/b")).unwrap();
            let mode = fs::metadata(dir.path().join("a/b"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.jsonl");
        write_atomic(&path, b"old", 0o600).unwrap();
        let err = write_atomic_with(&path, 0o600, |f| {
            f.write_all(b"ne")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(err.action, "write");
        assert_eq!(fs::read(&path).unwrap(), b"old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        // As an io::Error it keeps its kind and its source.
        let io: std::io::Error = err.into();
        assert_eq!(io.kind(), std::io::ErrorKind::Other);
    }
}
