//! [`AgentInfo`] to and from `muster.model.v1.AgentInfo`; [`AgentScheduling`] and
//! [`DrainPhase`] to and from theirs.

use muster_proto::model as pb;

use crate::agent::{AgentInfo, AgentScheduling, Drain, DrainPhase};
use crate::convert::{required, sorted, unsorted};
use crate::error::FieldError;

impl From<AgentInfo> for pb::AgentInfo {
    fn from(info: AgentInfo) -> Self {
        pb::AgentInfo {
            hostname: info.hostname,
            address: info.address,
            resources: Some(info.resources.into()),
            attributes: unsorted(info.attributes),
            dynamic_ports: Some(info.dynamic_ports.into()),
        }
    }
}

impl TryFrom<pb::AgentInfo> for AgentInfo {
    type Error = FieldError;

    fn try_from(proto: pb::AgentInfo) -> Result<Self, FieldError> {
        Ok(AgentInfo {
            hostname: proto.hostname,
            address: proto.address,
            resources: required(proto.resources, "resources")?,
            attributes: sorted(proto.attributes),
            dynamic_ports: crate::convert::ports::range_or_default(
                proto.dynamic_ports,
                "dynamic_ports",
            )?,
            // Never taken from the wire: the master sets it from the verified connection.
            identity: String::new(),
        })
    }
}

impl From<AgentScheduling> for pb::AgentScheduling {
    fn from(scheduling: AgentScheduling) -> Self {
        pb::AgentScheduling {
            ineligible: !scheduling.eligible,
            drain: scheduling.drain.map(|drain| pb::Drain {
                started_ms: drain.started_ms,
                deadline_ms: drain.deadline_ms.unwrap_or(0),
                past_deadline: drain.past_deadline,
            }),
            drained_at_ms: scheduling.drained_at_ms,
        }
    }
}

impl From<pb::AgentScheduling> for AgentScheduling {
    fn from(proto: pb::AgentScheduling) -> Self {
        AgentScheduling {
            eligible: !proto.ineligible,
            drain: proto.drain.map(|drain| Drain {
                started_ms: drain.started_ms,
                deadline_ms: (drain.deadline_ms != 0).then_some(drain.deadline_ms),
                past_deadline: drain.past_deadline,
            }),
            drained_at_ms: proto.drained_at_ms,
        }
    }
}

impl From<DrainPhase> for pb::DrainPhase {
    fn from(phase: DrainPhase) -> Self {
        match phase {
            DrainPhase::None => pb::DrainPhase::None,
            DrainPhase::Migrating => pb::DrainPhase::Migrating,
            DrainPhase::Stopping => pb::DrainPhase::Stopping,
        }
    }
}

impl From<pb::DrainPhase> for DrainPhase {
    fn from(phase: pb::DrainPhase) -> Self {
        match phase {
            pb::DrainPhase::None => DrainPhase::None,
            pb::DrainPhase::Migrating => DrainPhase::Migrating,
            pb::DrainPhase::Stopping => DrainPhase::Stopping,
        }
    }
}

#[cfg(test)]
mod scheduling_tests {
    use super::*;

    #[test]
    fn scheduling_round_trips_and_the_wire_default_is_eligible() {
        assert_eq!(
            AgentScheduling::from(pb::AgentScheduling::default()),
            AgentScheduling::default()
        );
        let draining = AgentScheduling {
            eligible: false,
            drain: Some(Drain {
                started_ms: 5,
                deadline_ms: Some(9),
                past_deadline: true,
            }),
            drained_at_ms: 0,
        };
        let wire = pb::AgentScheduling::from(draining.clone());
        assert_eq!(AgentScheduling::from(wire), draining);
        assert_eq!(draining.phase(), DrainPhase::Stopping);
        let without_deadline = AgentScheduling {
            drain: Some(Drain {
                started_ms: 5,
                deadline_ms: None,
                past_deadline: false,
            }),
            ..draining
        };
        assert_eq!(
            AgentScheduling::from(pb::AgentScheduling::from(without_deadline.clone())),
            without_deadline
        );
        assert_eq!(without_deadline.phase(), DrainPhase::Migrating);
    }
}
