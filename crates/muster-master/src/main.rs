//! `muster-master`: runs one master of a Muster cluster.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use muster_launch::security::TlsFlags;
use muster_launch::settings::HumanDuration;
use muster_master::{HTTP_PORT_OFFSET, MasterConfig, MasterServer};
use muster_security::{Role, Security};
use serde::Deserialize;

/// mimalloc: the master and its schedulers allocate per message and per task, from several
/// threads at once, where it is markedly faster than the system allocator (see README's
/// performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

muster_launch::settings! {
    /// Runs one master of a Muster cluster. Several masters (`--peer` for each, this one
    /// included) form one raft group; the raft leader is the leading master.
    //
    // Each setting is declared here once: its flag, its key in the config file (the field's
    // name), its help, and where it goes in `MasterConfig` (`=> place`), whose `new` gives the
    // defaults `--help` shows (or `[default: …]`). docs/configuration.md is rendered from it.
    #[derive(Debug, Default, Parser, Deserialize)]
    #[command(name = "muster-master", version)]
    #[serde(default, deny_unknown_fields)]
    struct MasterSettings: MasterConfig {
        /// TOML file with any of the settings below (flags win).
        #[arg(long)]
        #[serde(skip)]
        config: Option<PathBuf>,
        /// This master's id in the group.
        #[arg(long)]
        id: Option<u64> => id,
        /// Address to listen on, HOST:PORT.
        #[arg(long)]
        listen: Option<String> => listen,
        /// Where the HTTP/JSON API and /metrics listen, HOST:PORT.
        #[arg(long)]
        http_listen: Option<String> => http_listen [default: default_http_listen()],
        /// A member of the group, ID=HOST:PORT; repeat for each, this master included. None: a
        /// group of one.
        #[arg(long = "peer", value_name = "ID=HOST:PORT")]
        peers: Vec<String>,
        /// Another master's HTTP API, ID=HOST:PORT, where it is not its --peer port plus the
        /// offset this master's --http-listen has; repeat for each (for a standby's redirects).
        #[arg(long = "http-peer", value_name = "ID=HOST:PORT")]
        http_peers: Vec<String>,
        /// A master of a running group to ask to add this one, HOST:PORT (any of them; repeat
        /// for several). On first start this master waits, empty, to be added as a learner,
        /// catches up and becomes a voter; once in the group it is ignored. Give this
        /// master's own address as its only --peer (ID=HOST:PORT) when its --listen is not
        /// an address the others can reach.
        #[arg(long = "join", value_name = "HOST:PORT")]
        join: Vec<String>,
        /// Where the registry is stored (required).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// If the registry store in --data-dir is damaged, move it aside (DIR.damaged-<ms>) and
        /// start empty, catching up from the other masters, instead of refusing to start. It
        /// votes again only once its log is back where the damaged store's was. Never use it on
        /// a group of one: there is nothing to catch up from.
        #[arg(long, num_args = 0, default_missing_value = "true")]
        rejoin_damaged: Option<bool> => rejoin_damaged,
        /// Also ping each agent, Mesos-style (off unless given; heartbeats keep agents connected).
        #[arg(long, num_args = 0, default_missing_value = "true")]
        pings: Option<bool> => pings,
        /// How often to ping each agent when pinging, e.g. 15s.
        #[arg(long)]
        ping_interval: Option<HumanDuration> => ping_interval,
        /// Shortest heartbeat TTL given to agents, e.g. 10s.
        #[arg(long)]
        heartbeat_min_ttl: Option<HumanDuration> => heartbeat_min_ttl,
        /// Heartbeats per second the master aims to handle; TTLs grow with the agents to keep to
        /// it.
        #[arg(long)]
        heartbeats_per_second: Option<f64> => heartbeats_per_second,
        /// How late past its TTL a heartbeat may be, e.g. 10s.
        #[arg(long)]
        heartbeat_grace: Option<HumanDuration> => heartbeat_grace,
        /// First TTL of every agent after this master takes the lead, e.g. 5m.
        #[arg(long)]
        failover_heartbeat_ttl: Option<HumanDuration> => failover_heartbeat_ttl,
        /// Missed pings after which an agent is unreachable.
        #[arg(long)]
        max_missed_pings: Option<u32> => max_missed_pings,
        /// First wait before a crash-looping task is replaced again, doubling per failure, e.g.
        /// 10s.
        #[arg(long)]
        reschedule_delay: Option<HumanDuration> => reschedule_delay,
        /// Longest wait before a crash-looping task is replaced, e.g. 5m.
        #[arg(long)]
        reschedule_max_delay: Option<HumanDuration> => reschedule_max_delay,
        /// How long a launched task may go unconfirmed by its agent before it is lost and
        /// replaced, e.g. 1m.
        #[arg(long)]
        launch_timeout: Option<HumanDuration> => launch_timeout,
        /// How long a new leader waits for agents to re-register, e.g. 10m.
        #[arg(long)]
        reregistration_timeout: Option<HumanDuration> => reregistration_timeout,
        /// Largest share (0..1) of agents the deadline may mark unreachable.
        #[arg(long)]
        removal_limit: Option<f64> => removal_limit,
        /// Scheduler workers this master runs while it leads, serving the built-in schedulers
        /// (service, batch, system); 0 leaves those to workers in other programs (see
        /// examples/custom_scheduler.rs).
        #[arg(long)]
        workers: Option<usize> => workers,
        /// How long after a scheduler's workers last asked for work its evaluations say that
        /// no scheduler of that name is connected, e.g. 30s.
        #[arg(long)]
        scheduler_gone_after: Option<HumanDuration> => scheduler_gone_after,
        /// Which job types may stop tasks of lower-priority jobs to fit: a list of service,
        /// batch and system, or none.
        #[arg(long, value_name = "TYPES")]
        preemption: Option<muster_master::PreemptionSetting> => preemption,
        /// How often the leader checks that every job runs what it asks for, e.g. 30s.
        #[arg(long)]
        reconcile_interval: Option<HumanDuration> => reconcile_interval,
        /// Most bytes of one submitted job, encoded as protobuf (HTTP's JSON is read into that
        /// form first), up to 3145728.
        #[arg(long)]
        max_job_bytes: Option<usize> => job_limits.max_bytes,
        /// Most task groups one job may have.
        #[arg(long)]
        max_job_groups: Option<usize> => job_limits.max_groups,
        /// Most tasks one job may ask for, all its groups together.
        #[arg(long)]
        max_job_tasks: Option<u64> => job_limits.max_tasks,
        /// How many agents one agent certificate may register (1: a certificate speaks for
        /// one agent); more only for simulators that run many agents behind one certificate.
        #[arg(long)]
        agents_per_certificate: Option<usize> => agents_per_certificate,
        /// TLS: this master's certificate (role master), key and the cluster CA.
        #[command(flatten)]
        tls: TlsFlags,
    }
}

/// The defaults `--help` shows, and the settings start from, but for the security.
fn defaults() -> MasterConfig {
    MasterConfig::new(Security::Insecure)
}

/// The default of `--http-listen`, as `--help` says it.
fn default_http_listen() -> String {
    let defaults = defaults();
    let address = defaults.http_address(&defaults.listen).unwrap_or_default();
    format!("the --listen port plus {HTTP_PORT_OFFSET}: {address}")
}

/// `ID=HOST:PORT` of a peer, the host numeric.
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

/// Each of `peers` by id.
fn parse_peers(peers: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    peers.iter().map(|peer| parse_peer(peer)).collect()
}

/// The master's config: `flags` over the config file they name over the defaults.
fn config(flags: MasterSettings) -> anyhow::Result<MasterConfig> {
    let file = flags.config.clone();
    let settings = muster_launch::settings::over_file(flags, file.as_deref())?;
    let mut config = MasterConfig::new(settings.tls.security(Role::Master)?);
    settings.apply(&mut config);
    config.http_members = parse_peers(&settings.http_peers)?;
    config.members = parse_peers(&settings.peers)?;
    if !settings.join.is_empty() && config.members.keys().any(|id| *id != config.id) {
        bail!(
            "--join adds this master to a running group, which knows its members: give only \
             this master's own --peer (ID=HOST:PORT), or none"
        );
    }
    config.join = settings.join.clone();
    config.data_dir = settings
        .data_dir
        .context("--data-dir is required (or data_dir in the config file)")?;
    Ok(config)
}

async fn run(flags: MasterSettings) -> anyhow::Result<()> {
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
    // Whatever the registry's store creates (it holds job environments and token hashes) is
    // this user's alone; the store sets no modes of its own.
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
    let flags = muster_launch::settings::parse(MasterSettings::command(&defaults()));
    muster_launch::init_logging();
    match muster_launch::block_on(run(flags)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster-master: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md, whose section `muster-master` is rendered from `--help`.
    const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");

    #[test]
    fn the_configuration_reference_is_the_help() -> anyhow::Result<()> {
        let reference = muster_launch::settings::reference::<MasterSettings>(
            &MasterSettings::command(&defaults()),
            &[("tls", muster_launch::settings::keys_of::<TlsFlags>())],
        );
        muster_launch::settings::check_reference(
            std::path::Path::new(REFERENCE),
            "muster-master",
            &reference,
        )
    }

    /// `args` parsed as the binary parses them.
    fn parse(args: &[&str]) -> anyhow::Result<MasterSettings> {
        let args = std::iter::once("muster-master").chain(args.iter().copied());
        Ok(muster_launch::settings::try_parse_from(
            MasterSettings::command(&defaults()),
            args,
        )?)
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_the_defaults() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("master.toml");
        std::fs::write(
            &file,
            "data_dir = \"/tmp/m\"\nping_interval = \"20s\"\nworkers = 3\n\
             max_job_groups = 7\npings = true\npeers = [\"1=127.0.0.1:5050\"]\n\
             preemption = \"service\"\n[tls]\ninsecure = true\n",
        )?;
        let file = file.to_string_lossy().into_owned();
        let config = config(parse(&["--config", &file, "--workers", "0"])?)?;
        assert_eq!(config.preemption.to_string(), "service");
        let flagged = super::config(parse(&["--config", &file, "--preemption", "system,batch"])?)?;
        assert_eq!(flagged.preemption.to_string(), "batch,system");
        let bad = parse(&["--preemption", "cron"]).expect_err("cron is no job type");
        assert!(format!("{bad:#}").contains("\"cron\""), "{bad:#}");
        assert_eq!(config.ping_interval, std::time::Duration::from_secs(20));
        assert_eq!(config.workers, 0);
        assert_eq!(config.job_limits.max_groups, 7);
        assert!(config.pings);
        assert!(!config.rejoin_damaged);
        assert_eq!(
            config.members.get(&1).map(String::as_str),
            Some("127.0.0.1:5050")
        );
        assert_eq!(config.data_dir, PathBuf::from("/tmp/m"));
        let defaults = defaults();
        assert_eq!(config.heartbeat_grace, defaults.heartbeat_grace);
        assert_eq!(config.job_limits.max_tasks, defaults.job_limits.max_tasks);
        assert_eq!(config.listen, defaults.listen);
        assert!(config.security.is_insecure());
        Ok(())
    }

    #[test]
    fn help_shows_the_library_defaults() -> anyhow::Result<()> {
        let help = MasterSettings::command(&defaults())
            .render_help()
            .to_string();
        for part in [
            "Address to listen on, HOST:PORT [default: 127.0.0.1:5050]",
            "[default: the --listen port plus 10: 127.0.0.1:5060]",
            "e.g. 15s [default: 15s]",
            "e.g. 5m [default: 5m]",
            "[default: 1048576]",
            "may mark unreachable [default: 1]",
        ] {
            anyhow::ensure!(help.contains(part), "--help lacks {part:?}:\n{help}");
        }
        anyhow::ensure!(!help.contains("[default: false]"), "{help}");
        Ok(())
    }
}
