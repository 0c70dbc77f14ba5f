//! The groups of `message_throughput` on the system allocator (glibc's malloc) instead of
//! mimalloc, to see what the allocator accounts for. See `message_throughput.rs` for what each
//! group measures. Run with `cargo bench --bench message_throughput_system_alloc`, or one group,
//! e.g. `cargo bench --bench message_throughput_system_alloc -- spawn_stop`; the groups are
//! named with the suffix `_system_alloc`.

/// glibc's malloc, named explicitly: the point of this target.
#[global_allocator]
static ALLOCATOR: std::alloc::System = std::alloc::System;

/// Keeps this target's results apart from the mimalloc run's in `target/criterion/`.
const GROUP_SUFFIX: &str = "_system_alloc";

#[path = "message_throughput/groups.rs"]
mod groups;

criterion::criterion_main!(groups::local, groups::remote);
