//! Generated prost messages and tonic services for Muster's wire protocols.
//!
//! This crate holds generated code, and which wire protocols this build speaks ([`version`]):
//! conversions and logic live in the crates that own the domain types (`muster-model` for the
//! shared ones). One module per protobuf package under
//! `proto/` at the workspace root.
//!
//! # Layout
//! - [`transport`]: the actor transport between nodes (frames of envelopes on one stream).
//! - [`example`]: messages of the examples and the tests that drive them.
//! - [`registry`]: raft traffic between masters.
//! - [`model`]: the domain types the other packages share (jobs, evaluations, resources).
//! - [`cluster`]: masters and agents, and the operator API.
//! - [`scheduling`]: scheduler workers in other programs and the leading master.

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

pub mod version;

/// The generated packages, nested as their names are so that references between packages
/// (`muster.model.v1.Job` from `muster.scheduling.v1`) resolve.
mod generated {
    pub mod muster {
        pub mod transport {
            pub mod v1 {
                tonic::include_proto!("muster.transport.v1");
            }
        }
        pub mod example {
            pub mod v1 {
                tonic::include_proto!("muster.example.v1");
            }
        }
        pub mod registry {
            pub mod v1 {
                tonic::include_proto!("muster.registry.v1");
            }
        }
        pub mod model {
            pub mod v1 {
                tonic::include_proto!("muster.model.v1");
            }
        }
        pub mod cluster {
            pub mod v1 {
                tonic::include_proto!("muster.cluster.v1");
            }
        }
        pub mod scheduling {
            pub mod v1 {
                tonic::include_proto!("muster.scheduling.v1");
            }
        }
    }
}

/// The encoded `FileDescriptorSet` of every package above, for gRPC server reflection
/// (`grpcurl list`).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/muster_descriptors.bin"));

/// `muster.transport.v1`: the node-to-node actor transport.
pub use generated::muster::transport::v1 as transport;

/// `muster.example.v1`: messages of the examples.
pub use generated::muster::example::v1 as example;

/// `muster.registry.v1`: raft traffic between the masters of one registry group.
pub use generated::muster::registry::v1 as registry;

/// `muster.model.v1`: the domain types the cluster and scheduling packages share.
pub use generated::muster::model::v1 as model;

/// `muster.cluster.v1`: masters and agents, and the operator API.
pub use generated::muster::cluster::v1 as cluster;

/// `muster.scheduling.v1`: scheduler workers in their own programs and the leading master.
pub use generated::muster::scheduling::v1 as scheduling;
