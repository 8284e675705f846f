//! The real Python SDKs (`openai`, `ollama`) against every emulated flavor:

#![allow(clippy::unwrap_used)]
//! proof that the bodies match the real schemas closely enough.

use std::path::PathBuf;
use std::process::Command;

use pair_emulator::{EmulatedEngine, EmulatorConfig, Flavor};

const MODEL: &str = "llama3.2:3b";
const EMBED: &str = "nomic-embed-text:137m";

/// The interpreter with the SDKs.
fn python() -> PathBuf {
    pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"))
}

async fn run_script(script: &str, flavor: Flavor, base_path: &str) {
    let python = python();
    let cfg = EmulatorConfig::new(flavor, [MODEL, EMBED])
        .with_time_scale(0.001)
        .with_seed(3);
    let engine = EmulatedEngine::start(cfg).await.unwrap();
    let base_url = format!("{}{base_path}", engine.base_url());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .env("BASE_URL", base_url)
            .env("MODEL", MODEL)
            .env("EMBED_MODEL", EMBED)
            .env("NO_PROXY", "127.0.0.1")
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{flavor}: {stdout}\n{stderr}");
    assert!(stdout.contains("sdk ok"), "{stdout}");
    assert!(engine.hits() > 5);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_ollama() {
    run_script("openai_sdk.py", Flavor::Ollama, "/v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_openai_server() {
    run_script("openai_sdk.py", Flavor::OpenAi, "/v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_lmstudio() {
    run_script("openai_sdk.py", Flavor::LmStudio, "/v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_sdk_against_ollama() {
    run_script("ollama_sdk.py", Flavor::Ollama, "").await;
}
