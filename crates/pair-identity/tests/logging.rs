//! Pairing failures are logged (who, which step, which refusal) and the PIN
//! never is. Its own test binary: tracing's per-thread subscriber must not
//! race with callsites hit by other tests' threads.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use common::{inviter, joiner, refusal, wrong};
use pair_core::Role;
use pair_identity::{Refusal, join};
use tokio::task::JoinSet;

/// Collects formatted log output for assertions.
#[derive(Clone, Default)]
struct LogSink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn failures_are_logged_without_the_pin() {
    let sink = LogSink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .without_time()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    // Current-thread runtime: the server tasks log through this subscriber too.
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut tasks = JoinSet::new();
    let inv = inviter(&mut tasks).await;
    let (me, my_trust) = joiner(Role::Node);
    let pin = inv.service.open_invite(SystemTime::now()).unwrap();
    let typo = wrong(&pin);
    let r = join(&inv.addr, &typo, &me, &my_trust, "laptop").await;
    assert_eq!(refusal(r), Refusal::ConfirmationFailed);
    join(&inv.addr, &pin, &me, &my_trust, "laptop")
        .await
        .unwrap();

    let logs = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("pairing attempt failed"), "{logs}");
    assert!(logs.contains("ConfirmationFailed"), "{logs}");
    assert!(
        logs.contains(&me.id().to_string()),
        "failures name the peer: {logs}"
    );
    for secret in [pin.reveal(), typo.reveal()] {
        let leaked = logs
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|token| token == secret);
        assert!(!leaked, "PIN {secret} leaked into logs:\n{logs}");
    }
}
