//! Lists: `muster job list`, `muster eval list` and `muster agent list` (Nomad's `job status`
//! without a name, `eval list` and `node status`). Each reads linearizably from the leader, or
//! with `--stale` from the first master that answers.

use std::io::Write;

use muster::model::{Evaluation, SchedulerType};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;

use crate::connection::Connection;
use crate::output::{Format, print_json, staleness};
use crate::status_command;

/// `muster job list`: every job of the namespace (`-n '*'`: of every namespace the token may
/// read), or those whose name starts with `prefix`, one line each with its namespace.
pub(crate) async fn jobs(
    connection: &Connection,
    prefix: String,
    stale: bool,
    format: Format,
) -> anyhow::Result<()> {
    let list = connection
        .read(stale, |mut client| {
            let prefix = prefix.clone();
            let namespace = connection.namespace.clone();
            async move {
                client
                    .list_jobs(pb::ListJobsRequest {
                        stale,
                        prefix,
                        namespace,
                    })
                    .await
            }
        })
        .await?;
    if format.is_json() {
        return print_json(&muster_api::JobList::from(list));
    }
    let mut out = std::io::stdout().lock();
    if let Some(line) = staleness(list.read.as_ref()) {
        writeln!(out, "{line}")?;
    }
    if list.jobs.is_empty() {
        writeln!(out, "no jobs")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:<16} {:<8} {:>8} {:>7} {:<8} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>7} {:>5}",
        "NAME",
        "NAMESPACE",
        "TYPE",
        "PRIORITY",
        "VERSION",
        "STATUS",
        "DESIRED",
        "RUNNING",
        "STARTING",
        "FINISHED",
        "FAILED",
        "LOST",
        "UNKNOWN",
        "EVALS"
    )?;
    for job in &list.jobs {
        writeln!(
            out,
            "{:<24} {:<16} {:<8} {:>8} {:>7} {:<8} {:>7} {:>7} {:>8} {:>8} {:>6} {:>6} {:>7} {:>5}",
            job.name,
            namespace_name(&job.namespace),
            SchedulerType::try_from(job.scheduler).map_or("?", SchedulerType::name),
            job.priority,
            job.version,
            muster_api::job_status(job),
            job.desired,
            job.running,
            job.staging + job.starting,
            job.finished,
            job.failed,
            job.lost,
            job.unknown,
            job.evals_in_flight
        )?;
    }
    Ok(())
}

/// A namespace as the lists show it: `default` for the empty name the wire uses for it.
pub(crate) fn namespace_name(namespace: &str) -> &str {
    if namespace.is_empty() {
        "default"
    } else {
        namespace
    }
}

/// `muster eval list`: evaluations, newest first, of `job` (all jobs' if empty), up to
/// `limit`.
pub(crate) async fn evals(
    connection: &Connection,
    job: String,
    limit: u32,
    stale: bool,
    format: Format,
) -> anyhow::Result<()> {
    let list = connection
        .read(stale, |mut client| {
            let job = job.clone();
            let namespace = connection.namespace.clone();
            async move {
                client
                    .list_evaluations(pb::ListEvaluationsRequest {
                        stale,
                        job,
                        limit,
                        id: String::new(),
                        namespace,
                    })
                    .await
            }
        })
        .await?;
    if format.is_json() {
        return print_json(&muster_api::EvaluationList::from(list));
    }
    let mut out = std::io::stdout().lock();
    if let Some(line) = staleness(list.read.as_ref()) {
        writeln!(out, "{line}")?;
    }
    if list.evals.is_empty() {
        writeln!(out, "no evaluations")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<32} {:<16} {:<24} {:<9} {:>6} {:<28} DESCRIPTION",
        "ID", "NAMESPACE", "JOB", "STATUS", "INDEX", "TRIGGER"
    )?;
    let shown = list.evals.len();
    for eval in list.evals {
        writeln!(out, "{}", eval_line(eval))?;
    }
    if (shown as u64) < list.total {
        writeln!(
            out,
            "({shown} newest of {}; --limit shows more)",
            list.total
        )?;
    }
    Ok(())
}

/// One evaluation as a row of `muster eval list`.
fn eval_line(eval: model_pb::Evaluation) -> String {
    let id = eval.id.clone();
    match Evaluation::try_from(eval) {
        Ok(eval) => {
            let trigger = format!("{:?}", eval.trigger);
            let (namespace, job) = muster::model::split_job_id(&eval.job);
            format!(
                "{:<32} {:<16} {:<24} {:<9} {:>6} {:<28} {}",
                eval.id,
                namespace,
                job,
                eval.status.name(),
                eval.create_index,
                trigger,
                eval.status_description
            )
        }
        Err(e) => format!("{id:<32} (unreadable: {e})"),
    }
}

/// `muster agent list`: the agents and where they stand.
pub(crate) async fn agents(
    connection: &Connection,
    stale: bool,
    format: Format,
) -> anyhow::Result<()> {
    let state = status_command::read_state(connection, stale).await?;
    if format.is_json() {
        return print_json(&muster_api::AgentList::from(&state));
    }
    let mut out = std::io::stdout().lock();
    if let Some(line) = staleness(state.read.as_ref()) {
        writeln!(out, "{line}")?;
    }
    status_command::print_agents(&mut out, &state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evaluation_row_names_its_job_status_and_trigger() {
        let job = muster::model::Job::from_submitted(model_pb::Job {
            name: "web".into(),
            groups: vec![model_pb::TaskGroup {
                name: "main".into(),
                count: 1,
                command: "serve".into(),
                resources: Some(model_pb::Resources {
                    cpus: 0.5,
                    mem_mb: 64,
                }),
                ..model_pb::TaskGroup::default()
            }],
            ..model_pb::Job::default()
        })
        .expect("a valid job");
        let eval = muster::model::Evaluation::new(&job, muster::model::Trigger::JobRegister);
        let row = eval_line(eval.clone().into());
        assert!(row.starts_with(&eval.id.to_string()), "{row}");
        assert!(row.contains(" web "), "{row}");
        assert!(row.contains("pending"), "{row}");
        assert!(row.contains("JobRegister"), "{row}");
        let broken = eval_line(model_pb::Evaluation {
            id: "e1".into(),
            ..model_pb::Evaluation::default()
        });
        assert!(broken.contains("unreadable"), "{broken}");
    }
}
