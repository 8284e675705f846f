//! The adapters against pair-emulator's emulated engines, all three
//! flavors, on real loopback sockets: inventory with sizes, loaded state as
//! it changes, a dead engine marked unhealthy and coming back, faults on the
//! health route (500, hang), a hung engine not stalling another, and the
//! supervisor's port decisions with an engine really listening; and a
//! stand-in llama.cpp server whose `/slots` show its work.
#![allow(clippy::unwrap_used)]

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use pair_core::{ApiFlavor, EngineKind};
use pair_emulator::{EmulatedEngine, EmulatorConfig as EmuConfig, Flavor, ModelSpec};
use pair_engines::{
    EngineConfig, EngineError, EngineHandle, EngineSupervisor, PollConfig, PortPair, PortPlan,
    PortUse, ProbeFailure, SupervisorConfig, inspect_port, spawn_poller,
};
use support::{free_port, wait_for};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const WAIT: Duration = Duration::from_secs(10);

fn poll() -> PollConfig {
    PollConfig {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(500),
        fail_threshold: NonZeroU32::new(2).unwrap(),
        inventory_every: NonZeroU32::new(5).unwrap(),
    }
}

fn emu_config(flavor: Flavor) -> EmuConfig {
    EmuConfig::new(
        flavor,
        [
            ModelSpec::new("llama3.2", 2_019_393_189),
            ModelSpec::new("qwen2.5:0.5b", 397_821_319),
        ],
    )
    .with_time_scale(0.001)
    .with_default_max_tokens(4)
}

async fn emulator_on(flavor: Flavor, port: u16) -> EmulatedEngine {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    EmulatedEngine::spawn(emu_config(flavor), listener).unwrap()
}

struct Polling {
    handle: EngineHandle,
    tasks: TaskTracker,
    cancel: CancellationToken,
}

impl Polling {
    fn start(kind: EngineKind, url: &str) -> Self {
        let tasks = TaskTracker::new();
        let cancel = CancellationToken::new();
        let config = EngineConfig::new(kind, url, None).unwrap();
        let handle = spawn_poller(config, poll(), &tasks, cancel.clone()).unwrap();
        Self {
            handle,
            tasks,
            cancel,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.tasks.close();
        tokio::time::timeout(Duration::from_secs(5), self.tasks.wait())
            .await
            .unwrap();
    }
}

/// One short generation, which makes the emulated engine load the model.
async fn use_model(engine: &EmulatedEngine, model: &str) {
    let client = pair_engines::http_client(Duration::from_secs(10)).unwrap();
    let (path, body) = match engine.config().flavor {
        Flavor::Ollama => (
            "/api/generate",
            serde_json::json!({"model": model, "prompt": "hi", "stream": false}),
        ),
        _ => (
            "/v1/chat/completions",
            serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        ),
    };
    let resp = client
        .post(format!("{}{path}", engine.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
}

#[tokio::test]
async fn ollama_inventory_sizes_and_loaded_state_follow_the_engine() {
    let engine = emulator_on(Flavor::Ollama, 0).await;
    let p = Polling::start(EngineKind::Ollama, &engine.base_url());
    let mut rx = p.handle.subscribe();
    let r = wait_for(&mut rx, WAIT, "two installed models", |r| {
        r.snapshot.healthy && r.snapshot.models.len() == 2
    })
    .await
    .unwrap();
    assert_eq!(r.version.as_deref(), Some("0.12.6"));
    assert_eq!(r.snapshot.slots, 1);
    let llama = r
        .snapshot
        .find("llama3.2", ApiFlavor::Ollama)
        .expect("untagged name matches :latest");
    assert_eq!(llama.name.as_str(), "llama3.2:latest");
    assert_eq!(llama.size_bytes, Some(2_019_393_189));
    assert!(!llama.loaded, "Ollama loads on first use");

    use_model(&engine, "llama3.2").await;
    let r = wait_for(&mut rx, WAIT, "llama3.2 loaded", |r| {
        r.snapshot
            .find("llama3.2", ApiFlavor::Ollama)
            .is_some_and(|m| m.loaded)
    })
    .await
    .unwrap();
    assert!(
        !r.snapshot
            .find("qwen2.5:0.5b", ApiFlavor::Ollama)
            .unwrap()
            .loaded
    );
    p.stop().await;
    engine.shutdown().await;
}

#[tokio::test]
async fn lmstudio_native_listing_gives_sizes_and_loaded_state() {
    let engine = emulator_on(Flavor::LmStudio, 0).await;
    let p = Polling::start(EngineKind::LmStudio, &engine.base_url());
    let mut rx = p.handle.subscribe();
    let r = wait_for(&mut rx, WAIT, "two models", |r| {
        r.snapshot.healthy && r.snapshot.models.len() == 2
    })
    .await
    .unwrap();
    let m = r.snapshot.find("qwen2.5:0.5b", ApiFlavor::OpenAi).unwrap();
    assert_eq!(
        m.size_bytes,
        Some(397_821_319),
        "sizes come from /api/v1/models"
    );
    assert!(!m.loaded);
    assert!(
        !r.snapshot.kind.speaks(ApiFlavor::Ollama),
        "LM Studio speaks no Ollama"
    );
    assert!(
        r.snapshot.find("qwen2.5:0.5b", ApiFlavor::Ollama).is_some(),
        "its models are served to Ollama clients through translation"
    );

    use_model(&engine, "qwen2.5:0.5b").await;
    wait_for(&mut rx, WAIT, "qwen loaded", |r| {
        r.snapshot
            .find("qwen2.5:0.5b", ApiFlavor::OpenAi)
            .is_some_and(|m| m.loaded)
    })
    .await
    .unwrap();
    p.stop().await;
    engine.shutdown().await;
}

#[tokio::test]
async fn openai_server_lists_its_loaded_models_with_health() {
    let engine = emulator_on(Flavor::OpenAi, 0).await;
    let p = Polling::start(EngineKind::OpenAiCompat, &engine.base_url());
    let mut rx = p.handle.subscribe();
    let r = wait_for(&mut rx, WAIT, "two models", |r| {
        r.snapshot.healthy && r.snapshot.models.len() == 2
    })
    .await
    .unwrap();
    assert!(r.snapshot.models.iter().all(|m| m.loaded));
    assert!(r.snapshot.find("llama3.2", ApiFlavor::OpenAi).is_some());
    assert!(
        r.snapshot
            .find("llama3.2:latest", ApiFlavor::OpenAi)
            .is_none(),
        "exact names off Ollama"
    );
    assert!(engine.hits_for("/health") >= 1);
    p.stop().await;
    engine.shutdown().await;
}

#[tokio::test]
async fn dead_engine_is_unhealthy_then_recovers_for_every_flavor() {
    for flavor in Flavor::ALL {
        let port = free_port();
        let engine = emulator_on(flavor, port).await;
        let p = Polling::start(flavor.engine_kind(), &engine.base_url());
        let mut rx = p.handle.subscribe();
        wait_for(&mut rx, WAIT, "healthy", |r| {
            r.snapshot.healthy && !r.snapshot.models.is_empty()
        })
        .await
        .unwrap();

        engine.shutdown().await;
        let down = wait_for(&mut rx, WAIT, "unhealthy", |r| !r.snapshot.healthy)
            .await
            .unwrap();
        assert_eq!(down.last_failure, Some(ProbeFailure::Refused), "{flavor}");
        assert_eq!(
            down.snapshot.models.len(),
            2,
            "{flavor}: the last inventory is kept for display"
        );
        assert!(
            down.snapshot.find("llama3.2", ApiFlavor::OpenAi).is_none(),
            "{flavor}: but not routable"
        );

        let again = emulator_on(flavor, port).await;
        let up = wait_for(&mut rx, WAIT, "healthy again", |r| r.snapshot.healthy)
            .await
            .unwrap();
        assert_eq!(up.last_failure, None);
        assert!(
            up.snapshot.find("llama3.2", ApiFlavor::OpenAi).is_some(),
            "{flavor}"
        );
        p.stop().await;
        again.shutdown().await;
    }
}

#[tokio::test]
async fn health_route_faults_500_and_hang_mark_the_engine_down() {
    let engine = emulator_on(Flavor::OpenAi, 0).await;
    let p = Polling::start(EngineKind::OpenAiCompat, &engine.base_url());
    let mut rx = p.handle.subscribe();
    wait_for(&mut rx, WAIT, "healthy", |r| r.snapshot.healthy)
        .await
        .unwrap();

    let faults = engine.faults();
    faults.fail(None, 500, None);
    let down = wait_for(&mut rx, WAIT, "down on 500s", |r| !r.snapshot.healthy)
        .await
        .unwrap();
    assert_eq!(down.last_failure, Some(ProbeFailure::Status(500)));
    assert!(
        down.consecutive_failures >= 2,
        "one 500 is not enough: {}",
        down.consecutive_failures
    );
    faults.clear();
    wait_for(&mut rx, WAIT, "back after 500s", |r| r.snapshot.healthy)
        .await
        .unwrap();

    faults.hang(None);
    let down = wait_for(&mut rx, WAIT, "down on hang", |r| !r.snapshot.healthy)
        .await
        .unwrap();
    assert_eq!(down.last_failure, Some(ProbeFailure::Timeout));
    faults.clear();
    wait_for(&mut rx, WAIT, "back after hang", |r| r.snapshot.healthy)
        .await
        .unwrap();

    // A single failure (one slow or failed answer) does not take it down.
    faults.add(pair_emulator::FaultRule::global(pair_emulator::FaultAction::Status(502)).times(1));
    let mut quiet = p.handle.subscribe();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(quiet.borrow_and_update().snapshot.healthy);
    p.stop().await;
    engine.shutdown().await;
}

#[tokio::test]
async fn a_hung_engine_does_not_stall_another() {
    let hung = emulator_on(Flavor::Ollama, 0).await;
    let fine = emulator_on(Flavor::Ollama, 0).await;
    let a = Polling::start(EngineKind::Ollama, &hung.base_url());
    let b = Polling::start(EngineKind::Ollama, &fine.base_url());
    let (mut ra, mut rb) = (a.handle.subscribe(), b.handle.subscribe());
    wait_for(&mut ra, WAIT, "a healthy", |r| r.snapshot.healthy)
        .await
        .unwrap();
    wait_for(&mut rb, WAIT, "b healthy", |r| r.snapshot.healthy)
        .await
        .unwrap();

    hung.faults().hang(None);
    use_model(&fine, "qwen2.5:0.5b").await;
    // The healthy engine's change shows up while the other one hangs.
    wait_for(&mut rb, WAIT, "b sees qwen loaded", |r| {
        r.snapshot
            .find("qwen2.5:0.5b", ApiFlavor::Ollama)
            .is_some_and(|m| m.loaded)
    })
    .await
    .unwrap();
    wait_for(&mut ra, WAIT, "a down", |r| !r.snapshot.healthy)
        .await
        .unwrap();
    assert!(rb.borrow().snapshot.healthy);
    a.stop().await;
    b.stop().await;
    hung.shutdown().await;
    fine.shutdown().await;
}

#[tokio::test]
async fn refresh_request_rereads_the_inventory_at_once() {
    let engine = emulator_on(Flavor::OpenAi, 0).await;
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let slow = PollConfig {
        interval: Duration::from_secs(30),
        ..poll()
    };
    let config = EngineConfig::new(EngineKind::OpenAiCompat, &engine.base_url(), None).unwrap();
    let handle = spawn_poller(config, slow, &tasks, cancel.clone()).unwrap();
    let mut rx = handle.subscribe();
    let first = wait_for(&mut rx, WAIT, "first poll", |r| r.inventory_at_ms.is_some())
        .await
        .unwrap();
    let listings = engine.hits_for("/v1/models");
    tokio::time::sleep(Duration::from_millis(5)).await;
    handle.request_refresh();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while engine.hits_for("/v1/models") == listings {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no listing after request_refresh"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(handle.report().inventory_at_ms >= first.inventory_at_ms);
    cancel.cancel();
    tasks.close();
    tasks.wait().await;
    engine.shutdown().await;
}

fn sup_config(kind: EngineKind, usual: u16, moved: u16) -> SupervisorConfig {
    let mut cfg = SupervisorConfig::new(kind);
    cfg.ports = PortPair { usual, moved };
    cfg.probe_timeout = Duration::from_secs(2);
    cfg.inherit_output = false;
    cfg
}

#[tokio::test]
async fn supervisor_decisions_with_engines_listening() {
    // The engine itself on the proxy's port: one message saying how to move it.
    let (usual, moved) = (free_port(), free_port());
    let ollama = emulator_on(Flavor::Ollama, usual).await;
    let err = EngineSupervisor::start(sup_config(EngineKind::Ollama, usual, moved))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::EngineOnUsualPort {
                kind: EngineKind::Ollama,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains(&format!("OLLAMA_HOST=127.0.0.1:{moved} ollama serve")),
        "{err}"
    );
    assert!(ollama.hits() > 0);
    ollama.shutdown().await;

    // An OpenAI server where Ollama is expected is "something else" (the
    // reverse is not: Ollama serves the OpenAI routes too).
    let (usual, moved) = (free_port(), free_port());
    let stranger = emulator_on(Flavor::OpenAi, moved).await;
    let mut cfg = sup_config(EngineKind::Ollama, usual, moved);
    cfg.command = Some(pair_engines::EngineCommand::parse("true").unwrap());
    let err = EngineSupervisor::start(cfg).await.unwrap_err();
    assert!(
        matches!(err, EngineError::OtherOnMovedPort { port, .. } if port == moved),
        "{err:?}"
    );
    stranger.shutdown().await;

    // Adopt each flavor already on the moved port; nothing there -> Await.
    for flavor in Flavor::ALL {
        let (usual, moved) = (free_port(), free_port());
        let engine = emulator_on(flavor, moved).await;
        let sup = EngineSupervisor::start(sup_config(flavor.engine_kind(), usual, moved))
            .await
            .unwrap();
        assert_eq!(sup.plan(), PortPlan::Adopt, "{flavor}");
        assert_eq!(sup.engine().base_url.port(), moved);
        assert_eq!(sup.shutdown().await.unwrap(), None);
        assert_eq!(
            inspect_port(
                flavor.engine_kind(),
                "127.0.0.1",
                moved,
                Duration::from_secs(2)
            )
            .await
            .unwrap(),
            PortUse::Engine,
            "{flavor}: adopted engines keep running"
        );
        engine.shutdown().await;
    }
    let (usual, moved) = (free_port(), free_port());
    let sup = EngineSupervisor::start(sup_config(EngineKind::LmStudio, usual, moved))
        .await
        .unwrap();
    assert_eq!(sup.plan(), PortPlan::Await);
}

#[tokio::test]
async fn launched_command_that_exits_early_is_reported() {
    let (usual, moved) = (free_port(), free_port());
    let mut cfg = sup_config(EngineKind::OpenAiCompat, usual, moved);
    cfg.command = Some(pair_engines::EngineCommand::parse("sh -c 'exit 3' {port}").unwrap());
    let err = EngineSupervisor::start(cfg).await.unwrap_err();
    match err {
        EngineError::EngineExited { status, port, .. } => {
            assert_eq!(status.code(), Some(3));
            assert_eq!(port, moved);
        }
        other => panic!("expected EngineExited, got {other:?}"),
    }

    let mut cfg = sup_config(EngineKind::OpenAiCompat, free_port(), free_port());
    cfg.command = Some(pair_engines::EngineCommand::parse("llama-server -m x.gguf").unwrap());
    assert!(matches!(
        EngineSupervisor::start(cfg).await,
        Err(EngineError::BadCommand { .. })
    ));

    let mut cfg = sup_config(EngineKind::OpenAiCompat, free_port(), free_port());
    cfg.command = Some(pair_engines::EngineCommand::parse("sleep 30 {port}").unwrap());
    cfg.ready_timeout = Duration::from_millis(300);
    assert!(matches!(
        EngineSupervisor::start(cfg).await,
        Err(EngineError::NotReady { .. })
    ));
}

/// A llama.cpp server started without `--metrics` (its default) answers
/// `/metrics` with 501 but serves `/slots`: the tokens its slots decoded
/// are the probe's sign of work. Here a stand-in server, whose one slot
/// decodes a token between polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_server_without_metrics_shows_its_work_through_slots() {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut decoded = 0;
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/health" => ("200 OK", r#"{"status":"ok"}"#.to_owned()),
                "/metrics" => ("501 Not Implemented", String::new()),
                "/slots" => {
                    decoded += 1;
                    (
                        "200 OK",
                        format!(
                            r#"[{{"id":0,"is_processing":true,"next_token":{{"has_next_token":true,"n_decoded":{decoded}}}}}]"#
                        ),
                    )
                }
                _ => ("404 Not Found", String::new()),
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let config = EngineConfig::new(EngineKind::OpenAiCompat, &url, None).unwrap();
    let mut probe = pair_engines::EngineProbe::new(config, Duration::from_secs(3)).unwrap();
    let first = probe.poll(pair_engines::InventoryRead::Skip).await;
    assert_eq!(first.health, Ok(()));
    assert_eq!(first.queue, None, "no metrics");
    assert_eq!(first.work_tokens, Some(1), "its slots were read");
    let second = probe.poll(pair_engines::InventoryRead::Skip).await;
    assert_eq!(second.work_tokens, Some(2), "a token decoded between polls");
}

/// A stand-in OpenAI-compatible server answering `routes` (path, status,
/// body) and 404 for every other path.
fn stand_in(routes: &'static [(&'static str, &'static str, &'static str)]) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let _ = BufReader::new(&stream).read_line(&mut line);
            let path = line.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = routes
                .iter()
                .find(|(p, _, _)| *p == path)
                .map_or(("404 Not Found", ""), |(_, s, b)| (*s, *b));
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// Whether an OpenAI-compatible server continues a chat's final assistant
/// message is read from its routes with its inventory, nothing generated:
/// llama.cpp's server (`/props`, here the emulated engine) and vLLM
/// (`/version`) do; llama-cpp-python's server (neither route, not even
/// `/health`) is not known to. Not told on a poll that skips the
/// inventory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_compatible_server_is_known_to_continue_a_chat_by_its_routes() {
    const MODELS: &str = r#"{"object":"list","data":[{"id":"m","object":"model"}]}"#;
    let emulated = EmulatedEngine::spawn(
        EmuConfig::new(Flavor::OpenAi, ["m".to_owned()]),
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
    )
    .unwrap();
    let vllm = stand_in(&[
        ("/health", "200 OK", ""),
        ("/version", "200 OK", r#"{"version":"0.8.5"}"#),
        ("/v1/models", "200 OK", MODELS),
    ]);
    let llama_cpp_python = stand_in(&[("/v1/models", "200 OK", MODELS)]);
    for (url, continues) in [
        (emulated.base_url().to_string(), true),
        (vllm, true),
        (llama_cpp_python, false),
    ] {
        let config = EngineConfig::new(EngineKind::OpenAiCompat, &url, None).unwrap();
        let mut probe = pair_engines::EngineProbe::new(config, Duration::from_secs(3)).unwrap();
        let skipped = probe.poll(pair_engines::InventoryRead::Skip).await;
        assert_eq!(skipped.health, Ok(()), "{url}");
        assert_eq!(skipped.continues_chat, None, "{url}");
        let read = probe.poll(pair_engines::InventoryRead::Required).await;
        assert_eq!(read.continues_chat, Some(continues), "{url}");
        assert!(read.models.is_some_and(|m| !m.is_empty()), "{url}");
    }
}
