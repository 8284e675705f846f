//! Shared test fixtures: temporary identities, emulated engines, a cluster harness.
