//! The integration tests of `muster-security`: one binary (`cargo test -p muster-security --test it`),
//! one module per area. Filter by module: `cargo test -p muster-security --test it -- <module>::`.

mod certificates;
