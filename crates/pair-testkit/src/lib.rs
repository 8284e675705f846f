//! Test support, in one place, used only as a dev-dependency (`xtask tidy`
//! checks that no library or binary links it):
//!
//! - [`mod@env`]: where tests find what `scripts/setup-python.sh` installs (the
//!   Python SDKs, llama-cpp-python and its model, the coding agents).
//! - [`process`]: child processes killed with the test, and waiting on
//!   their output.
//! - [`netns`]: a network namespace joined to this one by a veth pair.
//! - [`harness`]: libtest's list and filter for harness-free test binaries.
//! - `hop` (feature `hop`): a fake hop whose nodes do as scripted, for
//!   tests of how a node's pipeline and the edge SDK end a request.
//! - `cluster` (feature `cluster`): the in-process local cluster
//!   (`pair_daemon::demo`, the demo's own) and what tests do with it.
//! - `node` (feature `cluster`): `pair-node run` processes over emulated
//!   engines, and the CLI run against them.

pub mod env;
pub mod harness;
pub mod netns;
pub mod process;

#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "hop")]
pub mod hop;
#[cfg(feature = "cluster")]
pub mod node;
