//! [`AgentInfo`] to and from `muster.model.v1.AgentInfo`.

use muster_proto::model as pb;

use crate::agent::AgentInfo;
use crate::convert::{required, sorted, unsorted};
use crate::error::FieldError;

impl From<AgentInfo> for pb::AgentInfo {
    fn from(info: AgentInfo) -> Self {
        pb::AgentInfo {
            hostname: info.hostname,
            address: info.address,
            resources: Some(info.resources.into()),
            attributes: unsorted(info.attributes),
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
            // Never taken from the wire: the master sets it from the verified connection.
            identity: String::new(),
        })
    }
}
