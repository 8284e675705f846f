//! Streams one chat answer from a pair cluster through the edge SDK.
//!
//! ```sh
//! cargo run -p pair-sdk --example chat -- --seed gpu-box.lan:14318 -m qwen2.5:7b "Why is the sky blue?"
//! ```
//! The machine must have joined the cluster first (`pair-client pair join`),
//! with the same state dir (`--state-dir`, default the XDG state dir).

use futures_util::StreamExt;
use pair_sdk::api::openai;
use pair_sdk::{Client, Config};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = pair_sdk::config::default_state_dir().ok_or("no home folder for the state")?;
    let mut cfg = Config::new(dir);
    let mut model = None;
    let mut prompt = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => cfg.seeds.extend(args.next()),
            "--state-dir" => cfg.state_dir = args.next().unwrap_or_default().into(),
            "-m" | "--model" => model = args.next(),
            _ => prompt.push(a),
        }
    }
    let model = model.ok_or("give a model: -m MODEL")?;
    let client = Client::open(cfg).await?;
    let chat = openai::ChatRequest::new(model, vec![openai::Message::user(prompt.join(" "))]);
    let mut chunks = client.stream(chat).await?;
    while let Some(chunk) = chunks.next().await {
        print!("{}", chunk?.text());
    }
    println!();
    eprintln!(
        "served by {} (first token after {:?}, {} attempt(s))",
        chunks.node_name, chunks.first_byte, chunks.attempts
    );
    client.close().await;
    Ok(())
}
