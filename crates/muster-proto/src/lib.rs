//! Generated prost messages and tonic services for Muster's wire protocols.
//!
//! This crate holds generated code only: conversions and logic live in the crates that own the
//! domain types. One module per protobuf package under `proto/` at the workspace root.
//!
//! # Layout
//! - [`transport`]: the actor transport between nodes (frames of envelopes on one stream).
//! - [`example`]: messages of the examples and the tests that drive them.
//! - [`registry`]: raft traffic between masters.
//! - [`cluster`]: masters and agents, and the operator API.
//! - [`scheduling`]: scheduler workers in other programs and the leading master.

#![allow(missing_docs, unreachable_pub, missing_debug_implementations)]

/// `muster.transport.v1`: the node-to-node actor transport.
pub mod transport {
    tonic::include_proto!("muster.transport.v1");
}

/// `muster.example.v1`: messages of the examples.
pub mod example {
    tonic::include_proto!("muster.example.v1");
}

/// `muster.registry.v1`: raft traffic between the masters of one registry group.
pub mod registry {
    tonic::include_proto!("muster.registry.v1");
}

/// `muster.cluster.v1`: masters and agents, and the operator API.
pub mod cluster {
    tonic::include_proto!("muster.cluster.v1");
}

/// `muster.scheduling.v1`: scheduler workers in their own programs and the leading master.
pub mod scheduling {
    tonic::include_proto!("muster.scheduling.v1");
}
