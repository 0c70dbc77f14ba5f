//! The integration tests of `muster-broker`: one binary (`cargo test -p muster-broker --test it`),
//! one module per area. Filter by module: `cargo test -p muster-broker --test it -- <module>::`.

mod blocked;
mod broker;
