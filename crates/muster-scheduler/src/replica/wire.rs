//! The watch's messages to and from the SDK's types, where the snapshot's conversions
//! (`crate::wire`) do not already serve.

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::FieldError;
use muster_proto::scheduling as pb;

use super::feed::Settings;
use crate::plan::TaskView;
use crate::wire::{deployments_from_wire, preemption_from_wire, quota_from_wire, quota_to_wire};

/// A task as the wire carries it.
pub(super) fn task_to_wire(task: &Arc<TaskView>) -> pb::TaskView {
    TaskView::clone(task).into()
}

/// The small parts of a snapshot as the wire carries them.
pub(super) fn settings_to_wire(settings: &Settings) -> pb::ClusterSettings {
    pb::ClusterSettings {
        held: settings.held.iter().cloned().collect(),
        quotas: settings
            .quotas
            .iter()
            .map(|(namespace, quota)| (namespace.clone(), quota_to_wire(quota.clone())))
            .collect(),
        deployments: settings
            .deployments
            .values()
            .cloned()
            .map(Into::into)
            .collect(),
        preemption: Some(pb::PreemptionConfig {
            service: settings.preemption.service,
            batch: settings.preemption.batch,
            system: settings.preemption.system,
        }),
    }
}

/// The small parts of a snapshot from the wire.
pub(super) fn settings_from_wire(proto: pb::ClusterSettings) -> Result<Settings, FieldError> {
    let mut quotas = BTreeMap::new();
    for (namespace, quota) in proto.quotas {
        let quota = quota_from_wire(quota, &format!("quotas[{namespace:?}]"))?;
        quotas.insert(namespace, quota);
    }
    Ok(Settings {
        held: proto.held.into_iter().collect(),
        quotas,
        deployments: deployments_from_wire(proto.deployments)?,
        preemption: preemption_from_wire(proto.preemption),
    })
}
