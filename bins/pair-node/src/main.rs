//! pair-node: the daemon and its CLI.

fn main() {}
