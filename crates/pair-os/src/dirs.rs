//! Where a node and a client keep their state, settings and logs.
//!
//! [`Roots`] are the OS's base folders; [`Dirs::layout`] puts pair's
//! folders in them. Both are pure: [`Roots::from_env`] computes each OS's
//! roots from an env lookup (so all three are tested on Linux), and
//! [`Roots::host`] asks the `directories` crate for the real host's (on
//! Windows the Known Folder API, which needs no variable at all; a test
//! checks the two agree on Linux).
//!
//! | OS | node state and settings | client state | logs |
//! |---|---|---|---|
//! | Linux | `$XDG_CONFIG_HOME/pair` (`~/.config/pair`) | `$XDG_STATE_HOME/pair-client` (`~/.local/state/pair-client`) | `$XDG_STATE_HOME/<app>` |
//! | macOS | `~/Library/Application Support/pair` | `~/Library/Application Support/pair-client` | `~/Library/Logs/<app>` |
//! | Windows | `%LOCALAPPDATA%\pair` | `%LOCALAPPDATA%\pair-client` | `%LOCALAPPDATA%\<app>\logs` |

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::Os;

/// Which program's folders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// `pair-node`: identity, trust store, keys, job log, control token.
    Node,
    /// `pair-client`: its identity, pins and ranking cache.
    Client,
}

impl App {
    pub const fn folder(self) -> &'static str {
        match self {
            App::Node => "pair",
            App::Client => "pair-client",
        }
    }
}

/// An OS's base folders for one user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    pub home: PathBuf,
    /// Settings (`$XDG_CONFIG_HOME`, Application Support, `%APPDATA%`).
    pub config: PathBuf,
    /// State that is not settings (`$XDG_STATE_HOME`; elsewhere the local
    /// data folder).
    pub state: PathBuf,
    /// Data kept on this machine only (`$XDG_DATA_HOME`, Application
    /// Support, `%LOCALAPPDATA%`).
    pub local_data: PathBuf,
}

/// Looks up an environment variable (`std::env::var_os` on the host; a
/// table in tests).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

impl Roots {
    /// `os`'s roots as computed from its environment variables, as the
    /// `directories` crate computes them on that OS (Windows: from
    /// `%USERPROFILE%`, `%LOCALAPPDATA%` and `%APPDATA%`, which is what the
    /// Known Folder API answers by default). `None` without a home.
    pub fn from_env(os: Os, env: Env<'_>) -> Option<Roots> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        match os {
            Os::Linux => {
                let home = var("HOME")?;
                // The XDG spec: a relative path is invalid and ignored.
                let xdg = |k: &str, dflt: &str| {
                    var(k)
                        .filter(|p| p.to_string_lossy().starts_with('/'))
                        .unwrap_or_else(|| join(os, &home, dflt))
                };
                Some(Roots {
                    config: xdg("XDG_CONFIG_HOME", ".config"),
                    state: xdg("XDG_STATE_HOME", ".local/state"),
                    local_data: xdg("XDG_DATA_HOME", ".local/share"),
                    home,
                })
            }
            Os::MacOs => {
                let home = var("HOME")?;
                let support = join(os, &home, "Library/Application Support");
                Some(Roots {
                    config: support.clone(),
                    state: support.clone(),
                    local_data: support,
                    home,
                })
            }
            Os::Windows => {
                let home = var("USERPROFILE").or_else(|| {
                    let drive = env("HOMEDRIVE")?;
                    let path = env("HOMEPATH")?;
                    let mut joined = drive;
                    joined.push(path);
                    Some(PathBuf::from(joined)).filter(|p| !p.as_os_str().is_empty())
                })?;
                let local = var("LOCALAPPDATA").unwrap_or_else(|| join(os, &home, "AppData/Local"));
                Some(Roots {
                    config: var("APPDATA").unwrap_or_else(|| join(os, &home, "AppData/Roaming")),
                    state: local.clone(),
                    local_data: local,
                    home,
                })
            }
        }
    }

    /// The real host's roots, from the `directories` crate (on Linux the
    /// XDG variables, on macOS the standard folders, on Windows the Known
    /// Folder API). `None` when the OS names no home for this user.
    pub fn host() -> Option<Roots> {
        let base = directories::BaseDirs::new()?;
        let home = base.home_dir().to_path_buf();
        let local_data = base.data_local_dir().to_path_buf();
        let state = match Os::current() {
            Os::Linux => base
                .state_dir()
                .map_or_else(|| home.join(".local/state"), Path::to_path_buf),
            Os::MacOs | Os::Windows => local_data.clone(),
        };
        Some(Roots {
            config: base.config_dir().to_path_buf(),
            state,
            local_data,
            home,
        })
    }
}

/// One program's folders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirs {
    /// Identity, keys, trust store, job log: what `--state-dir` replaces.
    pub state: PathBuf,
    /// Settings files.
    pub config: PathBuf,
    /// Where a service's log goes.
    pub logs: PathBuf,
}

impl Dirs {
    /// pair's folders for `app` on `os` under `roots`.
    pub fn layout(os: Os, app: App, roots: &Roots) -> Dirs {
        let name = app.folder();
        match os {
            Os::Linux => Dirs {
                state: match app {
                    // Where nodes have always kept it: existing identities stay.
                    App::Node => join(os, &roots.config, name),
                    App::Client => join(os, &roots.state, name),
                },
                config: join(os, &roots.config, name),
                logs: join(os, &roots.state, name),
            },
            Os::MacOs => Dirs {
                state: join(os, &roots.local_data, name),
                config: join(os, &roots.config, name),
                logs: join(os, &roots.home, &format!("Library/Logs/{name}")),
            },
            Os::Windows => {
                let base = join(os, &roots.local_data, name);
                Dirs {
                    logs: join(os, &base, "logs"),
                    config: base.clone(),
                    state: base,
                }
            }
        }
    }

    /// `app`'s folders on `os` from its environment; `None` without a home.
    pub fn compute(os: Os, app: App, env: Env<'_>) -> Option<Dirs> {
        Roots::from_env(os, env).map(|r| Dirs::layout(os, app, &r))
    }

    /// `app`'s folders on this host ([`Roots::host`]).
    pub fn host(app: App) -> Option<Dirs> {
        Roots::host().map(|r| Dirs::layout(Os::current(), app, &r))
    }
}

/// `base` joined with `rel` (written with `/`), with `os`'s separator, so a
/// Windows path computed on Linux reads as it would on Windows.
fn join(os: Os, base: &Path, rel: &str) -> PathBuf {
    match os {
        Os::Windows => {
            let base = base.to_string_lossy();
            let base = base.trim_end_matches(['\\', '/']);
            PathBuf::from(format!("{base}\\{}", rel.replace('/', "\\")))
        }
        Os::Linux | Os::MacOs => base.join(rel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(*v))
        }
    }

    #[test]
    fn linux_follows_xdg_and_keeps_the_nodes_old_place() {
        let e = env(&[("HOME", "/home/u")]);
        let node = Dirs::compute(Os::Linux, App::Node, &e).unwrap();
        assert_eq!(node.state, PathBuf::from("/home/u/.config/pair"));
        assert_eq!(node.config, PathBuf::from("/home/u/.config/pair"));
        assert_eq!(node.logs, PathBuf::from("/home/u/.local/state/pair"));
        let client = Dirs::compute(Os::Linux, App::Client, &e).unwrap();
        assert_eq!(
            client.state,
            PathBuf::from("/home/u/.local/state/pair-client")
        );

        let e = env(&[
            ("HOME", "/home/u"),
            ("XDG_CONFIG_HOME", "/x/conf"),
            ("XDG_STATE_HOME", "/x/state"),
        ]);
        let node = Dirs::compute(Os::Linux, App::Node, &e).unwrap();
        assert_eq!(node.state, PathBuf::from("/x/conf/pair"));
        assert_eq!(node.logs, PathBuf::from("/x/state/pair"));
        let client = Dirs::compute(Os::Linux, App::Client, &e).unwrap();
        assert_eq!(client.state, PathBuf::from("/x/state/pair-client"));

        // Relative or empty XDG values are ignored, as the spec says.
        let e = env(&[
            ("HOME", "/h"),
            ("XDG_CONFIG_HOME", "rel"),
            ("XDG_STATE_HOME", ""),
        ]);
        let node = Dirs::compute(Os::Linux, App::Node, &e).unwrap();
        assert_eq!(node.state, PathBuf::from("/h/.config/pair"));
        assert_eq!(node.logs, PathBuf::from("/h/.local/state/pair"));
        // No home, no default: the caller asks for --state-dir.
        assert_eq!(Dirs::compute(Os::Linux, App::Node, &env(&[])), None);
        assert_eq!(
            Dirs::compute(Os::Linux, App::Node, &env(&[("XDG_CONFIG_HOME", "/x")])),
            None
        );
    }

    #[test]
    fn macos_uses_application_support_and_library_logs() {
        let e = env(&[("HOME", "/Users/ann"), ("XDG_CONFIG_HOME", "/ignored")]);
        let node = Dirs::compute(Os::MacOs, App::Node, &e).unwrap();
        assert_eq!(
            node.state,
            PathBuf::from("/Users/ann/Library/Application Support/pair")
        );
        assert_eq!(node.config, node.state);
        assert_eq!(node.logs, PathBuf::from("/Users/ann/Library/Logs/pair"));
        let client = Dirs::compute(Os::MacOs, App::Client, &e).unwrap();
        assert_eq!(
            client.state,
            PathBuf::from("/Users/ann/Library/Application Support/pair-client")
        );
        assert_eq!(Dirs::compute(Os::MacOs, App::Node, &env(&[])), None);
    }

    #[test]
    fn windows_uses_local_app_data_with_or_without_its_variable() {
        let e = env(&[
            ("USERPROFILE", r"C:\Users\Ann"),
            ("LOCALAPPDATA", r"D:\Local"),
            ("HOME", "/ignored"),
        ]);
        let node = Dirs::compute(Os::Windows, App::Node, &e).unwrap();
        assert_eq!(node.state, PathBuf::from(r"D:\Local\pair"));
        assert_eq!(node.config, PathBuf::from(r"D:\Local\pair"));
        assert_eq!(node.logs, PathBuf::from(r"D:\Local\pair\logs"));
        let client = Dirs::compute(Os::Windows, App::Client, &e).unwrap();
        assert_eq!(client.state, PathBuf::from(r"D:\Local\pair-client"));

        // Neither HOME nor XDG, nor even LOCALAPPDATA: the profile's default.
        let e = env(&[("USERPROFILE", r"C:\Users\Bo\")]);
        let node = Dirs::compute(Os::Windows, App::Node, &e).unwrap();
        assert_eq!(node.state, PathBuf::from(r"C:\Users\Bo\AppData\Local\pair"));
        let e = env(&[("HOMEDRIVE", "C:"), ("HOMEPATH", r"\Users\Cy")]);
        let roots = Roots::from_env(Os::Windows, &e).unwrap();
        assert_eq!(roots.config, PathBuf::from(r"C:\Users\Cy\AppData\Roaming"));
        assert_eq!(
            Dirs::layout(Os::Windows, App::Client, &roots).state,
            PathBuf::from(r"C:\Users\Cy\AppData\Local\pair-client")
        );
        // Never a path relative to wherever it runs.
        assert_eq!(Dirs::compute(Os::Windows, App::Client, &env(&[])), None);
    }

    /// The pure rule and the `directories` crate agree on the host (Linux
    /// here), so what the tests say of the other OSes is what `directories`
    /// computes there.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_pure_roots_agree_with_the_directories_crate_on_this_host() {
        let host_env = |k: &str| std::env::var_os(k);
        let Some(pure) = Roots::from_env(Os::Linux, &host_env) else {
            // No $HOME: directories falls back to the password database,
            // which the pure rule does not read.
            return;
        };
        assert_eq!(Some(pure.clone()), Roots::host());
        for app in [App::Node, App::Client] {
            assert_eq!(Some(Dirs::layout(Os::Linux, app, &pure)), Dirs::host(app));
        }
    }
}
