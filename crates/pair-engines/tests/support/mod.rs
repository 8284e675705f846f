//! Test support for pair-engines: a real llama.cpp server
//! (llama-cpp-python) the test owns, free loopback ports, and waiting on
//! an engine's published report.
// Each test binary uses a different part of this module.
#![allow(dead_code, clippy::unwrap_used)]

pub(crate) mod llama;

use std::time::Duration;

use anyhow::{Context, bail};
use pair_engines::EngineReport;
use tokio::sync::watch;

/// A loopback port nothing listens on right now (the OS picks it; it is
/// released at once, so a later bind can race, which is rare enough).
pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Waits until `pred` holds for the published report, or fails with the
/// last report seen.
pub(crate) async fn wait_for(
    rx: &mut watch::Receiver<EngineReport>,
    within: Duration,
    what: &str,
    pred: impl Fn(&EngineReport) -> bool,
) -> anyhow::Result<EngineReport> {
    let waited = tokio::time::timeout(within, async {
        rx.wait_for(|r| pred(r)).await.map(|r| r.clone())
    })
    .await;
    match waited {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e).context("poller stopped"),
        Err(_) => bail!(
            "timed out after {within:?} waiting for {what}; last report: {:#?}",
            *rx.borrow()
        ),
    }
}
