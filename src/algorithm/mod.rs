//! The per-limiter state machines. Each is lock-free, allocation-free on the hot path, and takes the
//! clock as a parameter so that it can read time *after* loading its state: with a monotonic clock
//! that makes the times a limiter assigns non-decreasing in the order its compare-and-swaps succeed,
//! which is what the exactness proofs below rely on.
//!
//! A rejection never writes shared memory: every algorithm decides from loaded values first and only
//! the admit path stores.

mod fixed_window;
mod sliding_counter;
mod sliding_window;
mod token_bucket;

pub(crate) use fixed_window::FixedWindow;
pub(crate) use sliding_counter::SlidingCounter;
pub(crate) use sliding_window::SlidingWindow;
pub(crate) use token_bucket::TokenBucket;

use crate::error::TryAcquireError;

/// Packs a window id (low 32 bits of `now / window`) and a count into one word.
///
/// | bits 63..32 | bits 31..0 |
/// |---|---|
/// | window id, wrapping | permits counted in that window |
///
/// Ids are compared for equality only (or as "the id just before"), so wrapping after 2^32 windows
/// can only make two windows 2^32 apart look like one: the limiter is then *stricter* for one
/// window, never looser.
#[inline]
pub(crate) fn pack(window: u32, count: u32) -> u64 {
    (u64::from(window) << 32) | u64::from(count)
}

/// The inverse of [`pack`].
#[inline]
pub(crate) fn unpack(word: u64) -> (u32, u32) {
    ((word >> 32) as u32, word as u32)
}

/// The error for a request that can never fit.
#[inline]
pub(crate) fn too_big(requested: u32, capacity: u32) -> TryAcquireError {
    TryAcquireError::InsufficientCapacity {
        requested,
        capacity,
    }
}
