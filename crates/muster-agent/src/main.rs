//! `muster-agent`: runs a Muster agent on this machine until SIGINT or SIGTERM.
//!
//! Settings come from flags and, optionally, a TOML file (`--config`) with the same keys;
//! flags win. Logs go to stderr through `tracing` (`RUST_LOG`, by default `info` with openraft
//! and sled at `warn`; colour only on a terminal); the one line on stdout says where the agent
//! listens.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use muster_actor::{Node, NodeConfig, System};
use muster_agent::AgentConfig;
use muster_launch::security::{TlsFileConfig, TlsFlags};
use muster_security::{Role, Security};
use serde::Deserialize;

/// mimalloc: the master and its schedulers allocate per message and per task, from several
/// threads at once, where it is markedly faster than the system allocator (see README's
/// performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Default listen address.
const DEFAULT_LISTEN: &str = "127.0.0.1:5051";

/// Runs a Muster agent: registers with the leading master and runs the tasks it is sent.
#[derive(Debug, Parser)]
#[command(name = "muster-agent", version, about, long_about = None)]
struct Args {
    /// Address to listen on, as the masters reach it [default: 127.0.0.1:5051]
    #[arg(long, value_name = "HOST:PORT")]
    listen: Option<String>,
    /// A master's address; repeat for each master (required unless in the config file)
    #[arg(long = "master", value_name = "HOST:PORT")]
    masters: Vec<String>,
    /// Where the agent keeps its id, task checkpoints and task working directories
    /// (required unless in the config file)
    #[arg(long, value_name = "PATH")]
    data_dir: Option<PathBuf>,
    /// Hostname to report [default: this machine's]
    #[arg(long)]
    hostname: Option<String>,
    /// CPUs to offer [default: this machine's]
    #[arg(long)]
    cpus: Option<f64>,
    /// Memory to offer, in MiB [default: this machine's]
    #[arg(long, value_name = "MIB")]
    mem_mb: Option<u64>,
    /// An attribute to report; repeat for each
    #[arg(long = "attribute", value_name = "KEY=VALUE", value_parser = parse_attribute)]
    attributes: Vec<(String, String)>,
    /// A TOML file with the same keys (listen, master, data_dir, hostname, cpus, mem_mb,
    /// task_user, allowed_task_users, recovery_timeout, [attributes], [tls]); flags override it
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Do not bound tasks with cgroups even where the machine allows: each task's process
    /// group only (memory, CPU and process limits not enforced).
    #[arg(long)]
    no_cgroups: bool,
    /// The user tasks run as when their job names none [default: nobody when the agent runs
    /// as root, else the agent's user]
    #[arg(long, value_name = "USER")]
    task_user: Option<String>,
    /// A user a job may name for its tasks to run as; repeat for each [default: none]
    #[arg(long = "allow-task-user", value_name = "USER")]
    allowed_task_users: Vec<String>,
    /// How long the agent may be down and still take back its running tasks, e.g. 15m
    /// [default: 15m]; past it, it kills them when it starts
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    recovery_timeout: Option<std::time::Duration>,
    /// Kill the running tasks when the agent stops (by default they keep running, for the
    /// agent to take back when it starts again)
    #[arg(long)]
    stop_tasks_on_exit: bool,
    /// TLS: this agent's certificate (role agent), key and the cluster CA.
    #[command(flatten)]
    tls: TlsFlags,
}

/// The config file: the flags' keys, in snake case (kebab case is accepted too).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    #[serde(default, alias = "masters")]
    master: Vec<String>,
    #[serde(alias = "data-dir")]
    data_dir: Option<PathBuf>,
    hostname: Option<String>,
    cpus: Option<f64>,
    #[serde(alias = "mem-mb")]
    mem_mb: Option<u64>,
    #[serde(default, alias = "attribute")]
    attributes: BTreeMap<String, String>,
    #[serde(alias = "task-user")]
    task_user: Option<String>,
    #[serde(default, alias = "allow-task-user", alias = "allowed-task-users")]
    allowed_task_users: Vec<String>,
    /// A duration such as `15m`.
    #[serde(alias = "recovery-timeout")]
    recovery_timeout: Option<String>,
    /// `[tls]`: ca, cert, key, cluster, insecure.
    tls: Option<TlsFileConfig>,
}

/// `key=value`, with a non-empty key.
fn parse_attribute(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((key.trim().to_owned(), value.trim().to_owned()))
        }
        _ => Err(format!(
            "expected key=value with a non-empty key, got {text:?}"
        )),
    }
}

fn load_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

/// The listen address, the agent config and its security, from the flags over the file.
fn settings(args: Args) -> anyhow::Result<(String, AgentConfig, Security)> {
    let mut file = match &args.config {
        Some(path) => load_file(path)?,
        None => FileConfig::default(),
    };
    let security = args
        .tls
        .clone()
        .or_file(file.tls.take().unwrap_or_default())
        .security(Role::Agent)?;
    let listen = args
        .listen
        .or(file.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let masters = if args.masters.is_empty() {
        file.master
    } else {
        args.masters
    };
    if masters.is_empty() {
        bail!("no master given: pass --master HOST:PORT (or set `master` in the config file)");
    }
    let Some(data_dir) = args.data_dir.or(file.data_dir) else {
        bail!(
            "no data directory given: pass --data-dir PATH (or set `data_dir` in the config file)"
        );
    };
    let mut config = AgentConfig::new(masters, data_dir);
    if let Some(hostname) = args.hostname.or(file.hostname) {
        config.hostname = hostname;
    }
    if let Some(cpus) = args.cpus.or(file.cpus) {
        config.resources.0 = cpus;
    }
    if let Some(mem_mb) = args.mem_mb.or(file.mem_mb) {
        config.resources.1 = mem_mb;
    }
    config.cgroups = !args.no_cgroups;
    config.task_user = args.task_user.or(file.task_user);
    config.allowed_task_users = if args.allowed_task_users.is_empty() {
        file.allowed_task_users
    } else {
        args.allowed_task_users
    };
    let file_timeout = file
        .recovery_timeout
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .context("recovery_timeout in the config file")?;
    if let Some(timeout) = args.recovery_timeout.or(file_timeout) {
        config.recovery_timeout = timeout;
    }
    // The binary's tasks outlive it: a restart (even a SIGKILL) takes them back.
    config.stop_tasks_on_exit = args.stop_tasks_on_exit;
    config.attributes = file.attributes;
    config.attributes.extend(args.attributes);
    config.validate()?;
    Ok((listen, config, security))
}

async fn run(listen: String, config: AgentConfig, security: Security) -> anyhow::Result<()> {
    muster_agent::store::check_data_dir(&config.data_dir)?;
    if listen
        .parse::<SocketAddr>()
        .is_ok_and(|addr| addr.ip().is_unspecified())
    {
        tracing::warn!(
            %listen,
            "listening on an unspecified address: masters cannot reach the agent by it; \
             pass the address they should use"
        );
    }
    let signal = muster_launch::shutdown_signal()?;
    let system = System::new();
    muster_launch::security::reload_on_sighup(&security)?;
    let insecure = security.is_insecure();
    // Beside the actor transport: gRPC health (SERVING while registered with a master) and
    // reflection, for load balancers and grpcurl.
    let (serving, serving_now) = tokio::sync::watch::channel(false);
    let routes = muster_actor::health::operator_routes(serving_now, &[]).await?;
    let node = Node::serve(
        &system,
        Node::listen(&listen).await?,
        NodeConfig::new(security),
        routes,
    )?;
    let address = node.address().to_owned();
    let agent = match muster_agent::start(&node, config).await {
        Ok(agent) => agent,
        Err(e) => {
            node.shutdown();
            system.shutdown().await;
            return Err(e.into());
        }
    };
    agent.report_registered(serving);
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(
            stdout,
            "muster-agent listening on {address} ({}){}",
            agent.upid(),
            if insecure { ", INSECURE" } else { ", TLS" }
        )
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    }
    let which = signal.await;
    tracing::info!(signal = which, "shutting down");
    agent.stop().await;
    node.shutdown();
    system.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    muster_launch::init_logging();
    let outcome = settings(args).and_then(|(listen, config, security)| {
        muster_launch::block_on(run(listen, config, security))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("muster-agent: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
