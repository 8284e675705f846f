//! Node identity, trust store, PIN pairing through SPAKE2, mutual TLS with pinned peers.
