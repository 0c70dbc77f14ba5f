//! `muster-master`: runs one master of a Muster cluster.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Parser;
use muster_launch::security::{TlsFileConfig, TlsFlags};
use muster_master::{MasterConfig, MasterServer};
use muster_security::Role;
use serde::Deserialize;

/// mimalloc: the master and its schedulers allocate per message and per task, from several
/// threads at once, where it is markedly faster than the system allocator (see README's
/// performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs one master of a Muster cluster. Several masters (`--peer` for each, this one
/// included) form one raft group; the raft leader is the leading master.
#[derive(Debug, Parser)]
#[command(name = "muster-master", version)]
struct Flags {
    /// TOML file with any of the settings below (flags win).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This master's id in the group.
    #[arg(long)]
    id: Option<u64>,
    /// Address to listen on, HOST:PORT [default: 127.0.0.1:5050].
    #[arg(long)]
    listen: Option<String>,
    /// Where the HTTP/JSON API and /metrics listen, HOST:PORT [default: the --listen port
    /// plus 10: 127.0.0.1:5060].
    #[arg(long)]
    http_listen: Option<String>,
    /// A member of the group, ID=HOST:PORT; repeat for each, this master included. None: a
    /// group of one.
    #[arg(long = "peer", value_name = "ID=HOST:PORT")]
    peers: Vec<String>,
    /// Another master's HTTP API, ID=HOST:PORT, where it is not its --peer port plus the
    /// offset this master's --http-listen has; repeat for each (for a standby's redirects).
    #[arg(long = "http-peer", value_name = "ID=HOST:PORT")]
    http_peers: Vec<String>,
    /// Where the registry is stored.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// If the registry store in --data-dir is damaged, move it aside (DIR.damaged-<ms>) and
    /// start empty, catching up from the other masters, instead of refusing to start. It
    /// votes again only once its log is back where the damaged store's was. Never use it on
    /// a group of one: there is nothing to catch up from.
    #[arg(long)]
    rejoin_damaged: bool,
    /// Also ping each agent, Mesos-style (off unless given; heartbeats keep agents connected).
    #[arg(long)]
    pings: bool,
    /// How often to ping each agent when pinging, e.g. 15s [default: 15s].
    #[arg(long, value_parser = humantime::parse_duration)]
    ping_interval: Option<Duration>,
    /// Shortest heartbeat TTL given to agents, e.g. 10s [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_min_ttl: Option<Duration>,
    /// Heartbeats per second the master aims to handle; TTLs grow with the agents to keep to
    /// it [default: 50].
    #[arg(long)]
    heartbeats_per_second: Option<f64>,
    /// How late past its TTL a heartbeat may be, e.g. 10s [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_grace: Option<Duration>,
    /// First TTL of every agent after this master takes the lead, e.g. 5m [default: 5m].
    #[arg(long, value_parser = humantime::parse_duration)]
    failover_heartbeat_ttl: Option<Duration>,
    /// Missed pings after which an agent is unreachable [default: 5].
    #[arg(long)]
    max_missed_pings: Option<u32>,
    /// First wait before a crash-looping task is replaced again, doubling per failure, e.g.
    /// 10s [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration)]
    reschedule_delay: Option<Duration>,
    /// Longest wait before a crash-looping task is replaced, e.g. 5m [default: 5m].
    #[arg(long, value_parser = humantime::parse_duration)]
    reschedule_max_delay: Option<Duration>,
    /// How long a launched task may go unconfirmed by its agent before it is lost and
    /// replaced, e.g. 1m [default: 1m].
    #[arg(long, value_parser = humantime::parse_duration)]
    launch_timeout: Option<Duration>,
    /// How long a new leader waits for agents to re-register, e.g. 10m [default: 10m].
    #[arg(long, value_parser = humantime::parse_duration)]
    reregistration_timeout: Option<Duration>,
    /// Largest share (0..1) of agents the deadline may mark unreachable [default: 1].
    #[arg(long)]
    removal_limit: Option<f64>,
    /// Scheduler workers this master runs while it leads; 0 leaves scheduling to workers in
    /// other programs (see examples/custom_scheduler.rs) [default: 2].
    #[arg(long)]
    workers: Option<usize>,
    /// How often the leader checks that every job runs what it asks for, e.g. 30s
    /// [default: 30s].
    #[arg(long, value_parser = humantime::parse_duration)]
    reconcile_interval: Option<Duration>,
    /// Most bytes of one submitted job, encoded as protobuf (HTTP's JSON is read into that
    /// form first), up to 3145728 [default: 1048576].
    #[arg(long)]
    max_job_bytes: Option<usize>,
    /// Most task groups one job may have [default: 100].
    #[arg(long)]
    max_job_groups: Option<usize>,
    /// Most tasks one job may ask for, all its groups together [default: 50000].
    #[arg(long)]
    max_job_tasks: Option<u64>,
    /// TLS: this master's certificate (role master), key and the cluster CA.
    #[command(flatten)]
    tls: TlsFlags,
}

/// The config file: the same settings as the flags.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    listen: Option<String>,
    http_listen: Option<String>,
    peers: Option<Vec<String>>,
    http_peers: Option<Vec<String>>,
    data_dir: Option<PathBuf>,
    rejoin_damaged: Option<bool>,
    pings: Option<bool>,
    ping_interval: Option<String>,
    heartbeat_min_ttl: Option<String>,
    heartbeats_per_second: Option<f64>,
    heartbeat_grace: Option<String>,
    failover_heartbeat_ttl: Option<String>,
    max_missed_pings: Option<u32>,
    reschedule_delay: Option<String>,
    reschedule_max_delay: Option<String>,
    launch_timeout: Option<String>,
    reregistration_timeout: Option<String>,
    removal_limit: Option<f64>,
    workers: Option<usize>,
    max_job_bytes: Option<usize>,
    max_job_groups: Option<usize>,
    max_job_tasks: Option<u64>,
    reconcile_interval: Option<String>,
    /// `[tls]`: ca, cert, key, cluster, insecure.
    tls: Option<TlsFileConfig>,
}

fn parse_peer(peer: &str) -> anyhow::Result<(u64, String)> {
    let (id, address) = peer
        .split_once('=')
        .with_context(|| format!("peer {peer:?} is not ID=HOST:PORT"))?;
    let id = id
        .parse()
        .with_context(|| format!("peer {peer:?}: {id:?} is not a numeric id"))?;
    if address.parse::<std::net::SocketAddr>().is_err() {
        bail!("peer {peer:?}: {address:?} is not HOST:PORT with a numeric host");
    }
    Ok((id, address.to_owned()))
}

fn duration(name: &str, text: Option<String>) -> anyhow::Result<Option<Duration>> {
    text.map(|t| {
        humantime::parse_duration(&t).with_context(|| format!("{name} = {t:?} is not a duration"))
    })
    .transpose()
}

fn config(flags: Flags) -> anyhow::Result<MasterConfig> {
    let file = match &flags.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the config file {}", path.display()))?;
            toml::from_str::<FileConfig>(&text)
                .with_context(|| format!("bad config file {}", path.display()))?
        }
        None => FileConfig::default(),
    };
    let security = flags
        .tls
        .clone()
        .or_file(file.tls.unwrap_or_default())
        .security(Role::Master)?;
    let defaults = MasterConfig::new(security);
    let peers = if flags.peers.is_empty() {
        file.peers.unwrap_or_default()
    } else {
        flags.peers
    };
    let http_peers = if flags.http_peers.is_empty() {
        file.http_peers.unwrap_or_default()
    } else {
        flags.http_peers
    };
    let http_members = http_peers
        .iter()
        .map(|p| parse_peer(p))
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let members = peers
        .iter()
        .map(|p| parse_peer(p))
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    Ok(MasterConfig {
        id: flags.id.or(file.id).unwrap_or(defaults.id),
        listen: flags.listen.or(file.listen).unwrap_or(defaults.listen),
        http_listen: flags.http_listen.or(file.http_listen),
        http_members,
        members,
        data_dir: flags
            .data_dir
            .or(file.data_dir)
            .context("--data-dir is required (or data_dir in the config file)")?,
        pings: flags.pings || file.pings.unwrap_or(defaults.pings),
        rejoin_damaged: flags.rejoin_damaged
            || file.rejoin_damaged.unwrap_or(defaults.rejoin_damaged),
        heartbeat_min_ttl: flags
            .heartbeat_min_ttl
            .or(duration("heartbeat_min_ttl", file.heartbeat_min_ttl)?)
            .unwrap_or(defaults.heartbeat_min_ttl),
        heartbeats_per_second: flags
            .heartbeats_per_second
            .or(file.heartbeats_per_second)
            .unwrap_or(defaults.heartbeats_per_second),
        heartbeat_grace: flags
            .heartbeat_grace
            .or(duration("heartbeat_grace", file.heartbeat_grace)?)
            .unwrap_or(defaults.heartbeat_grace),
        failover_heartbeat_ttl: flags
            .failover_heartbeat_ttl
            .or(duration(
                "failover_heartbeat_ttl",
                file.failover_heartbeat_ttl,
            )?)
            .unwrap_or(defaults.failover_heartbeat_ttl),
        reschedule_delay: flags
            .reschedule_delay
            .or(duration("reschedule_delay", file.reschedule_delay)?)
            .unwrap_or(defaults.reschedule_delay),
        reschedule_max_delay: flags
            .reschedule_max_delay
            .or(duration("reschedule_max_delay", file.reschedule_max_delay)?)
            .unwrap_or(defaults.reschedule_max_delay),
        launch_timeout: flags
            .launch_timeout
            .or(duration("launch_timeout", file.launch_timeout)?)
            .unwrap_or(defaults.launch_timeout),
        ping_interval: flags
            .ping_interval
            .or(duration("ping_interval", file.ping_interval)?)
            .unwrap_or(defaults.ping_interval),
        max_missed_pings: flags
            .max_missed_pings
            .or(file.max_missed_pings)
            .unwrap_or(defaults.max_missed_pings),
        reregistration_timeout: flags
            .reregistration_timeout
            .or(duration(
                "reregistration_timeout",
                file.reregistration_timeout,
            )?)
            .unwrap_or(defaults.reregistration_timeout),
        removal_limit: flags
            .removal_limit
            .or(file.removal_limit)
            .unwrap_or(defaults.removal_limit),
        workers: flags.workers.or(file.workers).unwrap_or(defaults.workers),
        reconcile_interval: flags
            .reconcile_interval
            .or(duration("reconcile_interval", file.reconcile_interval)?)
            .unwrap_or(defaults.reconcile_interval),
        job_limits: muster_model::JobLimits {
            max_bytes: flags
                .max_job_bytes
                .or(file.max_job_bytes)
                .unwrap_or(defaults.job_limits.max_bytes),
            max_groups: flags
                .max_job_groups
                .or(file.max_job_groups)
                .unwrap_or(defaults.job_limits.max_groups),
            max_tasks: flags
                .max_job_tasks
                .or(file.max_job_tasks)
                .unwrap_or(defaults.job_limits.max_tasks),
        },
        ..defaults
    })
}

async fn run(flags: Flags) -> anyhow::Result<()> {
    let config = config(flags)?;
    if config.heartbeats_per_second.is_nan() || config.heartbeats_per_second <= 0.0 {
        bail!(
            "heartbeats per second must be a positive number, not {}",
            config.heartbeats_per_second
        );
    }
    if config.heartbeat_min_ttl.is_zero() {
        bail!("the minimum heartbeat TTL must be non-zero");
    }
    let data_dir = config.data_dir.clone();
    let id = config.id;
    let security = config.security.clone();
    // Handlers first: a SIGTERM that arrives once "listening" is printed must find them.
    let signal = muster_launch::shutdown_signal()?;
    let master = MasterServer::start(config).await?;
    muster_launch::security::reload_on_sighup(&security)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "muster-master {id} listening on {addr} (master@{addr}), HTTP API on {scheme}://{http}, registry in {}{}",
        data_dir.display(),
        if security.is_insecure() {
            ", INSECURE"
        } else {
            ", TLS"
        },
        addr = master.address(),
        scheme = if security.is_insecure() {
            "http"
        } else {
            "https"
        },
        http = master.http_address(),
    )?;
    out.flush()?;
    drop(out);
    let signal = signal.await;
    tracing::info!(signal, "shutting down");
    master.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    muster_launch::init_logging();
    match muster_launch::block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster-master: {e:#}");
            ExitCode::FAILURE
        }
    }
}
