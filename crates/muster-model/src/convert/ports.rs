//! [`PortRequest`], [`AssignedPort`] and [`PortRange`] to and from their `muster.model.v1`
//! messages. A port off the wire must fit in 16 bits; a range must not end before it starts.

use muster_proto::model as pb;

use crate::error::FieldError;
use crate::ports::{AssignedPort, PortRange, PortRequest};

/// A port number off the wire; `zero_allowed` for a request's "dynamic".
fn port(value: u32, field: &str, zero_allowed: bool) -> Result<u16, FieldError> {
    u16::try_from(value)
        .ok()
        .filter(|&p| zero_allowed || p > 0)
        .ok_or_else(|| FieldError::new(field, format!("{value} is not a port (1..65535)")))
}

impl From<PortRequest> for pb::PortRequest {
    fn from(request: PortRequest) -> Self {
        pb::PortRequest {
            label: request.label,
            static_port: request.static_port.into(),
        }
    }
}

impl TryFrom<pb::PortRequest> for PortRequest {
    type Error = FieldError;

    fn try_from(proto: pb::PortRequest) -> Result<Self, FieldError> {
        Ok(PortRequest {
            label: proto.label,
            static_port: port(proto.static_port, "static_port", true)?,
        })
    }
}

impl From<AssignedPort> for pb::AssignedPort {
    fn from(assigned: AssignedPort) -> Self {
        pb::AssignedPort {
            label: assigned.label,
            port: assigned.port.into(),
        }
    }
}

impl TryFrom<pb::AssignedPort> for AssignedPort {
    type Error = FieldError;

    fn try_from(proto: pb::AssignedPort) -> Result<Self, FieldError> {
        Ok(AssignedPort {
            label: proto.label,
            port: port(proto.port, "port", false)?,
        })
    }
}

impl From<PortRange> for pb::PortRange {
    fn from(range: PortRange) -> Self {
        pb::PortRange {
            min: range.min.into(),
            max: range.max.into(),
        }
    }
}

impl TryFrom<pb::PortRange> for PortRange {
    type Error = FieldError;

    fn try_from(proto: pb::PortRange) -> Result<Self, FieldError> {
        let range = PortRange {
            min: port(proto.min, "min", false)?,
            max: port(proto.max, "max", false)?,
        };
        if range.min > range.max {
            return Err(FieldError::new(
                "max",
                format!("{} is below the range's min, {}", range.max, range.min),
            ));
        }
        Ok(range)
    }
}

/// An agent's range as the wire has it: absent is the default range.
pub(crate) fn range_or_default(
    proto: Option<pb::PortRange>,
    field: &str,
) -> Result<PortRange, FieldError> {
    match proto {
        Some(range) => crate::convert::read(range, field),
        None => Ok(PortRange::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_off_the_wire_fit_sixteen_bits_and_ranges_run_forwards() {
        assert!(
            PortRequest::try_from(pb::PortRequest {
                label: "http".into(),
                static_port: 0,
            })
            .is_ok()
        );
        let error = PortRequest::try_from(pb::PortRequest {
            label: "http".into(),
            static_port: 70_000,
        })
        .unwrap_err();
        assert_eq!(error.field(), "static_port");
        assert!(
            AssignedPort::try_from(pb::AssignedPort {
                label: "http".into(),
                port: 0,
            })
            .is_err()
        );
        let backwards = PortRange::try_from(pb::PortRange { min: 30, max: 20 });
        assert_eq!(backwards.unwrap_err().field(), "max");
        assert_eq!(
            range_or_default(None, "dynamic_ports"),
            Ok(PortRange::default())
        );
    }
}
