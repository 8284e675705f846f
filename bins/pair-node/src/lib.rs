//! pair-node: the daemon (`daemon`), its configuration (`config`), the
//! engines it fronts (`engines`: named, started, or detected), the local
//! control API and Jobs view (`control`, `ui`), the CLI client (`cli`), the
//! GPU of an emulated engine (`emulated`) and an in-process cluster harness
//! used by the demo and the tests (`harness`).

pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod emulated;
pub mod engines;
pub mod harness;
pub mod ui;
