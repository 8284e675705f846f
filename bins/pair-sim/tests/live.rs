//! The simulator's live twin, as CI checks it: `pair-sim live` runs the
//! ci-smoke scenario through real `pair-node` processes over emulated
//! engines, and fails if two policies the simulator puts at least 2x
//! apart by mean TTFT come out in the other order live (closer ones swap
//! from run to run at 8 users). It runs among the other tests (each its
//! own process under cargo nextest), so its two minutes overlap theirs.

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

#[test]
fn live_agrees_with_the_simulator_on_the_ci_scenario() {
    let sim = Path::new(env!("CARGO_BIN_EXE_pair-sim"));
    // The daemon of this build, beside the simulator (cargo builds it for
    // the workspace's tests; `cargo build -p pair-node` for this one alone).
    let node = sim.with_file_name("pair-node");
    assert!(
        node.exists(),
        "{} is built by `cargo test --workspace` (or `cargo build -p pair-node`)",
        node.display()
    );
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/ci-smoke.toml");
    let out = Command::new(sim)
        .arg("live")
        .arg(&scenario)
        .args([
            "--time-scale",
            "0.1",
            "--duration",
            "240",
            "--no-search",
            "--check-ranking",
            "--margin",
            "2",
            "--pair-node",
        ])
        .arg(&node)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "live disagrees with the simulator");
    assert!(
        said.contains("ranking of policies: live agrees with the simulator"),
        "{said}"
    );
}
