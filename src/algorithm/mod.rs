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

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::Rate;
    use std::time::Duration;

    /// Drives an algorithm to exhaustion at several points in time, then checks that a burst of
    /// rejections (single, multi-permit and probes) leaves every atomic word as it was.
    fn rejections_write_nothing<A>(
        state: A,
        try_acquire: impl Fn(&A, u32, &ManualClock) -> Result<crate::Admission, TryAcquireError>,
        words: impl Fn(&A) -> Vec<u64>,
    ) {
        let clock = ManualClock::new();
        for step in 0..20 {
            clock.advance(Duration::from_millis(37 * step));
            while try_acquire(&state, 1, &clock).is_ok() {}
            let before = words(&state);
            for n in [1, 2, 0, 1] {
                assert!(try_acquire(&state, n, &clock).is_err());
            }
            assert_eq!(words(&state), before, "a rejection wrote shared memory");
        }
    }

    #[test]
    fn rejections_write_no_shared_memory() {
        let window = Duration::from_millis(100);
        rejections_write_nothing(
            FixedWindow::new(5, window).unwrap(),
            |s, n, c| s.try_acquire(n, c),
            FixedWindow::words,
        );
        rejections_write_nothing(
            SlidingWindow::new(5, window).unwrap(),
            |s, n, c| s.try_acquire(n, c),
            SlidingWindow::words,
        );
        rejections_write_nothing(
            SlidingCounter::new(5, window).unwrap(),
            |s, n, c| s.try_acquire(n, c),
            SlidingCounter::words,
        );
        rejections_write_nothing(
            TokenBucket::new(Rate::new(5, window), 5).unwrap(),
            |s, n, c| s.try_acquire(n, c),
            TokenBucket::words,
        );
    }
}
