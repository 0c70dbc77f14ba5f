//! [`Resources`] to and from `muster.model.v1.Resources`.

use muster_proto::model as pb;

use crate::error::FieldError;
use crate::resources::Resources;

impl From<Resources> for pb::Resources {
    fn from(resources: Resources) -> Self {
        // What the model's arithmetic makes of odd amounts, so that the other side can read it.
        let cpus = if resources.cpus.is_nan() || resources.cpus < 0.0 {
            0.0
        } else {
            resources.cpus.min(f64::MAX)
        };
        pb::Resources {
            cpus,
            mem_mb: resources.mem_mb,
        }
    }
}

impl TryFrom<pb::Resources> for Resources {
    type Error = FieldError;

    fn try_from(proto: pb::Resources) -> Result<Self, FieldError> {
        let cpus = proto.cpus;
        if !cpus.is_finite() || cpus < 0.0 {
            return Err(FieldError::new(
                "cpus",
                format!("{cpus} is not a finite, non-negative number of cores"),
            ));
        }
        Ok(Resources {
            cpus,
            mem_mb: proto.mem_mb,
        })
    }
}
