//! Repository tasks: cargo xtask ci | bench | fuzz | tidy.

fn main() {}
