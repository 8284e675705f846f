//! `pair-node demo` as a user runs it (the real binary), driven by the real
//! `openai` and `ollama` Python SDKs: chat, streaming chat, completions,
//! generate, embeddings, listings and error handling.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::path::PathBuf;
use std::process::{Command, Stdio};

use pair_testkit::process::{KillOnDrop, wait_for_output};
use std::time::Duration;

fn python() -> PathBuf {
    pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn python_sdks_work_against_the_demo() {
    let py = python();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pair-node"))
        .args([
            "demo",
            "--nodes",
            "3",
            "--ollama-face",
            "127.0.0.1:0",
            "--openai-face",
            "127.0.0.1:0",
        ])
        .env("PAIR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start pair-node demo");
    let stdout = child.stdout.take().expect("stdout");
    let demo = KillOnDrop(child);
    let (mut ollama, mut openai) = (None, None);
    wait_for_output(stdout, Duration::from_secs(60), |line| {
        if let Some(u) = line.strip_prefix("Ollama face ") {
            ollama = Some(u.trim().to_owned());
        }
        if let Some(u) = line.strip_prefix("OpenAI face ") {
            openai = Some(u.trim().to_owned());
        }
        ollama.is_some() && openai.is_some()
    })
    .expect("demo did not start");
    let (ollama, openai) = (ollama.expect("ollama url"), openai.expect("openai url"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/clients.py");
    let out = Command::new(py)
        .arg(script)
        .args([&ollama, &openai])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.trim_end().ends_with("checks"), "{stdout}");
    drop(demo);
}
