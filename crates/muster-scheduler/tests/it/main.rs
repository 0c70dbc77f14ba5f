//! The integration tests of `muster-scheduler`: one binary (`cargo test -p muster-scheduler --test it`),
//! one module per area. Filter by module: `cargo test -p muster-scheduler --test it -- <module>::`.

mod common;

mod drain;
mod gang;
mod placement;
mod ports;
mod preemption;
mod preferences;
mod quota;
mod reconcile;
mod rolling;
mod worker;
