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

/// The program that sets the ACL: Windows' own `icacls`, by its full path
/// where `SystemRoot` says where Windows is (not whatever `icacls` a `PATH`
/// finds first).
pub fn icacls_program(env: impl Fn(&str) -> Option<String>) -> std::path::PathBuf {
    env("SystemRoot").map_or_else(
        || "icacls.exe".into(),
        |root| {
            let mut p = std::path::PathBuf::from(root);
            p.push("System32");
            p.push("icacls.exe");
            p
        },
    )
}

/// The user a process runs as, as `icacls` names it (`DOMAIN\user`), from
/// the variables Windows sets for every process.
pub fn windows_user(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let user = env("USERNAME").filter(|u| !u.is_empty())?;
    Some(match env("USERDOMAIN").filter(|d| !d.is_empty()) {
        Some(domain) => format!("{domain}\\{user}"),
        None => user,
    })
}

/// `icacls` arguments that leave `path` to `user` alone: inheritance
/// removed (the folder's entries are dropped, not copied) and full control
/// granted to the user, replacing any grant it had; for a folder, the
/// grant is inherited by what is created in it.
pub fn owner_only_icacls(path: &Path, user: &str, is_dir: bool) -> Vec<std::ffi::OsString> {
    let grant = if is_dir {
        format!("{user}:(OI)(CI)F")
    } else {
        format!("{user}:F")
    };
    vec![
        path.as_os_str().to_owned(),
        "/inheritance:r".into(),
        "/grant:r".into(),
        grant.into(),
    ]
}

#[cfg(windows)]
fn owner_only_acl(path: &Path, is_dir: bool) -> io::Result<()> {
    let env = |k: &str| std::env::var(k).ok();
    let user = windows_user(env)
        .ok_or_else(|| io::Error::other("cannot name the current user (USERNAME is not set)"))?;
    let out = std::process::Command::new(icacls_program(env))
        .args(owner_only_icacls(path, &user, is_dir))
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "icacls could not leave {} to {user} alone: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
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

    /// Windows' owner-only ACL: Windows' own icacls by its full path, the
    /// user as Windows names it, inheritance removed and the user's grant
    /// (inherited by a folder's contents) the only one.
    #[test]
    fn windows_leaves_a_secret_to_its_user_through_icacls() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let full = env(&[
            ("SystemRoot", r"C:\Windows"),
            ("USERNAME", "ann"),
            ("USERDOMAIN", "BOX"),
        ]);
        assert_eq!(
            icacls_program(full),
            std::path::PathBuf::from(r"C:\Windows")
                .join("System32")
                .join("icacls.exe")
        );
        assert_eq!(windows_user(full).as_deref(), Some(r"BOX\ann"));
        let bare = env(&[("USERNAME", "ann")]);
        assert_eq!(windows_user(bare).as_deref(), Some("ann"));
        assert_eq!(icacls_program(bare), std::path::PathBuf::from("icacls.exe"));
        assert_eq!(windows_user(env(&[])), None);
        let path = Path::new(r"C:\Users\ann\AppData\Local\pair\node.key");
        assert_eq!(
            owner_only_icacls(path, r"BOX\ann", false),
            [
                path.as_os_str(),
                "/inheritance:r".as_ref(),
                "/grant:r".as_ref(),
                r"BOX\ann:F".as_ref()
            ]
        );
        assert_eq!(
            owner_only_icacls(path, "ann", true)[3],
            std::ffi::OsString::from("ann:(OI)(CI)F")
        );
    }

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
