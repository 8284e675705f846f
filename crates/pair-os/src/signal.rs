//! The binaries' shutdown signal: SIGTERM (what systemd and launchd send
//! to stop a service) or Ctrl-C on Unix; Ctrl-C (and the console's close)
//! elsewhere.

/// Resolves when the process is asked to stop.
pub async fn shutdown_signal() {
    #[cfg(all(unix, not(pair_portable)))]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Sends `signal` to this process once the listener is installed, and
    /// says whether `shutdown_signal` then resolved.
    #[cfg(unix)]
    async fn stops_on(signal: &str) -> bool {
        let stop = shutdown_signal();
        tokio::pin!(stop);
        // One poll installs the handlers.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut stop)
                .await
                .is_err()
        );
        let sent = std::process::Command::new("kill")
            .args([signal, &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .is_ok()
    }

    /// Ctrl-C stops the process on every host (here: SIGINT, which is what
    /// tokio's Ctrl-C is on Unix), the portable fallback included; SIGTERM
    /// (a service manager's stop) stops a Unix node. One test, so the two
    /// signals never cross.
    #[cfg(unix)]
    #[tokio::test]
    async fn ctrl_c_and_sigterm_stop() {
        assert!(stops_on("-INT").await);
        #[cfg(not(pair_portable))]
        assert!(stops_on("-TERM").await);
    }
}
