//! Crash-safe file writes: temp file, fsync, rename, fsync the directory.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const TEMP_MARK: &str = ".tmp-";

/// Writes `bytes` to `path` so that a crash at any point leaves either the old
/// file or the new one, never a mix. `mode` is applied to the temp file before
/// any byte is written, so secrets are never world-readable, even briefly.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = parent(path);
    let tmp = temp_path(path);
    let io = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            action,
            path: p,
            source,
        }
    };
    let mut file = open_new(&tmp, mode).map_err(io("create", &tmp))?;
    let written = file
        .write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io("write", &tmp));
    drop(file);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(Error::Io {
            action: "replace",
            path: path.to_path_buf(),
            source: e,
        });
    }
    sync_dir(&dir);
    Ok(())
}

/// Removes temp files a crash left next to `path`. They are never read: the
/// rename is the commit point, so a leftover temp file is by definition an
/// uncommitted write.
pub(crate) fn clean_leftovers(path: &Path) {
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

/// Creates `dir` (and parents) with owner-only permissions.
pub(crate) fn ensure_dir(dir: &Path) -> Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|source| Error::Io {
        action: "create directory",
        path: dir.to_path_buf(),
        source,
    })
}

/// Reads a file, `Ok(None)` when it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let unique: u64 = rand::random();
    parent(path).join(format!(
        "{name}{TEMP_MARK}{}-{unique:016x}",
        std::process::id()
    ))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn open_new(path: &Path, mode: u32) -> std::io::Result<fs::File> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    opts.open(path)
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
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
