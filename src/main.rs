//! `muster`: a one-process dev cluster (`muster dev`), a cluster's state (`muster status`), and
//! jobs (`muster job run FILE`, `muster job status NAME`, `muster job stop NAME`).

mod job_file;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use muster::actor::{Node, System};
use muster::agent::AgentConfig;
use muster::master::{MasterConfig, MasterServer, OperatorMsg};
use muster::model::{Evaluation, SchedulerType, TaskState};
use muster::proto::cluster as pb;
use muster::proto::cluster::operator_client::OperatorClient;
use muster::scheduler::protocol::leader_hint;
use muster_security::{DEFAULT_CLUSTER, Security, Tls};

/// mimalloc: the master and its schedulers allocate per message and per task, from several
/// threads at once, where it is markedly faster than the system allocator (see README's
/// performance section).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Muster: cluster coordination on a libprocess-style actor runtime.
#[derive(Debug, Parser)]
#[command(name = "muster", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a single-node master and one agent in this process, on a temporary data dir.
    Dev {
        /// The master's address (agents, operators and `muster status` use it).
        #[arg(long, default_value = "127.0.0.1:5050")]
        listen: String,
        /// The agent's address.
        #[arg(long, default_value = "127.0.0.1:5051")]
        agent_listen: String,
        /// Keep data here instead of a temporary dir removed on exit.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Scheduler workers in the master; 0 leaves scheduling to workers in other programs
        /// (see examples/custom_scheduler.rs).
        #[arg(long, default_value_t = 2)]
        workers: usize,
    },
    /// Show the cluster: the leader, agents with their tasks, frameworks.
    Status {
        /// Any master's address; a standby's answer leads to the leader.
        #[arg(long, default_value = "127.0.0.1:5050")]
        master: String,
    },
    /// Run, inspect and stop jobs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
        /// Any master's address; a standby's answer leads to the leader.
        #[arg(long, global = true, default_value = "127.0.0.1:5050")]
        master: String,
    },
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Submit the job in a TOML file (new or changed).
    Run {
        /// The job file (see examples/jobs/hello.toml).
        file: PathBuf,
    },
    /// Show a job: its tasks, where they run, and its evaluations.
    Status {
        /// The job's name.
        name: String,
    },
    /// Stop a job's tasks.
    Stop {
        /// The job's name.
        name: String,
    },
}

async fn dev(
    listen: String,
    agent_listen: String,
    data_dir: Option<PathBuf>,
    workers: usize,
) -> anyhow::Result<()> {
    let temporary = match data_dir {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("muster-dev-").tempdir()?),
    };
    let data_dir = match (&temporary, data_dir) {
        (Some(dir), _) => dir.path().to_owned(),
        (None, Some(dir)) => dir,
        (None, None) => bail!("no data dir"),
    };
    // A throwaway CA and a certificate per role: the dev cluster runs secured, as any other.
    let tls_dir = data_dir.join("tls");
    let [master_files, agent_files, client_files] =
        muster_security::certs::write_dev_pki(&tls_dir, DEFAULT_CLUSTER)
            .map_err(|e| anyhow::anyhow!("cannot create the dev cluster's certificates: {e}"))?;
    let master_security = Security::Tls(Tls::load(master_files, DEFAULT_CLUSTER)?);
    let agent_security = Security::Tls(Tls::load(agent_files, DEFAULT_CLUSTER)?);
    let master = MasterServer::start(MasterConfig {
        listen,
        data_dir: data_dir.join("master"),
        workers,
        ..MasterConfig::new(master_security)
    })
    .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !master
        .pid()
        .ask(|reply| OperatorMsg::GetMetrics(reply).into())
        .await?
        .is_leader
    {
        if tokio::time::Instant::now() > deadline {
            bail!("the dev master did not become leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let system = System::new();
    let node = Node::bind(&system, &agent_listen, agent_security).await?;
    let mut agent_config =
        AgentConfig::new(vec![master.address().to_owned()], data_dir.join("agent"));
    agent_config.registration_backoff_initial = Duration::from_millis(100);
    let agent = muster::agent::start(&node, agent_config).await?;
    let (agent_id, _) = tokio::time::timeout(Duration::from_secs(30), agent.registered())
        .await
        .context("the dev agent did not register within 30 s")??;

    let mut out = std::io::stdout().lock();
    writeln!(out, "muster dev cluster running")?;
    writeln!(
        out,
        "  master  {addr}  (master@{addr}, operator API)",
        addr = master.address()
    )?;
    writeln!(out, "  agent   {}  {}", agent.upid(), agent_id)?;
    writeln!(out, "  data    {}", data_dir.display())?;
    writeln!(
        out,
        "  TLS     CA and certificates in {} (client: {})",
        tls_dir.display(),
        client_files.cert.display()
    )?;
    if workers == 0 {
        writeln!(
            out,
            "  no scheduler workers in the master: jobs wait for yours (examples/custom_scheduler.rs)"
        )?;
    }
    writeln!(
        out,
        "Try `muster status` in another terminal. Ctrl-C stops the cluster."
    )?;
    out.flush()?;
    drop(out);

    muster_launch::shutdown_signal()?.await;
    agent.stop().await;
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

/// A client of the leading master and its cluster state, found from any master by following
/// the `leader` each one names (every master answers `GetState`).
async fn leader_client(
    master: String,
) -> anyhow::Result<(OperatorClient<tonic::transport::Channel>, pb::ClusterState)> {
    let mut address = master;
    loop {
        let mut client = connect(&address).await?;
        let state = client
            .get_state(pb::GetStateRequest {})
            .await
            .with_context(|| format!("the master at {address} did not answer"))?
            .into_inner();
        if state.is_leader {
            return Ok((client, state));
        }
        if state.leader.is_empty() || state.leader == address {
            bail!("the master at {address} is a standby and knows no leader yet");
        }
        address = state.leader;
    }
}

async fn connect(address: &str) -> anyhow::Result<OperatorClient<tonic::transport::Channel>> {
    OperatorClient::connect(format!("http://{address}"))
        .await
        .with_context(|| format!("cannot reach a master at {address}"))
}

/// Makes a leader-only `call` at the master at `address`; if that master is a standby naming
/// the leader (FAILED_PRECONDITION with the leader in the `muster-leader` metadata: the one
/// "not the leader" convention of `muster::scheduler::protocol`), makes it once more there.
async fn at_leader<T, F, Fut>(address: &str, call: F) -> anyhow::Result<T>
where
    F: Fn(OperatorClient<tonic::transport::Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let refused = match call(connect(address).await?).await {
        Ok(reply) => return Ok(reply.into_inner()),
        Err(status) => status,
    };
    let Some(leader) = leader_hint(&refused).filter(|leader| leader != address) else {
        bail!("{}", refused.message());
    };
    call(connect(&leader).await?)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| anyhow::anyhow!("{}", status.message()))
}

async fn job(master: String, command: JobCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::Run { file } => {
            let spec = job_file::read(&file)?;
            let name = spec.name.clone();
            let reply = at_leader(&master, |mut client| {
                let job = Some(spec.clone());
                async move { client.submit_job(pb::SubmitJobRequest { job }).await }
            })
            .await?;
            writeln!(
                out,
                "job {name} submitted (version {}, evaluation {})",
                reply.version, reply.eval_id
            )?;
        }
        JobCommand::Stop { name } => {
            let reply = at_leader(&master, |mut client| {
                let name = name.clone();
                async move { client.stop_job(pb::StopJobRequest { name }).await }
            })
            .await?;
            writeln!(out, "job {name} stopping (evaluation {})", reply.eval_id)?;
        }
        JobCommand::Status { name } => {
            let status = at_leader(&master, |mut client| {
                let name = name.clone();
                async move { client.job_status(pb::JobStatusRequest { name }).await }
            })
            .await?;
            let spec = status.job.unwrap_or_default();
            writeln!(
                out,
                "job {} ({}, priority {}, version {}){}",
                spec.name,
                SchedulerType::try_from(spec.scheduler).map_or("?", SchedulerType::name),
                spec.priority,
                status.version,
                if status.stopped { ", stopped" } else { "" }
            )?;
            writeln!(out, "tasks:")?;
            if status.tasks.is_empty() {
                writeln!(out, "  (none yet)")?;
            }
            for task in &status.tasks {
                let Some(t) = &task.task else { continue };
                writeln!(
                    out,
                    "  {:<28} {:<10} exit {:<4} on {}  (id {})",
                    t.name,
                    state_name(t.state),
                    t.exit_code,
                    task.agent_id,
                    t.id
                )?;
                if !t.message.is_empty() {
                    writeln!(out, "    {}", t.message)?;
                }
            }
            writeln!(out, "evaluations (newest first):")?;
            for eval in status.evals {
                let id = eval.id.clone();
                match Evaluation::try_from(eval) {
                    Ok(eval) => writeln!(
                        out,
                        "  {}  {:<9} {:?}  {}",
                        eval.id,
                        eval.status.name(),
                        eval.trigger,
                        eval.status_description
                    )?,
                    Err(e) => writeln!(out, "  {id}  ({e})")?,
                }
            }
        }
    }
    Ok(())
}

fn state_name(state: i32) -> String {
    TaskState::try_from(state).map_or_else(|_| state.to_string(), |s| s.name().to_owned())
}

async fn status(master: String) -> anyhow::Result<()> {
    let (_, state) = leader_client(master).await?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "leader {} (term {}){}",
        state.leader,
        state.term,
        if state.recovering { ", recovering" } else { "" }
    )?;
    writeln!(
        out,
        "agents: {} ({} connected), {} unreachable",
        state.agents.len(),
        state.agents.iter().filter(|a| a.connected).count(),
        state.unreachable.len()
    )?;
    if !state.agents.is_empty() {
        writeln!(
            out,
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  CONNECTED",
            "ID", "HOSTNAME", "ADDRESS", "CPUS", "MEM MB", "TASKS"
        )?;
    }
    for agent in &state.agents {
        let info = agent.info.clone().unwrap_or_default();
        let resources = info.resources.unwrap_or_default();
        writeln!(
            out,
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  {}",
            agent.id,
            info.hostname,
            info.address,
            resources.cpus,
            resources.mem_mb,
            agent.tasks.len(),
            agent.connected
        )?;
        for task in &agent.tasks {
            let task_state = state_name(task.state);
            writeln!(
                out,
                "      task {} ({}) {} {}",
                task.id, task.framework_id, task_state, task.command
            )?;
        }
    }
    for agent in &state.unreachable {
        writeln!(
            out,
            "  unreachable {} since {} ms",
            agent.id, agent.marked_at_ms
        )?;
    }
    if !state.frameworks.is_empty() {
        let names: Vec<&str> = state.frameworks.iter().map(|f| f.id.as_str()).collect();
        writeln!(out, "frameworks: {}", names.join(", "))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    muster_launch::init_logging();
    let result = muster_launch::block_on(async {
        match cli.command {
            Command::Dev {
                listen,
                agent_listen,
                data_dir,
                workers,
            } => dev(listen, agent_listen, data_dir, workers).await,
            Command::Status { master } => status(master).await,
            Command::Job { command, master } => job(master, command).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster: {e:#}");
            ExitCode::FAILURE
        }
    }
}
