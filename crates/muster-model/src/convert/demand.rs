//! [`Demand`] to and from `muster.model.v1.Demand`.

use muster_proto::model as pb;

use crate::convert::{all, each, required};
use crate::demand::Demand;
use crate::error::FieldError;

impl From<Demand> for pb::Demand {
    fn from(demand: Demand) -> Self {
        pb::Demand {
            resources: Some(demand.resources.into()),
            constraints: all(demand.constraints),
            over_quota: demand.over_quota.unwrap_or_default(),
            gang: demand.gang,
            gang_fitting: demand.gang_fitting,
        }
    }
}

impl TryFrom<pb::Demand> for Demand {
    type Error = FieldError;

    fn try_from(proto: pb::Demand) -> Result<Self, FieldError> {
        Ok(Demand {
            resources: required(proto.resources, "resources")?,
            constraints: each(proto.constraints, "constraints")?,
            over_quota: Some(proto.over_quota).filter(|reason| !reason.is_empty()),
            gang: proto.gang,
            gang_fitting: proto.gang_fitting,
        })
    }
}
