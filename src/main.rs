//! `muster`: a one-process dev cluster (`muster dev`), a cluster's state (`muster status`),
//! jobs (`muster job run FILE`, `muster job status NAME`, `muster job stop NAME`,
//! `muster job list`), evaluations (`muster eval list`), agents (`muster agent list`), TLS
//! material (`muster tls`), ACL tokens (`muster acl`) and registry snapshots
//! (`muster operator snapshot save|restore`).

mod acl_command;
mod agent_command;
mod connection;
mod dev;
mod job_file;
mod list_command;
mod operator_command;
mod output;
mod tls_command;
mod when;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use acl_command::AclCommand;
use agent_command::AgentCommand;
use anyhow::Context as _;
use clap::{Parser, Subcommand};
use connection::{Connection, Target};
use dev::DevOptions;
use muster::model::{Evaluation, SchedulerType, TaskState};
use muster::proto::cluster as pb;
use operator_command::OperatorCommand;
use output::{Format, print_json};
use tls_command::TlsCommand;

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
    /// Where and how to reach a master (MUSTER_ADDR, MUSTER_CACERT, MUSTER_CLIENT_CERT,
    /// MUSTER_CLIENT_KEY, MUSTER_TOKEN).
    #[command(flatten)]
    target: Target,
    /// Print the answer as JSON, one document per line: the same document the HTTP API
    /// answers for it (`GET /v1/jobs` for `job list`, ...).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a single-node master and one agent in this process, on a temporary data dir, with
    /// TLS and ACLs on (a throwaway CA; the settings are written where the CLI finds them).
    Dev {
        /// The master's address (agents, operators and `muster status` use it).
        #[arg(long, default_value = "127.0.0.1:5050")]
        listen: String,
        /// The agent's address.
        #[arg(long, default_value = "127.0.0.1:5051")]
        agent_listen: String,
        /// Keep data (and the certificates and token) here instead of a temporary dir
        /// removed on exit.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Scheduler workers in the master; 0 leaves scheduling to workers in other programs
        /// (see examples/custom_scheduler.rs).
        #[arg(long, default_value_t = 2)]
        workers: usize,
    },
    /// Show the cluster: the leader, agents with their tasks, frameworks.
    Status {
        /// Answer from the master given, whatever its role, without confirming leadership
        /// (faster, and works without a quorum; may be behind: says by how much)
        #[arg(long)]
        stale: bool,
    },
    /// Run, inspect and stop jobs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// List evaluations.
    Eval {
        #[command(subcommand)]
        command: EvalCommand,
    },
    /// Agents: list them, drain one, set whether one takes new tasks.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Follow what changes on the leader — jobs, evaluations, tasks, agents — as it happens
    /// (Nomad's event stream), until interrupted.
    Events {
        /// Resume after this index of the leader's stream (0: every event still kept).
        #[arg(long, default_value_t = 0)]
        index: u64,
        /// Only this topic (job, evaluation, task, agent); repeat for several.
        #[arg(long = "topic")]
        topics: Vec<String>,
    },
    /// Make a cluster CA and certificates for masters, agents and clients.
    Tls {
        #[command(subcommand)]
        command: TlsCommand,
    },
    /// Bootstrap ACLs; create, list and delete tokens.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Cluster operations: registry snapshots.
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
    },
}

#[derive(Debug, Subcommand)]
enum EvalCommand {
    /// Evaluations, newest first: every job's, or one's.
    List {
        /// Only this job's.
        #[arg(long, default_value = "")]
        job: String,
        /// At most this many (the master caps it at 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Answer from the first master that answers, whatever its role; may be behind: says
        /// by how much
        #[arg(long)]
        stale: bool,
    },
}

#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Every job (or those whose name starts with a prefix), with its tasks by state.
    List {
        /// Only jobs whose name starts with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Answer from the first master that answers, whatever its role (a standby knows the
        /// jobs, not their tasks); may be behind: says by how much
        #[arg(long)]
        stale: bool,
    },
    /// Submit the job in a TOML file (new or changed).
    Run {
        /// The job file (see examples/jobs/hello.toml).
        file: PathBuf,
    },
    /// Show a job: its tasks, where they run, and its evaluations.
    Status {
        /// The job's name.
        name: String,
        /// Answer from the master given, whatever its role (a standby knows the job and its
        /// evaluations, not its tasks); may be behind: says by how much
        #[arg(long)]
        stale: bool,
    },
    /// Print a task's stdout (or stderr), across the agent's rotations (Nomad's `alloc
    /// logs`): the job's task given with --task, else its running task (or its latest).
    Logs {
        /// The job's name.
        name: String,
        /// The task's id (see `muster job status NAME`).
        #[arg(long)]
        task: Option<String>,
        /// stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        /// Keep printing what the task writes until it ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// A dry run of `job run FILE` (Nomad's `job plan`): what the scheduler would place,
    /// stop and replace now. Nothing is submitted.
    Plan {
        /// The job file.
        file: PathBuf,
    },
    /// A job's versions, newest first: what changed from one to the next (Nomad's `job
    /// history`).
    History {
        /// The job's name.
        name: String,
        /// Answer from the master given, whatever its role; may be behind: says by how much
        #[arg(long)]
        stale: bool,
    },
    /// Stop a job's tasks.
    Stop {
        /// The job's name.
        name: String,
    },
}

/// The cluster state: linearizable from the leader (following a standby's hint), or with
/// `stale` from the master given, as it has it.
pub(crate) async fn read_state(
    connection: &Connection,
    stale: bool,
) -> anyhow::Result<pb::ClusterState> {
    connection
        .read(stale, |mut client| async move {
            client.get_state(pb::GetStateRequest { stale }).await
        })
        .await
}

/// One line saying how stale a stale read may be; nothing for a linearizable one.
pub(crate) fn staleness(read: Option<&pb::ReadInfo>) -> Option<String> {
    let read = read.filter(|r| r.stale)?;
    let contact = match read.last_contact_ms {
        0 => "it leads".to_owned(),
        u64::MAX => "it has not heard from a leader".to_owned(),
        ms => format!(
            "last heard from the leader {} ago",
            humantime::format_duration(std::time::Duration::from_millis(ms))
        ),
    };
    Some(format!(
        "stale read: registry index {}, {contact}{}",
        read.applied_index,
        if read.known_leader {
            ""
        } else {
            ", no leader known"
        }
    ))
}

async fn job(connection: &Connection, command: JobCommand, format: Format) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::Run { file } => {
            let spec = job_file::read(&file)?;
            let name = spec.name.clone();
            let reply = connection
                .at_leader(|mut client| {
                    let job = Some(spec.clone());
                    async move { client.submit_job(pb::SubmitJobRequest { job }).await }
                })
                .await?;
            if format.is_json() {
                return print_json(&muster_api::Submitted::from(reply));
            }
            writeln!(
                out,
                "job {name} submitted (version {}, evaluation {})",
                reply.version, reply.eval_id
            )?;
        }
        JobCommand::Logs {
            name,
            task,
            stderr,
            follow,
        } => {
            drop(out);
            return job_logs(connection, &name, task, stderr, follow, format).await;
        }
        JobCommand::Plan { file } => {
            let spec = job_file::read(&file)?;
            let plan = connection
                .at_leader(|mut client| {
                    let job = Some(spec.clone());
                    async move { client.plan_job(pb::SubmitJobRequest { job }).await }
                })
                .await?;
            let plan = muster_api::JobPlan::from(plan);
            if format.is_json() {
                drop(out);
                return print_json(&plan);
            }
            writeln!(
                out,
                "job {} would be version {}: {} to place, {} to stop, {} replaced",
                spec.name,
                plan.version,
                plan.place.len(),
                plan.stop.len(),
                plan.replaced.len()
            )?;
            for task in &plan.place {
                writeln!(out, "  + {} on {}", task.name, task.agent_id)?;
            }
            for task in &plan.stop {
                writeln!(
                    out,
                    "  - {} on {} ({})",
                    task.name, task.agent_id, task.task_id
                )?;
            }
            for line in &plan.unplaced {
                writeln!(out, "  ! does not fit: {line}")?;
            }
        }
        JobCommand::History { name, stale } => {
            let list = connection
                .read(stale, |mut client| {
                    let name = name.clone();
                    async move {
                        client
                            .job_versions(pb::JobStatusRequest { name, stale })
                            .await
                    }
                })
                .await?;
            let doc = muster_api::JobVersions::from(list);
            if format.is_json() {
                drop(out);
                return print_json(&doc);
            }
            if doc.read.stale {
                writeln!(out, "stale read: registry index {}", doc.read.applied_index)?;
            }
            for (i, version) in doc.versions.iter().enumerate() {
                let groups: Vec<String> = version
                    .job
                    .groups
                    .iter()
                    .map(|g| {
                        format!(
                            "{} x{} ({} {})",
                            g.name,
                            g.count,
                            g.command,
                            g.args.join(" ")
                        )
                    })
                    .collect();
                writeln!(
                    out,
                    "version {}{}{}: {}",
                    version.version,
                    if i == 0 { " (current)" } else { "" },
                    if version.stopped { ", stopped" } else { "" },
                    groups.join("; ")
                )?;
                if let Some(older) = doc.versions.get(i + 1) {
                    for change in job_changes(&older.job, &version.job) {
                        writeln!(out, "    {change}")?;
                    }
                }
            }
        }
        JobCommand::List { prefix, stale } => {
            drop(out);
            return list_command::jobs(connection, prefix, stale, format).await;
        }
        JobCommand::Stop { name } => {
            let reply = connection
                .at_leader(|mut client| {
                    let name = name.clone();
                    async move { client.stop_job(pb::StopJobRequest { name }).await }
                })
                .await?;
            if format.is_json() {
                return print_json(&muster_api::Submitted::from(reply));
            }
            writeln!(out, "job {name} stopping (evaluation {})", reply.eval_id)?;
        }
        JobCommand::Status { name, stale } => {
            let status = connection
                .read(stale, |mut client| {
                    let name = name.clone();
                    async move {
                        client
                            .job_status(pb::JobStatusRequest { name, stale })
                            .await
                    }
                })
                .await?;
            if format.is_json() {
                return print_json(&muster_api::JobDetail::from(status));
            }
            if let Some(line) = staleness(status.read.as_ref()) {
                writeln!(out, "{line}")?;
            }
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

/// What changed from `older` to `newer`, one line each (`group web: count 2 -> 3`).
fn job_changes(older: &muster_api::JobSpec, newer: &muster_api::JobSpec) -> Vec<String> {
    let mut changes = Vec::new();
    if older.priority != newer.priority {
        changes.push(format!("priority {} -> {}", older.priority, newer.priority));
    }
    for group in &newer.groups {
        match older.groups.iter().find(|g| g.name == group.name) {
            None => changes.push(format!("group {} added", group.name)),
            Some(before) if before != group => {
                let mut what = Vec::new();
                if before.count != group.count {
                    what.push(format!("count {} -> {}", before.count, group.count));
                }
                if before.command != group.command || before.args != group.args {
                    what.push("command changed".to_owned());
                }
                if before.env != group.env {
                    what.push("environment changed".to_owned());
                }
                if before.cpus != group.cpus || before.mem_mb != group.mem_mb {
                    what.push("resources changed".to_owned());
                }
                if what.is_empty() {
                    what.push("changed".to_owned());
                }
                changes.push(format!("group {}: {}", group.name, what.join(", ")));
            }
            Some(_) => {}
        }
    }
    for group in &older.groups {
        if !newer.groups.iter().any(|g| g.name == group.name) {
            changes.push(format!("group {} removed", group.name));
        }
    }
    changes
}

/// How often `job logs --follow` asks for more.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `muster job logs`: the task's output from its oldest kept byte, and with `follow` what it
/// writes next, until it ends. With `--json`, one [`muster_api::TaskLogs`] per piece.
async fn job_logs(
    connection: &Connection,
    name: &str,
    task: Option<String>,
    stderr: bool,
    follow: bool,
    format: Format,
) -> anyhow::Result<()> {
    let status = connection
        .at_leader(|mut client| {
            let name = name.to_owned();
            async move {
                client
                    .job_status(pb::JobStatusRequest { name, stale: false })
                    .await
            }
        })
        .await?;
    let tasks: Vec<_> = status
        .tasks
        .iter()
        .filter_map(|t| t.task.as_ref())
        .collect();
    let task_id = match task {
        Some(id) => {
            anyhow::ensure!(
                tasks.iter().any(|t| t.id == id),
                "job {name} has no task {id:?} (see `muster job status {name}`)"
            );
            id
        }
        None => tasks
            .iter()
            .find(|t| state_name(t.state) == "running")
            .or(tasks.last())
            .map(|t| t.id.clone())
            .with_context(|| format!("job {name} has no task yet"))?,
    };
    let mut offset = 0;
    loop {
        let chunk = connection
            .at_leader(|mut client| {
                let request = pb::ReadTaskOutput {
                    task_id: task_id.clone(),
                    stderr,
                    offset,
                    limit: 0,
                };
                async move { client.task_logs(request).await }
            })
            .await?;
        let more = chunk.next_offset > chunk.offset;
        let running = chunk.task_running;
        offset = chunk.next_offset;
        if format.is_json() {
            if more {
                print_json(&muster_api::TaskLogs::new(&task_id, stderr, chunk))?;
            }
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(&chunk.data)?;
            out.flush()?;
        }
        if more {
            continue;
        }
        if !follow || !running {
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// `muster events`: prints each event as it comes, as a line of text or of JSON (the HTTP
/// API's event document).
async fn events(
    connection: &Connection,
    index: u64,
    topics: Vec<String>,
    format: Format,
) -> anyhow::Result<()> {
    for topic in &topics {
        if !muster_api::EVENT_TOPICS.contains(&topic.as_str()) {
            anyhow::bail!("unknown topic {topic:?}: job, evaluation, task or agent");
        }
    }
    let mut stream = connection
        .at_leader(|mut client| {
            let request = pb::StreamEventsRequest {
                index,
                topics: topics.clone(),
            };
            async move { client.stream_events(request).await }
        })
        .await?;
    while let Some(event) = stream.message().await? {
        let payload: serde_json::Value =
            serde_json::from_str(&event.payload_json).unwrap_or(serde_json::Value::Null);
        let document = muster_api::Event {
            index: event.index,
            term: event.term,
            time_ms: event.time_ms,
            topic: event.topic,
            kind: event.kind,
            key: event.key,
            payload,
        };
        if format.is_json() {
            print_json(&document)?;
        } else {
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:>6}  {}  {:<20} {}  {}",
                document.index,
                when::rfc3339(document.time_ms),
                document.kind,
                document.key,
                event_summary(&document)
            )?;
            out.flush()?;
        }
    }
    Ok(())
}

/// The few fields of an event's payload worth a glance.
fn event_summary(event: &muster_api::Event) -> String {
    let field = |name: &str| {
        event.payload[name]
            .as_str()
            .map(str::to_owned)
            .or_else(|| event.payload[name].as_u64().map(|n| n.to_string()))
            .or_else(|| event.payload[name].as_bool().map(|b| b.to_string()))
    };
    let pairs: &[&str] = match event.topic.as_str() {
        "task" => &["state", "agent_id", "exit_code"],
        "evaluation" => &["job", "status", "triggered_by"],
        "job" => &["version", "stopped"],
        _ => &["status"],
    };
    pairs
        .iter()
        .filter_map(|name| field(name).map(|value| format!("{name}={value}")))
        .collect::<Vec<_>>()
        .join(" ")
}

fn state_name(state: i32) -> String {
    TaskState::try_from(state).map_or_else(|_| state.to_string(), |s| s.name().to_owned())
}

async fn status(connection: &Connection, stale: bool, format: Format) -> anyhow::Result<()> {
    let state = read_state(connection, stale).await?;
    if format.is_json() {
        return print_json(&muster_api::ClusterStatus::from(&state));
    }
    let mut out = std::io::stdout().lock();
    if let Some(line) = staleness(state.read.as_ref()) {
        writeln!(out, "{line}")?;
    }
    writeln!(
        out,
        "leader {} (term {}){}",
        state.leader,
        state.term,
        if state.recovering { ", recovering" } else { "" }
    )?;
    writeln!(
        out,
        "security: {}",
        if state.insecure {
            "INSECURE (--insecure: no TLS, no roles, no tokens)"
        } else {
            "mutual TLS, roles, ACL tokens"
        }
    )?;
    print_agents(&mut out, &state)?;
    if !state.frameworks.is_empty() {
        let names: Vec<&str> = state.frameworks.iter().map(|f| f.id.as_str()).collect();
        writeln!(out, "frameworks: {}", names.join(", "))?;
    }
    Ok(())
}

/// The agents of `state`: a count, a table of the connected and disconnected ones with their
/// tasks, and the unreachable ones (`muster status`, `muster agent list`).
pub(crate) fn print_agents(out: &mut impl Write, state: &pb::ClusterState) -> anyhow::Result<()> {
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
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  {:<13} {:<9}  SCHEDULING",
            "ID", "HOSTNAME", "ADDRESS", "CPUS", "MEM MB", "TASKS", "ISOLATION", "CONNECTED"
        )?;
    }
    for agent in &state.agents {
        let info = agent.info.clone().unwrap_or_default();
        let resources = info.resources.unwrap_or_default();
        let isolation = info
            .attributes
            .get(muster::agent::ISOLATION_ATTRIBUTE)
            .map_or("?", String::as_str);
        let scheduling = muster_api::AgentScheduling::new(&agent.id, agent.scheduling.as_ref());
        writeln!(
            out,
            "  {:<12} {:<20} {:<28} {:>6} {:>8} {:>6}  {:<13} {:<9}  {}",
            agent.id,
            info.hostname,
            info.address,
            resources.cpus,
            resources.mem_mb,
            agent.tasks.len(),
            isolation,
            agent.connected,
            agent_command::describe(&scheduling)
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
            "  unreachable {} since {}",
            agent.id,
            when::when(agent.marked_at_ms)
        )?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    muster_launch::init_logging();
    let target = cli.target;
    let format = Format::from_flag(cli.json);
    let result = muster_launch::block_on(async move {
        match cli.command {
            Command::Dev {
                listen,
                agent_listen,
                data_dir,
                workers,
            } => {
                dev::run(DevOptions {
                    listen,
                    agent_listen,
                    data_dir,
                    workers,
                })
                .await
            }
            Command::Tls { command } => tls_command::run(command),
            Command::Status { stale } => status(&target.resolve()?, stale, format).await,
            Command::Events { index, topics } => {
                events(&target.resolve()?, index, topics, format).await
            }
            Command::Job { command } => job(&target.resolve()?, command, format).await,
            Command::Eval {
                command: EvalCommand::List { job, limit, stale },
            } => list_command::evals(&target.resolve()?, job, limit, stale, format).await,
            Command::Agent { command } => {
                agent_command::run(&target.resolve()?, command, format).await
            }
            Command::Acl { command } => acl_command::run(&target.resolve()?, command, format).await,
            Command::Operator { command } => {
                operator_command::run(&target.resolve()?, command, format).await
            }
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
