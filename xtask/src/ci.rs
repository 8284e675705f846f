//! The fuzz step of `cargo xtask ci`: every target under `fuzz/` builds,
//! then runs for a couple of seconds from a copy of its committed seeds
//! (`fuzz/seeds/<target>/`), so a target that no longer builds, has no
//! seeds, or crashes at once fails CI. Longer runs are on demand
//! (`fuzz/run-all.sh`, docs/fuzzing.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// libFuzzer's `-max_total_time` for each target. It stops once more than
/// this many whole seconds have passed, so a target takes about a second
/// more, plus cargo's check that the build is fresh.
const SMOKE_SECS: u32 = 2;
/// An input running longer than this counts as a hang (a crash).
const INPUT_TIMEOUT_SECS: u32 = 10;
/// Targets fuzzed at once, at most: each is one process on one core.
const MAX_JOBS: usize = 4;
/// Lines of the end of a failed target's output shown (after the lines
/// that say what failed).
const LOG_TAIL_LINES: usize = 16;

/// Builds every fuzz target (dev profile), then smoke-runs each.
pub(crate) fn fuzz(root: &Path) -> Result<()> {
    let dir = root.join("fuzz");
    crate::run(&dir, "cargo", &["+nightly", "fuzz", "build", "--dev"])?;
    smoke(&dir)
}

/// What one target's smoke run came to.
struct Smoke {
    target: String,
    took: Duration,
    execs: Option<u64>,
    /// What its output says went wrong, when it failed.
    failure: Option<String>,
}

fn smoke(dir: &Path) -> Result<()> {
    let targets = targets(dir)?;
    let scratch = Scratch::new()?;
    // Fuzzing adds to the corpus it is given: copy the seeds, so the
    // repository's stay as committed.
    let mut queue = Vec::with_capacity(targets.len());
    for target in &targets {
        let seeds = dir.join("seeds").join(target);
        let corpus = scratch.0.join(target);
        copy_seeds(&seeds, &corpus).with_context(|| {
            format!(
                "fuzz target {target} needs seed inputs in {}",
                seeds.display()
            )
        })?;
        queue.push((target.as_str(), corpus));
    }
    let jobs = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_JOBS)
        .min(queue.len().max(1));
    eprintln!(
        "xtask: fuzz smoke: {} targets, {SMOKE_SECS} s each from their seeds, {jobs} at a time",
        queue.len()
    );
    let started = Instant::now();
    let queue = Mutex::new(queue.into_iter());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.next());
                    let Some((target, corpus)) = next else { break };
                    let smoke = run_target(dir, target, &corpus);
                    report(&smoke);
                    if let Ok(mut r) = results.lock() {
                        r.push(smoke);
                    }
                }
            });
        }
    });
    let results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a fuzz smoke worker panicked"))?;
    eprintln!(
        "xtask: fuzz smoke: {} targets in {:.1} s",
        results.len(),
        started.elapsed().as_secs_f64()
    );
    let mut failed: Vec<&Smoke> = results.iter().filter(|r| r.failure.is_some()).collect();
    if results.len() != targets.len() {
        bail!(
            "fuzz smoke: {} of {} targets ran",
            results.len(),
            targets.len()
        );
    }
    if failed.is_empty() {
        return Ok(());
    }
    failed.sort_by(|a, b| a.target.cmp(&b.target));
    for f in &failed {
        eprintln!(
            "\nxtask: fuzz target {} failed:\n{}",
            f.target,
            f.failure.as_deref().unwrap_or_default()
        );
    }
    let names: Vec<&str> = failed.iter().map(|f| f.target.as_str()).collect();
    bail!(
        "fuzz smoke failed: {} (reproducers in fuzz/artifacts/<target>/; replay with \
         `cd fuzz && cargo +nightly fuzz run --dev <target> <reproducer>`)",
        names.join(", ")
    )
}

/// The fuzz targets, as cargo-fuzz lists them (the `[[bin]]`s of
/// fuzz/Cargo.toml).
fn targets(dir: &Path) -> Result<Vec<String>> {
    let out = Command::new("cargo")
        .args(["+nightly", "fuzz", "list"])
        .current_dir(dir)
        .output()
        .context("running cargo +nightly fuzz list")?;
    if !out.status.success() {
        bail!(
            "cargo +nightly fuzz list failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if targets.is_empty() {
        bail!("cargo +nightly fuzz list named no targets");
    }
    Ok(targets)
}

/// Copies the files of `seeds` into a new directory `corpus`; there must
/// be at least one.
fn copy_seeds(seeds: &Path, corpus: &Path) -> Result<()> {
    std::fs::create_dir_all(corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let mut copied = 0usize;
    for entry in std::fs::read_dir(seeds).with_context(|| format!("reading {}", seeds.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let name = path.file_name().context("a seed file without a name")?;
            std::fs::copy(&path, corpus.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
            copied += 1;
        }
    }
    if copied == 0 {
        bail!("{} holds no seed files", seeds.display());
    }
    Ok(())
}

fn run_target(dir: &Path, target: &str, corpus: &Path) -> Smoke {
    let started = Instant::now();
    let out = Command::new("cargo")
        .args(["+nightly", "fuzz", "run", "--dev", target])
        .arg(corpus)
        .arg("--")
        .arg(format!("-max_total_time={SMOKE_SECS}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .args(["-rss_limit_mb=2048", "-print_final_stats=1"])
        // cargo-fuzz's own backtrace says nothing about the target's crash
        // (the target's panic keeps RUST_BACKTRACE).
        .env("RUST_LIB_BACKTRACE", "0")
        .current_dir(dir)
        .output();
    let took = started.elapsed();
    let (ok, log) = match out {
        Ok(out) => {
            let mut log = String::from_utf8_lossy(&out.stdout).into_owned();
            log.push_str(&String::from_utf8_lossy(&out.stderr));
            (out.status.success(), log)
        }
        Err(e) => (
            false,
            format!("could not start cargo +nightly fuzz run: {e}"),
        ),
    };
    let execs = log
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|n| n.trim().parse().ok());
    Smoke {
        target: target.to_owned(),
        took,
        execs,
        failure: (!ok).then(|| failure_summary(&log)),
    }
}

fn report(smoke: &Smoke) {
    let execs = smoke
        .execs
        .map_or_else(|| "?".to_owned(), |n| n.to_string());
    let verdict = if smoke.failure.is_some() {
        "FAILED"
    } else {
        "ok"
    };
    eprintln!(
        "xtask: fuzz smoke {:<24} {verdict:<6} {:>5.1} s {execs:>8} runs",
        smoke.target,
        smoke.took.as_secs_f64()
    );
}

/// The lines of a failed run's output that say what went wrong (a
/// panic's message, a sanitizer's or libFuzzer's error, where the crashing
/// input was written), then its last lines (cargo-fuzz's reproduction
/// commands, or a build error).
fn failure_summary(log: &str) -> String {
    const MARKS: &[&str] = &[
        "ERROR: AddressSanitizer",
        "ERROR: LeakSanitizer",
        "ERROR: libFuzzer",
        "SUMMARY: ",
        "Test unit written to",
    ];
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.contains("panicked at") {
            // The message follows on its own lines, up to a blank one or
            // the backtrace.
            out.push(line);
            for &more in lines[i + 1..].iter().take(6) {
                if more.trim().is_empty() || more.starts_with("stack backtrace") {
                    break;
                }
                out.push(more);
                i += 1;
            }
        } else if MARKS.iter().any(|m| line.contains(m)) {
            out.push(line);
        }
        i += 1;
    }
    if !out.is_empty() {
        out.push("...");
    }
    out.extend(&lines[lines.len().saturating_sub(LOG_TAIL_LINES)..]);
    out.join("\n")
}

/// A directory under the system's temporary one, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("pair-fuzz-smoke-{}", std::process::id()));
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("clearing {}", path.display()))?;
        }
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_summed_up_by_what_went_wrong_then_the_end() {
        let mut log = String::from(
            "INFO: Running with entropic power schedule\n\
             thread '<unnamed>' panicked at fuzz_targets/x.rs:3:5:\n\
             round trip\n  left: 1\n right: 2\n\
             stack backtrace:\n   0: frame\n\
             ==1== ERROR: libFuzzer: deadly signal\n\
             Test unit written to artifacts/x/crash-1\n",
        );
        for n in 0..LOG_TAIL_LINES {
            log.push_str(&format!("tail {n}\n"));
        }
        let sum = failure_summary(&log);
        let lines: Vec<&str> = sum.lines().collect();
        assert_eq!(
            lines[..7],
            [
                "thread '<unnamed>' panicked at fuzz_targets/x.rs:3:5:",
                "round trip",
                "  left: 1",
                " right: 2",
                "==1== ERROR: libFuzzer: deadly signal",
                "Test unit written to artifacts/x/crash-1",
                "...",
            ]
        );
        assert_eq!(lines.len(), 7 + LOG_TAIL_LINES);
        assert_eq!(
            lines.last(),
            Some(&format!("tail {}", LOG_TAIL_LINES - 1).as_str())
        );
        assert_eq!(
            failure_summary("error: could not compile"),
            "error: could not compile"
        );
    }

    #[test]
    fn seeds_are_copied_and_required() -> Result<()> {
        let tmp = tempfile::tempdir()?;
        let seeds = tmp.path().join("seeds");
        std::fs::create_dir_all(&seeds)?;
        let corpus = tmp.path().join("corpus");
        assert!(copy_seeds(&seeds, &corpus).is_err(), "no seeds accepted");
        std::fs::write(seeds.join("one"), b"1")?;
        copy_seeds(&seeds, &corpus)?;
        assert_eq!(std::fs::read(corpus.join("one"))?, b"1");
        assert!(copy_seeds(&tmp.path().join("missing"), &corpus).is_err());
        Ok(())
    }
}
