//! Tests of the peer table.
