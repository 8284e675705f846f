//! Repository invariants that no compiler checks: the pure crates stay
//! pure, the layers point down (no library on a binary, dev-dependencies
//! included; test support only in dev-dependencies; the emulator off the
//! proxy; the edge SDK off the cluster plane, the engines and the job
//! store), only pair-link spells an inference path or an `x-pair-*`
//! header name, no two files of a crate import each other in a circle,
//! nothing outside `docs/` points outside the repository, every Rust source file says what it is for, and
//! what only some OSes have (`/proc`, `/etc/`, rlimits, Unix signals) is
//! named only under a `cfg` that says which.

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
pub(crate) const KEPT_OFF_TELEMETRY: &[&str] = &["pair-discovery", "pair-simulator", "pair-sim"];
pub(crate) const TELEMETRY_SHELL: &[&str] = &["pair-telemetry", "sysinfo", "nvml-wrapper"];

/// Crates at the bottom of the workspace: they depend on no other `pair-*`
/// crate (pair-os: what differs between OSes, below pair-fs, discovery,
/// engines, the daemon and the binaries).
pub(crate) const LEAF_CRATES: &[&str] = &["pair-os"];

pub(crate) fn run(root: &Path) -> Result<()> {
    let mut problems = Vec::new();
    let graphs = dependency_graphs(root)?;
    let graph = graphs.normal;
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
    problems.extend(layering(&graph)?);
    problems.extend(leaves(&graph));
    problems.extend(dev_layering(&graph, &graphs.dev));
    problems.extend(routes_outside_the_link(root)?);
    problems.extend(sdk_off_the_node(&graph)?);
    problems.extend(module_cycles(root)?);
    problems.extend(outside_links(root)?);
    problems.extend(missing_headers(root)?);
    problems.extend(thick_binaries(root)?);
    problems.extend(unportable(root)?);
    if problems.is_empty() {
        eprintln!("xtask tidy: ok");
        Ok(())
    } else {
        bail!("tidy found problems:\n  {}", problems.join("\n  "))
    }
}

/// A package's dependencies by kind (package name -> names), as resolved
/// for this workspace by `cargo metadata`.
#[derive(Debug, Default)]
pub(crate) struct Graphs {
    /// Normal dependencies (what a build links).
    pub(crate) normal: HashMap<String, Vec<String>>,
    /// Dev-dependencies (what its tests, benches and examples link).
    pub(crate) dev: HashMap<String, Vec<String>>,
}

/// Both graphs, from one `cargo metadata`.
pub(crate) fn dependency_graphs(root: &Path) -> Result<Graphs> {
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

fn parse_graph(json: &[u8]) -> Result<Graphs> {
    let meta: Value = serde_json::from_slice(json).context("parsing cargo metadata")?;
    let mut names = HashMap::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        if let (Some(id), Some(name)) = (p["id"].as_str(), p["name"].as_str()) {
            names.insert(id.to_owned(), name.to_owned());
        }
    }
    let mut graphs = Graphs::default();
    for node in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        let Some(from) = node["id"].as_str().and_then(|id| names.get(id)) else {
            continue;
        };
        let of_kind = |kind: Option<&str>| -> Vec<String> {
            node["deps"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|k| k["kind"].as_str() == kind)
                })
                .filter_map(|d| d["pkg"].as_str().and_then(|id| names.get(id)).cloned())
                .collect()
        };
        graphs.normal.insert(from.clone(), of_kind(None));
        graphs.dev.insert(from.clone(), of_kind(Some("dev")));
    }
    Ok(graphs)
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

/// The binaries (`bins/*`): no library may depend on one.
const BINARIES: &[&str] = &["pair-node", "pair-sim", "pair-client"];
/// Test support: linked only by tests (a dev-dependency, or the test
/// crates'). It starts the daemon through its library (pair-daemon) and
/// the `pair-node` binary as a process, never as a dependency.
const TEST_SUPPORT: &str = "pair-testkit";
/// Crates that are tests themselves (and so may link binaries).
const TEST_CRATES: &[&str] = &["pair-tests", "pair-fuzz"];

/// What the dev-dependencies may not break: a library's tests, benches and
/// examples link no binary crate (they reach the daemon through the test
/// kit), and no library or binary links the test kit outside its tests.
pub(crate) fn dev_layering(
    normal: &HashMap<String, Vec<String>>,
    dev: &HashMap<String, Vec<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let mut crates: Vec<&String> = normal.keys().filter(|k| k.starts_with("pair-")).collect();
    crates.sort();
    for krate in crates {
        if TEST_CRATES.contains(&krate.as_str()) {
            continue;
        }
        if normal
            .get(krate)
            .is_some_and(|deps| deps.iter().any(|d| d == TEST_SUPPORT))
        {
            problems.push(format!(
                "{krate} links {TEST_SUPPORT} outside its tests (make it a dev-dependency)"
            ));
        }
        if BINARIES.contains(&krate.as_str()) {
            continue;
        }
        for d in dev.get(krate).into_iter().flatten() {
            if BINARIES.contains(&d.as_str()) {
                problems.push(format!(
                    "library {krate} dev-depends on binary {d} (use {TEST_SUPPORT})"
                ));
            }
        }
    }
    problems
}
/// Dependencies point down: no library reaches a binary, and the emulator
/// (an engine) never reaches the proxy (the request path).
pub(crate) fn layering(graph: &HashMap<String, Vec<String>>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for krate in graph.keys().filter(|k| k.starts_with("pair-")) {
        if BINARIES.contains(&krate.as_str()) || TEST_CRATES.contains(&krate.as_str()) {
            continue;
        }
        let mut bad = reachable_any(graph, krate, BINARIES)?;
        bad.remove(krate);
        for b in bad {
            problems.push(format!("library {krate} depends on binary {b}"));
        }
    }
    if graph.contains_key("pair-emulator") {
        for b in reachable_any(graph, "pair-emulator", &["pair-proxy"])? {
            problems.push(format!("pair-emulator reaches {b}"));
        }
    }
    Ok(problems)
}

/// [`LEAF_CRATES`] that depend on another workspace crate.
pub(crate) fn leaves(graph: &HashMap<String, Vec<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    for leaf in LEAF_CRATES {
        for d in graph.get(*leaf).into_iter().flatten() {
            if d.starts_with("pair-") {
                problems.push(format!("{leaf} (a leaf crate) depends on {d}"));
            }
        }
    }
    problems
}

/// The one crate that spells an inference path ([`routes_outside_the_link`]).
pub(crate) const ROUTE_CRATE: &str = "pair-link";

/// Crates that may spell the engines' paths: the emulator plays the
/// engines, whose paths these are, not pair's routes.
pub(crate) const ENGINE_SIDE: &[&str] = &["pair-emulator"];

/// What the edge SDK must not link (normal dependencies): the cluster
/// plane, the engine adapters and the job store are a node's, not a
/// client's.
pub(crate) const KEPT_OFF_SDK: &[&str] = &["pair-cluster", "pair-engines", "pair-jobs"];

/// The inference routes, as pair-link's `InferenceRoute::path` spells them.
fn inference_routes(root: &Path) -> Result<Vec<String>> {
    let path = root.join("crates/pair-link/src/route.rs");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let start = text
        .find("pub const fn path(self)")
        .context("pair-link's route.rs has no InferenceRoute::path")?;
    let body = &text[start..];
    let end = body
        .find("\n    }\n")
        .context("InferenceRoute::path not closed")?;
    let routes: Vec<String> = body[..end]
        .lines()
        .filter_map(|l| {
            let rest = &l[l.find("=> \"")? + 4..];
            Some(rest[..rest.find('"')?].to_owned())
        })
        .collect();
    if routes.is_empty() {
        bail!("no routes found in pair-link's InferenceRoute::path");
    }
    Ok(routes)
}

/// Crates that may spell an `x-pair-*` header name: the test kit and the
/// live twin play a user's program, which names the headers as the README
/// does.
pub(crate) const CLIENT_SIDE: &[&str] = &["pair-testkit", "pair-simulator"];

/// An `x-pair-*` header name quoted whole in `code` (`"x-pair-node"`; not
/// a message that mentions one).
fn quoted_header(code: &str) -> Option<&str> {
    let mut rest = code;
    while let Some(at) = rest.find("\"x-pair-") {
        let name = &rest[at + 1..];
        let len = name
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
            .unwrap_or(name.len());
        if name[len..].starts_with('"') {
            return Some(&name[..len]);
        }
        rest = &rest[at + 1..];
    }
    None
}

/// Only pair-link spells an inference path or an `x-pair-*` header name:
/// no other crate's sources (crates/ and bins/, their tests, benches and
/// test modules aside) quote one, but the engine side's paths and the
/// client side's header names.
fn routes_outside_the_link(root: &Path) -> Result<Vec<String>> {
    let routes = inference_routes(root)?;
    let mut problems = Vec::new();
    for dir in ["crates", "bins"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut crates: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        crates.sort();
        for krate in crates {
            let Some(name) = krate.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name == ROUTE_CRATE {
                continue;
            }
            let paths = !ENGINE_SIDE.contains(&name);
            let headers = !CLIENT_SIDE.contains(&name);
            walk(&krate.join("src"), &mut |path| {
                let test_module = path.file_stem().is_some_and(|s| s == "tests");
                if path.extension().is_some_and(|e| e == "rs") && !test_module {
                    let code = non_test_code(&std::fs::read_to_string(path)?);
                    for r in routes.iter().filter(|_| paths) {
                        if code.contains(&format!("\"{r}\"")) {
                            problems.push(format!(
                                "{} spells the inference route {r} (only {ROUTE_CRATE} does)",
                                path.display()
                            ));
                        }
                    }
                    if let Some(h) = quoted_header(&code).filter(|_| headers) {
                        problems.push(format!(
                            "{} spells the header {h} (only {ROUTE_CRATE} does)",
                            path.display()
                        ));
                    }
                }
                Ok(())
            })?;
        }
    }
    Ok(problems)
}

/// The edge SDK links none of [`KEPT_OFF_SDK`].
fn sdk_off_the_node(graph: &HashMap<String, Vec<String>>) -> Result<Vec<String>> {
    Ok(reachable_any(graph, "pair-sdk", KEPT_OFF_SDK)?
        .into_iter()
        .map(|bad| format!("pair-sdk reaches {bad} in its dependency tree"))
        .collect())
}

/// A file's code without its test module and comment lines.
fn non_test_code(text: &str) -> String {
    let code = text.find("#[cfg(test)]").map_or(text, |i| &text[..i]);
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Files of one crate that import each other in a circle (each crate under
/// crates/ and bins/).
fn module_cycles(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for top in ["crates", "bins"] {
        let Ok(entries) = std::fs::read_dir(root.join(top)) else {
            continue;
        };
        for entry in entries {
            let src = entry?.path().join("src");
            if !src.is_dir() {
                continue;
            }
            for cycle in cycles_in(&src)? {
                problems.push(format!(
                    "{}: files import each other in a circle: {}",
                    src.display(),
                    cycle.join(", ")
                ));
            }
        }
    }
    Ok(problems)
}

/// The module path of each source file under `src` (`a/b.rs` and
/// `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` the root).
fn module_files(src: &Path) -> Result<HashMap<Vec<String>, std::path::PathBuf>> {
    let mut files = HashMap::new();
    walk(src, &mut |path| {
        if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src)?.with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["lib"] || parts == ["main"] {
                parts.clear();
            }
            files.insert(parts, path.to_path_buf());
        }
        Ok(())
    })?;
    Ok(files)
}

/// The module paths a piece of code names through `crate::`, `super::` and
/// `self::` (with `{a, b::c}` groups), relative to `module`.
pub(crate) fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    for (kw, base) in [
        ("crate::", Vec::new()),
        ("super::", module[..module.len().saturating_sub(1)].to_vec()),
        ("self::", module.to_vec()),
    ] {
        let mut at = 0;
        while let Some(i) = code[at..].find(kw) {
            let start = at + i;
            at = start + kw.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            let rest = &code[at..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let path = path_segments(item.trim());
                    if !path.is_empty() {
                        out.push([base.clone(), path].concat());
                    }
                }
            } else {
                let path = path_segments(rest);
                if !path.is_empty() {
                    out.push([base.clone(), path].concat());
                }
            }
        }
    }
    out
}

/// `a::b::C` at the start of `text` as its segments.
fn path_segments(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        out.push(rest[..end].to_owned());
        match rest[end..].strip_prefix("::") {
            Some(r) if r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') => rest = r,
            _ => break,
        }
    }
    out
}

/// The groups of files under `src` that reach each other through their
/// imports (each group sorted, each listed once).
fn cycles_in(src: &Path) -> Result<Vec<Vec<String>>> {
    let files = module_files(src)?;
    let mut edges: HashMap<&Vec<String>, BTreeSet<&Vec<String>>> = HashMap::new();
    for (module, path) in &files {
        let code = non_test_code(&std::fs::read_to_string(path)?);
        let targets = edges.entry(module).or_default();
        for named in named_paths(&code, module) {
            let target = (1..=named.len())
                .rev()
                .find_map(|n| files.get_key_value(&named[..n]).map(|(k, _)| k));
            if let Some(t) = target
                && t != module
                && !t.is_empty()
            {
                targets.insert(t);
            }
        }
    }
    let reach = |from: &Vec<String>| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for t in edges.get(n).into_iter().flatten() {
                if seen.insert(*t) {
                    stack.push(t);
                }
            }
        }
        seen
    };
    let reaches: HashMap<&Vec<String>, BTreeSet<&Vec<String>>> =
        files.keys().map(|m| (m, reach(m))).collect();
    let mut groups = BTreeSet::new();
    for (m, r) in &reaches {
        if !r.contains(m) {
            continue;
        }
        let group: Vec<String> = r
            .iter()
            .filter(|o| reaches.get(*o).is_some_and(|back| back.contains(m)))
            .map(|o| {
                if o.is_empty() {
                    "(root)".to_owned()
                } else {
                    o.join("::")
                }
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        groups.insert(group);
    }
    Ok(groups.into_iter().collect())
}

/// No file outside `docs/` points outside the repository (at the shared
/// material a session reads, or at a path on one machine).
fn outside_links(root: &Path) -> Result<Vec<String>> {
    // Spelt in pieces so this file does not name what it looks for.
    const OUTSIDE: &[&str] = &[
        concat!("../", "shared/"),
        concat!("shared", "/reference/"),
        concat!("shared", "/design.md"),
        concat!("shared", "/style.md"),
        concat!("/wo", "rk/"),
    ];
    let mut problems = Vec::new();
    for top in [
        "crates",
        "bins",
        "xtask",
        "tests",
        "scripts",
        "fuzz",
        "scenarios",
        ".ci",
    ] {
        walk(&root.join(top), &mut |path| {
            let text_file = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| ["rs", "md", "sh", "toml", "py", "lua"].contains(&e))
                || path.file_name().is_some_and(|n| n == "run");
            if text_file && let Ok(text) = std::fs::read_to_string(path) {
                for o in OUTSIDE {
                    if text.contains(o) {
                        problems.push(format!(
                            "{} points outside the repository ({o})",
                            path.display()
                        ));
                    }
                }
            }
            Ok(())
        })?;
    }
    for file in [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
        "Cargo.toml",
    ] {
        if let Ok(text) = std::fs::read_to_string(root.join(file)) {
            for o in OUTSIDE {
                if text.contains(o) {
                    problems.push(format!("{file} points outside the repository ({o})"));
                }
            }
        }
    }
    Ok(problems)
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

/// Lines of Rust a binary's `src/` may hold: its command line and the
/// wiring of libraries. Whatever another program could use (the node's
/// configuration, the simulator, the SDK's client) lives in a library
/// crate under `crates/`.
pub(crate) const BINARY_SRC_LINES: usize = 800;

/// Binaries (`bins/*/src`) over [`BINARY_SRC_LINES`].
fn thick_binaries(root: &Path) -> Result<Vec<String>> {
    let mut sizes = Vec::new();
    for entry in std::fs::read_dir(root.join("bins")).context("reading bins/")? {
        let dir = entry?.path();
        let mut lines = 0;
        walk(&dir.join("src"), &mut |path| {
            if path.extension().is_some_and(|e| e == "rs") {
                lines += std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .lines()
                    .count();
            }
            Ok(())
        })?;
        sizes.push((dir.display().to_string(), lines));
    }
    Ok(over_budget(&sizes, BINARY_SRC_LINES))
}

/// The binaries whose `src/` holds more than `budget` lines.
pub(crate) fn over_budget(sizes: &[(String, usize)], budget: usize) -> Vec<String> {
    sizes
        .iter()
        .filter(|(_, lines)| *lines > budget)
        .map(|(bin, lines)| {
            format!(
                "{bin}/src has {lines} lines, over a binary's {budget}: move what is not its command line into a library crate"
            )
        })
        .collect()
}

/// What only some OSes have: Linux's `/proc` and `/etc/` files, Unix's
/// rlimits, signals, `SO_REUSEPORT` and `std::os::unix`. Spelt in pieces so
/// this file does not name what it looks for.
pub(crate) const OS_SPECIFIC: &[&str] = &[
    concat!("/pr", "oc"),
    concat!("/et", "c/"),
    concat!("getr", "limit"),
    concat!("signal", "::unix"),
    concat!("set_reuse", "_port"),
    concat!("os::", "unix"),
];

/// Source files under crates/, bins/ and tests/ that name [`OS_SPECIFIC`]
/// outside a `cfg` naming an OS: pair builds for Windows and macOS by
/// design, and a test that assumes Linux says so (`#[cfg(target_os =
/// "linux")]`).
fn unportable(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for top in ["crates", "bins", "tests"] {
        walk(&root.join(top), &mut |path| {
            if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                for (line, what) in unguarded_os_names(&text) {
                    out.push(format!(
                        "{}:{line} names {what} outside a cfg for the OS that has it",
                        path.display()
                    ));
                }
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// Whether a `cfg` predicate restricts by OS.
fn names_an_os(cfg: &str) -> bool {
    [
        "unix",
        "windows",
        "target_os",
        "target_family",
        "pair_portable",
    ]
    .iter()
    .any(|os| cfg.contains(os))
}

/// The lines (1-based) of `text` naming an [`OS_SPECIFIC`] item outside an
/// OS `cfg`: a file-wide `#![cfg(...)]`, or the item (block, function,
/// module, statement) an outer `#[cfg(...)]` is on. Comments do not count.
pub(crate) fn unguarded_os_names(text: &str) -> Vec<(usize, &'static str)> {
    let inner_cfg = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .take_while(|l| l.starts_with("#!["))
        .any(|l| l.starts_with("#![cfg(") && names_an_os(l));
    if inner_cfg {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut depth = 0usize;
    // Depths at which a guarded item's block opened: inside while deeper.
    let mut guarded: Vec<usize> = Vec::new();
    // An OS cfg seen, its item not yet opened (or ended with `;`).
    let mut pending = false;
    for (n, raw) in text.lines().enumerate() {
        let code = match raw.find("//") {
            Some(i) if !raw[..i].contains('"') => &raw[..i],
            _ => raw,
        };
        let trimmed = code.trim();
        if trimmed.starts_with("#[cfg(") && names_an_os(trimmed) {
            pending = true;
        }
        let inside = pending || !guarded.is_empty();
        if !inside && !trimmed.starts_with("#[") {
            for what in OS_SPECIFIC {
                if code.contains(what) {
                    out.push((n + 1, *what));
                }
            }
        }
        if trimmed.starts_with("#[") {
            continue;
        }
        for c in code.chars() {
            match c {
                '{' => {
                    if pending {
                        guarded.push(depth);
                        pending = false;
                    }
                    depth += 1;
                }
                '}' => {
                    depth = depth.saturating_sub(1);
                    if guarded.last() == Some(&depth) {
                        guarded.pop();
                    }
                }
                ';' if pending => pending = false,
                _ => {}
            }
        }
    }
    out
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

    #[test]
    fn a_binary_over_its_line_budget_is_named() {
        let sizes = [
            ("bins/thin".to_owned(), 400),
            ("bins/thick".to_owned(), 1_200),
        ];
        let problems = over_budget(&sizes, BINARY_SRC_LINES);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("bins/thick/src has 1200 lines"));
        // This workspace's binaries are within it.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert_eq!(thick_binaries(&root).unwrap(), Vec::<String>::new());
    }

    /// The tidy rule itself runs in `cargo test`: pair-core and
    /// pair-scheduler must not reach tokio, hyper, rustls or nvml-wrapper.
    #[test]
    fn pure_crates_reach_no_runtime_http_tls_or_nvml() {
        let root = crate::project_root();
        let graph = dependency_graphs(&root).expect("cargo metadata").normal;
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
        let graph = dependency_graphs(&root).expect("cargo metadata").normal;
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
    fn the_layers_point_down_and_no_files_import_in_a_circle() {
        let root = crate::project_root();
        let graphs = dependency_graphs(&root).expect("cargo metadata");
        let graph = &graphs.normal;
        assert_eq!(layering(graph).unwrap(), Vec::<String>::new());
        assert_eq!(leaves(graph), Vec::<String>::new());
        let mut leafy = HashMap::new();
        leafy.insert("pair-os".to_owned(), vec!["pair-core".to_owned()]);
        assert_eq!(
            leaves(&leafy),
            ["pair-os (a leaf crate) depends on pair-core"]
        );
        assert_eq!(dev_layering(graph, &graphs.dev), Vec::<String>::new());
        assert_eq!(
            routes_outside_the_link(&root).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(sdk_off_the_node(graph).unwrap(), Vec::<String>::new());
        assert_eq!(inference_routes(&root).unwrap().len(), 11);
        assert_eq!(module_cycles(&root).unwrap(), Vec::<String>::new());
        assert_eq!(outside_links(&root).unwrap(), Vec::<String>::new());
    }

    /// The route rule can fail: a crate other than pair-link that quotes an
    /// inference path is caught, its test modules and the emulator aside.
    #[test]
    fn the_route_rule_catches_a_path_outside_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let write = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write(
            "crates/pair-link/src/route.rs",
            "//! r\nimpl R {\n    pub const fn path(self) -> &'static str {\n        match self {\n            Self::A => \"/api/chat\",\n        }\n    }\n}\n",
        );
        write(
            "crates/pair-x/src/lib.rs",
            "//! x\nconst P: &str = \"/api/chat\";\n",
        );
        write(
            "crates/pair-x/src/a/tests.rs",
            "//! t\nconst P: &str = \"/api/chat\";\n",
        );
        write(
            "crates/pair-emulator/src/lib.rs",
            "//! e\nconst P: &str = \"/api/chat\";\n",
        );
        write(
            "crates/pair-y/src/lib.rs",
            "//! y\nconst M: &str = \"x-pair-deadline must be a number\";\nconst H: &str = \"x-pair-node\";\n",
        );
        write(
            "crates/pair-testkit/src/lib.rs",
            "//! k\nconst H: &str = \"x-pair-node\";\n",
        );
        assert_eq!(inference_routes(root).unwrap(), ["/api/chat"]);
        let problems = routes_outside_the_link(root).unwrap();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("pair-x/src/lib.rs"), "{problems:?}");
        assert!(
            problems[1].contains("pair-y/src/lib.rs") && problems[1].contains("x-pair-node"),
            "{problems:?}"
        );
        assert_eq!(quoted_header("\"x-pair-deadline of {} s\""), None);

        let mut graph = HashMap::new();
        graph.insert("pair-sdk".to_owned(), vec!["pair-y".to_owned()]);
        graph.insert("pair-y".to_owned(), vec!["pair-jobs".to_owned()]);
        graph.insert("pair-jobs".to_owned(), vec![]);
        assert_eq!(
            sdk_off_the_node(&graph).unwrap(),
            ["pair-sdk reaches pair-jobs in its dependency tree"]
        );
    }

    /// The checks can fail: a library on a binary, and two files that name
    /// each other, are caught.
    #[test]
    fn the_layering_and_cycle_rules_catch_what_they_forbid() {
        let mut graph = HashMap::new();
        graph.insert("pair-x".to_owned(), vec!["pair-node".to_owned()]);
        graph.insert("pair-node".to_owned(), vec![]);
        let problems = layering(&graph).unwrap();
        assert_eq!(problems, ["library pair-x depends on binary pair-node"]);

        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::write(src.join("lib.rs"), "//! root\nmod a;\nmod b;\nmod c;\n").unwrap();
        std::fs::write(src.join("a.rs"), "//! a\nuse crate::b::X;\n").unwrap();
        std::fs::write(src.join("b.rs"), "//! b\nuse crate::{c, a::Y};\n").unwrap();
        std::fs::write(
            src.join("c.rs"),
            "//! c\n// crate::a in a comment\n#[cfg(test)]\nuse crate::a;\n",
        )
        .unwrap();
        assert_eq!(
            cycles_in(src).unwrap(),
            vec![vec!["a".to_owned(), "b".to_owned()]]
        );
        assert_eq!(
            named_paths(
                "use super::{x::y, z}; self::w::q()",
                &["m".to_owned(), "n".to_owned()]
            ),
            vec![
                vec!["m".to_owned(), "x".to_owned(), "y".to_owned()],
                vec!["m".to_owned(), "z".to_owned()],
                vec![
                    "m".to_owned(),
                    "n".to_owned(),
                    "w".to_owned(),
                    "q".to_owned()
                ],
            ]
        );
    }

    /// The dev-dependency rules can fail: a library whose bench links the
    /// daemon's binary, and a binary that links the test kit, are caught; a
    /// library whose tests reach the daemon through the test kit is not.
    #[test]
    fn the_dev_dependency_rules_catch_what_they_forbid() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let mut normal = HashMap::new();
        let mut dev = HashMap::new();
        for (krate, n, d) in [
            ("pair-sdk", &[][..], &["pair-node"][..]),
            ("pair-jobs", &[], &["pair-testkit"]),
            ("pair-client", &["pair-testkit"], &[]),
            ("pair-testkit", &["pair-daemon"], &[]),
            ("pair-daemon", &[], &[]),
            ("pair-node", &["pair-daemon"], &["pair-testkit"]),
        ] {
            normal.insert(krate.to_owned(), names(n));
            dev.insert(krate.to_owned(), names(d));
        }
        assert_eq!(
            dev_layering(&normal, &dev),
            [
                "pair-client links pair-testkit outside its tests (make it a dev-dependency)",
                "library pair-sdk dev-depends on binary pair-node (use pair-testkit)",
            ]
        );
        // Normal dependencies alone miss the first: the old rule's blind spot.
        assert_eq!(layering(&normal).unwrap(), Vec::<String>::new());
        // The test kit is a library like the others: linking the binary
        // would be caught.
        normal.insert("pair-testkit".to_owned(), names(&["pair-node"]));
        assert_eq!(
            layering(&normal).unwrap(),
            ["library pair-testkit depends on binary pair-node"]
        );
    }

    /// OS-specific names only under an OS `cfg`, in this workspace and
    /// by the rule's own cases.
    #[test]
    fn os_specific_names_stay_under_a_cfg() {
        assert_eq!(
            unportable(&crate::project_root()).unwrap(),
            Vec::<String>::new()
        );
        let p = concat!("/pr", "oc");
        let sig = concat!("signal", "::unix");
        let lim = concat!("getr", "limit");
        let bare = format!("//! x\nfn f() {{\n    read(\"{p}/self/stat\");\n}}\n");
        assert_eq!(unguarded_os_names(&bare), [(3, p)]);
        // A comment is not code.
        assert!(unguarded_os_names(&format!("//! {p}\n/// {sig}\nfn f() {{}}\n")).is_empty());
        // An item under an OS cfg, a block, a statement; the file as a whole.
        let guarded = format!(
            "//! x\n#[cfg(target_os = \"linux\")]\nfn f() {{\n    if x {{\n        read(\"{p}\");\n    }}\n}}\n\
             fn g() {{\n    #[cfg(unix)]\n    {{\n        use tokio::{sig};\n    }}\n    \
             #[cfg(all(unix, not(pair_portable)))]\n    let n = rlimit::{lim}(x);\n}}\n"
        );
        assert!(unguarded_os_names(&guarded).is_empty(), "{guarded}");
        let after = format!("{guarded}fn h() {{ {lim}(); }}\n");
        assert_eq!(unguarded_os_names(&after).len(), 1);
        let file = format!("//! x\n\n#![cfg(target_os = \"linux\")]\nfn f() {{ {p}; }}\n");
        assert!(unguarded_os_names(&file).is_empty());
        // A test cfg says nothing of the OS.
        let test_only =
            format!("//! x\n#[cfg(test)]\nmod t {{\n    const P: &str = \"{p}\";\n}}\n");
        assert_eq!(unguarded_os_names(&test_only).len(), 1);
    }

    #[test]
    fn every_source_file_has_a_header() {
        let missing = missing_headers(&crate::project_root()).unwrap();
        assert!(missing.is_empty(), "{missing:#?}");
    }
}
