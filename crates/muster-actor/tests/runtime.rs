//! The integration tests of `muster-actor`: one binary, one module per area.
//!
//! Run with `cargo test -p muster-actor --test runtime`. Anything time-based runs on tokio's
//! paused clock; tasks synchronise through asks, oneshots and `wait()`, never through sleeps.

#[path = "runtime/support.rs"]
mod support;

#[path = "runtime/ask.rs"]
mod ask;
#[path = "runtime/defer.rs"]
mod defer;
#[path = "runtime/dispatch.rs"]
mod dispatch;
#[path = "runtime/isolation.rs"]
mod isolation;
#[path = "runtime/links.rs"]
mod links;
#[path = "runtime/mailbox.rs"]
mod mailbox;
#[path = "runtime/pool.rs"]
mod pool;
#[path = "runtime/shutdown.rs"]
mod shutdown;
#[path = "runtime/supervision.rs"]
mod supervision;
#[path = "runtime/tell.rs"]
mod tell;
#[path = "runtime/timers.rs"]
mod timers;
