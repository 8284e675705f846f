//! Against a real OpenAI-compatible engine: llama-cpp-python's server with
//! SmolLM2-135M. Inventory and health through the OpenAI adapter, a crash
//! seen as unhealthy, and port inversion with a real engine process
//! (launch on the moved port, adopt, refuse the usual port, never kill what
//! the supervisor did not start). CI runs these; they fail, never skip, when
//! the Python side is missing.
#![allow(clippy::unwrap_used)]

mod support;

use std::num::NonZeroU32;
use std::time::Duration;

use pair_core::{ApiFlavor, EngineKind};
use pair_engines::{
    EngineConfig, EngineError, EngineProbe, EngineSupervisor, PollConfig, PortPair, PortPlan,
    PortUse, ProbeFailure, SupervisorConfig, inspect_port, spawn_poller,
};
use support::llama::{LlamaServer, llama_command};
use support::{free_port, wait_for};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn fast_poll() -> PollConfig {
    PollConfig {
        interval: Duration::from_millis(200),
        // The machines running this are small and busy: generous deadline.
        timeout: Duration::from_secs(3),
        fail_threshold: NonZeroU32::new(2).unwrap(),
        inventory_every: NonZeroU32::new(10).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_adapter_reads_llama_cpp_python_and_sees_it_die() -> anyhow::Result<()> {
    let mut server = LlamaServer::start(free_port()).await?;
    let config = EngineConfig::new(EngineKind::OpenAiCompat, &server.url(), None)?;

    // One poll by hand: the probe alone, no task.
    let mut probe = EngineProbe::new(config.clone(), Duration::from_secs(3))?;
    assert_eq!(probe.identify().await, PortUse::Engine);
    let obs = probe.poll(pair_engines::InventoryRead::Required).await;
    assert_eq!(obs.health, Ok(()));
    let models = obs.models.expect("the model list is read when required");
    assert_eq!(models.len(), 1);
    assert_eq!(models[0].name.as_str(), "smollm2");
    assert!(
        models[0].loaded,
        "an OpenAI-compatible server lists loaded models"
    );
    assert_eq!(obs.queue, None, "llama-cpp-python exports no /metrics");

    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let handle = spawn_poller(config, fast_poll(), &tasks, cancel.clone())?;
    let mut rx = handle.subscribe();
    let up = wait_for(
        &mut rx,
        Duration::from_secs(20),
        "healthy with smollm2",
        |r| r.snapshot.healthy && !r.snapshot.models.is_empty(),
    )
    .await?;
    assert_eq!(up.snapshot.kind, EngineKind::OpenAiCompat);
    assert_eq!(
        up.snapshot.slots, 1,
        "llama-cpp-python runs one request at a time"
    );
    assert!(up.snapshot.find("smollm2", ApiFlavor::OpenAi).is_some());
    assert!(!up.snapshot.kind.speaks(ApiFlavor::Ollama));
    assert!(
        up.snapshot.find("smollm2", ApiFlavor::Ollama).is_some(),
        "served to Ollama clients through translation"
    );
    assert!(up.last_ok_ms.is_some());

    // A crash: the poller notices within a couple of intervals, keeps the
    // model listed for the record, and stops routing to it.
    server.kill().await?;
    let down = wait_for(
        &mut rx,
        Duration::from_secs(5),
        "unhealthy after kill",
        |r| !r.snapshot.healthy,
    )
    .await?;
    assert_eq!(down.last_failure, Some(ProbeFailure::Refused));
    assert_eq!(down.snapshot.models.len(), 1);
    assert!(down.snapshot.find("smollm2", ApiFlavor::OpenAi).is_none());
    assert!(!handle.snapshot().healthy);

    cancel.cancel();
    tasks.close();
    tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovered_engine_comes_back_with_its_inventory() -> anyhow::Result<()> {
    let port = free_port();
    let mut server = LlamaServer::start(port).await?;
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let config = EngineConfig::new(EngineKind::OpenAiCompat, &server.url(), None)?;
    let handle = spawn_poller(config, fast_poll(), &tasks, cancel.clone())?;
    let mut rx = handle.subscribe();
    wait_for(&mut rx, Duration::from_secs(20), "healthy", |r| {
        r.snapshot.healthy && !r.snapshot.models.is_empty()
    })
    .await?;
    server.kill().await?;
    let down = wait_for(&mut rx, Duration::from_secs(5), "unhealthy", |r| {
        !r.snapshot.healthy
    })
    .await?;
    let last_inventory = down.inventory_at_ms;

    let _again = LlamaServer::start(port).await?;
    let back = wait_for(
        &mut rx,
        Duration::from_secs(20),
        "healthy again with a fresh inventory",
        |r| r.snapshot.healthy && r.inventory_at_ms > last_inventory,
    )
    .await?;
    assert!(back.snapshot.find("smollm2", ApiFlavor::OpenAi).is_some());
    assert_eq!(back.last_failure, None);

    cancel.cancel();
    tasks.close();
    tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_llama_cpp_python_stays_healthy_while_generating() -> anyhow::Result<()> {
    let mut server = LlamaServer::start(free_port()).await?;
    let tasks = TaskTracker::new();
    let cancel = CancellationToken::new();
    let config = EngineConfig::new(EngineKind::OpenAiCompat, &server.url(), None)?;
    let handle = spawn_poller(config, fast_poll(), &tasks, cancel.clone())?;
    let mut rx = handle.subscribe();
    wait_for(&mut rx, Duration::from_secs(20), "healthy", |r| {
        r.snapshot.healthy && !r.snapshot.models.is_empty()
    })
    .await?;

    // A long generation (end-of-text tokens banned, so it runs its full
    // length) holds llama-cpp-python's model lock for seconds.
    let client = pair_engines::http_client(Duration::from_secs(120))?;
    let body = serde_json::json!({
        "model": "smollm2", "prompt": "Once upon a time", "max_tokens": 256,
        "logit_bias": {"0": -100.0, "1": -100.0, "2": -100.0},
    });
    let url = format!("{}/v1/completions", server.url());
    let generation = tokio::spawn(async move {
        client
            .post(url)
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json::<serde_json::Value>()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = handle.report().last_ok_ms;
    let mut healthy_throughout = true;
    while !generation.is_finished() {
        healthy_throughout &= handle.snapshot().healthy;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = match generation.await? {
        Ok(answer) => answer,
        Err(e) if !server.is_running() => anyhow::bail!(
            "llama-cpp-python died while generating ({e}). If dmesg shows `trap invalid opcode` in \
             libggml-cpu.so, its llama.cpp was built with -march=native on a CPU advertising AMX \
             it cannot run; rebuild it with CMAKE_ARGS=-DGGML_NATIVE=OFF"
        ),
        Err(e) => return Err(e.into()),
    };
    let after = handle.report();
    assert!(
        healthy_throughout,
        "a busy engine is not a dead one: {after:#?}"
    );
    assert!(
        after.last_ok_ms > during,
        "polls kept succeeding during the generation"
    );
    assert_eq!(
        answer["choices"][0]["finish_reason"], "length",
        "the polls did not cut the generation short: {answer}"
    );

    cancel.cancel();
    tasks.close();
    tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await?;
    Ok(())
}

fn supervisor_config(usual: u16, moved: u16) -> SupervisorConfig {
    let mut cfg = SupervisorConfig::new(EngineKind::OpenAiCompat);
    cfg.ports = PortPair { usual, moved };
    cfg.inherit_output = false;
    cfg.ready_timeout = Duration::from_secs(90);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_launches_the_engine_on_the_moved_port_and_stops_it() -> anyhow::Result<()> {
    let (usual, moved) = (free_port(), free_port());
    let mut cfg = supervisor_config(usual, moved);
    cfg.command = Some(llama_command()?);
    let sup = EngineSupervisor::start(cfg).await?;
    assert_eq!(sup.plan(), PortPlan::Launch);
    assert_eq!(sup.engine().base_url.port(), moved);
    assert!(sup.child_pid().is_some());
    assert_eq!(
        inspect_port(
            EngineKind::OpenAiCompat,
            "127.0.0.1",
            moved,
            Duration::from_secs(3)
        )
        .await?,
        PortUse::Engine
    );
    assert_eq!(
        inspect_port(
            EngineKind::OpenAiCompat,
            "127.0.0.1",
            usual,
            Duration::from_secs(3)
        )
        .await?,
        PortUse::Free,
        "the usual port stays free for the proxy"
    );

    let status = sup.shutdown().await?;
    assert!(status.is_some(), "the child it started is reaped");
    assert_eq!(
        inspect_port(
            EngineKind::OpenAiCompat,
            "127.0.0.1",
            moved,
            Duration::from_secs(3)
        )
        .await?,
        PortUse::Free
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervisor_adopts_a_running_engine_and_never_stops_it() -> anyhow::Result<()> {
    let (usual, moved) = (free_port(), free_port());
    let mut server = LlamaServer::start(moved).await?;
    let mut cfg = supervisor_config(usual, moved);
    // Even with a command configured, an engine already there is adopted.
    cfg.command = Some(llama_command()?);
    let sup = EngineSupervisor::start(cfg).await?;
    assert_eq!(sup.plan(), PortPlan::Adopt);
    assert_eq!(sup.child_pid(), None);
    assert_eq!(sup.shutdown().await?, None);
    assert!(server.is_running(), "an adopted engine is not ours to stop");
    assert_eq!(
        inspect_port(
            EngineKind::OpenAiCompat,
            "127.0.0.1",
            moved,
            Duration::from_secs(3)
        )
        .await?,
        PortUse::Engine
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_on_the_usual_port_is_refused_with_how_to_move_it() -> anyhow::Result<()> {
    let (usual, moved) = (free_port(), free_port());
    let mut server = LlamaServer::start(usual).await?;
    let mut cfg = supervisor_config(usual, moved);
    cfg.command = Some(llama_command()?);
    let err = EngineSupervisor::start(cfg).await.unwrap_err();
    assert!(
        matches!(err, EngineError::EngineOnUsualPort { kind: EngineKind::OpenAiCompat, usual: u, moved: m } if u == usual && m == moved),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&format!("--port {moved}")), "{msg}");
    assert!(server.is_running(), "the user's engine is left alone");
    assert_eq!(
        inspect_port(
            EngineKind::OpenAiCompat,
            "127.0.0.1",
            moved,
            Duration::from_secs(3)
        )
        .await?,
        PortUse::Free,
        "nothing was launched"
    );
    Ok(())
}
