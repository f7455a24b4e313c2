//! Shared by the memory-measuring benches (`keyed`, `keyed_map`): a counting global allocator and
//! the fixed pseudo-random key sequence both libraries are driven with.

#![allow(dead_code)] // each bench uses the parts it needs

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts live heap bytes (as requested, and as glibc malloc would hold them), and live large
/// allocations by size class, for the bytes-per-key figures.
pub struct Counting;

/// Live bytes, as requested.
pub static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Live bytes, as glibc malloc chunks (estimate: see [`chunk`]).
pub static LIVE_CHUNKS: AtomicUsize = AtomicUsize::new(0);
/// Allocations of at least [`LARGE`] bytes are also counted by size class (floor of log2).
pub const LARGE: usize = 4096;
pub static LARGE_COUNT: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
pub static LARGE_BYTES: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];

/// The size of the glibc malloc chunk serving a request of `size` bytes on 64-bit Linux: an
/// 8-byte header, 16-byte granularity, 32 bytes at least. (Large requests are mmapped and page
/// rounded instead; the difference is negligible at the sizes that matter here.)
pub fn chunk(size: usize) -> usize {
    ((size + 8 + 15) & !15).max(32)
}

fn track(size: usize, add: bool) {
    let (live, chunks) = (size, chunk(size));
    if add {
        LIVE.fetch_add(live, Ordering::Relaxed);
        LIVE_CHUNKS.fetch_add(chunks, Ordering::Relaxed);
    } else {
        LIVE.fetch_sub(live, Ordering::Relaxed);
        LIVE_CHUNKS.fetch_sub(chunks, Ordering::Relaxed);
    }
    if size >= LARGE {
        let class = size.ilog2() as usize;
        if add {
            LARGE_COUNT[class].fetch_add(1, Ordering::Relaxed);
            LARGE_BYTES[class].fetch_add(size, Ordering::Relaxed);
        } else {
            LARGE_COUNT[class].fetch_sub(1, Ordering::Relaxed);
            LARGE_BYTES[class].fetch_sub(size, Ordering::Relaxed);
        }
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so this
// allocator keeps `System`'s contract; it only adds counters (which allocate nothing).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        track(layout.size(), true);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        track(layout.size(), true);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(layout.size(), false);
        // SAFETY: `ptr` came from this allocator with this `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        track(new_size, true);
        track(layout.size(), false);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A snapshot of the counters.
#[derive(Clone, Copy)]
pub struct Heap {
    pub live: usize,
    pub chunks: usize,
    pub large_count: [usize; 64],
    pub large_bytes: [usize; 64],
}

impl Heap {
    pub fn now() -> Self {
        Heap {
            live: LIVE.load(Ordering::Relaxed),
            chunks: LIVE_CHUNKS.load(Ordering::Relaxed),
            large_count: std::array::from_fn(|i| LARGE_COUNT[i].load(Ordering::Relaxed)),
            large_bytes: std::array::from_fn(|i| LARGE_BYTES[i].load(Ordering::Relaxed)),
        }
    }
}

/// A fixed pseudo-random walk over `0..n` (xorshift), `len` long, so that every run (and every
/// library) looks up the same keys and large key sets miss the CPU caches as real traffic does.
pub fn key_sequence(n: u64, len: usize, seed: u64) -> Vec<u64> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        })
        .collect()
}
