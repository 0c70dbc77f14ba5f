//! The integration tests of `muster-agent`: one binary (`cargo test -p muster-agent --test it`),
//! one module per area. Filter by module: `cargo test -p muster-agent --test it -- <module>::`.

mod common;

mod agent;
mod cli;
mod dist;
mod health;
mod heartbeats;
mod logs;
mod metrics;
mod simulated_runner;
mod task_output;
