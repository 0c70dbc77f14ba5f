//! The integration tests of `muster-master`: one binary (`cargo test -p muster-master --test it`),
//! one module per area. Filter by module: `cargo test -p muster-master --test it -- <module>::`.

mod common;

mod acl;
mod agent_claims;
mod attacks;
mod cli;
mod cluster_watch;
mod dist;
mod drain;
mod event_secrets;
mod failover;
mod gangs;
mod grpcurl;
mod health_reflection;
mod heartbeats;
mod http_api;
mod jobs;
mod logs;
mod metrics;
mod named_schedulers;
mod namespaces;
mod plans_bound;
mod ports;
mod preemption;
mod quotas;
mod remote_workers;
mod scheduling;
mod secrets_at_rest;
mod tls_reload;
mod web_ui;
