//! Where tests find the real clients and the real engine that
//! `scripts/setup-python.sh` installs (and `.ci/run` runs): one place for
//! the environment variables, the fallbacks and the message when something
//! is missing. A missing piece fails the test that needs it: CI installs
//! them all, and a silent skip would hide a gap.

use std::path::{Path, PathBuf};

/// What to do when something is missing.
pub const SETUP_HINT: &str = "run scripts/setup-python.sh (it prints PAIR_PYTHON, PAIR_LLAMA_PYTHON and PAIR_LLAMA_MODEL; CI runs it)";

/// Where `scripts/setup-python.sh` caches llama-cpp-python and the model,
/// under `$HOME` (keyed by the llama-cpp-python version it installs).
const LLAMA_CACHE: &str = ".cache/pair/llama-0.3.36";

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `var` if set, else `fallback`; an error naming both if the file is not
/// there.
fn existing(var: &str, fallback: PathBuf, what: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os(var).map_or(fallback, PathBuf::from);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{what} {} is missing ({var}): {SETUP_HINT}",
            path.display()
        ))
    }
}

/// The Python interpreter with the `openai` and `ollama` SDKs:
/// `PAIR_PYTHON`, else the repository's `.venv`.
pub fn sdk_python() -> Result<PathBuf, String> {
    existing(
        "PAIR_PYTHON",
        repo_root().join(".venv/bin/python"),
        "the Python with the openai/ollama SDKs",
    )
}

/// What to do when an agent CLI is missing.
pub const AGENTS_HINT: &str =
    "run scripts/setup-agents.sh (it prints PAIR_CLAUDE and PAIR_CODEX; CI runs it)";

/// The real Claude Code CLI (`claude`), from `PAIR_CLAUDE`.
pub fn claude() -> Result<PathBuf, String> {
    agent("PAIR_CLAUDE", "Claude Code (claude)")
}

/// The real Codex CLI (`codex`), from `PAIR_CODEX`.
pub fn codex() -> Result<PathBuf, String> {
    agent("PAIR_CODEX", "Codex (codex)")
}

fn agent(var: &str, what: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .ok_or_else(|| format!("{what}: {var} is not set: {AGENTS_HINT}"))?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{what} {} is missing ({var}): {AGENTS_HINT}",
            path.display()
        ))
    }
}

/// llama-cpp-python's interpreter and the SmolLM2-135M GGUF:
/// `PAIR_LLAMA_PYTHON` and `PAIR_LLAMA_MODEL`, else the cache.
pub fn llama_paths() -> Result<(PathBuf, PathBuf), String> {
    let cache = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(LLAMA_CACHE))
        .unwrap_or_default();
    Ok((
        existing(
            "PAIR_LLAMA_PYTHON",
            cache.join("bin/python"),
            "the llama-cpp-python interpreter",
        )?,
        existing(
            "PAIR_LLAMA_MODEL",
            cache.join("model/smollm2.gguf"),
            "the SmolLM2 GGUF",
        )?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_an_error_naming_it_and_the_fix() {
        let err = existing(
            "PAIR_TESTENV_UNSET_VAR",
            PathBuf::from("/nonexistent/python"),
            "x",
        )
        .unwrap_err();
        assert!(err.contains("/nonexistent/python") && err.contains("PAIR_TESTENV_UNSET_VAR"));
        assert!(err.contains("scripts/setup-python.sh"));
    }

    #[test]
    fn an_existing_file_is_found() {
        let here = PathBuf::from(file!());
        let abs = repo_root().join(&here);
        assert_eq!(
            existing("PAIR_TESTENV_UNSET_VAR", abs.clone(), "x"),
            Ok(abs)
        );
    }
}
