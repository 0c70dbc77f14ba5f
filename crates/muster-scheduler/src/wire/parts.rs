//! The snapshot's small parts on the wire (quotas, deployments, the preemption setting),
//! shared by the whole snapshot (`Scheduling/Snapshot`) and the watch's changes
//! (`Scheduling/WatchCluster`).

use std::collections::BTreeMap;

use muster_model::convert::each;
use muster_model::{FieldError, PreemptionConfig, Quota};
use muster_proto::scheduling as pb;

/// A quota as the wire carries it.
pub(crate) fn quota_to_wire(quota: Quota) -> pb::Quota {
    pb::Quota {
        cpus: quota.cpus,
        mem_mb: quota.mem_mb,
        tasks: quota.tasks,
    }
}

/// A quota from the wire: cpus, if limited, finite and not negative.
pub(crate) fn quota_from_wire(proto: pb::Quota, field: &str) -> Result<Quota, FieldError> {
    if let Some(cpus) = proto.cpus
        && !(cpus.is_finite() && cpus >= 0.0)
    {
        return Err(FieldError::new(
            format!("{field}.cpus"),
            format!("{cpus} is not a number of cpus (finite, 0 or more)"),
        ));
    }
    Ok(Quota {
        cpus: proto.cpus,
        mem_mb: proto.mem_mb,
        tasks: proto.tasks,
    })
}

/// Deployments from the wire, by job.
pub(crate) fn deployments_from_wire(
    protos: Vec<muster_proto::model::Deployment>,
) -> Result<BTreeMap<String, muster_model::Deployment>, FieldError> {
    Ok(each::<muster_model::Deployment, _>(protos, "deployments")?
        .into_iter()
        .map(|d| (d.job.clone(), d))
        .collect())
}

/// The preemption setting from the wire; the default if it is missing.
pub(crate) fn preemption_from_wire(proto: Option<pb::PreemptionConfig>) -> PreemptionConfig {
    proto.map_or_else(PreemptionConfig::default, |p| PreemptionConfig {
        service: p.service,
        batch: p.batch,
        system: p.system,
    })
}
