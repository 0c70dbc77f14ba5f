//! The integration tests of `muster`: one binary (`cargo test -p muster --test it`),
//! one module per area. Filter by module: `cargo test -p muster --test it -- <module>::`.

mod common;

mod agent_recovery;
mod cli_tls;
mod cluster_failover;
mod deployments;
mod dev_cluster;
mod fuzz_decoders;
mod import_circles;
mod job_edits;
mod layout;
mod leader_pause;
mod monitor;
mod operator_snapshot;
mod raft_membership;
mod registry_crash;
mod remote_process;
mod rolling_upgrade;
mod shell_docs;
mod task_lifecycle;
