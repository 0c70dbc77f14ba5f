//! Generates the prost messages and tonic services from `proto/` at the workspace root.
//!
//! protoc comes from `protoc-bin-vendored` unless `$PROTOC` names another, so a fresh machine
//! needs no system protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let protos = [
        root.join("muster/transport/v1/transport.proto"),
        root.join("muster/example/v1/ping.proto"),
        root.join("muster/registry/v1/raft.proto"),
        root.join("muster/model/v1/model.proto"),
        root.join("muster/cluster/v1/cluster.proto"),
        root.join("muster/scheduling/v1/scheduling.proto"),
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }
    println!("cargo:rerun-if-env-changed=PROTOC");

    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    // Every package's descriptors in one set, for gRPC server reflection.
    let descriptors = PathBuf::from(std::env::var("OUT_DIR")?).join("muster_descriptors.bin");
    let mut config = tonic_prost_build::Config::new();
    config
        .protoc_executable(protoc)
        .file_descriptor_set_path(descriptors)
        .bytes(["."])
        // Launches carry it, reports do not: a pointer in every task a message holds.
        .boxed(".muster.model.v1.Task.lifecycle")
        .enable_type_names();
    tonic_prost_build::configure().compile_with_config(config, &protos, &[root])?;
    Ok(())
}
