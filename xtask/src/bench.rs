//! `cargo xtask bench`: the benchmark suite side by side in one command,
//! one table at the end. Speeds are measured here, never asserted in
//! tests (BENCHMARKS.md has the method and the figures).
//!
//! - the scheduler's ranking (criterion, `pair-scheduler --bench rank`);
//! - the proxy against nginx on the same box, with hyper's stack beside
//!   it, one peer hop, the streamed first byte and memory
//!   (`scripts/bench/proxy.sh`, its "Targets" table);
//! - the simulator's speed (`pair-sim bench`).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

pub(crate) fn run(root: &Path, runs: u32, seconds: u32) -> Result<()> {
    let mut rows: Vec<[String; 3]> = Vec::new();

    eprintln!("xtask bench: release build");
    crate::run(
        root,
        "cargo",
        &["build", "--release", "-p", "pair-node", "-p", "pair-sim"],
    )?;

    eprintln!("xtask bench: scheduler (criterion)");
    let out = output(
        Command::new("cargo").current_dir(root).args([
            "bench",
            "-p",
            "pair-scheduler",
            "--bench",
            "rank",
            "--",
            "--warm-up-time",
            "1",
            "--measurement-time",
            "2",
        ]),
        "cargo bench -p pair-scheduler --bench rank",
    )?;
    for (id, median) in criterion_medians(&out) {
        // Ranking 8 nodes with a 20k-token prompt's prefix lookup: issue
        // 41's bar; without a prompt, the older sub-microsecond one.
        let target = if id.starts_with("rank_prefix/") && id.ends_with("/8") {
            "< 2 µs"
        } else if id.ends_with("/8") {
            "< 1 µs"
        } else if id.ends_with("/256") {
            "< 20 µs"
        } else {
            "-"
        };
        rows.push([
            format!("rank {id} (target {target})"),
            median,
            String::new(),
        ]);
    }

    eprintln!("xtask bench: simulator");
    let sim = root.join("target/release/pair-sim");
    let out = output(
        Command::new(&sim).current_dir(root).args([
            "bench",
            "--requests",
            "1000000",
            "--nodes",
            "16",
            "--policy",
            "predicted-latency",
        ]),
        "pair-sim bench",
    )?;
    let line = out
        .lines()
        .find(|l| l.contains("requests on"))
        .unwrap_or("")
        .trim();
    let cpu = line
        .split(", ")
        .find(|p| p.starts_with("cpu "))
        .unwrap_or("?");
    rows.push([
        "simulator, 1 M requests on 16 nodes, predicted-latency (target: well under 10 s CPU)"
            .into(),
        cpu.to_owned(),
        String::new(),
    ]);

    eprintln!("xtask bench: proxy, peer hop, streaming, memory (scripts/bench/proxy.sh)");
    let report = root.join("target/bench/proxy.md");
    std::fs::create_dir_all(root.join("target/bench"))?;
    let mut proxy = Command::new("bash");
    proxy
        .current_dir(root)
        .arg("scripts/bench/proxy.sh")
        .env("SKIP_BUILD", "1")
        .env("RUNS", runs.to_string())
        .env("DUR", seconds.to_string())
        .env("ALT_ARGS", "--http-stack hyper")
        .env("FLOOR", "/nonexistent")
        .env("RAW", "/nonexistent")
        .env("RESULTS", &report);
    crate::status(proxy, "scripts/bench/proxy.sh")?;
    let text = std::fs::read_to_string(&report)
        .with_context(|| format!("reading {}", report.display()))?;
    for row in targets_table(&text) {
        rows.push(row);
    }

    println!();
    println!("| what (target) | measured | verdict |");
    println!("|---|---|---|");
    for [what, measured, verdict] in &rows {
        println!("| {what} | {measured} | {verdict} |");
    }
    println!();
    println!("proxy details: {}", report.display());
    Ok(())
}

/// A command's stdout and stderr together, failing if it failed.
fn output(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// `(benchmark id, median)` from criterion's output: a line naming the id
/// (`rank/pair/8`), then `time:   [low median high]` on it or the next.
pub(crate) fn criterion_medians(out: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut id: Option<String> = None;
    for line in out.lines() {
        let trimmed = line.trim();
        if let Some(first) = trimmed.split_whitespace().next()
            && first.contains('/')
            && !trimmed.starts_with("Benchmarking")
            && !first.starts_with('[')
        {
            id = Some(first.to_owned());
        }
        if let Some(pos) = trimmed.find("time:")
            && let Some(name) = id.take()
        {
            let inner = trimmed[pos + 5..]
                .trim()
                .trim_start_matches('[')
                .trim_end_matches(']');
            let parts: Vec<&str> = inner.split_whitespace().collect();
            if parts.len() >= 4 {
                found.push((name, format!("{} {}", parts[2], parts[3])));
            }
        }
    }
    found
}

/// The rows of a proxy report's "Targets" table as (what, measured,
/// verdict).
pub(crate) fn targets_table(report: &str) -> Vec<[String; 3]> {
    let Some(start) = report.find("### Targets") else {
        return Vec::new();
    };
    report[start..]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| target") && !l.starts_with("|---"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells.len() >= 3).then(|| {
                [
                    cells[0].to_owned(),
                    cells[1].to_owned(),
                    cells[2].to_owned(),
                ]
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criterion_and_report_tables_are_read() {
        let out = "Benchmarking rank/pair/8: Analyzing\n\
                   rank/pair/8             time:   [290.1 ns 301.2 ns 310.0 ns]\n\
                   rank/predicted-latency/256\n\
                   \x20                       time:   [14.1 µs 14.9 µs 15.6 µs]\n";
        assert_eq!(
            criterion_medians(out),
            vec![
                ("rank/pair/8".to_owned(), "301.2 ns".to_owned()),
                (
                    "rank/predicted-latency/256".to_owned(),
                    "14.9 µs".to_owned()
                ),
            ]
        );
        let report = "x\n### Targets\n\n| target | measured | verdict |\n|---|---|---|\n\
                      | idle RSS < 30 MB | 21.0 MB | PASS |\n";
        assert_eq!(
            targets_table(report),
            vec![[
                "idle RSS < 30 MB".to_owned(),
                "21.0 MB".to_owned(),
                "PASS".to_owned()
            ]]
        );
    }
}
