//! pair-sim: emulated engines and the cluster simulator.

fn main() {}
