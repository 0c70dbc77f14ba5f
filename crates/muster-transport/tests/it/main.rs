//! The integration tests of `muster-transport`: one binary (`cargo test -p muster-transport
//! --test it`), one module per area. Filter by module: `cargo test -p muster-transport --test it
//! -- <module>::`.

mod remote;
mod remote_security;
