//! pair-node: the daemon and its CLI. `main` only parses arguments, sets up
//! tracing and hands over to the library.

#[cfg(feature = "demo")]
use std::net::SocketAddr;
use std::process::ExitCode;
#[cfg(feature = "demo")]
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pair_daemon::cli::{self, ControlClient};
use pair_daemon::config::{ConfigError, FileConfig, NodeConfig, RunArgs};
use pair_daemon::daemon::{self, Listeners};
#[cfg(feature = "demo")]
use pair_daemon::demo::{ClusterSpec, LocalCluster};
use tokio_util::sync::CancellationToken;

/// glibc malloc is slow when buffers are freed on another thread than the
/// one that allocated them, which a proxy's answers do all the time.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "mimalloc")]
mod memory;
#[cfg(windows)]
mod winsvc;

/// Exit code for bad configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "pair-node",
    version,
    about = "A peer-to-peer inference router for local LLM engines"
)]
struct Cli {
    /// Event loops (threads) serving connections: each is a single-threaded
    /// runtime with its own engine connections, and connections are dealt
    /// over them round-robin (thread per core, like nginx's workers).
    /// Default: the number of cores, at most 4. 1 runs the whole node on
    /// one thread.
    #[arg(
        long,
        global = true,
        env = "PAIR_THREADS",
        value_parser = clap::value_parser!(u16).range(1..=512)
    )]
    threads: Option<u16>,
    /// Log lines as text (coloured only on a terminal) or JSON, one object
    /// a line, for log shippers.
    #[arg(long, global = true, env = "PAIR_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// Started by the Windows service controller (the command line
    /// `service install` registers there says so).
    #[arg(long, hide = true)]
    windows_service: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node daemon.
    Run(Box<RunArgs>),
    /// Run N nodes on loopback, each with an emulated engine of different
    /// hardware, paired through the real protocol; faces on 11434 and 1234.
    #[cfg(feature = "demo")]
    Demo {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value = "127.0.0.1:11434")]
        ollama_face: SocketAddr,
        #[arg(long, default_value = "127.0.0.1:1234")]
        openai_face: SocketAddr,
        #[arg(long, default_value = "predicted-latency")]
        policy: String,
        /// Model aliases on the first node (PATTERN=MODEL, repeatable):
        /// Claude Code's and Codex's default model names reach a demo model.
        #[arg(
            long = "alias",
            value_delimiter = ',',
            default_value = "claude-*=qwen2.5:7b,gpt-*=qwen2.5:7b"
        )]
        aliases: Vec<String>,
        /// Wall seconds per emulated second (0.25: engines four times
        /// faster than their hardware).
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
    },
    /// Pair this node with another one.
    Pair {
        #[command(subcommand)]
        action: PairAction,
    },
    /// Paired peers and their state.
    Peers(ClientArgs),
    /// Recent jobs ("sent to / ran on").
    Jobs {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long, default_value_t = 30)]
        limit: usize,
    },
    /// Remove a peer's pin; its connections are closed.
    Unpair {
        /// Node UUID or name.
        node: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// This node's status.
    Status(ClientArgs),
    /// API keys for the LAN face (`--lan-face`); they hold on every node.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Run the node as a service started at boot or login: a systemd user
    /// unit (Linux), a launchd agent (macOS), a Windows service.
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
}

#[derive(Subcommand)]
enum ServiceAction {
    /// Write, register and start the service, running `pair-node run` with
    /// these flags: `pair-node service install -- --name gpu --engine-cmd 'ollama serve'`.
    Install {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        run_args: Vec<String>,
    },
    /// Stop and remove the service.
    Uninstall,
    /// Whether the service is installed and running.
    Status,
}

#[derive(Subcommand)]
enum KeysAction {
    /// Make a key; its secret is printed once (only its hash is kept).
    Add {
        /// A name for people: `keys list`, `keys revoke`, the Jobs view.
        name: String,
        /// Models the key may use: exact names or `*` patterns
        /// (repeatable; default: every model).
        #[arg(long = "models", num_args = 1..)]
        models: Vec<String>,
        /// Requests a minute the key may make: `30/min` or `30`.
        #[arg(long, value_parser = parse_rate)]
        rate: Option<std::num::NonZeroU32>,
        /// The class of the key's requests that name none
        /// (`x-pair-priority`): `interactive` (default) or `batch`, which
        /// waits for interactive work when the cluster is full (`--queue
        /// priorities`).
        #[arg(long, value_parser = parse_priority)]
        priority: Option<pair_daemon::control::Priority>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The keys this node holds (its own and its peers').
    List(ClientArgs),
    /// Revoke a key on every node (within a report interval).
    Revoke {
        name: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

/// `30/min` or `30`: requests a minute.
fn parse_priority(s: &str) -> Result<pair_daemon::control::Priority, String> {
    pair_daemon::control::Priority::parse(s)
        .ok_or_else(|| format!("{s:?}: interactive or batch expected"))
}

fn parse_rate(s: &str) -> Result<std::num::NonZeroU32, String> {
    let n = s.strip_suffix("/min").unwrap_or(s).trim();
    n.parse()
        .map_err(|_| format!("{s:?}: a positive number of requests a minute expected, e.g. 30/min"))
}

#[derive(Subcommand)]
enum PairAction {
    /// Open an invite and print its PIN (valid 5 minutes).
    Invite(ClientArgs),
    /// Join the node at HOST:PORT (its cluster port) with the PIN it shows;
    /// a link-local IPv6 address takes its interface: [fe80::1%eth0]:14318.
    Join {
        addr: String,
        #[arg(long)]
        pin: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(clap::Args, Clone)]
struct ClientArgs {
    /// The local node's face URL.
    #[arg(long, env = "PAIR_CONTROL", default_value = "http://127.0.0.1:11434")]
    control: String,
    /// The node's state directory, where the calls that change the node
    /// (pair, unpair) read its owner's token. Default: the OS's (`pair-node
    /// run --help`).
    #[arg(long, env = "PAIR_STATE_DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

impl ClientArgs {
    fn client(&self) -> anyhow::Result<ControlClient> {
        ControlClient::new(&self.control)
    }

    /// A client that sends the owner's token the running node wrote.
    fn owner(&self) -> anyhow::Result<ControlClient> {
        let dir = match &self.state_dir {
            Some(d) => d.clone(),
            None => pair_daemon::config::default_state_dir()?,
        };
        let token = pair_identity::ControlToken::read(&dir).with_context(|| {
            format!(
                "this call needs the token pair-node writes to its state dir at start; \
                 is it running with --state-dir {}? (pass the same --state-dir here)",
                dir.display()
            )
        })?;
        Ok(self.client()?.with_token(token))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.windows_service {
        return as_windows_service(cli);
    }
    run_cli(cli)
}

/// The node under the Windows service controller: the same work, on the
/// service's thread, stopped by the controller's Stop.
#[cfg(windows)]
fn as_windows_service(cli: Cli) -> ExitCode {
    winsvc::run(Box::new(move || run_cli(cli)))
}

#[cfg(not(windows))]
fn as_windows_service(_: Cli) -> ExitCode {
    eprintln!("pair-node: --windows-service is for the Windows service controller");
    ExitCode::from(EXIT_CONFIG)
}

fn run_cli(cli: Cli) -> ExitCode {
    // One crypto provider (ring) for every TLS user in the process.
    pair_identity::install_crypto_provider();
    let filter = tracing_subscriber::EnvFilter::try_from_env("PAIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        // Colour codes only where a person reads them.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    // Each open connection costs a descriptor: take what the hard limit
    // allows (the connection cap is derived from it).
    match pair_os::raise_open_file_limit() {
        Ok(n) => tracing::debug!(nofile = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let threads = cli.threads.map_or_else(default_threads, usize::from);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pair-node: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(dispatch(cli.command, threads)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<ConfigError>().is_some() => {
            eprintln!("pair-node: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("pair-node: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One event loop per core, at most 4: a loop forwards tens of thousands
/// of requests a second, far beyond what LLM engines produce.
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

async fn dispatch(cmd: Command, threads: usize) -> anyhow::Result<()> {
    match cmd {
        Command::Run(args) => {
            #[cfg(feature = "mimalloc")]
            memory::return_freed_memory();
            let file = match &args.config {
                Some(p) => FileConfig::load(p)?,
                None => FileConfig::default(),
            };
            let cfg = NodeConfig::resolve(
                *args,
                file,
                pair_daemon::config::default_state_dir().ok(),
                pair_os::hostname(),
                &local_ips(),
            )?;
            let mut cfg = cfg;
            cfg.event_loops = threads;
            let setup = pair_daemon::engines::set_up(&cfg).await?;
            cfg.engines = setup.engines;
            let supervisor = setup.supervisor;
            let listeners = Listeners::bind(&cfg).await?;
            let shutdown = CancellationToken::new();
            let on_signal = shutdown.clone();
            tokio::spawn(async move {
                wait_for_signal().await;
                on_signal.cancel();
            });
            let result = daemon::run(cfg, listeners, shutdown).await;
            if let Some(sup) = supervisor
                && let Err(e) = sup.shutdown().await
            {
                tracing::warn!(error = %e, "stopping the engine we started");
            }
            result
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            nodes,
            ollama_face,
            openai_face,
            policy,
            aliases,
            time_scale,
        } => {
            #[cfg(feature = "mimalloc")]
            memory::return_freed_memory();
            let demo_cfg = Demo {
                nodes,
                ollama_face,
                openai_face,
                policy,
                aliases,
                time_scale,
            };
            demo(demo_cfg, threads).await
        }
        Command::Pair { action } => match action {
            PairAction::Invite(c) => {
                let inv = c.owner()?.invite().await?;
                if c.json {
                    println!("{}", serde_json::to_string_pretty(&inv)?);
                } else {
                    println!("PIN {}  (valid {} s)", inv.pin, inv.expires_in_s);
                    println!(
                        "on the other machine: pair-node pair join <this-host>:{} --pin {}",
                        inv.cluster_addr.port(),
                        inv.pin
                    );
                }
                Ok(())
            }
            PairAction::Join { addr, pin, client } => {
                // A malformed address or a zone that names no interface is a
                // usage error, said before the daemon is asked.
                pair_identity::service::pairing_target(&addr).map_err(ConfigError::Address)?;
                let joined = client.owner()?.join(&addr, &pin).await?;
                if client.json {
                    println!("{}", serde_json::to_string_pretty(&joined)?);
                } else {
                    println!(
                        "paired with {} ({})\nfingerprint {}",
                        joined.name, joined.id, joined.fingerprint
                    );
                }
                Ok(())
            }
        },
        Command::Peers(c) => {
            let rows = c.client()?.peers().await?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                cli::print_peers(&rows);
            }
            Ok(())
        }
        Command::Jobs { client, limit } => {
            let jobs = client.client()?.jobs(limit).await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&jobs)?);
            } else {
                cli::print_jobs(&jobs);
            }
            Ok(())
        }
        Command::Unpair { node, client } => {
            let v = client.owner()?.unpair(&node).await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("unpaired {}", v["name"].as_str().unwrap_or(&node));
                if let Some(note) = v["note"].as_str() {
                    println!("note: {note}");
                }
            }
            Ok(())
        }
        Command::Keys { action } => keys(action).await,
        Command::Service { action } => service(action),
        Command::Status(c) => {
            let s = c.client()?.status().await?;
            if c.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                cli::print_status(&s);
            }
            Ok(())
        }
    }
}

/// `pair-node demo`'s settings.
#[cfg(feature = "demo")]
struct Demo {
    nodes: usize,
    ollama_face: SocketAddr,
    openai_face: SocketAddr,
    policy: String,
    aliases: Vec<String>,
    time_scale: f64,
}

#[cfg(feature = "demo")]
async fn demo(d: Demo, threads: usize) -> anyhow::Result<()> {
    let n = d.nodes;
    if n == 0 {
        return Err(ConfigError::Policy("--nodes must be at least 1".into()).into());
    }
    if !(d.time_scale.is_finite() && d.time_scale > 0.0) {
        anyhow::bail!("--time-scale must be a positive number");
    }
    let mut spec = ClusterSpec::new(n);
    spec.first_faces = Some((d.ollama_face, d.openai_face));
    spec.event_loops = threads;
    spec.time_scale = d.time_scale;
    // Real models stop on their own: an agent's greeting is a few words,
    // not the 32k tokens its max_tokens allows.
    spec.answer_length = pair_daemon::demo::NATURAL_ANSWERS;
    spec.cache = Some(pair_daemon::demo::AGENT_CONTEXT);
    spec.policy = d
        .policy
        .parse()
        .map_err(|_| ConfigError::Policy(d.policy.clone()))?;
    spec.nodes[0].aliases = d
        .aliases
        .iter()
        .map(|a| {
            a.parse().map_err(|source| ConfigError::Alias {
                input: a.clone(),
                source,
            })
        })
        .collect::<Result<_, _>>()?;
    eprintln!("starting {n} node(s) on loopback (emulated engines, real pairing and mTLS)…");
    let cluster = LocalCluster::start(spec).await?;
    cluster.wait_converged(Duration::from_secs(20)).await?;
    let first = &cluster.nodes[0];
    println!("pair demo: {n} node(s) paired and routing");
    for (node, spec) in cluster.nodes.iter().zip(&cluster.spec.nodes) {
        println!(
            "  {:<22} {}  profile {:<8} models {}",
            node.name,
            node.id.short(),
            spec.profile,
            spec.models.join(", ")
        );
    }
    let o = first.ollama_url();
    let a = first.openai_url();
    // The edge client's own state, as fresh as the demo's nodes (gone
    // with them).
    let client_dir = tempfile::Builder::new()
        .prefix("pair-client-demo-")
        .tempdir()?;
    println!("Ollama face {o}");
    println!("OpenAI face {a}");
    println!(
        r#"
Try:
  curl {o}/api/chat -d '{{"model":"llama3.2:3b","messages":[{{"role":"user","content":"hi"}}]}}'
  curl {a}/v1/chat/completions -H 'content-type: application/json' \
       -d '{{"model":"qwen2.5:7b","messages":[{{"role":"user","content":"hi"}}],"stream":true}}'
  curl {o}/api/tags
  curl -si {o}/api/generate -d '{{"model":"llama3.2:3b","prompt":"hi","stream":false}}' | grep x-pair
  pair-node peers --control {o}
  pair-node jobs --control {o}
Join it from pair-client (a machine without an engine; here, this one):
  pair-node pair invite --control {o} --state-dir {state}
  pair-client --state-dir {client} pair join {cluster} --pin PIN
  pair-client --state-dir {client} probe
  pair-client --state-dir {client} chat -m llama3.2:3b "hi"
  pair-client --state-dir {client} serve --ollama-face 127.0.0.1:11444 --openai-face 127.0.0.1:1244
Coding agents (model aliases: {aliases}):
  ANTHROPIC_BASE_URL={a} ANTHROPIC_API_KEY=local claude
  PAIR_KEY=local codex -c model_provider=pair -c 'model_providers.pair={{name="pair",base_url="{a}/v1",wire_api="responses",env_key="PAIR_KEY"}}' -m qwen2.5:7b
Jobs view: {o}/ui     Metrics: {o}/metrics
Ctrl-C to stop."#,
        aliases = d.aliases.join(", "),
        state = cluster
            .state_dir(0)
            .map_or_else(String::new, |p| p.display().to_string()),
        cluster = first.cluster_addr,
        client = client_dir.path().display(),
    );
    wait_for_signal().await;
    eprintln!("stopping…");
    cluster.stop().await;
    Ok(())
}

async fn keys(action: KeysAction) -> anyhow::Result<()> {
    match action {
        KeysAction::Add {
            name,
            models,
            rate,
            priority,
            client,
        } => {
            let made = client
                .owner()?
                .add_key(&pair_daemon::control::NewKey {
                    name,
                    models,
                    rate_per_min: rate,
                    priority,
                })
                .await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&made)?);
            } else {
                println!("{}", made.secret);
                eprintln!(
                    "key '{}' made: give the secret above to the client (Authorization: Bearer, or x-api-key); it is not shown again",
                    made.key.name
                );
            }
        }
        KeysAction::List(client) => {
            let rows = client.client()?.keys().await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                for k in rows {
                    let models = if k.models.is_empty() {
                        "every model".to_owned()
                    } else {
                        k.models.join(", ")
                    };
                    let rate = k
                        .rate_per_min
                        .map_or("no rate limit".to_owned(), |r| format!("{r}/min"));
                    let state = if k.revoked_at_ms.is_some() {
                        "revoked"
                    } else {
                        "live"
                    };
                    let class = k.priority.unwrap_or_default().as_str();
                    println!("{:<20} {state:<8} {models}; {rate}; {class}", k.name);
                }
            }
        }
        KeysAction::Revoke { name, client } => {
            let revoked = client.owner()?.revoke_key(&name).await?;
            if client.json {
                println!("{}", serde_json::to_string_pretty(&revoked)?);
            } else {
                println!(
                    "revoked '{name}' ({} key(s)); every node refuses it within a report interval",
                    revoked.len()
                );
            }
        }
    }
    Ok(())
}

use pair_os::signal::shutdown_signal as wait_for_signal;

fn service(action: ServiceAction) -> anyhow::Result<()> {
    use pair_daemon::service;
    match action {
        ServiceAction::Install { run_args } => {
            let program = std::env::current_exe().context("finding this executable")?;
            let dirs = pair_os::Dirs::host(pair_os::App::Node);
            let spec = service::ServiceSpec::for_node(
                program,
                &run_args,
                dirs.as_ref().map(|d| d.state.clone()),
                dirs.map_or_else(std::env::temp_dir, |d| d.logs),
            )?;
            service::install(&spec).context("installing the service")?;
            println!(
                "installed and started pair-node as a service (state dir {})",
                spec.state_dir.display()
            );
        }
        ServiceAction::Uninstall => {
            service::uninstall().context("removing the service")?;
            println!("removed the pair-node service");
        }
        ServiceAction::Status => {
            println!(
                "{}",
                service::status().context("asking the service manager")?
            );
        }
    }
    Ok(())
}

/// This machine's addresses (none when they cannot be listed: then only
/// loopback and the unspecified address count as the node's own).
fn local_ips() -> Vec<std::net::IpAddr> {
    pair_discovery::local_addrs()
        .map(|addrs| addrs.into_iter().map(|a| a.ip).collect())
        .unwrap_or_default()
}
