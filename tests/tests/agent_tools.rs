//! The real coding agents through pair, unchanged: Claude Code (`claude
//! -p`) and Codex (`codex exec`), installed by `scripts/setup-agents.sh`,
//! each doing a turn with a tool call through a node on an emulated
//! Ollama engine and through one on an emulated OpenAI-compatible engine
//! (the emulated model calls the tool the prompt writes out, and the tool
//! really runs: it writes a file), and a text-only turn on the real
//! llama.cpp engine; and the `openai` SDK's `responses.create`.
//!
//! Every request stays on loopback: HOME and CODEX_HOME are temporary,
//! telemetry, updates and error reports are off, and every proxy variable
//! points at a dead loopback port.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use pair_emulator::Flavor;
use pair_testkit::cluster::LocalCluster;
use pair_testkit::cluster::{cluster, llama_server};
use serde_json::Value;
use tokio::process::Command;

/// How long one agent run may take.
const RUN_FOR: Duration = Duration::from_secs(180);
/// The emulated model's natural answer length: agents ask for up to
/// 32,000 tokens; a real model stops long before.
const ANSWER_TOKENS: &str = "12";

/// A command for an agent CLI with a temporary HOME, nothing reaching past
/// loopback, run in `work`.
fn sandboxed(program: &Path, home: &Path, work: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(work)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .env("TERM", "dumb")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true);
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        // Port 9 (discard) on loopback: nothing listens, nothing leaves.
        cmd.env(var, "http://127.0.0.1:9");
    }
    cmd
}

async fn run(mut cmd: Command, what: &str) -> Output {
    let out = tokio::time::timeout(RUN_FOR, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish in {RUN_FOR:?}"))
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `claude -p PROMPT ARGS...` against `base` (a node's OpenAI face),
/// with its JSON result.
async fn claude(base: &str, prompt: &str, args: &[&str], work: &Path) -> Value {
    let bin = pair_testkit::env::claude().unwrap_or_else(|e| panic!("{e}"));
    let home = tempfile::tempdir().unwrap();
    let mut cmd = sandboxed(&bin, home.path(), work);
    cmd.env("ANTHROPIC_BASE_URL", base)
        .env("ANTHROPIC_API_KEY", "sk-local")
        .env(
            "ANTHROPIC_CUSTOM_HEADERS",
            format!("x-emulator-answer-tokens: {ANSWER_TOKENS}"),
        )
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_MAX_RETRIES", "1")
        .args(["-p", prompt, "--output-format", "json"])
        .args(args);
    let out = run(cmd, "claude -p").await;
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "claude's result is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(result["is_error"], false, "{result}");
    result
}

/// `codex exec PROMPT` with `model` through `base` (a node's OpenAI face)
/// as a Responses API provider; its last message.
async fn codex(base: &str, model: &str, prompt: &str, work: &Path) -> String {
    let bin = pair_testkit::env::codex().unwrap_or_else(|e| panic!("{e}"));
    let home = tempfile::tempdir().unwrap();
    let codex_home = tempfile::tempdir().unwrap();
    std::fs::write(
        codex_home.path().join("config.toml"),
        format!(
            r#"model = "{model}"
model_provider = "pair"

[model_providers.pair]
name = "pair"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "PAIR_API_KEY"
request_max_retries = 0
stream_max_retries = 0
http_headers = {{ "x-emulator-answer-tokens" = "{ANSWER_TOKENS}" }}

[analytics]
enabled = false

[features]
plugins = false
"#
        ),
    )
    .unwrap();
    let last = work.join(".codex-last-message");
    let mut cmd = sandboxed(&bin, home.path(), work);
    cmd.env("CODEX_HOME", codex_home.path())
        .env("PAIR_API_KEY", "sk-local")
        .args([
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--output-last-message",
        ])
        .arg(&last)
        .arg(prompt);
    run(cmd, "codex exec").await;
    std::fs::read_to_string(&last).unwrap_or_default()
}

/// Two nodes: the first on an emulated Ollama engine holding `qwen2.5:7b`
/// and aliasing Claude's model names to it, the second on an emulated
/// OpenAI-compatible engine holding `coder:7b`.
async fn two_engines() -> LocalCluster {
    cluster(2, |s| {
        s.nodes[0].models = vec!["qwen2.5:7b".into()];
        s.nodes[0].aliases = vec!["claude-*=qwen2.5:7b".parse().unwrap()];
        s.nodes[1].flavor = Flavor::OpenAi;
        s.nodes[1].models = vec!["coder:7b".into()];
    })
    .await
    .unwrap()
}

/// What the tool the agent ran wrote.
fn written(work: &Path, file: &str) -> String {
    std::fs::read_to_string(work.join(file))
        .unwrap_or_else(|e| panic!("the agent's tool did not write {file}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_runs_a_tool_through_nodes_on_ollama_and_openai_engines() {
    let c = two_engines().await;
    let work = tempfile::tempdir().unwrap();
    // Claude's own default model name, through the alias, on Ollama; the
    // request enters at the other node.
    let result = claude(
        &c.nodes[1].openai_url(),
        r#"Bash({"command": "echo pair-tool-ok > on-ollama.txt"})"#,
        &["--allowedTools", "Bash"],
        work.path(),
    )
    .await;
    assert!(result["num_turns"].as_u64().unwrap() >= 2, "{result}");
    assert_eq!(written(work.path(), "on-ollama.txt").trim(), "pair-tool-ok");
    assert!(c.engines[0].hits_for_model("qwen2.5:7b") >= 2);
    // A model named outright, on the OpenAI-compatible engine.
    let result = claude(
        &c.nodes[0].openai_url(),
        r#"Bash({"command": "echo pair-tool-ok > on-openai.txt"})"#,
        &["--allowedTools", "Bash", "--model", "coder:7b"],
        work.path(),
    )
    .await;
    assert!(result["num_turns"].as_u64().unwrap() >= 2, "{result}");
    assert_eq!(written(work.path(), "on-openai.txt").trim(), "pair-tool-ok");
    assert!(c.engines[1].hits_for_model("coder:7b") >= 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_runs_a_tool_through_nodes_on_ollama_and_openai_engines() {
    let c = two_engines().await;
    let work = tempfile::tempdir().unwrap();
    for (node, model, file, engine) in [
        (1, "qwen2.5:7b", "on-ollama.txt", 0),
        (0, "coder:7b", "on-openai.txt", 1),
    ] {
        let said = codex(
            &c.nodes[node].openai_url(),
            model,
            &format!(r#"exec_command({{"cmd": "echo pair-tool-ok > {file}"}})"#),
            work.path(),
        )
        .await;
        assert_eq!(written(work.path(), file).trim(), "pair-tool-ok", "{model}");
        assert!(
            !said.trim().is_empty(),
            "codex got an answer after the tool"
        );
        assert!(c.engines[engine].hits_for_model(model) >= 2, "{model}");
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_and_codex_talk_to_a_real_llama_cpp_engine() {
    // Codex's own instructions and tools are some 6,000 tokens.
    let (server, base) = llama_server(16_384).await.expect("llama.cpp server");
    let c = cluster(2, |s| {
        s.time_scale = 1.0;
        // A 135M model on two CPU cores prefills Codex's prompt for longer
        // than the default no-progress bound.
        s.first_byte_timeout = Duration::from_secs(300);
        s.nodes[1].external = Some(format!("openai-compat={base}"));
        s.nodes[1].models = vec!["smollm2".into()];
        s.nodes[1].profile = "cpu-smollm2-135m".into();
    })
    .await
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let result = claude(
        &c.nodes[0].openai_url(),
        "Say hello.",
        &[
            "--model",
            "smollm2",
            "--tools",
            "",
            "--system-prompt",
            "You are a helpful assistant. Answer in one short sentence.",
        ],
        work.path(),
    )
    .await;
    assert!(result["result"].as_str().is_some(), "{result}");
    // Claude Code's token count, from the real engine's own tokenizer and
    // chat template: no estimate, and a longer prompt counts more.
    let count = |text: &str| {
        let url = format!("{}/v1/messages/count_tokens", c.nodes[0].openai_url());
        let body = serde_json::json!({"model": "smollm2",
            "messages": [{"role": "user", "content": text}]});
        async move {
            let resp = reqwest::Client::new()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    let short = count("Say hello.").await;
    let long = count("Say hello to every one of the people in this room, one by one.").await;
    assert!(short.get("estimated").is_none(), "{short}");
    let (short, long) = (
        short["input_tokens"].as_u64().unwrap(),
        long["input_tokens"].as_u64().unwrap(),
    );
    assert!(short > 0 && long > short + 5, "{short} {long}");
    codex(
        &c.nodes[0].openai_url(),
        "smollm2",
        "Say hello.",
        work.path(),
    )
    .await;
    c.stop().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdks_responses_create_plain_streamed_and_with_a_tool() {
    let c = two_engines().await;
    let py = pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/responses.py");
    for (node, model) in [(0, "coder:7b"), (1, "qwen2.5:7b")] {
        let out = Command::new(&py)
            .arg(&script)
            .arg(c.nodes[node].openai_url())
            .arg(model)
            .output()
            .await
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{model}: {said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.trim_end().ends_with("checks"), "{said}");
    }
    c.stop().await;
}
