//! pair-node: the daemon (`daemon`), its configuration (`config`), the
//! engines it fronts (`engines`: named, started, or detected), the local
//! control API and Jobs view (`control`, `ui`), the CLI client (`cli`) and
//! an in-process cluster harness used by the demo and the tests (`harness`).

pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod engines;
pub mod harness;
pub mod ui;
