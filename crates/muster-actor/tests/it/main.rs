//! The integration tests of `muster-actor`: one binary (`cargo test -p muster-actor --test it`),
//! one module per area. Filter by module: `cargo test -p muster-actor --test it -- <module>::`.
//!
//! Anything time-based runs on tokio's paused clock; tasks synchronise through asks, oneshots
//! and `wait()`, never through sleeps.

mod support;

mod ask;
mod defer;
mod dispatch;
mod isolation;
mod links;
mod mailbox;
mod pool;
mod shutdown;
mod supervision;
mod tell;
mod timers;
