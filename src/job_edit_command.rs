//! `muster job scale` and `muster job revert`: a new version of a job made from one the
//! cluster holds (its current version with one group's count changed, or an earlier version
//! again), submitted as `job run` submits a file.
//!
//! Each reads the job from the leader and submits the new version there: a change another
//! client submits in between is replaced by this one, as a `job run` of a file would replace
//! it.

use std::io::Write;

use anyhow::{Context as _, bail};
use muster::model::SchedulerType;
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;

use crate::connection::Connection;
use crate::output::{Format, print_json};

/// `job`'s current version with `group`'s count set to `count`.
///
/// # Errors
/// The job is a system job (one task per agent), or has no such group.
pub(crate) fn scaled(
    mut job: model_pb::Job,
    group: &str,
    count: u32,
) -> anyhow::Result<model_pb::Job> {
    if job.scheduler == model_pb::SchedulerType::System as i32 {
        bail!(
            "job {} is a system job: it runs one task per eligible agent, whatever a count says",
            job.name
        );
    }
    if job.stopped {
        bail!(
            "job {} is stopped: scaling it would start it again (run it, or revert to a \
             version, to start it)",
            job.name
        );
    }
    let names: Vec<String> = job.groups.iter().map(|g| g.name.clone()).collect();
    let Some(found) = job.groups.iter_mut().find(|g| g.name == group) else {
        bail!(
            "job {} has no group {group:?} (its groups: {})",
            job.name,
            names.join(", ")
        );
    };
    found.count = count;
    Ok(job)
}

/// Version `version` of a job, from its kept `versions` (newest first), to submit again.
///
/// # Errors
/// The version is the current one, or is not kept.
pub(crate) fn reverted(
    name: &str,
    versions: pb::JobVersionList,
    version: u64,
) -> anyhow::Result<model_pb::Job> {
    let current = versions.versions.first().map(|v| v.version);
    if current == Some(version) {
        bail!("version {version} is job {name}'s current version: nothing to revert to");
    }
    let kept: Vec<String> = versions
        .versions
        .iter()
        .map(|v| v.version.to_string())
        .collect();
    versions
        .versions
        .into_iter()
        .find(|v| v.version == version)
        .with_context(|| {
            format!(
                "job {name} has no version {version} kept (it keeps {})",
                kept.join(", ")
            )
        })
}

/// `muster job scale NAME GROUP COUNT`.
pub(crate) async fn scale(
    connection: &Connection,
    name: &str,
    group: &str,
    count: u32,
    format: Format,
) -> anyhow::Result<()> {
    let status = connection
        .at_leader(|mut client| {
            let request = pb::JobStatusRequest {
                name: name.to_owned(),
                stale: false,
                namespace: connection.namespace.clone(),
            };
            async move { client.job_status(request).await }
        })
        .await?;
    let mut job = status
        .job
        .with_context(|| format!("the master sent job {name} without its definition"))?;
    job.stopped |= status.stopped;
    if SchedulerType::try_from(job.scheduler).is_err() {
        bail!("job {name} has a scheduler type this CLI does not know");
    }
    let job = scaled(job, group, count)?;
    submit(
        connection,
        job,
        format,
        &format!("group {group} of job {name} scaled to {count}"),
    )
    .await
}

/// `muster job revert NAME VERSION`.
pub(crate) async fn revert(
    connection: &Connection,
    name: &str,
    version: u64,
    format: Format,
) -> anyhow::Result<()> {
    let versions = connection
        .at_leader(|mut client| {
            let request = pb::JobStatusRequest {
                name: name.to_owned(),
                stale: false,
                namespace: connection.namespace.clone(),
            };
            async move { client.job_versions(request).await }
        })
        .await?;
    let job = reverted(name, versions, version)?;
    submit(
        connection,
        job,
        format,
        &format!("job {name} reverted to version {version}"),
    )
    .await
}

/// Submits `job` at the leader and says `done` with its new version.
async fn submit(
    connection: &Connection,
    job: model_pb::Job,
    format: Format,
    done: &str,
) -> anyhow::Result<()> {
    let reply = connection
        .at_leader(|mut client| {
            let job = Some(job.clone());
            async move { client.submit_job(pb::SubmitJobRequest { job }).await }
        })
        .await?;
    if format.is_json() {
        return print_json(&muster_api::Submitted::from(reply));
    }
    writeln!(
        std::io::stdout().lock(),
        "{done}: version {} (evaluation {})",
        reply.version,
        reply.eval_id
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(scheduler: model_pb::SchedulerType) -> model_pb::Job {
        model_pb::Job {
            name: "web".into(),
            scheduler: scheduler as i32,
            groups: vec![model_pb::TaskGroup {
                name: "fe".into(),
                count: 3,
                ..model_pb::TaskGroup::default()
            }],
            ..model_pb::Job::default()
        }
    }

    #[test]
    fn scaling_changes_one_groups_count_and_names_what_is_wrong() -> anyhow::Result<()> {
        let scaled_job = scaled(job(model_pb::SchedulerType::Service), "fe", 5)?;
        assert_eq!(scaled_job.groups[0].count, 5);
        let missing = scaled(job(model_pb::SchedulerType::Service), "be", 5).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("no group \"be\" (its groups: fe)"),
            "{missing}"
        );
        let system = scaled(job(model_pb::SchedulerType::System), "fe", 5).unwrap_err();
        assert!(system.to_string().contains("system job"), "{system}");
        let mut stopped = job(model_pb::SchedulerType::Service);
        stopped.stopped = true;
        let stopped = scaled(stopped, "fe", 5).unwrap_err();
        assert!(stopped.to_string().contains("is stopped"), "{stopped}");
        Ok(())
    }

    #[test]
    fn reverting_takes_a_kept_earlier_version() -> anyhow::Result<()> {
        let version = |version: u64, count: u32| {
            let mut job = job(model_pb::SchedulerType::Service);
            job.groups[0].count = count;
            job.version = version;
            job
        };
        let versions = || pb::JobVersionList {
            versions: vec![version(3, 9), version(2, 4), version(1, 1)],
            ..pb::JobVersionList::default()
        };
        assert_eq!(reverted("web", versions(), 2)?.groups[0].count, 4);
        let current = reverted("web", versions(), 3).unwrap_err();
        assert!(current.to_string().contains("current version"), "{current}");
        let gone = reverted("web", versions(), 7).unwrap_err();
        assert!(gone.to_string().contains("keeps 3, 2, 1"), "{gone}");
        Ok(())
    }
}
