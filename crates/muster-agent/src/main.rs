//! `muster-agent`: runs a Muster agent on this machine until SIGINT or SIGTERM.
//!
//! Settings come from flags and, optionally, a TOML file (`--config`) with the same keys;
//! flags win. Logs go to stderr through `tracing` (`RUST_LOG`, by default `info` with openraft
//! and sled at `warn`; colour only on a terminal); the one line on stdout says where the agent
//! listens, and ends with where its metrics are served.
//!
//! Beside its gRPC port (the actor transport, gRPC health and reflection) the agent serves an
//! HTTP port (`--http-listen`, by default the `--listen` port plus 10): `GET /metrics` in the
//! Prometheus text format, `GET /v1/health/live` and `GET /v1/health/ready` (200 while
//! registered with a master, else 503). It has the agent's TLS (no client certificate
//! required) and asks for no token: agents hold no token table (see `muster_agent::http`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use muster_actor::System;
use muster_agent::AgentConfig;
use muster_launch::security::{TlsFileConfig, TlsFlags};
use muster_security::{Role, Security};
use muster_transport::{Node, NodeConfig};
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
    /// Address the masters reach the agent at, when it is not --listen (behind a proxy, a NAT
    /// or a port mapping) [default: the --listen address]
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Address of the HTTP port: GET /metrics (Prometheus text, no token; TLS as the rest of
    /// the agent, no client certificate needed) and /v1/health/live, /v1/health/ready
    /// [default: the --listen host, its port plus 10; port 0 stays 0, any free port]
    #[arg(long, value_name = "HOST:PORT")]
    http_listen: Option<String>,
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
    /// A TOML file with the same keys (listen, advertise, http_listen, master, data_dir,
    /// hostname, cpus,
    /// mem_mb, task_user, allowed_task_users, recovery_timeout, task_output_max_bytes,
    /// task_output_files, task_output_check_interval, [attributes], [tls]); flags override it
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
    /// Most bytes one output file of a task holds: its executor rotates stdout (to stdout.1,
    /// the older files shifting) before a write would take it past this, so a stream keeps at
    /// most (task-output-files + 1) times this on disk; in bytes or with a unit: 512KiB, 10MiB,
    /// 1GiB [default: 10MiB]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    task_output_max_bytes: Option<u64>,
    /// Rotated files kept per stream of a task (stdout.1 to stdout.N); the oldest goes when
    /// one more would be made [default: 5]
    #[arg(long, value_name = "N")]
    task_output_files: Option<u32>,
    /// How often the output files of running tasks started by an agent from before executors
    /// rotated them are checked for rotation (copy and truncate), e.g. 1s [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    task_output_check_interval: Option<std::time::Duration>,
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
    advertise: Option<String>,
    #[serde(alias = "http-listen")]
    http_listen: Option<String>,
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
    /// A number of bytes, or a size such as `10MiB`.
    #[serde(alias = "task-output-max-bytes")]
    task_output_max_bytes: Option<FileSize>,
    #[serde(alias = "task-output-files")]
    task_output_files: Option<u32>,
    /// A duration such as `1s`.
    #[serde(alias = "task-output-check-interval")]
    task_output_check_interval: Option<String>,
    /// `[tls]`: ca, cert, key, cluster, insecure.
    tls: Option<TlsFileConfig>,
}

/// A size in the config file: a number of bytes, or text as the flag takes it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileSize {
    Bytes(u64),
    Text(String),
}

impl FileSize {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            FileSize::Bytes(bytes) => Ok(*bytes),
            FileSize::Text(text) => parse_size(text),
        }
    }
}

/// A size: a number of bytes, optionally followed by a unit, `B`, `KiB`, `MiB` or `GiB` (`K`,
/// `M`, `G` for short; any case), as in `10MiB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1024,
        "m" | "mib" => 1024 * 1024,
        "g" | "gib" => 1024 * 1024 * 1024,
        _ => {
            return Err(format!(
                "{text:?} is not a size: expected a number of bytes, optionally with a unit \
                 (B, KiB, MiB, GiB), such as 10MiB"
            ));
        }
    };
    let number: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a size: expected a number of bytes, such as 10485760 or 10MiB")
    })?;
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large a size"))
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

/// What the binary runs with, from the flags over the file.
#[derive(Debug)]
struct Settings {
    /// The gRPC port's address (the actor transport).
    listen: String,
    /// Where masters reach it, if not at `listen`.
    advertise: Option<String>,
    /// The HTTP port's address (metrics and health).
    http_listen: String,
    config: AgentConfig,
    security: Security,
}

/// The settings, from the flags over the file.
fn settings(args: Args) -> anyhow::Result<Settings> {
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
    let http_listen =
        muster_agent::http::http_address(&listen, args.http_listen.or(file.http_listen).as_deref())
            .map_err(anyhow::Error::msg)?;
    let advertise = args.advertise.or(file.advertise);
    if let Some(advertise) = &advertise
        && advertise.parse::<SocketAddr>().is_err()
        && advertise
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        anyhow::bail!("--advertise {advertise:?} is not HOST:PORT");
    }
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
    let file_max_bytes = file
        .task_output_max_bytes
        .as_ref()
        .map(FileSize::bytes)
        .transpose()
        .map_err(anyhow::Error::msg)
        .context("task_output_max_bytes in the config file")?;
    if let Some(max_bytes) = args.task_output_max_bytes.or(file_max_bytes) {
        config.task_output_max_bytes = max_bytes;
    }
    if let Some(files) = args.task_output_files.or(file.task_output_files) {
        config.task_output_files = files;
    }
    let file_interval = file
        .task_output_check_interval
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .context("task_output_check_interval in the config file")?;
    if let Some(interval) = args.task_output_check_interval.or(file_interval) {
        config.task_output_check_interval = interval;
    }
    // The binary's tasks outlive it: a restart (even a SIGKILL) takes them back.
    config.stop_tasks_on_exit = args.stop_tasks_on_exit;
    config.attributes = file.attributes;
    config.attributes.extend(args.attributes);
    config.validate()?;
    Ok(Settings {
        listen,
        advertise,
        http_listen,
        config,
        security,
    })
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    let Settings {
        listen,
        advertise,
        http_listen,
        config,
        security,
    } = settings;
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
    let routes = muster_transport::health::operator_routes(serving_now.clone(), &[]).await?;
    let listener = Node::listen(&listen).await?;
    // Both ports are bound before anything starts, so a port in use is named at once.
    let http_listener = Node::listen(&http_listen)
        .await
        .context("the HTTP port (--http-listen)")?;
    let http_address = http_listener.local_addr();
    let http_security = security.clone();
    let bound = listener.local_addr().to_string();
    let mut node_config = NodeConfig::new(security);
    node_config.advertise = advertise;
    let node = Node::serve(&system, listener, node_config, routes)?;
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
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    muster_agent::http::serve(
        http_listener,
        &http_security,
        muster_agent::http::router(agent.clone(), node.clone(), serving_now),
        async move {
            let _ = http_stopped.await;
        },
    );
    {
        let mut stdout = std::io::stdout().lock();
        // Tests and scripts read the address up to the first space: keep the start as it is.
        writeln!(
            stdout,
            "muster-agent listening on {bound} ({}){}{}, metrics on {}://{http_address}/metrics",
            agent.upid(),
            if address == bound {
                String::new()
            } else {
                format!(", advertised as {address}")
            },
            if insecure { ", INSECURE" } else { ", TLS" },
            if insecure { "http" } else { "https" },
        )
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    }
    let which = signal.await;
    tracing::info!(signal = which, "shutting down");
    let _ = http_stop.send(());
    agent.stop().await;
    node.shutdown();
    system.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    muster_launch::init_logging();
    let outcome = settings(args).and_then(|settings| muster_launch::block_on(run(settings)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("muster-agent: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_bytes_or_binary_units_and_name_bad_text() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_size("10MiB"), Ok(10 * 1024 * 1024));
        assert_eq!(parse_size("10m"), Ok(10 * 1024 * 1024));
        assert_eq!(parse_size("1 GiB"), Ok(1024 * 1024 * 1024));
        assert_eq!(parse_size("7B"), Ok(7));
        for bad in ["", "MiB", "10MB", "ten", "-1", "99999999999999999999GiB"] {
            let Err(error) = parse_size(bad) else {
                panic!("{bad:?} parsed as a size");
            };
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn output_settings_come_from_the_file_and_flags_win() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "master = [\"127.0.0.1:5050\"]\ndata_dir = \"/tmp/a\"\n\
             task_output_max_bytes = \"2MiB\"\ntask_output_files = 3\n\
             task_output_check_interval = \"250ms\"\n[tls]\ninsecure = true\n",
        )?;
        let config_arg = file.to_string_lossy().into_owned();
        let args = Args::try_parse_from(["muster-agent", "--config", &config_arg])?;
        let config = settings(args)?.config;
        assert_eq!(config.task_output_max_bytes, 2 * 1024 * 1024);
        assert_eq!(config.task_output_files, 3);
        assert_eq!(
            config.task_output_check_interval,
            std::time::Duration::from_millis(250)
        );
        let args = Args::try_parse_from([
            "muster-agent",
            "--config",
            &config_arg,
            "--task-output-max-bytes",
            "4096",
            "--task-output-files",
            "1",
        ])?;
        let config = settings(args)?.config;
        assert_eq!(config.task_output_max_bytes, 4096);
        assert_eq!(config.task_output_files, 1);
        let args = Args::try_parse_from([
            "muster-agent",
            "--config",
            &config_arg,
            "--task-output-files",
            "0",
        ])?;
        let Err(error) = settings(args) else {
            anyhow::bail!("zero task_output_files accepted");
        };
        assert!(error.to_string().contains("task_output_files"), "{error:#}");
        Ok(())
    }

    #[test]
    fn the_http_port_is_the_listen_port_plus_ten_unless_the_file_or_a_flag_says()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("agent.toml");
        let base = "master = [\"127.0.0.1:5050\"]\ndata_dir = \"/tmp/a\"\n[tls]\ninsecure = true\n";
        std::fs::write(&file, base)?;
        let config_arg = file.to_string_lossy().into_owned();
        let parse = |extra: &[&str]| -> anyhow::Result<Settings> {
            let mut args = vec!["muster-agent", "--config", &config_arg];
            args.extend_from_slice(extra);
            settings(Args::try_parse_from(args)?)
        };
        assert_eq!(parse(&[])?.http_listen, "127.0.0.1:5061");
        assert_eq!(
            parse(&["--listen", "10.0.0.7:7000"])?.http_listen,
            "10.0.0.7:7010"
        );
        assert_eq!(
            parse(&["--listen", "127.0.0.1:0"])?.http_listen,
            "127.0.0.1:0"
        );
        std::fs::write(&file, format!("http_listen = \"127.0.0.1:9100\"\n{base}"))?;
        assert_eq!(parse(&[])?.http_listen, "127.0.0.1:9100");
        assert_eq!(
            parse(&["--http-listen", "0.0.0.0:9200"])?.http_listen,
            "0.0.0.0:9200"
        );
        std::fs::write(&file, base)?;
        let Err(error) = parse(&["--listen", "no-port"]) else {
            anyhow::bail!("a listen address without a port gave an HTTP address");
        };
        assert!(error.to_string().contains("no-port"), "{error:#}");
        Ok(())
    }
}
