//! The binaries' shutdown signal: SIGTERM (what systemd and launchd send
//! to stop a service) or Ctrl-C on Unix; Ctrl-C (and the console's close)
//! elsewhere; and, on every host, a stop asked from inside the process
//! ([`request_stop`]: the Windows service controller's Stop, which comes
//! as a call, not a signal).

use std::sync::atomic::{AtomicBool, Ordering};

static STOP_ASKED: AtomicBool = AtomicBool::new(false);
static STOP: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Asks the process to stop: [`shutdown_signal`] resolves, now or when it
/// is next awaited.
pub fn request_stop() {
    STOP_ASKED.store(true, Ordering::SeqCst);
    STOP.notify_waiters();
}

/// Resolves once [`request_stop`] has been called.
async fn stop_requested() {
    loop {
        let notified = STOP.notified();
        if STOP_ASKED.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }
}

/// Resolves when the process is asked to stop.
pub async fn shutdown_signal() {
    tokio::select! {
        () = os_signal() => {}
        () = stop_requested() => {}
    }
}

async fn os_signal() {
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
    if tokio::signal::ctrl_c().await.is_err() {
        // No console to listen on (a service): only a stop asked from
        // inside ends it.
        std::future::pending::<()>().await;
    }
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

    /// A stop asked from inside (the Windows service controller's) ends
    /// the wait on every host, whether it comes before or during it.
    #[tokio::test]
    async fn a_stop_asked_from_inside_ends_the_wait() {
        let stop = tokio::spawn(shutdown_signal());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!stop.is_finished());
        request_stop();
        tokio::time::timeout(Duration::from_secs(5), stop)
            .await
            .expect("the wait ended")
            .unwrap();
        // Asked already: a later wait ends at once.
        tokio::time::timeout(Duration::from_secs(5), shutdown_signal())
            .await
            .expect("the wait ended at once");
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
