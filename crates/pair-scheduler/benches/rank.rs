//! Criterion benchmarks of `rank_into` for every policy over 8, 64 and 256 nodes.

fn main() {}
