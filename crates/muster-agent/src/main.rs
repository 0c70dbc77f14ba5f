//! `muster-agent`: runs a Muster agent on this machine until SIGINT or SIGTERM.
//!
//! Settings come from flags and, optionally, a TOML file (`--config`) with the same keys;
//! flags win over the file, and the file over `AgentConfig`'s defaults (docs/configuration.md
//! lists them all). Logs go to stderr through `tracing` (`RUST_LOG`, by default `info` with
//! openraft and sled at `warn`; colour only on a terminal); the one line on stdout says where
//! the agent listens, and ends with where its metrics are served.
//!
//! Beside its gRPC port (the actor transport, gRPC health and reflection) the agent serves an
//! HTTP port (`--http-listen`, by default the `--listen` port plus 10): `GET /metrics` in the
//! Prometheus text format, `GET /v1/health/live` and `GET /v1/health/ready` (200 while
//! registered with a master, else 503). It has the agent's TLS (no client certificate
//! required) and asks for no token: agents hold no token table (see `muster_agent::http`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::Parser;
use muster_actor::System;
use muster_agent::http::HTTP_PORT_OFFSET;
use muster_agent::{AgentConfig, DEFAULT_TASK_UID_RANGE, DynamicPorts, UidRange};
use muster_launch::security::TlsFlags;
use muster_launch::settings::{ByteSize, HumanDuration};
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

muster_launch::settings! {
    /// Runs a Muster agent: registers with the leading master and runs the tasks it is sent.
    //
    // Each setting is declared here once: its flag, its key in the config file (the field's
    // name; the kebab-case aliases are kept for files written for them), its help, and where it
    // goes in `AgentConfig` (`=> place`), whose `new` gives the defaults `--help` shows (or
    // `[default: …]`). docs/configuration.md is rendered from it.
    #[derive(Debug, Default, Parser, Deserialize)]
    #[command(name = "muster-agent", version, about, long_about = None)]
    #[serde(default, deny_unknown_fields)]
    struct AgentSettings: AgentConfig {
        /// Address to listen on, as the masters reach it
        #[arg(long, value_name = "HOST:PORT")]
        listen: Option<String> [default: DEFAULT_LISTEN],
        /// Address the masters reach the agent at, when it is not --listen (behind a proxy, a NAT
        /// or a port mapping)
        #[arg(long, value_name = "HOST:PORT")]
        advertise: Option<String> [default: "the --listen address"],
        /// Address of the HTTP port: GET /metrics (Prometheus text, no token; TLS as the rest of
        /// the agent, no client certificate needed) and /v1/health/live, /v1/health/ready
        #[arg(long, value_name = "HOST:PORT")]
        #[serde(alias = "http-listen")]
        http_listen: Option<String> [default: format!(
            "the --listen host, its port plus {HTTP_PORT_OFFSET}; port 0 stays 0, any free port"
        )],
        /// A master's address; repeat for each master (required unless in the config file)
        #[arg(long, value_name = "HOST:PORT")]
        #[serde(alias = "masters")]
        master: Vec<String>,
        /// Where the agent keeps its id, task checkpoints and task working directories
        /// (required unless in the config file)
        #[arg(long, value_name = "PATH")]
        #[serde(alias = "data-dir")]
        data_dir: Option<PathBuf>,
        /// Hostname to report
        #[arg(long)]
        hostname: Option<String> => hostname [default: "this machine's"],
        /// CPUs to offer
        #[arg(long)]
        cpus: Option<f64> => resources.0 [default: "this machine's"],
        /// Memory to offer, in MiB
        #[arg(long, value_name = "MIB")]
        #[serde(alias = "mem-mb")]
        mem_mb: Option<u64> => resources.1 [default: "this machine's"],
        /// An attribute to report; repeat for each (in the config file, a table: the file's and
        /// then the flags', a later key winning)
        #[arg(long = "attribute", value_name = "KEY=VALUE", value_parser = parse_attribute)]
        #[serde(alias = "attribute", deserialize_with = "muster_launch::settings::table")]
        attributes: Vec<(String, String)> => attributes,
        /// A TOML file with the settings below but --no-cgroups and --stop-tasks-on-exit, under
        /// the keys docs/configuration.md lists (the flags' names in snake case, but
        /// allowed_task_users, an [attributes] table and a [tls] table); flags override it
        #[arg(long, value_name = "FILE")]
        #[serde(skip)]
        config: Option<PathBuf>,
        /// Do not bound tasks with cgroups even where the machine allows: each task's process
        /// group only (memory, CPU and process limits not enforced).
        #[arg(long, num_args = 0, default_missing_value = "true")]
        #[serde(skip)]
        no_cgroups: Option<bool>,
        /// The user tasks run as when their job names none
        #[arg(long, value_name = "USER")]
        #[serde(alias = "task-user")]
        task_user: Option<String> => task_user [default:
            "a uid of the task's own from --task-uid-range when the agent runs as root, else the \
             agent's user"
        ],
        /// The uids a root agent runs tasks as when neither their job nor --task-user names a
        /// user: each running task gets one of its own (its group the same number, no other
        /// groups), free again once it has ended. No user of the machine may have one of them,
        /// and each agent of a machine needs a range of its own
        #[arg(long, value_name = "START-END")]
        #[serde(alias = "task-uid-range")]
        task_uid_range: Option<UidRange> => task_uid_range [default: DEFAULT_TASK_UID_RANGE],
        /// The ports handed out to tasks that ask for a dynamic one; no other program of the
        /// machine should listen in the range
        #[arg(long, value_name = "MIN-MAX")]
        #[serde(alias = "dynamic-ports")]
        dynamic_ports: Option<DynamicPorts> => dynamic_ports [default: "20000-32000"],
        /// A user a job may name for its tasks to run as; repeat for each
        #[arg(long = "allow-task-user", value_name = "USER")]
        #[serde(alias = "allow-task-user", alias = "allowed-task-users")]
        allowed_task_users: Vec<String> => allowed_task_users [default: "none"],
        /// How long the agent may be down and still take back its running tasks (past it, it
        /// kills them when it starts), e.g. 15m
        #[arg(long, value_name = "DURATION")]
        #[serde(alias = "recovery-timeout")]
        recovery_timeout: Option<HumanDuration> => recovery_timeout,
        /// Most bytes one output file of a task holds: its executor rotates stdout (to stdout.1,
        /// the older files shifting) before a write would take it past this, so a stream keeps at
        /// most (task-output-files + 1) times this on disk; in bytes or with a unit: 512KiB, 10MiB,
        /// 1GiB
        #[arg(long, value_name = "SIZE")]
        #[serde(alias = "task-output-max-bytes")]
        task_output_max_bytes: Option<ByteSize> => task_output_max_bytes,
        /// Rotated files kept per stream of a task (stdout.1 to stdout.N); the oldest goes when
        /// one more would be made
        #[arg(long, value_name = "N")]
        #[serde(alias = "task-output-files")]
        task_output_files: Option<u32> => task_output_files,
        /// How often the output files of running tasks started by an agent from before executors
        /// rotated them are checked for rotation (copy and truncate), e.g. 1s
        #[arg(long, value_name = "DURATION")]
        #[serde(alias = "task-output-check-interval")]
        task_output_check_interval: Option<HumanDuration> => task_output_check_interval,
        /// Kill the running tasks when the agent stops (by default they keep running, for the
        /// agent to take back when it starts again)
        #[arg(long, num_args = 0, default_missing_value = "true")]
        #[serde(skip)]
        stop_tasks_on_exit: Option<bool>,
        /// TLS: this agent's certificate (role agent), key and the cluster CA.
        #[command(flatten)]
        tls: TlsFlags,
    }
}

/// The defaults `--help` shows, and the settings start from, but for the masters and the data
/// directory (which have none).
fn defaults() -> AgentConfig {
    AgentConfig::new(Vec::new(), "")
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

/// What the binary runs with, from the flags over the file over the defaults.
#[derive(Debug)]
struct Startup {
    /// The gRPC port's address (the actor transport).
    listen: String,
    /// Where masters reach it, if not at `listen`.
    advertise: Option<String>,
    /// The HTTP port's address (metrics and health).
    http_listen: String,
    config: AgentConfig,
    security: Security,
}

/// What to start with: `flags` over the config file they name over the defaults.
fn startup(flags: AgentSettings) -> anyhow::Result<Startup> {
    let file = flags.config.clone();
    let settings = muster_launch::settings::over_file(flags, file.as_deref())?;
    let security = settings.tls.security(Role::Agent)?;
    let listen = settings
        .listen
        .clone()
        .unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
    let http_listen = muster_agent::http::http_address(&listen, settings.http_listen.as_deref())
        .map_err(anyhow::Error::msg)?;
    let advertise = settings.advertise.clone();
    if let Some(advertise) = &advertise
        && advertise.parse::<SocketAddr>().is_err()
        && advertise
            .rsplit_once(':')
            .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        bail!("--advertise {advertise:?} is not HOST:PORT");
    }
    if settings.master.is_empty() {
        bail!("no master given: pass --master HOST:PORT (or set `master` in the config file)");
    }
    let Some(data_dir) = settings.data_dir.clone() else {
        bail!(
            "no data directory given: pass --data-dir PATH (or set `data_dir` in the config file)"
        );
    };
    let mut config = AgentConfig::new(settings.master.clone(), data_dir);
    settings.apply(&mut config);
    config.cgroups = settings.no_cgroups != Some(true);
    // The binary's tasks outlive it: a restart (even a SIGKILL) takes them back.
    config.stop_tasks_on_exit = settings.stop_tasks_on_exit == Some(true);
    config.validate()?;
    Ok(Startup {
        listen,
        advertise,
        http_listen,
        config,
        security,
    })
}

async fn run(startup: Startup) -> anyhow::Result<()> {
    let Startup {
        listen,
        advertise,
        http_listen,
        config,
        security,
    } = startup;
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
    let flags = muster_launch::settings::parse(AgentSettings::command(&defaults()));
    muster_launch::init_logging();
    let outcome = startup(flags).and_then(|startup| muster_launch::block_on(run(startup)));
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

    /// docs/configuration.md, whose section `muster-agent` is rendered from `--help`.
    const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");

    #[test]
    fn the_configuration_reference_is_the_help() -> anyhow::Result<()> {
        let reference = muster_launch::settings::reference::<AgentSettings>(
            &AgentSettings::command(&defaults()),
            &[("tls", muster_launch::settings::keys_of::<TlsFlags>())],
        );
        muster_launch::settings::check_reference(
            std::path::Path::new(REFERENCE),
            "muster-agent",
            &reference,
        )
    }

    /// `args` parsed as the binary parses them, then what it would start with.
    fn start(args: &[&str]) -> anyhow::Result<Startup> {
        let args = std::iter::once("muster-agent").chain(args.iter().copied());
        startup(muster_launch::settings::try_parse_from(
            AgentSettings::command(&defaults()),
            args,
        )?)
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
        let config = start(&["--config", &config_arg])?.config;
        assert_eq!(config.task_output_max_bytes, 2 * 1024 * 1024);
        assert_eq!(config.task_output_files, 3);
        assert_eq!(
            config.task_output_check_interval,
            std::time::Duration::from_millis(250)
        );
        let config = start(&[
            "--config",
            &config_arg,
            "--task-output-max-bytes",
            "4096",
            "--task-output-files",
            "1",
        ])?
        .config;
        assert_eq!(config.task_output_max_bytes, 4096);
        assert_eq!(config.task_output_files, 1);
        let Err(error) = start(&["--config", &config_arg, "--task-output-files", "0"]) else {
            anyhow::bail!("zero task_output_files accepted");
        };
        assert!(error.to_string().contains("task_output_files"), "{error:#}");
        Ok(())
    }

    #[test]
    fn the_file_takes_kebab_keys_and_attribute_tables_merged_with_the_flags() -> anyhow::Result<()>
    {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            "masters = [\"127.0.0.1:5050\"]\ndata-dir = \"/tmp/a\"\nmem-mb = 512\n\
             task_output_max_bytes = 65536\nrecovery-timeout = \"2m\"\n\
             allow-task-user = [\"daemon\"]\n\
             [attributes]\nrack = \"r1\"\nzone = \"z1\"\n[tls]\ninsecure = true\n",
        )?;
        let config_arg = file.to_string_lossy().into_owned();
        let startup = start(&[
            "--config",
            &config_arg,
            "--attribute",
            "zone=z2",
            "--no-cgroups",
        ])?;
        let config = startup.config;
        assert_eq!(config.masters, ["127.0.0.1:5050"]);
        assert_eq!(config.resources.1, 512);
        assert_eq!(config.task_output_max_bytes, 65536);
        assert_eq!(config.recovery_timeout, std::time::Duration::from_secs(120));
        assert_eq!(config.allowed_task_users, ["daemon"]);
        assert_eq!(
            config.attributes.get("rack").map(String::as_str),
            Some("r1")
        );
        assert_eq!(
            config.attributes.get("zone").map(String::as_str),
            Some("z2")
        );
        assert!(!config.cgroups);
        assert!(!config.stop_tasks_on_exit);
        assert_eq!(config.hostname, defaults().hostname);
        assert_eq!(startup.listen, DEFAULT_LISTEN);
        assert!(startup.security.is_insecure());

        std::fs::write(&file, "no_cgroups = true\n")?;
        let Err(error) = start(&["--config", &config_arg]) else {
            anyhow::bail!("a flag-only key was read from the file");
        };
        assert!(format!("{error:#}").contains("no_cgroups"), "{error:#}");
        Ok(())
    }

    #[test]
    fn the_task_uid_range_comes_from_the_file_or_a_flag_and_a_bad_one_is_named()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("agent.toml");
        let base = "master = [\"127.0.0.1:5050\"]\ndata_dir = \"/tmp/a\"\n[tls]\ninsecure = true\n";
        std::fs::write(&file, base)?;
        let config_arg = file.to_string_lossy().into_owned();
        let range = |extra: &[&str]| -> anyhow::Result<UidRange> {
            let mut args = vec!["--config", &config_arg];
            args.extend_from_slice(extra);
            Ok(start(&args)?.config.task_uid_range)
        };
        assert_eq!(range(&[])?, DEFAULT_TASK_UID_RANGE);
        assert_eq!(
            range(&["--task-uid-range", "61000-61999"])?,
            UidRange::new(61000, 61999)?
        );
        for (bad, why) in [
            ("61000", "expected START-END"),
            ("a-b", "expected START-END"),
            ("0-10", "root"),
            ("10-9", "ends before it starts"),
        ] {
            let Err(error) = range(&["--task-uid-range", bad]) else {
                anyhow::bail!("--task-uid-range {bad} accepted");
            };
            let error = format!("{error:#}");
            assert!(
                error.contains("--task-uid-range") && error.contains(why),
                "{bad}: {error}"
            );
        }

        std::fs::write(&file, format!("task_uid_range = \"62000-62009\"\n{base}"))?;
        assert_eq!(range(&[])?, UidRange::new(62000, 62009)?);
        assert_eq!(range(&["--task-uid-range", "7-7"])?, UidRange::new(7, 7)?);
        std::fs::write(&file, format!("task_uid_range = \"62009-62000\"\n{base}"))?;
        let Err(error) = range(&[]) else {
            anyhow::bail!("a reversed task_uid_range in the file was accepted");
        };
        let error = format!("{error:#}");
        assert!(
            error.contains("task_uid_range") && error.contains("ends before it starts"),
            "{error}"
        );
        Ok(())
    }

    #[test]
    fn the_dynamic_port_range_comes_from_the_file_or_a_flag_and_a_bad_one_is_named()
    -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("agent.toml");
        let base = "master = [\"127.0.0.1:5050\"]\ndata_dir = \"/tmp/a\"\n[tls]\ninsecure = true\n";
        std::fs::write(&file, format!("dynamic_ports = \"40000-40099\"\n{base}"))?;
        let config_arg = file.to_string_lossy().into_owned();
        let range = |extra: &[&str]| -> anyhow::Result<muster_model::PortRange> {
            let mut args = vec!["--config", &config_arg];
            args.extend_from_slice(extra);
            Ok(start(&args)?.config.dynamic_ports)
        };
        assert_eq!(
            range(&[])?,
            muster_model::PortRange::parse("40000-40099").map_err(anyhow::Error::msg)?
        );
        assert_eq!(range(&["--dynamic-ports", "50000-50009"])?.len(), 10);
        for (bad, why) in [
            ("50000", "port range"),
            ("0-10", "not a port"),
            ("10-9", "ends before it starts"),
        ] {
            let Err(error) = range(&["--dynamic-ports", bad]) else {
                anyhow::bail!("--dynamic-ports {bad} accepted");
            };
            let error = format!("{error:#}");
            assert!(
                error.contains("--dynamic-ports") && error.contains(why),
                "{bad}: {error}"
            );
        }
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
        let parse = |extra: &[&str]| -> anyhow::Result<Startup> {
            let mut args = vec!["--config", &config_arg];
            args.extend_from_slice(extra);
            start(&args)
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

    #[test]
    fn help_shows_the_library_defaults() {
        let help = AgentSettings::command(&defaults())
            .render_help()
            .to_string();
        for part in [
            "[default: 127.0.0.1:5051]",
            "e.g. 15m [default: 15m]",
            "1GiB [default: 10MiB]",
            "one more would be made [default: 5]",
            "e.g. 1s [default: 1s]",
            "[default: a uid of the task's own from --task-uid-range when the agent runs as root, \
             else the agent's user]",
            "a range of its own [default: 61184-65519]",
            "Hostname to report [default: this machine's]",
        ] {
            assert!(help.contains(part), "--help lacks {part:?}:\n{help}");
        }
    }
}
