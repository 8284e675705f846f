//! `pair-client`: join a pair cluster as a client, see how the SDK ranks
//! its nodes, chat through it, or serve local faces backed by it.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use futures_util::StreamExt;
use pair_client::serve::{self, Faces};
use pair_os::signal::shutdown_signal;
use pair_scheduler::Policy;
use pair_sdk::api::{ollama, openai};
use pair_sdk::{Client, Config, Mdns};

#[derive(Parser, Debug)]
#[command(
    name = "pair-client",
    version,
    about = "Use a pair cluster from a machine without an engine"
)]
struct Cli {
    /// Identity, pins and the ranking cache. Default: $XDG_STATE_HOME/pair-client
    /// on Linux, ~/Library/Application Support/pair-client on macOS,
    /// %LOCALAPPDATA%\pair-client on Windows.
    #[arg(long, global = true, env = "PAIR_CLIENT_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// A node's cluster port, HOST:PORT (repeat; a DNS name that resolves
    /// to several addresses gives each).
    #[arg(
        long = "seed",
        global = true,
        env = "PAIR_CLIENT_SEEDS",
        value_delimiter = ','
    )]
    seeds: Vec<String>,
    /// Find nodes by mDNS: off, loopback (tests, demos) or lan.
    #[arg(long, global = true, default_value = "off", env = "PAIR_CLIENT_MDNS")]
    mdns: MdnsArg,
    /// The mDNS port for `--mdns loopback`.
    #[arg(long, global = true, default_value_t = 5353)]
    mdns_port: u16,
    /// How long a ranking is used before the nodes are probed again.
    #[arg(long, global = true, default_value = "5m", value_parser = humantime::parse_duration, env = "PAIR_CLIENT_CACHE_TTL")]
    cache_ttl: Duration,
    /// Ranking policy.
    #[arg(long, global = true, default_value = "predicted-latency")]
    policy: Policy,
    /// This machine's name, as nodes list it.
    #[arg(long, global = true)]
    name: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum MdnsArg {
    Off,
    Loopback,
    Lan,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Pair this machine with a node (as a client).
    Pair {
        #[command(subcommand)]
        command: PairCommand,
    },
    /// Probe the nodes: round trip, load, models, and the order the SDK uses.
    Probe {
        /// For this model's order (otherwise by round trip).
        #[arg(short, long)]
        model: Option<String>,
        /// Probe now even if the cached ranking is fresh.
        #[arg(long)]
        fresh: bool,
        #[arg(long)]
        json: bool,
    },
    /// Stream an answer, then say which node served it.
    Chat {
        #[arg(short, long)]
        model: String,
        /// Which API shape to speak to the node.
        #[arg(long, default_value = "openai")]
        api: ApiArg,
        /// Keep the conversation on one node.
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        max_tokens: Option<u32>,
        prompt: String,
    },
    /// Local Ollama and OpenAI faces backed by the cluster, for unmodified apps.
    Serve {
        #[arg(
            long,
            default_value = "127.0.0.1:11434",
            env = "PAIR_CLIENT_OLLAMA_FACE"
        )]
        ollama_face: SocketAddr,
        #[arg(
            long,
            default_value = "127.0.0.1:1234",
            env = "PAIR_CLIENT_OPENAI_FACE"
        )]
        openai_face: SocketAddr,
        /// Extra Host names the faces accept (behind your own reverse proxy).
        #[arg(long = "allowed-host", value_delimiter = ',')]
        allowed_hosts: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
enum PairCommand {
    /// Pair with the node at HOST:PORT (its cluster port) using the PIN
    /// from `pair-node pair invite` there.
    Join {
        addr: String,
        #[arg(long)]
        pin: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ApiArg {
    Openai,
    Ollama,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PAIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pair-client: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pair-client: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let state_dir = match cli.state_dir.clone() {
        Some(dir) => dir,
        None => pair_sdk::config::default_state_dir()
            .context("this user has no home folder: pass --state-dir")?,
    };
    let mut cfg = Config::new(state_dir);
    cfg.seeds.clone_from(&cli.seeds);
    cfg.mdns = match cli.mdns {
        MdnsArg::Off => Mdns::Off,
        MdnsArg::Loopback => Mdns::Loopback {
            port: cli.mdns_port,
        },
        MdnsArg::Lan => Mdns::Lan,
    };
    cfg.cache_ttl = cli.cache_ttl;
    cfg.policy = cli.policy;
    if let Some(n) = &cli.name {
        cfg.name.clone_from(n);
    }
    let name = cfg.name.clone();
    let client = Client::open(cfg).await?;
    let code = match cli.command {
        Command::Pair {
            command: PairCommand::Join { addr, pin },
        } => {
            let record = client.join(&addr, &pin).await?;
            println!(
                "paired with {} ({}) as client {}",
                record.name,
                record.id,
                client.id()
            );
            let others = client.pinned_nodes().len().saturating_sub(1);
            if others > 0 {
                println!("{others} more node(s) of its cluster pinned through it");
            }
            ExitCode::SUCCESS
        }
        Command::Probe { model, fresh, json } => {
            let survey = client.survey_for(model.as_deref(), fresh).await?;
            if json {
                let v = serde_json::json!({
                    "probed": client.stats().rounds > 0,
                    "age_ms": survey.age.as_millis() as u64,
                    "nodes": survey.nodes.iter().map(|(n, reason)| serde_json::json!({
                        "id": n.id, "name": n.name, "addr": n.addr, "rtt_us": n.rtt_us,
                        "running": n.snapshot.workload.running, "queued": n.snapshot.workload.queued,
                        "slots": n.snapshot.slots(), "pressure": n.snapshot.pressure.band(),
                        "models": n.models, "reason": reason,
                    })).collect::<Vec<_>>(),
                    "failures": survey.failures.iter().map(|f| serde_json::json!({
                        "addr": f.addr, "node": f.expected, "error": f.why,
                    })).collect::<Vec<_>>(),
                });
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_survey(&survey, model.as_deref(), client.stats().rounds > 0);
            }
            ExitCode::SUCCESS
        }
        Command::Chat {
            model,
            api,
            session,
            max_tokens,
            prompt,
        } => chat(&client, &model, api, session, max_tokens, &prompt).await?,
        Command::Serve {
            ollama_face,
            openai_face,
            allowed_hosts,
        } => {
            let serving = serve::start(
                client.clone(),
                Faces {
                    ollama: Some(ollama_face),
                    openai: Some(openai_face),
                    allowed_hosts,
                },
                &name,
            )
            .await?;
            eprintln!(
                "pair-client serving: Ollama face http://{}  OpenAI face http://{}",
                serving.ollama.map_or_else(|| "-".into(), |a| a.to_string()),
                serving.openai.map_or_else(|| "-".into(), |a| a.to_string()),
            );
            shutdown_signal().await;
            serving.stop().await;
            ExitCode::SUCCESS
        }
    };
    client.close().await;
    Ok(code)
}

async fn chat(
    client: &Client,
    model: &str,
    api: ApiArg,
    session: Option<String>,
    max_tokens: Option<u32>,
    prompt: &str,
) -> Result<ExitCode> {
    let mut out = std::io::stdout();
    let session = session.as_deref();
    let (node, first_byte, attempts) = match api {
        ApiArg::Openai => {
            let mut req = openai::ChatRequest::new(model, vec![openai::Message::user(prompt)]);
            req.max_tokens = max_tokens;
            print_stream(client, session, req, &mut out).await?
        }
        ApiArg::Ollama => {
            let mut req = ollama::ChatRequest {
                model: model.to_owned(),
                messages: vec![ollama::Message::user(prompt)],
                ..ollama::ChatRequest::default()
            };
            if let Some(n) = max_tokens {
                req.options.insert("num_predict".into(), n.into());
            }
            print_stream(client, session, req, &mut out).await?
        }
    };
    writeln!(out)?;
    eprintln!(
        "served by {node}; first token after {:.1} ms{}",
        first_byte.as_secs_f64() * 1000.0,
        if attempts > 1 {
            format!(" ({attempts} attempts)")
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// Streams `req`'s answer to `out`; who served it, how soon, in how many
/// attempts.
async fn print_stream<E>(
    client: &Client,
    session: Option<&str>,
    req: E,
    out: &mut impl std::io::Write,
) -> Result<(String, Duration, usize)>
where
    E: pair_sdk::api::Endpoint,
    E::Chunk: pair_sdk::api::ChunkText,
{
    use pair_sdk::api::ChunkText as _;
    let mut chunks = match session {
        Some(key) => client.session(key).stream(req).await?,
        None => client.stream(req).await?,
    };
    while let Some(chunk) = chunks.next().await {
        write!(out, "{}", chunk?.text())?;
        out.flush()?;
    }
    Ok((chunks.node_name, chunks.first_byte, chunks.attempts))
}

fn print_survey(survey: &pair_sdk::Survey, model: Option<&str>, probed: bool) {
    println!(
        "ranking {} ({} node(s))",
        if probed {
            "probed now".to_owned()
        } else {
            format!("cached, {} s old", survey.age.as_secs())
        },
        survey.nodes.len()
    );
    println!(
        "{:<3} {:<20} {:<22} {:>9} {:>4} {:>4} {:>5}  models",
        "#", "node", "address", "rtt", "run", "queue", "slots"
    );
    for (i, (n, _)) in survey.nodes.iter().enumerate() {
        let models: Vec<String> = n
            .models
            .iter()
            .map(|m| {
                format!(
                    "{}{} ({} ms)",
                    m.id,
                    if m.loaded { "*" } else { "" },
                    m.predicted_ttft_ms
                )
            })
            .collect();
        println!(
            "{:<3} {:<20} {:<22} {:>7.2}ms {:>4} {:>4} {:>5}  {}",
            i + 1,
            n.name,
            n.addr.to_string(),
            f64::from(n.rtt_us) / 1000.0,
            n.snapshot.workload.running,
            n.snapshot.workload.queued,
            n.snapshot.slots(),
            models.join(", ")
        );
    }
    if let Some(m) = model {
        println!("order for {m}:");
        for (i, (n, reason)) in survey.nodes.iter().enumerate() {
            println!(
                "  {}. {}  {}",
                i + 1,
                n.name,
                reason.as_deref().unwrap_or("")
            );
        }
        if survey.nodes.is_empty() {
            println!("  no reachable node holds {m}");
        }
    }
    println!("(* loaded; ms: predicted time to first token there)");
    for f in &survey.failures {
        println!("unreachable: {} {}", f.addr, f.why);
    }
}
