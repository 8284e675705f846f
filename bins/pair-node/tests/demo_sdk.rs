//! `pair-node demo` as a user runs it (the real binary), driven by the real
//! `openai` and `ollama` Python SDKs: chat, streaming chat, completions,
//! generate, embeddings, listings and error handling; then joined from
//! `pair-client` with the lines it prints, as printed.

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
    let mut printed = Vec::new();
    wait_for_output(stdout, Duration::from_secs(60), |line| {
        if let Some(u) = line.strip_prefix("Ollama face ") {
            ollama = Some(u.trim().to_owned());
        }
        if let Some(u) = line.strip_prefix("OpenAI face ") {
            openai = Some(u.trim().to_owned());
        }
        printed.push(line.to_owned());
        line.starts_with("Ctrl-C to stop")
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
    a_greeting_ends_on_its_own(&openai);
    join_as_printed(&printed);
    drop(demo);
}

/// Claude Code's "Say hi" (Anthropic Messages, `max_tokens` 32000): the
/// demo's model stops on its own, as a real one does, instead of running to
/// the limit (at the demo's speed, minutes of text).
fn a_greeting_ends_on_its_own(openai: &str) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-H", "content-type: application/json"])
        .args(["-H", "anthropic-version: 2023-06-01", "-d"])
        .arg(r#"{"model":"llama3.2:3b","max_tokens":32000,"messages":[{"role":"user","content":"Say hi"}]}"#)
        .arg(format!("{openai}/v1/messages"))
        .output()
        .expect("run curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "curl failed: {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).expect(&body);
    assert_eq!(answer["stop_reason"], "end_turn", "{answer}");
    let tokens = answer["usage"]["output_tokens"]
        .as_u64()
        .expect("output_tokens");
    assert!((1..=4096).contains(&tokens), "{tokens} tokens: {answer}");
}

/// The demo's "Join it from pair-client" lines, run as printed (the PIN
/// the first gives put into the second): the first probe after the join
/// lists every node.
fn join_as_printed(printed: &[String]) {
    let line = |starts: &str, has: &str| {
        printed
            .iter()
            .map(|l| l.trim())
            .find(|l| l.starts_with(starts) && l.contains(has))
            .unwrap_or_else(|| panic!("no `{starts} ... {has}` line: {printed:#?}"))
            .split_whitespace()
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let client = pair_testkit::node::client_bin();
    let run = |program: &std::path::Path, args: &[String]| {
        let out = Command::new(program)
            .args(args)
            .env("PAIR_LOG", "warn")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        said
    };
    let invited = run(
        std::path::Path::new(env!("CARGO_BIN_EXE_pair-node")),
        &line("pair-node pair invite", ""),
    );
    let pin = invited
        .split_whitespace()
        .skip_while(|w| *w != "PIN")
        .nth(1)
        .unwrap_or_else(|| panic!("no PIN in {invited}"))
        .to_owned();
    let join: Vec<String> = line("pair-client", " pair join ")
        .into_iter()
        .map(|a| if a == "PIN" { pin.clone() } else { a })
        .collect();
    let said = run(&client, &join);
    assert!(said.contains("paired with node-1"), "{said}");
    let table = run(&client, &line("pair-client", " probe"));
    for node in ["node-1-rtx4090", "node-2-rtx3060", "node-3-laptop"] {
        assert!(
            table.contains(node),
            "the first probe lists {node}: {table}"
        );
    }
}
