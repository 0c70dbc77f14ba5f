//! The heap in use, for the benches that report memory: mimalloc (the binaries' allocator),
//! with allocations and frees added up in per-thread shards (one shared counter would bounce a
//! cache line between the cores on every allocation). A bench installs [`Counted`] as its
//! global allocator and reads [`heap_in_use`].

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

/// mimalloc, with what is in use counted.
pub(crate) struct Counted;

const SHARDS: usize = 32;

#[repr(align(128))]
struct Shard(AtomicIsize);

static IN_USE: [Shard; SHARDS] = [const { Shard(AtomicIsize::new(0)) }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn count(bytes: isize) {
    let shard = MY_SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0);
    IN_USE[shard].0.fetch_add(bytes, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to mimalloc unchanged; the counting touches no memory the
// allocator hands out.
unsafe impl GlobalAlloc for Counted {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: the caller's contract is mimalloc's.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: as above.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: as above.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: as above.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

/// Bytes allocated and not freed, by every thread of the program.
pub(crate) fn heap_in_use() -> i64 {
    IN_USE
        .iter()
        .map(|shard| shard.0.load(Ordering::Relaxed) as i64)
        .sum()
}
