//! One face for any engine: Ollama and Anthropic clients on engines that do
//! not speak their API, through each node's translation, with the real
//! `ollama` and `anthropic` Python SDKs; and a mixed cluster (Ollama, LM
//! Studio, OpenAI-compatible) where every face lists every model and each
//! API reaches each engine kind.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use pair_emulator::Flavor;
use pair_testkit::cluster::LocalCluster;
use pair_testkit::cluster::{cluster, http, sdks, served_by};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_and_anthropic_sdks_on_an_openai_compatible_engine() {
    let c = cluster(1, |s| s.nodes[0].flavor = Flavor::OpenAi)
        .await
        .unwrap();
    let c = tokio::task::spawn_blocking(move || {
        let said = sdks(&c, 0, "llama3.2:3b", "nomic-embed-text", "both")
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("both: {said}");
        c
    })
    .await
    .unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_on_an_ollama_engine() {
    let c = cluster(1, |_| {}).await.unwrap();
    let c = tokio::task::spawn_blocking(move || {
        let said = sdks(&c, 0, "llama3.2:3b", "nomic-embed-text", "anthropic")
            .unwrap_or_else(|e| panic!("{e}"));
        eprintln!("anthropic: {said}");
        c
    })
    .await
    .unwrap();
    c.stop().await;
}

async fn post(url: String, pin: &str, body: Value) -> reqwest::Response {
    http()
        .post(url)
        .header("x-pair-node-pin", pin)
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_cluster_serves_every_api_on_every_engine_kind() {
    let c = cluster(3, |s| {
        let flavors = [Flavor::Ollama, Flavor::LmStudio, Flavor::OpenAi];
        for (i, (n, f)) in s.nodes.iter_mut().zip(flavors).enumerate() {
            n.flavor = f;
            n.models = vec![format!("model-{i}:1b")];
        }
    })
    .await
    .unwrap();
    let all: Vec<String> = (0..3).map(|i| format!("model-{i}:1b")).collect();
    for node in &c.nodes {
        let tags: Value = http()
            .get(format!("{}/api/tags", node.ollama_url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let models: Value = http()
            .get(format!("{}/v1/models", node.openai_url()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        for m in &all {
            assert!(
                tags["models"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["name"] == *m),
                "{} lists {m} on its Ollama face: {tags}",
                node.name
            );
            assert!(
                models["data"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|e| e["id"] == *m),
                "{} lists {m} on its OpenAI face: {models}",
                node.name
            );
        }
    }
    // Each API from node 0's faces to each engine kind.
    let face = &c.nodes[0];
    for (i, target) in c.nodes.iter().enumerate() {
        let model = &all[i];
        let pin = target.id.to_string();
        let ollama = post(
            format!("{}/api/chat", face.ollama_url()),
            &pin,
            json!({"model": model, "stream": false, "messages": [{"role": "user", "content": "hi"}],
                   "options": {"num_predict": 4}}),
        )
        .await;
        assert_eq!(ollama.status(), 200, "Ollama API on {}", target.name);
        assert_eq!(served_by(&ollama), Some(pin.clone()));
        let translated = ollama
            .headers()
            .get("x-pair-translated")
            .map(|v| v.to_str().unwrap().to_owned());
        // An Ollama engine speaks Ollama; the others get it translated.
        assert_eq!(translated.is_some(), i != 0, "receipt on {}", target.name);
        let v: Value = ollama.json().await.unwrap();
        assert!(
            v["message"]["content"].as_str().is_some() && v["done"] == true,
            "{v}"
        );

        let openai = post(
            format!("{}/v1/chat/completions", face.openai_url()),
            &pin,
            json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(openai.status(), 200, "OpenAI API on {}", target.name);
        assert!(openai.headers().get("x-pair-translated").is_none());

        let anthropic = post(
            format!("{}/v1/messages", face.openai_url()),
            &pin,
            json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(anthropic.status(), 200, "Anthropic API on {}", target.name);
        assert_eq!(
            anthropic.headers().get("x-pair-translated").unwrap(),
            "anthropic->openai"
        );
        let v: Value = anthropic.json().await.unwrap();
        assert_eq!(v["type"], "message", "{v}");
    }

    // A translated stream the engine cuts ends with an error in the
    // client's own format: an Ollama line, an Anthropic error event.
    let openai_node = &c.nodes[2];
    c.engines[2].faults().close_after_chunks(None, 2);
    let pin = openai_node.id.to_string();
    let cut = post(
        format!("{}/api/chat", face.ollama_url()),
        &pin,
        json!({"model": all[2], "messages": [{"role": "user", "content": "hi"}],
               "options": {"num_predict": 50}}),
    )
    .await;
    assert_eq!(cut.status(), 200);
    let body = cut.text().await.unwrap();
    let last: Value = serde_json::from_str(body.trim_end().lines().last().unwrap()).unwrap();
    assert!(
        last["error"].as_str().is_some(),
        "ends with an error line: {body}"
    );
    let cut = post(
        format!("{}/v1/messages", face.openai_url()),
        &pin,
        json!({"model": all[2], "max_tokens": 50, "stream": true,
               "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    let body = cut.text().await.unwrap();
    assert!(
        body.contains("event: error") && !body.contains("message_stop"),
        "ends with an error event: {body}"
    );
    c.engines[2].faults().clear();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_the_moment_the_faces_open_is_served() {
    // Started, not waited on: the engine's first poll has not come yet.
    let mut spec = pair_testkit::cluster::ClusterSpec::new(1);
    spec.time_scale = 0.05;
    spec.nodes[0].flavor = Flavor::OpenAi;
    let c = LocalCluster::start(spec).await.unwrap();
    let node = &c.nodes[0];
    let (ollama, openai) = tokio::join!(
        http()
            .post(format!("{}/api/chat", node.ollama_url()))
            .json(
                &json!({"model": "llama3.2:3b", "stream": false, "options": {"num_predict": 3},
                          "messages": [{"role": "user", "content": "hi"}]})
            )
            .send(),
        http()
            .post(format!("{}/v1/chat/completions", node.openai_url()))
            .json(&json!({"model": "llama3.2:3b", "max_tokens": 3,
                          "messages": [{"role": "user", "content": "hi"}]}))
            .send(),
    );
    let (ollama, openai) = (ollama.unwrap(), openai.unwrap());
    assert_eq!(ollama.status(), 200, "{:?}", ollama.text().await);
    assert_eq!(openai.status(), 200, "{:?}", openai.text().await);
    c.stop().await;
}
