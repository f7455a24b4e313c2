//! Fixed window: one atomic word, updated by compare-and-swap.

use super::{pack, too_big, unpack, window_id, Algo, RETIRED};
use crate::clock::{nanos, Clock};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering};
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
///
/// This struct holds the parameters; the word is the [`Algo::Cell`], kept by the limiter (one per
/// key in a keyed limiter). A word of [`RETIRED`] belongs to a key that eviction removed.
pub(crate) struct FixedWindow {
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
            limit,
            window,
            per_window: StrengthReducedU64::new(window),
        })
    }

    /// Permits free in `word` at `now`, the time until `now`'s window ends, and that window's id.
    #[inline(always)]
    fn free(&self, word: u64, now: u64) -> (u32, u64, u32) {
        let window = now / self.per_window;
        let until_reset = window
            .saturating_add(1)
            .saturating_mul(self.window)
            .saturating_sub(now);
        let id = window_id(window);
        let (wid, count) = unpack(word);
        let used = if wid == id { count } else { 0 };
        (self.limit - used, until_reset, id)
    }
}

impl Algo for FixedWindow {
    type Cell = AtomicU64;

    fn cell(&self) -> AtomicU64 {
        AtomicU64::new(pack(0, 0))
    }

    fn limit(&self) -> u32 {
        self.limit
    }

    #[inline(always)]
    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        if n > self.limit {
            return Err(too_big(n, self.limit));
        }
        // Acquire: pairs with the Release of the CAS that wrote this word, so the clock read below
        // happens after the writer's clock read and returns a time no earlier than its window.
        let mut current = state.load(Ordering::Acquire);
        loop {
            if current == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            let now = clock.now();
            let (free, until_reset, id) = self.free(current, now);
            if free < n.max(1) {
                // The next window starts empty and n ≤ limit, so that is exactly when n fits.
                return Err(TryAcquireError::Rejected(Rejection::new(
                    until_reset,
                    self.limit,
                )));
            }
            if n == 0 || !COMMIT {
                return Ok(Admission::new(now, until_reset, free));
            }
            let next = pack(id, self.limit - free + n);
            // Release on success: publishes our clock reading to the next thread that loads the
            // word (see the load above). Acquire on failure: we use the new word the same way.
            match state.compare_exchange_weak(current, next, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return Ok(Admission::new(now, until_reset, free - n)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Takes `n` off the count if the word still holds the admission's window, and the clock is
    /// still in it; otherwise the window has ended, the admission no longer weighs on any
    /// decision, and there is nothing to give back.
    ///
    /// **Why it is exact and never looser.** Invariant: the word's count is at least the permits
    /// of the never-refunded admissions in its window (every admission adds its own n, every
    /// refund subtracts only an n that it added, in the window it added it to). The admission
    /// being refunded is still counted when its refund runs, so the count minus n is still at
    /// least the rest; and with the clock unchanged it is exactly the count the window would have
    /// without it. Requiring the clock to be in the admission's window also rules out the 31-bit
    /// id wrap: the word's window lies between the admission's and the clock's (load-then-clock),
    /// so a matching id is that very window.
    fn refund<C: Clock>(&self, state: &AtomicU64, n: u32, admission: &Admission, clock: &C) {
        let window = admission.at_nanos() / self.per_window;
        let id = window_id(window);
        // Acquire: as in `try_acquire`: our clock read below is no earlier than the last writer's.
        let mut word = state.load(Ordering::Acquire);
        loop {
            let (wid, count) = unpack(word);
            if word == RETIRED || wid != id || clock.now() / self.per_window != window {
                return;
            }
            // Release on success: publishes our clock reading like an admission does. Acquire on
            // failure: as for the first load.
            match state.compare_exchange_weak(
                word,
                pack(id, count.saturating_sub(n)),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    #[cfg(feature = "store")]
    fn save(state: &AtomicU64) -> Vec<u64> {
        vec![state.load(Ordering::Acquire)]
    }

    #[cfg(feature = "store")]
    fn restore(&self, words: &[u64]) -> Option<AtomicU64> {
        match words {
            [word] if *word != RETIRED => Some(AtomicU64::new(*word)),
            _ => None,
        }
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(state: &AtomicU64) -> Vec<u64> {
        vec![state.load(Ordering::Relaxed)]
    }

    fn available(&self, state: &AtomicU64, now: u64) -> u32 {
        // Relaxed: a statistic; no decision depends on it.
        match state.load(Ordering::Relaxed) {
            RETIRED => self.limit,
            word => self.free(word, now).0,
        }
    }

    fn retire<C: Clock>(&self, state: &AtomicU64, clock: &C) -> Result<(), u64> {
        // Acquire: as in `try_acquire`, so our clock read is no earlier than the last admission's.
        let word = state.load(Ordering::Acquire);
        if word == RETIRED {
            return Ok(());
        }
        let now = clock.now();
        if word == pack(0, 0) {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        let (free, until_reset, _) = self.free(word, now);
        if free < self.limit {
            // Busy until its window ends.
            return Err(now.saturating_add(until_reset));
        }
        // Release on success: publishes our clock reading to whoever sees RETIRED and re-creates
        // the key, so the fresh word is used at times no earlier than ours. Relaxed on failure: an
        // admission landed; we only report "busy".
        state
            .compare_exchange(word, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    fn retired(state: &AtomicU64) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        state.load(Ordering::Relaxed) == RETIRED
    }
}
