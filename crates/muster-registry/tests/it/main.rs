//! The integration tests of `muster-registry`: one binary (`cargo test -p muster-registry --test it`),
//! one module per area. Filter by module: `cargo test -p muster-registry --test it -- <module>::`.

mod cluster;
mod storage_suite;
