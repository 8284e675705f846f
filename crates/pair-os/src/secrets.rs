//! Keeping secrets (the node's key, its control token, API keys, the trust
//! store) readable by their owner only: Unix modes where there are modes
//! (set when the file is created, so a secret is never world-readable even
//! briefly); on Windows a protected ACL that grants the current user alone
//! full access, so the file does not take the folder's permissions.

use std::fs;
use std::io;
use std::path::Path;

use crate::Os;

/// How a file or folder created with a Unix `mode` is protected on an OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// The mode, given at creation.
    Mode(u32),
    /// The owner alone, through a protected ACL set right after creation,
    /// before any byte is written.
    OwnerOnlyAcl,
    /// What the folder gives (a mode open to others asks for nothing more).
    Inherited,
}

/// What protects an object created with `mode` on `os`.
pub const fn protection(os: Os, mode: u32) -> Protection {
    match os {
        Os::Linux | Os::MacOs => Protection::Mode(mode),
        Os::Windows if mode & 0o077 == 0 => Protection::OwnerOnlyAcl,
        Os::Windows => Protection::Inherited,
    }
}

/// What protects an object created with `mode` on this host: the OS's
/// rule, except that a build with `--cfg pair_portable` takes the fallback
/// of a host with neither modes nor the ACL API (inherited permissions).
pub const fn host_protection(mode: u32) -> Protection {
    if Os::host_is_unix() {
        Protection::Mode(mode)
    } else if cfg!(windows) {
        protection(Os::Windows, mode)
    } else {
        Protection::Inherited
    }
}

/// Options that create a new file for writing with `mode` where modes
/// exist; [`protect`] then finishes the job elsewhere.
pub fn create_new(mode: u32) -> fs::OpenOptions {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(all(unix, not(pair_portable)))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    #[cfg(any(not(unix), pair_portable))]
    let _ = mode;
    opts
}

/// A recursive folder builder with `mode` where modes exist.
pub fn dir_builder(mode: u32) -> fs::DirBuilder {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(all(unix, not(pair_portable)))]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(mode);
    }
    #[cfg(any(not(unix), pair_portable))]
    let _ = mode;
    builder
}

/// Applies what [`host_protection`] says beyond the creation mode: on
/// Windows, the owner-only ACL (for a folder, inherited by what is created
/// in it). Nothing to do elsewhere.
pub fn protect(path: &Path, mode: u32, is_dir: bool) -> io::Result<()> {
    match host_protection(mode) {
        Protection::Mode(_) | Protection::Inherited => {
            let _ = (path, is_dir);
            Ok(())
        }
        Protection::OwnerOnlyAcl => owner_only_acl(path, is_dir),
    }
}

#[cfg(windows)]
fn owner_only_acl(path: &Path, is_dir: bool) -> io::Result<()> {
    use winapi::um::winnt::{FILE_ALL_ACCESS, PSID};
    use windows_acl::acl::ACL;
    use windows_acl::helper;

    let os_err = |code: u32| io::Error::from_raw_os_error(code as i32);
    let name = path
        .to_str()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path is not UTF-8"))?;
    let user =
        helper::current_user().ok_or_else(|| io::Error::other("cannot name the current user"))?;
    let me = helper::name_to_sid(&user, None).map_err(os_err)?;
    let me_str = helper::sid_to_string(me.as_ptr() as PSID).map_err(os_err)?;
    let mut acl = ACL::from_file_path(name, false).map_err(os_err)?;
    // Every entry but the owner's goes; the ACL is written back protected,
    // so nothing is inherited from the folder either.
    for entry in acl.all().map_err(os_err)? {
        if entry.string_sid != me_str
            && let Some(sid) = entry.sid
        {
            acl.remove(sid.as_ptr() as PSID, None, None)
                .map_err(os_err)?;
        }
    }
    acl.allow(me.as_ptr() as PSID, is_dir, FILE_ALL_ACCESS)
        .map_err(os_err)?;
    Ok(())
}

#[cfg(not(windows))]
fn owner_only_acl(path: &Path, _is_dir: bool) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        format!("no ACL API on this OS for {}", path.display()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn unix_uses_modes_and_windows_an_owner_only_acl() {
        assert_eq!(protection(Os::Linux, 0o600), Protection::Mode(0o600));
        assert_eq!(protection(Os::MacOs, 0o700), Protection::Mode(0o700));
        assert_eq!(protection(Os::Windows, 0o600), Protection::OwnerOnlyAcl);
        assert_eq!(protection(Os::Windows, 0o700), Protection::OwnerOnlyAcl);
        assert_eq!(protection(Os::Windows, 0o644), Protection::Inherited);
        if cfg!(all(target_os = "linux", pair_portable)) {
            assert_eq!(host_protection(0o600), Protection::Inherited);
        } else if cfg!(target_os = "linux") {
            assert_eq!(host_protection(0o600), Protection::Mode(0o600));
        }
    }

    #[test]
    fn a_secret_is_created_as_the_host_protects_it() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("state");
        dir_builder(0o700).create(&sub).unwrap();
        protect(&sub, 0o700, true).unwrap();
        let path = sub.join("key.pem");
        let mut f = create_new(0o600).open(&path).unwrap();
        protect(&path, 0o600, false).unwrap();
        f.write_all(b"secret").unwrap();
        assert!(create_new(0o600).open(&path).is_err(), "create_new");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let file = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            let folder = fs::metadata(&sub).unwrap().permissions().mode() & 0o777;
            match host_protection(0o600) {
                Protection::Mode(m) => {
                    assert_eq!(file, m);
                    assert_eq!(folder, 0o700);
                }
                // The portable fallback: what the umask leaves.
                _ => assert_ne!(file, 0),
            }
        }
    }
}
