//! `muster`: a one-process dev cluster (`muster dev`), a cluster's state (`muster status`),
//! jobs (`muster job run FILE`, `muster job status NAME`, `muster job stop NAME`,
//! `muster job list`), evaluations (`muster eval list`), agents (`muster agent list`), TLS
//! material (`muster tls`), ACL tokens and policies (`muster acl`), namespaces
//! (`muster namespace`) and registry snapshots (`muster operator snapshot save|restore`).
//!
//! This file is the grammar (the clap types) and the dispatch; each command group is
//! implemented in its own module: `dev`, `status_command`, `job_command`, `list_command`
//! (`job list`, `eval list`, `agent list`), `agent_command`, `events_command`, `tls_command`,
//! `acl_command`, `namespace_command` and `operator_command`. What they share: `connection`
//! (reaching a master), `output` (text or JSON), `when` (times) and `job_file` (job files).

mod acl_command;
mod agent_command;
mod connection;
mod deployment_command;
mod dev;
mod dev_settings;
mod events_command;
mod job_command;
mod job_edit_command;
mod job_file;
mod list_command;
mod monitor_command;
mod namespace_command;
mod operator_command;
mod output;
mod raft_command;
mod shell_command;
mod status_command;
mod tls_command;
mod when;

use std::path::PathBuf;
use std::process::ExitCode;

use acl_command::AclCommand;
use agent_command::AgentCommand;
use clap::{Parser, Subcommand};
use connection::Target;
use dev::DevOptions;
use job_command::JobCommand;
use namespace_command::NamespaceCommand;
use operator_command::OperatorCommand;
use output::Format;
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
    /// MUSTER_CLIENT_KEY, MUSTER_TOKEN), and the namespace (MUSTER_NAMESPACE).
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
    /// Stream a master's log as it happens, from a level of your choosing, without
    /// restarting it (operator write; `--json`: one JSON object a line).
    Monitor(monitor_command::MonitorArgs),
    /// Show the cluster: the leader, agents with their tasks, the jobs that own tasks.
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
    /// Deployments: list them, show one, promote its canaries, pause, resume or fail it.
    Deployment {
        #[command(subcommand)]
        command: deployment_command::DeploymentCommand,
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
    /// Bootstrap ACLs; create, list and delete tokens and policies.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Namespaces: create, change, list and delete them.
    Namespace {
        #[command(subcommand)]
        command: NamespaceCommand,
    },
    /// Cluster operations: registry snapshots.
    Operator {
        #[command(subcommand)]
        command: OperatorCommand,
    },
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write the man pages (muster.1, and one per subcommand) into a directory.
    Man {
        /// Where (made if missing).
        #[arg(long, value_name = "DIR", default_value = "man")]
        out_dir: PathBuf,
    },
}

/// `muster eval ...`
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
            Command::Status { stale } => {
                status_command::run(&target.resolve()?, stale, format).await
            }
            Command::Monitor(args) => monitor_command::run(&target.resolve()?, args, format).await,
            Command::Events { index, topics } => {
                events_command::run(&target.resolve()?, index, topics, format).await
            }
            Command::Job { command } => job_command::run(&target.resolve()?, command, format).await,
            Command::Deployment { command } => {
                deployment_command::run(&target.resolve()?, command, format).await
            }
            Command::Eval {
                command: EvalCommand::List { job, limit, stale },
            } => list_command::evals(&target.resolve()?, job, limit, stale, format).await,
            Command::Agent { command } => {
                agent_command::run(&target.resolve()?, command, format).await
            }
            Command::Acl { command } => acl_command::run(&target.resolve()?, command, format).await,
            Command::Namespace { command } => {
                namespace_command::run(&target.resolve()?, command, format).await
            }
            Command::Operator { command } => {
                operator_command::run(&target.resolve()?, command, format).await
            }
            Command::Completions { shell } => shell_command::completions::<Cli>(shell),
            Command::Man { out_dir } => {
                for path in shell_command::man_pages::<Cli>(&out_dir)? {
                    println!("{}", path.display());
                }
                Ok(())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of the output went away (`muster job list | head`): what it wanted, it
        // has.
        Err(e) if reader_gone(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` is a write to a pipe whose reader closed it.
fn reader_gone(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            || cause
                .downcast_ref::<serde_json::Error>()
                .and_then(|json| json.io_error_kind())
                == Some(std::io::ErrorKind::BrokenPipe)
    })
}
