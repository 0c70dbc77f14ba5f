//! `muster job`: submit a job file (`run`) or see what it would change (`plan`), list jobs
//! (`list`), show one (`status`) and its versions (`history`), print a task's output (`logs`),
//! stop a job (`stop`), and make a new version of one it holds (`scale`, `revert`: see
//! `job_edit_command`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Subcommand;
use muster::model::{Evaluation, SchedulerType};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;

use crate::connection::Connection;
use crate::output::{Format, print_json, staleness, state_name};
use crate::{job_edit_command, job_file, list_command};

/// `muster job ...`
#[derive(Debug, Subcommand)]
pub(crate) enum JobCommand {
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
    /// Set one group's count (Nomad's `job scale`): the job as it is now, with that count,
    /// submitted as a new version.
    Scale {
        /// The job's name.
        name: String,
        /// The group to scale.
        group: String,
        /// Its new count.
        count: u32,
    },
    /// Submit an earlier version of a job again, as a new version (Nomad's `job revert`;
    /// `job history NAME` lists the versions kept).
    Revert {
        /// The job's name.
        name: String,
        /// The version to go back to.
        version: u64,
    },
}

/// Runs `muster job ...` against `connection`.
pub(crate) async fn run(
    connection: &Connection,
    command: JobCommand,
    format: Format,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        JobCommand::Run { file } => {
            let spec = job_file::read(&file, &connection.namespace)?;
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
            let spec = job_file::read(&file, &connection.namespace)?;
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
            for task in &plan.preempt {
                writeln!(
                    out,
                    "  x {} on {} ({}) preempted: its job's priority is lower",
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
                    let namespace = connection.namespace.clone();
                    async move {
                        client
                            .job_versions(pb::JobStatusRequest {
                                name,
                                stale,
                                namespace,
                            })
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
        JobCommand::Scale { name, group, count } => {
            drop(out);
            return job_edit_command::scale(connection, &name, &group, count, format).await;
        }
        JobCommand::Revert { name, version } => {
            drop(out);
            return job_edit_command::revert(connection, &name, version, format).await;
        }
        JobCommand::List { prefix, stale } => {
            drop(out);
            return list_command::jobs(connection, prefix, stale, format).await;
        }
        JobCommand::Stop { name } => {
            let reply = connection
                .at_leader(|mut client| {
                    let name = name.clone();
                    let namespace = connection.namespace.clone();
                    async move {
                        client
                            .stop_job(pb::StopJobRequest { name, namespace })
                            .await
                    }
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
                    let namespace = connection.namespace.clone();
                    async move {
                        client
                            .job_status(pb::JobStatusRequest {
                                name,
                                stale,
                                namespace,
                            })
                            .await
                    }
                })
                .await?;
            let deployment = latest_deployment(connection, &name, stale).await?;
            if format.is_json() {
                let mut doc = muster_api::JobDetail::from(status);
                doc.deployment = deployment;
                return print_json(&doc);
            }
            if let Some(line) = staleness(status.read.as_ref()) {
                writeln!(out, "{line}")?;
            }
            let spec = status.job.unwrap_or_default();
            writeln!(
                out,
                "job {} in namespace {} ({}, priority {}, version {}){}",
                spec.name,
                list_command::namespace_name(&spec.namespace),
                SchedulerType::try_from(spec.scheduler).map_or("?", SchedulerType::name),
                spec.priority,
                status.version,
                if status.stopped { ", stopped" } else { "" }
            )?;
            if let Some(d) = &deployment {
                writeln!(out, "{}", deployment_line(d))?;
            }
            writeln!(out, "tasks:")?;
            if status.tasks.is_empty() {
                writeln!(out, "  (none yet)")?;
            }
            for task in &status.tasks {
                let Some(t) = &task.task else { continue };
                writeln!(
                    out,
                    "  {:<28} {:<10} {:<9} on {}  (id {}){}",
                    t.name,
                    state_name(t.state),
                    exit_words(t),
                    task.agent_id,
                    t.id,
                    health_words(t)
                )?;
                if !t.message.is_empty() {
                    writeln!(out, "    {}", t.message)?;
                }
                if !t.ports.is_empty() {
                    let ports: Vec<String> = t
                        .ports
                        .iter()
                        .map(|p| format!("{}={}", p.label, p.port))
                        .collect();
                    writeln!(out, "    ports: {}", ports.join(" "))?;
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

/// The newest deployment of job `name` (in the connection's namespace), if it has one.
async fn latest_deployment(
    connection: &Connection,
    name: &str,
    stale: bool,
) -> anyhow::Result<Option<muster_api::DeploymentInfo>> {
    let list = connection
        .read(stale, |mut client| {
            let request = pb::ListDeploymentsRequest {
                namespace: connection.namespace.clone(),
                job: name.to_owned(),
                id: String::new(),
                stale,
            };
            async move { client.list_deployments(request).await }
        })
        .await?;
    Ok(list
        .deployments
        .into_iter()
        .next()
        .map(muster_api::DeploymentInfo::from))
}

/// `job status`'s line of the job's latest deployment: `deployment web.v3: running
/// (replacing tasks)`.
fn deployment_line(d: &muster_api::DeploymentInfo) -> String {
    if d.description.is_empty() {
        format!("deployment {}: {}", d.id, d.status)
    } else {
        format!("deployment {}: {} ({})", d.id, d.status, d.description)
    }
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
            let namespace = connection.namespace.clone();
            async move {
                client
                    .job_status(pb::JobStatusRequest {
                        name,
                        stale: false,
                        namespace,
                    })
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
        None => task_to_read(&tasks).with_context(|| format!("job {name} has no task yet"))?,
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

/// The task whose output `muster job logs` shows when none is named: a running one, else the
/// last the status lists.
fn task_to_read(tasks: &[&model_pb::Task]) -> Option<String> {
    tasks
        .iter()
        .find(|t| t.state == model_pb::TaskState::Running as i32)
        .or(tasks.last())
        .map(|t| t.id.clone())
}

/// A task's exit in words (`exit 3`), or nothing while it has not ended: a running task has no
/// exit code to show.
/// What a task's checks and restarts say, for `job status`: `  healthy, 2 restarts`, or
/// nothing for a task without checks that never restarted.
fn health_words(task: &muster_proto::model::Task) -> String {
    let mut words = Vec::new();
    let health = muster_model::TaskHealth::from_wire(task.health);
    if health != muster_model::TaskHealth::None {
        words.push(health.as_str().to_owned());
    }
    match task.restarts {
        0 => {}
        1 => words.push("1 restart".to_owned()),
        n => words.push(format!("{n} restarts")),
    }
    if words.is_empty() {
        String::new()
    } else {
        format!("  {}", words.join(", "))
    }
}

fn exit_words(task: &muster_proto::model::Task) -> String {
    let ended = muster_model::TaskState::try_from(task.state).is_ok_and(|s| s.is_terminal());
    if ended {
        format!("exit {}", task.exit_code)
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ended_task_shows_an_exit_code() {
        let task = |state: model_pb::TaskState, exit_code| model_pb::Task {
            state: state as i32,
            exit_code,
            ..model_pb::Task::default()
        };
        assert_eq!(exit_words(&task(model_pb::TaskState::Running, 0)), "");
        let mut checked = task(model_pb::TaskState::Running, 0);
        assert_eq!(health_words(&checked), "");
        checked.health = model_pb::TaskHealth::Healthy as i32;
        checked.restarts = 2;
        assert_eq!(health_words(&checked), "  healthy, 2 restarts");
        assert_eq!(
            exit_words(&task(model_pb::TaskState::Finished, 0)),
            "exit 0"
        );
        assert_eq!(exit_words(&task(model_pb::TaskState::Failed, 3)), "exit 3");
    }

    #[test]
    fn logs_read_a_running_task_before_the_last_listed() {
        let task = |id: &str, state: model_pb::TaskState| model_pb::Task {
            id: id.into(),
            state: state as i32,
            ..model_pb::Task::default()
        };
        let running = task("web.server[0]-a", model_pb::TaskState::Running);
        let finished = task("web.server[0]-b", model_pb::TaskState::Finished);
        assert_eq!(
            task_to_read(&[&running, &finished]).as_deref(),
            Some("web.server[0]-a")
        );
        assert_eq!(
            task_to_read(&[&finished]).as_deref(),
            Some("web.server[0]-b")
        );
        assert_eq!(task_to_read(&[]), None);
    }

    fn group(name: &str, count: u32) -> muster_api::GroupSpec {
        muster_api::GroupSpec {
            name: name.into(),
            count,
            command: "sleep".into(),
            args: vec!["60".into()],
            cpus: 0.5,
            mem_mb: 64,
            ..muster_api::GroupSpec::default()
        }
    }

    #[test]
    fn a_versions_changes_are_one_line_each() {
        let older = muster_api::JobSpec {
            name: "web".into(),
            priority: 50,
            groups: vec![group("web", 2), group("cache", 1), group("old", 1)],
            ..muster_api::JobSpec::default()
        };
        let mut cache = group("cache", 1);
        cache.args = vec!["61".into()];
        cache.mem_mb = 128;
        let newer = muster_api::JobSpec {
            priority: 60,
            groups: vec![group("web", 3), cache, group("new", 1)],
            ..older.clone()
        };
        assert_eq!(
            job_changes(&older, &newer),
            [
                "priority 50 -> 60",
                "group web: count 2 -> 3",
                "group cache: command changed, resources changed",
                "group new added",
                "group old removed",
            ]
        );
        assert!(job_changes(&older, &older).is_empty());
    }

    #[test]
    fn a_jobs_latest_deployment_is_one_line() {
        let mut d = muster_api::DeploymentInfo {
            id: "web.v3".into(),
            job: "web".into(),
            namespace: "default".into(),
            job_version: 3,
            status: "running".into(),
            description: "replacing tasks".into(),
            groups: Vec::new(),
            created_ms: 0,
            progress_by_ms: 0,
            reverted_to: None,
        };
        assert_eq!(
            deployment_line(&d),
            "deployment web.v3: running (replacing tasks)"
        );
        d.description.clear();
        assert_eq!(deployment_line(&d), "deployment web.v3: running");
    }
}
