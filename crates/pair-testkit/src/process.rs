//! Child processes in tests: killed and reaped when dropped, and their
//! output read until the line a test waits for, within a limit.

use std::time::Duration;

/// A child process (an engine, another `pair-node`) killed and reaped when
/// dropped, so a failing test never leaves one behind.
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads a child's output (`stdout` or `stderr`) line by line on a thread
/// and hands each line to `want` until it returns true, for at most
/// `limit`; the rest of the output keeps draining so the child never blocks
/// on a full pipe. A child that exits or hangs fails with the lines seen,
/// instead of blocking the test forever.
pub fn wait_for_output<R: std::io::Read + Send + 'static>(
    out: R,
    limit: Duration,
    mut want: impl FnMut(&str) -> bool,
) -> std::result::Result<(), String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Bytes, not `lines()`: a line that is not UTF-8 must neither end
        // the wait nor stop the draining.
        let mut reader = std::io::BufReader::new(out);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
                    // After the wait is over the receiver is gone: keep draining.
                    let _ = tx.send(line);
                }
            }
        }
    });
    let deadline = std::time::Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if want(&line) {
                    return Ok(());
                }
                seen.push(line);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                return Err(format!(
                    "no expected output within {limit:?}; got:\n{}",
                    seen.join("\n")
                ));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!(
                    "the process exited; its output:\n{}",
                    seen.join("\n")
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_waits_end_on_the_line_on_exit_and_on_time() {
        let found = wait_for_output(
            &b"a\n\xff\xfe not utf-8\nready x=1\nb\n"[..],
            Duration::from_secs(5),
            |l| l.starts_with("ready"),
        );
        assert_eq!(found, Ok(()));
        let exited = wait_for_output(&b"a\n"[..], Duration::from_secs(5), |_| false);
        assert!(exited.unwrap_err().contains("exited"));
        // A writer that never closes and never says the line.
        let (reader, _writer) = std::io::pipe().unwrap();
        let hung = wait_for_output(reader, Duration::from_millis(200), |_| false);
        assert!(hung.unwrap_err().contains("within"));
    }
}
