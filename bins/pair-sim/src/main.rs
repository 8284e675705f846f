//! pair-sim: the simulator's command line (a thin shell over the
//! `pair-simulator` library) and emulated engines.
//!
//! Argument parsing, wiring and printing only: `run` compares routing policies on scenario files, `live` runs them on
//! real `pair-node` processes beside the simulator, `bench` times the
//! simulator, `engine` serves an emulated Ollama / OpenAI / LM Studio engine.
//! Bad configuration exits with code 64 and a one-line reason.

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use pair_emulator::HardwareProfile;
use pair_emulator::http::{EmulatorConfig, Flavor};
use pair_simulator::{CompareOptions, Scenario, SimError, report};

/// Exit code for bad configuration (EX_USAGE).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser, Debug)]
#[command(
    name = "pair-sim",
    version,
    about = "Cluster simulator and emulated engines for pair"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate scenarios under one or all routing policies.
    Run {
        /// Scenario files (TOML).
        #[arg(required = true)]
        scenarios: Vec<PathBuf>,
        /// A policy name, a comma-separated list, or `all`.
        #[arg(long, default_value = "all")]
        policy: String,
        /// Write the full results as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write SVG plots into this directory.
        #[arg(long)]
        svg: Option<PathBuf>,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Override the scenario's routing: `single` (one router sees
        /// everything), `per-node` (each node routes its own clients, spread
        /// over the nodes) or `per-node:NODE` (every client enters at NODE).
        #[arg(long)]
        routing: Option<String>,
        /// Modelled seconds to run instead of the scenario's duration.
        #[arg(long)]
        duration: Option<u64>,
        /// Closed-loop users of the searched source instead of the
        /// scenario's.
        #[arg(long)]
        users: Option<u32>,
        /// Every agent job fans out exactly this many sub-tasks.
        #[arg(long)]
        fan_out: Option<u32>,
        /// Run on these nodes only (comma-separated names), e.g. the
        /// fastest node alone.
        #[arg(long)]
        only: Option<String>,
        /// Routers do not feed their prefix index (every node priced as
        /// caching nothing), to see what the index changes.
        #[arg(long)]
        no_prefix_index: bool,
        /// Late binding: `off` (commit each request to a node at once),
        /// `fifo`, `sjf` (shortest predicted job first, with aging),
        /// `priorities` (sjf, batch work after interactive) or `preempt`
        /// (priorities, and interactive work that would wait cuts a running
        /// batch job, which continues later); overrides the scenario's
        /// `routing.queue`.
        #[arg(long)]
        queue: Option<String>,
        /// Skip the users-at-SLO search (one run per policy only).
        #[arg(long)]
        no_search: bool,
        /// Run policies one after another instead of on threads.
        #[arg(long)]
        sequential: bool,
    },
    /// Run scenarios live: real `pair-node` processes on loopback in front
    /// of emulated engines, the scenario's workload against their faces,
    /// printed beside the simulator's run of the same scenario (a router
    /// per node, as live).
    Live(Box<LiveArgs>),
    /// Time the simulator on a synthetic open-loop cluster.
    Bench {
        #[arg(long, default_value_t = 1_000_000)]
        requests: u64,
        #[arg(long, default_value_t = 16)]
        nodes: usize,
        #[arg(long, default_value = "predicted-latency")]
        policy: String,
    },
    /// Serve an emulated engine on a TCP address until Ctrl-C.
    Engine {
        /// ollama, openai or lmstudio.
        #[arg(long)]
        flavor: String,
        #[arg(long)]
        listen: SocketAddr,
        /// Comma-separated model names (sizes are guessed from names like `8b`).
        #[arg(long, value_delimiter = ',', required = true)]
        models: Vec<String>,
        /// Hardware profile (rtx4090, rtx3060, laptop, m3-max, cpu, cpu-smollm2-135m).
        #[arg(long, default_value = "rtx4090")]
        profile: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Wall seconds per modelled second (0.01 = a hundred times faster).
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
    },
}

/// `pair-sim live`'s options.
#[derive(clap::Args, Debug)]
struct LiveArgs {
    /// Scenario files (TOML).
    #[arg(required = true)]
    scenarios: Vec<PathBuf>,
    /// A policy name, a comma-separated list, or `all`.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Wall seconds per modelled second (0.25: four times faster).
    #[arg(long, default_value_t = 0.25)]
    time_scale: f64,
    /// Modelled seconds to run instead of the scenario's duration.
    #[arg(long)]
    duration: Option<u64>,
    /// Closed-loop users instead of the scenario's (a target such as
    /// "holds 23 users at the SLO" is this run passing the SLO).
    #[arg(long)]
    users: Option<u32>,
    /// Override the scenario's seed: the demand sent live and the
    /// simulator's run beside it alike (a near-saturated scenario's
    /// figures move more between seeds than between live and simulated).
    #[arg(long)]
    seed: Option<u64>,
    /// The pair-node binary (default: beside this one, else on PATH).
    #[arg(long)]
    pair_node: Option<PathBuf>,
    /// Event loops per node.
    #[arg(long, default_value_t = 1)]
    threads: u16,
    /// Fail (exit 1) if two policies the simulator ranks clearly apart
    /// (mean TTFT more than --margin times apart) come out in the other
    /// order live.
    #[arg(long)]
    check_ranking: bool,
    #[arg(long, default_value_t = 1.5)]
    margin: f64,
    /// Skip the simulator's users-at-SLO search.
    #[arg(long)]
    no_search: bool,
    /// Also search users at SLO live, up to this many users (a live
    /// run per probe: slow).
    #[arg(long)]
    live_search: Option<u32>,
    /// Send each conversation's key as `x-pair-session`, as an app that
    /// names its conversations does (by default no header: the nodes find
    /// a conversation from its messages).
    #[arg(long)]
    session_header: bool,
    /// Late binding on the live nodes and in the simulator: `off`, `fifo`,
    /// `sjf`, `priorities` or `preempt` (default: the scenario's).
    #[arg(long)]
    queue: Option<String>,
    /// Live runs of each scenario (a fresh cluster each): with more than
    /// one, each figure is shown as its median and range over the runs,
    /// beside the simulator's (one live run on two cores is noisy).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Write both reports as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Errors the shell distinguishes: configuration (64) or anything else (1).
enum Failure {
    Config(String),
    Other(anyhow::Error),
}

impl From<SimError> for Failure {
    fn from(e: SimError) -> Self {
        if e.is_config() {
            Failure::Config(chain(&e))
        } else {
            Failure::Other(e.into())
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

/// An error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string().replace('\n', " "));
        src = inner.source();
    }
    s
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            scenarios,
            policy,
            json,
            svg,
            seed,
            routing,
            duration,
            users,
            fan_out,
            only,
            no_prefix_index,
            queue,
            no_search,
            sequential,
        } => run(
            scenarios,
            &policy,
            json,
            svg,
            &Overrides {
                seed,
                routing: routing.as_deref(),
                duration,
                users,
                fan_out,
                only: only.as_deref(),
                no_prefix_index,
                queue: queue.as_deref(),
            },
            !no_search,
            !sequential,
        ),
        Command::Live(args) => live(&args),
        Command::Bench {
            requests,
            nodes,
            policy,
        } => bench(requests, nodes, &policy),
        Command::Engine {
            flavor,
            listen,
            models,
            profile,
            seed,
            time_scale,
        } => engine(&flavor, listen, models, &profile, seed, time_scale),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(reason)) => {
            eprintln!("pair-sim: bad configuration: {reason}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(Failure::Other(e)) => {
            eprintln!("pair-sim: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// What the command line changes in a scenario file.
#[derive(Debug, Default)]
struct Overrides<'a> {
    seed: Option<u64>,
    routing: Option<&'a str>,
    /// Modelled seconds.
    duration: Option<u64>,
    users: Option<u32>,
    fan_out: Option<u32>,
    /// Comma-separated node names.
    only: Option<&'a str>,
    no_prefix_index: bool,
    queue: Option<&'a str>,
}

/// Loads a scenario file with the command line's overrides applied.
fn load(path: &Path, o: &Overrides<'_>) -> Result<Scenario, Failure> {
    let mut s = Scenario::load(path).map_err(|e| match e {
        e if e.is_config() => Failure::Config(format!("{}: {}", path.display(), chain(&e))),
        e => Failure::from(e),
    })?;
    if let Some(seed) = o.seed {
        s.seed = seed;
    }
    if let Some(r) = o.routing {
        s.routing = pair_simulator::scenario::Routing::from_flag(r, &s.nodes)
            .map_err(|e| Failure::Config(format!("--routing: {}", chain(&e))))?;
    }
    if let Some(d) = o.duration {
        s = s
            .with_duration(d.saturating_mul(1_000_000))
            .map_err(|e| Failure::Config(format!("--duration {d}: {}", chain(&e))))?;
    }
    if let Some(u) = o.users {
        s = s
            .try_with_users(u)
            .map_err(|e| Failure::Config(format!("--users: {}: {}", path.display(), chain(&e))))?;
    }
    if o.no_prefix_index {
        s.prefix_index = false;
    }
    if let Some(q) = o.queue {
        s.queue = pair_simulator::scenario::parse_queue(q)
            .map_err(|e| Failure::Config(format!("--queue: {}", chain(&e))))?;
    }
    if let Some(n) = o.fan_out {
        s = s.with_fan_out(n).map_err(|e| {
            Failure::Config(format!("--fan-out: {}: {}", path.display(), chain(&e)))
        })?;
    }
    if let Some(only) = o.only {
        let names: Vec<&str> = only.split(',').map(str::trim).collect();
        s = s
            .with_only_nodes(&names)
            .map_err(|e| Failure::Config(format!("--only: {}: {}", path.display(), chain(&e))))?;
    }
    Ok(s)
}

fn run(
    paths: Vec<PathBuf>,
    policy: &str,
    json: Option<PathBuf>,
    svg: Option<PathBuf>,
    overrides: &Overrides<'_>,
    search: bool,
    parallel: bool,
) -> Result<(), Failure> {
    let policies = pair_simulator::parse_policies(policy)?;
    // Parse every scenario before running any: a typo in the last file
    // should not cost the minutes the first ones take.
    let scenarios = paths
        .iter()
        .map(|p| load(p, overrides))
        .collect::<Result<Vec<_>, _>>()?;
    let opts = CompareOptions {
        policies,
        search,
        parallel,
    };
    let total: u64 = scenarios
        .iter()
        .map(|s| report::planned_simulations(s, &opts))
        .sum();
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/~{len} {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut reports = Vec::with_capacity(scenarios.len());
    for scn in &scenarios {
        let tick = |msg: &str| {
            bar.inc(1);
            bar.set_message(msg.to_owned());
        };
        let r = pair_simulator::compare(scn, &opts, &tick)?;
        bar.suspend(|| println!("{}", report::render_table(&r)));
        if let Some(dir) = &svg {
            let files = report::write_svgs(&r, dir)?;
            for f in files {
                tracing::info!(file = %f.display(), "wrote plot");
            }
        }
        reports.push(r);
    }
    bar.finish_and_clear();
    if let Some(path) = &json {
        let text = report::to_json(&reports)?;
        std::fs::write(path, text).map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(dir) = &svg {
        println!("plots written to {}", dir.display());
    }
    Ok(())
}

fn live(args: &LiveArgs) -> Result<(), Failure> {
    let policies = pair_simulator::parse_policies(&args.policy)?;
    let overrides = Overrides {
        seed: args.seed,
        duration: args.duration,
        users: args.users,
        queue: args.queue.as_deref(),
        ..Overrides::default()
    };
    let mut scenarios = Vec::with_capacity(args.scenarios.len());
    for p in &args.scenarios {
        scenarios.push(pair_simulator::live::as_live(&load(p, &overrides)?));
    }
    let opts = pair_simulator::live::LiveOptions {
        policies: policies.clone(),
        pair_node: args
            .pair_node
            .clone()
            .unwrap_or_else(pair_simulator::live::default_pair_node),
        time_scale: args.time_scale,
        threads: args.threads,
        search_max: args.live_search,
        session_header: args.session_header,
    };
    let quiet = |_: &str| {};
    let progress = |msg: &str| eprintln!("pair-sim live: {msg}");
    let mut reports = Vec::new();
    let mut differences = Vec::new();
    for scn in &scenarios {
        let sim = pair_simulator::compare(
            scn,
            &CompareOptions {
                policies: policies.clone(),
                search: !args.no_search,
                parallel: true,
            },
            &quiet,
        )?;
        let mut lives = Vec::new();
        for run in 1..=args.repeat {
            if args.repeat > 1 {
                progress(&format!("{}: run {run} of {}", scn.name, args.repeat));
            }
            let live = pair_simulator::live::compare_live(scn, &opts, &progress)?;
            println!("live, time scale {}:", args.time_scale);
            println!("{}", report::render_table(&live));
            println!("{}", report::render_side_by_side(&sim, &live));
            if args.check_ranking {
                for d in pair_simulator::live::ranking_differences(&sim, &live, args.margin) {
                    differences.push(format!("{} (run {run}): {d}", scn.name));
                }
            }
            lives.push(live);
        }
        if args.repeat > 1 {
            println!("{}", report::render_spread(&sim, &lives));
        }
        reports.push(sim);
        reports.extend(lives);
    }
    if let Some(path) = &args.json {
        let text = report::to_json(&reports)?;
        std::fs::write(path, text).map_err(|source| SimError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if differences.is_empty() {
        if args.check_ranking {
            println!("ranking of policies: live agrees with the simulator");
        }
        Ok(())
    } else {
        Err(Failure::Other(anyhow::anyhow!(
            "the live ranking of policies differs from the simulator's:\n  {}",
            differences.join("\n  ")
        )))
    }
}

fn bench(requests: u64, nodes: usize, policy: &str) -> Result<(), Failure> {
    let policies = pair_simulator::parse_policies(policy)?;
    for p in policies {
        let r = pair_simulator::bench::run_bench(requests, nodes, p)?;
        println!(
            "{:<18} {} requests on {} nodes ({:.0} simulated s, {} events): wall {:.2} s, cpu {}, {:.2} M requests/s; p95 TTFT {:.0} ms",
            r.policy.as_str(),
            r.requests,
            r.nodes,
            r.simulated_s,
            r.events,
            r.wall_s,
            r.cpu_s.map_or("n/a".to_owned(), |c| format!("{c:.2} s")),
            r.requests as f64 / r.wall_s.max(1e-9) / 1e6,
            r.ttft_p95_ms
        );
    }
    Ok(())
}

fn engine(
    flavor: &str,
    listen: SocketAddr,
    models: Vec<String>,
    profile: &str,
    seed: u64,
    time_scale: f64,
) -> Result<(), Failure> {
    let flavor: Flavor = flavor
        .parse()
        .map_err(|e: pair_emulator::EmulatorError| Failure::Config(chain(&e)))?;
    let profile = HardwareProfile::by_name(profile).map_err(|e| Failure::Config(chain(&e)))?;
    if !(time_scale.is_finite() && time_scale > 0.0) {
        return Err(Failure::Config(
            "--time-scale must be a positive number".into(),
        ));
    }
    let config = EmulatorConfig::new(flavor, models)
        .with_profile(profile)
        .with_seed(seed)
        .with_time_scale(time_scale);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr().context("no local address")?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let ctrl_c = shutdown.clone();
        let watcher = tokio::spawn(async move {
            // Ctrl-C (or a failed signal handler) ends the server gracefully.
            let _ = tokio::signal::ctrl_c().await;
            ctrl_c.cancel();
        });
        println!(
            "emulated {} engine listening on http://{addr}",
            flavor.as_str()
        );
        let served = pair_emulator::http::serve(config, listener, shutdown.clone()).await;
        shutdown.cancel();
        watcher.abort();
        let _ = watcher.await;
        served.map_err(|e| match e {
            pair_emulator::EmulatorError::BadConfig { .. } => Failure::Config(chain(&e)),
            e => Failure::Other(e.into()),
        })
    })
}
