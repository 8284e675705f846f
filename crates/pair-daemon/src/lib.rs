//! The node as a library, under `pair-node`'s command line: the daemon
//! (`daemon`), its configuration (`config`), the
//! engines it fronts (`engines`: named, started, or detected), the local
//! control API and Jobs view (`control`, `ui`), the CLI client (`cli`), the
//! GPU of an emulated engine (`emulated`), the node as an OS service
//! (`service`: systemd, launchd, the Windows service controller) and, with
//! feature `demo`, the
//! demo's in-process cluster (`demo`), which the tests also start through
//! `pair-testkit`.

pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
#[cfg(feature = "demo")]
pub mod demo;
pub mod emulated;
pub mod engines;
pub mod service;
pub mod ui;
