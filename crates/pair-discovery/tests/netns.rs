//! The namespace test: real multicast between two network namespaces joined
//! by a veth pair (10.77.0.0/24), one discovery node in each, checking
//! discovery, goodbye and eviction after a kill.
//!
//! Needs root (CI runs as root). If namespaces cannot be created the test
//! fails loudly, unless `PAIR_SKIP_NETNS=1` says to skip it. The binary
//! re-executes itself inside each namespace (`ip netns exec`) as the node,
//! selected by the `PAIR_NETNS_NODE` environment variable. Everything it
//! creates is named with the pid and removed again, even on failure.

#![allow(clippy::unwrap_used, clippy::print_stderr)]

#[cfg(target_os = "linux")]
mod support;

#[cfg(target_os = "linux")]
#[path = "netns/linux.rs"]
mod linux;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    linux::main()
}

/// Network namespaces are Linux's: elsewhere there is nothing to run.
#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    println!("skipped: the namespace test needs Linux network namespaces");
    std::process::ExitCode::SUCCESS
}
