//! Muster's criterion benches. They are this package's bench targets (`cargo bench --bench
//! c2m`, and so on, from the workspace's root); docs/performance.md says what each measures
//! and what it measured. This library is empty: cargo wants one in every package.
