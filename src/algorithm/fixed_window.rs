//! Fixed window: one atomic word, updated by compare-and-swap.

use super::{pack, too_big, unpack};
use crate::clock::{nanos, Clock};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
use std::time::Duration;
use strength_reduce::StrengthReducedU64;

/// At most `limit` permits per window; windows are `[k·window, (k+1)·window)` on the clock's epoch.
///
/// State: one word, see [`pack`] for its layout. Transitions (n ≥ 1 permits at time `now` in window
/// `w`):
///
/// | word holds | decision | new word |
/// |---|---|---|
/// | (`w`, c) with c + n ≤ limit | admit | (`w`, c + n) |
/// | (`w`, c) with c + n > limit | reject, retry at the end of `w` | unchanged |
/// | (v ≠ `w`, _) and n ≤ limit | admit (a new window) | (`w`, n) |
///
/// "v ≠ w" always means an *older* window: the word is loaded before the clock is read, and the clock
/// is monotonic, so no thread can see a window id newer than its own `now`.
pub(crate) struct FixedWindow {
    /// Alone on its cache line: the parameters below are read by every call, the word is written.
    state: CachePadded<AtomicU64>,
    limit: u32,
    window: u64,
    per_window: StrengthReducedU64,
}

impl FixedWindow {
    pub(crate) fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let window = nanos(window, "window")?;
        if window == 0 {
            return Err(ConfigError::Zero { what: "window" });
        }
        Ok(FixedWindow {
            state: CachePadded::new(AtomicU64::new(pack(0, 0))),
            limit,
            window,
            per_window: StrengthReducedU64::new(window),
        })
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    #[inline(always)]
    pub(crate) fn try_acquire<C: Clock>(
        &self,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        if n > self.limit {
            return Err(too_big(n, self.limit));
        }
        // Acquire: pairs with the Release of the CAS that wrote this word, so the clock read below
        // happens after the writer's clock read and returns a time no earlier than its window.
        let mut current = self.state.load(Ordering::Acquire);
        loop {
            let now = clock.now();
            let window = now / self.per_window;
            let until_reset = window
                .saturating_add(1)
                .saturating_mul(self.window)
                .saturating_sub(now);
            let (id, count) = unpack(current);
            let used = if id == window as u32 { count } else { 0 };
            let free = self.limit - used;
            if free < n.max(1) {
                // The next window starts empty and n ≤ limit, so that is exactly when n fits.
                return Err(TryAcquireError::Rejected(Rejection::new(
                    until_reset,
                    self.limit,
                )));
            }
            if n == 0 {
                return Ok(Admission::new(now, until_reset, free));
            }
            let next = pack(window as u32, used + n);
            // Release on success: publishes our clock reading to the next thread that loads the
            // word (see the load above). Acquire on failure: we use the new word the same way.
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Admission::new(now, until_reset, free - n)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Every atomic word, for tests that check a rejection wrote nothing.
    #[cfg(all(test, not(turnstile_loom)))]
    pub(crate) fn words(&self) -> Vec<u64> {
        vec![self.state.load(Ordering::Relaxed)]
    }

    /// Permits available at `now` (a snapshot).
    pub(crate) fn available(&self, now: u64) -> u32 {
        // Relaxed: a statistic; no decision depends on it.
        let (id, count) = unpack(self.state.load(Ordering::Relaxed));
        let window = now / self.per_window;
        if id == window as u32 {
            self.limit - count
        } else {
            self.limit
        }
    }
}
