//! Repository invariants that no compiler checks: the pure crates stay pure,
//! and every Rust source file says what it is for.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Crates that must never reach an async runtime, HTTP, TLS or NVML.
pub(crate) const PURE_CRATES: &[&str] = &["pair-core", "pair-scheduler"];
pub(crate) const FORBIDDEN: &[&str] = &[
    "tokio",
    "hyper",
    "rustls",
    "nvml-wrapper",
    "mio",
    "reqwest",
    "axum",
];

/// Crates that read node info and the pressure rule from pair-core and must
/// not pull in the telemetry shell (its probes, sysinfo and NVML) for them.
pub(crate) const KEPT_OFF_TELEMETRY: &[&str] = &["pair-discovery", "pair-sim"];
pub(crate) const TELEMETRY_SHELL: &[&str] = &["pair-telemetry", "sysinfo", "nvml-wrapper"];

pub(crate) fn run(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    let graph = normal_dependency_graph(root)?;
    for krate in PURE_CRATES {
        for bad in reachable_forbidden(&graph, krate)? {
            problems.push(format!("{krate} reaches {bad} in its dependency tree"));
        }
    }
    for krate in KEPT_OFF_TELEMETRY {
        for bad in reachable_any(&graph, krate, TELEMETRY_SHELL)? {
            problems.push(format!("{krate} reaches {bad} in its dependency tree"));
        }
    }
    problems.extend(missing_headers(root)?);
    if problems.is_empty() {
        eprintln!("xtask tidy: ok");
        Ok(())
    } else {
        bail!("tidy found problems:\n  {}", problems.join("\n  "))
    }
}

/// package name -> names of its normal (non-dev, non-build) dependencies,
/// as resolved for this workspace by `cargo metadata`.
pub(crate) fn normal_dependency_graph(root: &Path) -> Result<HashMap<String, Vec<String>>> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(root)
        .output()
        .or_else(|_| {
            Command::new("cargo")
                .args(["metadata", "--format-version", "1"])
                .current_dir(root)
                .output()
        })
        .context("running cargo metadata")?;
    if !out.status.success() {
        // --locked fails when Cargo.lock is stale; fall back to a plain run.
        let out = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1"])
            .current_dir(root)
            .output()
            .context("running cargo metadata")?;
        return parse_graph(&out.stdout);
    }
    parse_graph(&out.stdout)
}

fn parse_graph(json: &[u8]) -> Result<HashMap<String, Vec<String>>> {
    let meta: Value = serde_json::from_slice(json).context("parsing cargo metadata")?;
    let mut names = HashMap::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        if let (Some(id), Some(name)) = (p["id"].as_str(), p["name"].as_str()) {
            names.insert(id.to_owned(), name.to_owned());
        }
    }
    let mut graph: HashMap<String, Vec<String>> = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        let Some(from) = node["id"].as_str().and_then(|id| names.get(id)) else {
            continue;
        };
        let deps = node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].is_null())
            })
            .filter_map(|d| d["pkg"].as_str().and_then(|id| names.get(id)).cloned())
            .collect();
        graph.insert(from.clone(), deps);
    }
    Ok(graph)
}

pub(crate) fn reachable_forbidden(
    graph: &HashMap<String, Vec<String>>,
    start: &str,
) -> Result<BTreeSet<String>> {
    reachable_any(graph, start, FORBIDDEN)
}

/// Which of `names` `start` reaches through normal dependencies.
pub(crate) fn reachable_any(
    graph: &HashMap<String, Vec<String>>,
    start: &str,
    names: &[&str],
) -> Result<BTreeSet<String>> {
    if !graph.contains_key(start) {
        bail!("{start} is not in the workspace's dependency graph");
    }
    let mut seen = BTreeSet::new();
    let mut stack = vec![start.to_owned()];
    let mut bad = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n.clone()) {
            continue;
        }
        if names.contains(&n.as_str()) {
            bad.insert(n.clone());
        }
        stack.extend(graph.get(&n).into_iter().flatten().cloned());
    }
    Ok(bad)
}

/// Every .rs file under crates/, bins/, xtask/ and tests/ starts with `//!`.
fn missing_headers(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for top in ["crates", "bins", "xtask", "tests"] {
        walk(&root.join(top), &mut |path| {
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                if !first.starts_with("//!") && !first.starts_with("#![") {
                    out.push(format!("{} does not start with a //! line", path.display()));
                }
            }
            Ok(())
        })?;
    }
    Ok(out)
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path) -> Result<()>) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            walk(&path, f)?;
        } else {
            f(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tidy rule itself runs in `cargo test`: pair-core and
    /// pair-scheduler must not reach tokio, hyper, rustls or nvml-wrapper.
    #[test]
    fn pure_crates_reach_no_runtime_http_tls_or_nvml() {
        let root = crate::project_root();
        let graph = normal_dependency_graph(&root).expect("cargo metadata");
        for krate in PURE_CRATES {
            let bad = reachable_forbidden(&graph, krate).expect("crate in graph");
            assert!(bad.is_empty(), "{krate} reaches {bad:?}");
        }
    }

    /// Discovery and the simulator take node info and the pressure rule from
    /// pair-core, not from pair-telemetry with its sysinfo and NVML.
    #[test]
    fn wire_type_readers_reach_no_telemetry_shell() {
        let root = crate::project_root();
        let graph = normal_dependency_graph(&root).expect("cargo metadata");
        for krate in KEPT_OFF_TELEMETRY {
            let bad = reachable_any(&graph, krate, TELEMETRY_SHELL).expect("crate in graph");
            assert!(bad.is_empty(), "{krate} reaches {bad:?}");
        }
    }

    /// The check can fail: a crate that does use tokio is caught.
    #[test]
    fn the_rule_catches_a_crate_that_reaches_tokio() {
        let mut graph = HashMap::new();
        graph.insert("a".to_owned(), vec!["b".to_owned()]);
        graph.insert("b".to_owned(), vec!["tokio".to_owned()]);
        graph.insert("tokio".to_owned(), vec![]);
        let bad = reachable_forbidden(&graph, "a").unwrap();
        assert_eq!(bad.into_iter().collect::<Vec<_>>(), vec!["tokio"]);
    }

    #[test]
    fn every_source_file_has_a_header() {
        let missing = missing_headers(&crate::project_root()).unwrap();
        assert!(missing.is_empty(), "{missing:#?}");
    }
}
