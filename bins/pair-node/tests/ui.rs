//! The Jobs view in a real browser: headless Chromium (Debian package)
//! renders `/ui` of a running cluster; the rendered DOM must show every node
//! and the jobs with "sent to / ran on", and a screenshot is taken.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

use std::process::Command;
use std::time::Duration;

use pair_testkit::cluster::{ClusterSpec, LocalCluster};

fn chromium() -> &'static str {
    let path = "/usr/bin/chromium";
    assert!(
        std::path::Path::new(path).exists(),
        "chromium is missing: scripts/setup.sh installs it (CI does)"
    );
    path
}

fn browser(url: &str, extra: &[&str], profile: &std::path::Path) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_view_renders_nodes_and_jobs_in_headless_chromium() {
    pair_identity::install_crypto_provider();
    let mut spec = ClusterSpec::new(2);
    spec.time_scale = 0.05;
    let c = LocalCluster::start(spec).await.unwrap();
    c.wait_converged(Duration::from_secs(20)).await.unwrap();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for node in &c.nodes {
        let r = http
            .post(format!("{}/api/generate", c.nodes[0].ollama_url()))
            .header("x-pair-node-pin", node.id.to_string())
            .body(r#"{"model":"llama3.2:3b","prompt":"hi","stream":false}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await;
    }
    let url = format!("{}/ui", c.nodes[0].ollama_url());
    let dir = tempfile::tempdir().unwrap();
    let (u, p) = (url.clone(), dir.path().join("profile-dom"));
    let dom = tokio::task::spawn_blocking(move || browser(&u, &["--dump-dom"], &p))
        .await
        .unwrap();
    let html = String::from_utf8_lossy(&dom.stdout).into_owned();
    for node in &c.nodes {
        assert!(
            html.contains(&node.name),
            "node {} not rendered:\n{html}",
            node.name
        );
    }
    // The jobs table itself (the page's CSS and node cards also hold words
    // like "completed" and the model name): one completed row per request,
    // each naming the node it ran on.
    let jobs = html
        .split("<tbody id=\"jobs\">")
        .nth(1)
        .and_then(|rest| rest.split("</tbody>").next())
        .unwrap_or_else(|| panic!("no jobs table:\n{html}"));
    assert_eq!(
        jobs.matches("<td class=\"completed\">completed").count(),
        c.nodes.len(),
        "one completed row per request:\n{jobs}"
    );
    for node in &c.nodes {
        assert!(jobs.contains(&node.name), "ran on {}:\n{jobs}", node.name);
    }
    assert_eq!(jobs.matches("llama3.2:3b").count(), c.nodes.len());

    let shot = dir.path().join("jobs-view.png");
    let (u, p, s) = (url, dir.path().join("profile-shot"), shot.clone());
    let out = tokio::task::spawn_blocking(move || {
        browser(&u, &[&format!("--screenshot={}", s.display())], &p)
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    if let Some(keep) = std::env::var_os("PAIR_UI_SCREENSHOT") {
        std::fs::write(keep, &png).unwrap();
    }
    c.stop().await;
}
