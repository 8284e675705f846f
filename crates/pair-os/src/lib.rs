//! What differs between Linux, macOS and Windows, decided in one place.
//!
//! Every decision is a pure function of an [`Os`] value and the
//! environment (an env lookup, a raw reading), so each OS's rule is
//! unit-tested on Linux: where state lives ([`dirs`]), the host's name
//! ([`host`]), the open-file cap ([`limits`]), how an engine's command line
//! splits ([`cmdline`]), which interfaces are virtual and which names are
//! valid ([`net`]), how an engine's process tree is stopped ([`process`])
//! and how a secret file is protected ([`secrets`]). Thin shells apply
//! them to the host ([`Os::current`]).
//!
//! Code that only one OS can compile sits behind `cfg(unix)` or
//! `cfg(windows)`. The fallbacks that need no Windows API (the fixed
//! open-file cap, Ctrl-C-only shutdown, no Unix modes) are also compiled
//! and tested on Linux under `RUSTFLAGS="--cfg pair_portable"`, which
//! makes this crate (and pair-fs) take them as a non-Unix host would.

// Tests may unwrap: a panic is the failure report there.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cmdline;
pub mod dirs;
pub mod host;
pub mod limits;
pub mod net;
pub mod process;
pub mod secrets;
#[cfg(feature = "signal")]
pub mod signal;

pub use cmdline::{SplitError, split_command_line};
pub use dirs::{App, Dirs, Roots};
pub use host::hostname;
pub use limits::{open_file_cap, raise_open_file_limit};
pub use net::{bind_tcp, is_virtual_interface, valid_interface_name};

/// The operating systems pair decides for. Other Unixes follow Linux's
/// rules (XDG directories, process groups, Unix modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Os {
    Linux,
    MacOs,
    Windows,
}

impl Os {
    /// Every OS, for tests that check a rule on each.
    pub const ALL: [Os; 3] = [Os::Linux, Os::MacOs, Os::Windows];

    /// The OS this build runs on.
    pub const fn current() -> Os {
        if cfg!(windows) {
            Os::Windows
        } else if cfg!(target_os = "macos") {
            Os::MacOs
        } else {
            Os::Linux
        }
    }

    /// Whether the host runs Unix code paths: Unix modes, signals, process
    /// groups, rlimits. False on Windows, and on any host built with
    /// `--cfg pair_portable` (the fallbacks run on Linux in CI).
    pub const fn host_is_unix() -> bool {
        cfg!(all(unix, not(pair_portable)))
    }

    /// The path separator of this OS.
    pub const fn separator(self) -> char {
        match self {
            Os::Windows => '\\',
            Os::Linux | Os::MacOs => '/',
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Os::Linux => "linux",
            Os::MacOs => "macos",
            Os::Windows => "windows",
        }
    }
}

impl std::fmt::Display for Os {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_the_os_this_was_built_for() {
        if cfg!(target_os = "linux") {
            assert_eq!(Os::current(), Os::Linux);
            assert_eq!(Os::host_is_unix(), !cfg!(pair_portable));
        }
        assert_eq!(Os::Windows.separator(), '\\');
        assert_eq!(Os::MacOs.to_string(), "macos");
    }
}
