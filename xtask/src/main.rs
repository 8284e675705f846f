//! Repository tasks. `cargo xtask ci` runs exactly what CI runs, so a
//! developer can reproduce CI with one command on a fresh machine;
//! `cargo xtask bench` runs the benchmark suite side by side and prints one
//! table.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

mod bench;
mod ci;
mod tidy;

#[derive(Parser)]
#[command(about = "pair repository tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the tests need, then fmt, clippy, test, the portable
    /// fallbacks (`--cfg pair_portable`), doc, deny, tidy,
    /// the simulator smoke run and the fuzz targets' build and smoke run.
    Ci {
        /// Skip the idempotent install step (apt, cargo-deny, cargo-fuzz,
        /// Python venvs).
        #[arg(long)]
        no_setup: bool,
    },
    /// The benchmark suite side by side, one table: scheduler, proxy
    /// against nginx (and hyper's stack), peer hop, streaming first byte,
    /// memory, simulator speed.
    Bench {
        /// Runs of each proxy measurement (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: u32,
        /// Seconds of each wrk run.
        #[arg(long, default_value_t = 2)]
        seconds: u32,
    },
    /// The chaos test at a chosen size: three nodes on emulated engines
    /// take N mixed requests over S seconds while nodes and engines fail;
    /// prints the summary table (CI runs a small one).
    Chaos {
        #[arg(long, default_value_t = 3000)]
        requests: u32,
        #[arg(long, default_value_t = 120)]
        seconds: u32,
        /// Seed of the request mix (a run is reproducible from it).
        #[arg(long, default_value_t = 0x5eed)]
        seed: u64,
        /// Build optimised (slower to build, closer to a real node).
        #[arg(long)]
        release: bool,
    },
    /// Install test prerequisites only (idempotent).
    Setup,
    /// Repository invariants (dependency direction, file headers).
    Tidy,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.task {
        Task::Ci { no_setup } => {
            if !no_setup {
                setup(&root)?;
            }
            ci(&root)
        }
        Task::Bench { runs, seconds } => bench::run(&root, runs, seconds),
        Task::Chaos {
            requests,
            seconds,
            seed,
            release,
        } => {
            let mut c = Command::new("cargo");
            c.current_dir(&root)
                .args(["test", "-p", "pair-node", "--test", "chaos"]);
            if release {
                c.arg("--release");
            }
            c.args(["--", "--nocapture"])
                .env("CHAOS_REQUESTS", requests.to_string())
                .env("CHAOS_SECONDS", seconds.to_string())
                .env("CHAOS_SEED", seed.to_string())
                .env("CHAOS_REPORT", root.join("target/chaos-report.md"));
            status(c, "chaos test")
        }
        Task::Setup => setup(&root),
        Task::Tidy => tidy::run(&root),
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn setup(root: &Path) -> Result<()> {
    run(root, "bash", &["scripts/setup.sh"])
}

fn ci(root: &Path) -> Result<()> {
    let py = python_env(root)?;
    run(root, "cargo", &["fmt", "--all", "--", "--check"])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // Every test of every target, each its own process, several at once
    // (.config/nextest.toml); doctests below, which nextest does not run.
    nextest(root)?;
    let mut test = Command::new("cargo");
    test.current_dir(root)
        .args([
            "nextest",
            "run",
            "--workspace",
            "--all-targets",
            "--no-fail-fast",
        ])
        .envs(py.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    status(test, "cargo nextest run")?;
    run(root, "cargo", &["test", "--workspace", "--doc"])?;
    portable_fallbacks(root)?;
    let mut doc = Command::new("cargo");
    doc.current_dir(root)
        .args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings");
    status(doc, "cargo doc")?;
    run(
        root,
        "cargo",
        &["deny", "check", "bans", "licenses", "sources"],
    )?;
    tidy::run(root)?;
    // The bench reports' statistics (scripts/bench/stats.py).
    run(
        root,
        "python3",
        &[
            "-m",
            "unittest",
            "discover",
            "-s",
            "scripts/bench",
            "-p",
            "test_*.py",
        ],
    )?;
    // The simulator's smoke run and its live twin (real pair-node
    // processes) are tests of pair-sim (bins/pair-sim/tests): they ran
    // above, among the others.
    // Every fuzz target builds and survives a short run from its seeds
    // (longer runs are on demand: docs/fuzzing.md).
    ci::fuzz(root)?;
    eprintln!("xtask ci: all checks passed");
    Ok(())
}

/// The fallbacks a non-Unix host takes (the fixed open-file cap,
/// Ctrl-C-only shutdown, no Unix modes), compiled and tested on Linux with
/// `--cfg pair_portable`: pair-os and pair-fs, in a target dir of their own
/// so the main build's cache stays valid.
fn portable_fallbacks(root: &Path) -> Result<()> {
    let mut test = Command::new("cargo");
    test.current_dir(root)
        .args([
            "nextest",
            "run",
            "-p",
            "pair-os",
            "-p",
            "pair-fs",
            "--all-features",
            "--no-fail-fast",
        ])
        .env("RUSTFLAGS", "--cfg pair_portable -D warnings")
        .env("CARGO_TARGET_DIR", root.join("target/portable"));
    status(test, "portable fallbacks (--cfg pair_portable)")
}

/// The `KEY=VALUE` lines scripts/setup-python.sh and
/// scripts/setup-agents.sh print (both are idempotent and fast on a warm
/// cache), passed to the tests as environment.
fn python_env(root: &Path) -> Result<Vec<(String, String)>> {
    let mut vars = Vec::new();
    for script in ["scripts/setup-python.sh", "scripts/setup-agents.sh"] {
        let out = Command::new("bash")
            .arg(script)
            .current_dir(root)
            .output()
            .with_context(|| format!("running {script}"))?;
        if !out.status.success() {
            bail!("{script} failed:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        vars.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned())),
        );
    }
    Ok(vars)
}

fn run(root: &Path, program: &str, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new(program);
    cmd.current_dir(root).args(args);
    status(cmd, &format!("{program} {}", args.join(" ")))
}

fn status(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let started = std::time::Instant::now();
    let st = cmd.status().with_context(|| format!("starting {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    eprintln!(
        "xtask: {what}: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// cargo-nextest, CI's test runner: this machine's, or installed once.
fn nextest(root: &Path) -> Result<()> {
    let there = Command::new("cargo")
        .args(["nextest", "--version"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| o.status.success());
    if there {
        return Ok(());
    }
    run(root, "cargo", &["install", "--locked", "cargo-nextest"])
}
