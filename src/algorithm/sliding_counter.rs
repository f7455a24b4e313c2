//! Sliding window counter: the previous and current fixed-window counts, weighted.

use super::{pack, too_big, unpack};
use crate::clock::{nanos, Clock};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
use std::time::Duration;
use strength_reduce::StrengthReducedU64;

/// Approximates a sliding window with two counts: at elapsed time `e` into window `w`, the estimate
/// is `prev · (W − e) / W + cur`, where `prev` is window `w − 1`'s final count. A request for n
/// permits is admitted iff `estimate + n ≤ limit`, evaluated exactly in integers
/// (`prev·(W−e) + (cur+n)·W ≤ limit·W`, in u128).
///
/// **Error bound.** Every fixed window still admits at most `limit`, and the estimate never exceeds
/// `limit` at an admission; but the estimate assumes the previous window's admissions were spread
/// evenly. Any interval of length `W` that starts `W − x` before the current window began holds at
/// most `limit + prev · x / W < 2·limit` admissions; the worst case needs the previous window's
/// admissions bunched at its very end. Use the exact sliding window when that matters.
///
/// **Memory:** two words whatever the limit: 1,000,000 per minute costs what 10 per second costs.
///
/// State: `current` = (window id, count) as in [`pack`]; `previous` = (id, count) of the last window
/// that was rolled over, so readers can find `prev` once `current` has moved on.
///
/// | `current` holds (now in window w) | prev used | cur used | admit writes |
/// |---|---|---|---|
/// | (w, c) | `previous`.count if its id is w − 1, else 0 | c | `current` = (w, c + n) |
/// | (w − 1, c) | c | 0 | `previous` ≥ (w − 1, c), then `current` = (w, n) |
/// | older | 0 | 0 | `current` = (w, n) |
///
/// Rolling over stores `previous` *before* the CAS that moves `current` to the new window, so a
/// thread that loads the new `current` (Acquire) finds the final count of the window before it.
pub(crate) struct SlidingCounter {
    /// Both words on one cache line of their own, apart from the read-only parameters below.
    words: CachePadded<Words>,
    limit: u32,
    window: u64,
    per_window: StrengthReducedU64,
}

struct Words {
    current: AtomicU64,
    previous: AtomicU64,
}

/// Is the (id, count) word `a` later than `b`? Ids compare by wrapping distance.
#[inline]
fn later(a: u64, b: u64) -> bool {
    let ((aid, ac), (bid, bc)) = (unpack(a), unpack(b));
    let distance = aid.wrapping_sub(bid) as i32;
    distance > 0 || (distance == 0 && ac > bc)
}

/// `a / b` (b > 0), in 64 bits when both fit: a u128 division is a library call several times slower.
#[inline]
fn div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b),
        _ => a / b,
    }
}

impl SlidingCounter {
    pub(crate) fn new(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::Zero { what: "limit" });
        }
        let window = nanos(window, "window")?;
        if window == 0 {
            return Err(ConfigError::Zero { what: "window" });
        }
        Ok(SlidingCounter {
            words: CachePadded::new(Words {
                current: AtomicU64::new(pack(0, 0)),
                previous: AtomicU64::new(pack(u32::MAX, 0)),
            }),
            limit,
            window,
            per_window: StrengthReducedU64::new(window),
        })
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    /// (prev, cur) as seen by a caller in window `id` whose `current` word is `word`.
    #[inline]
    fn counts(&self, word: u64, id: u32) -> (u32, u32) {
        let (wid, count) = unpack(word);
        if wid == id {
            // Relaxed is enough: the Acquire load of `current` that produced `word` synchronised
            // with the CAS that rolled into window `id`, and that CAS came after the store of
            // `previous`, so coherence guarantees we read that store or a later one.
            let (pid, pcount) = unpack(self.words.previous.load(Ordering::Relaxed));
            let prev = if pid == id.wrapping_sub(1) { pcount } else { 0 };
            (prev, count)
        } else if wid == id.wrapping_sub(1) {
            (count, 0)
        } else {
            (0, 0)
        }
    }

    #[inline]
    fn fits(&self, prev: u32, cur: u32, n: u32, elapsed: u64) -> bool {
        let w = u128::from(self.window);
        u128::from(prev) * u128::from(self.window - elapsed) + (u128::from(cur) + u128::from(n)) * w
            <= u128::from(self.limit) * w
    }

    /// Exact time until n permits fit, given the counts now and no further admissions.
    ///
    /// Out of line and cold: only rejections need it, and its divisions would crowd the admit path.
    #[cold]
    #[inline(never)]
    fn retry_after(&self, prev: u32, cur: u32, n: u32, elapsed: u64) -> u64 {
        let w = u128::from(self.window);
        let (prev, cur, n, limit) = (
            u128::from(prev),
            u128::from(cur),
            u128::from(n),
            u128::from(self.limit),
        );
        if cur + n <= limit && prev > 0 {
            // Later in this window: need prev·(W − e') ≤ (limit − cur − n)·W.
            let first = w - div((limit - cur - n) * w, prev).min(w);
            if first < w {
                return (first as u64).saturating_sub(elapsed);
            }
        }
        // In the next window this window's count becomes prev and cur starts at 0; `first == W`
        // means the window after that (where prev is 0).
        let first = if cur == 0 {
            0
        } else {
            w - div((limit - n) * w, cur).min(w)
        };
        (self.window - elapsed) + first as u64
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
        // Acquire: pairs with the Release CAS that wrote this word: our clock read below is no
        // earlier than the writer's, and the roll-over store of `previous` is visible (see counts).
        let mut word = self.words.current.load(Ordering::Acquire);
        loop {
            let now = clock.now();
            let (window, elapsed) = StrengthReducedU64::div_rem(now, self.per_window);
            let id = window as u32;
            let (prev, cur) = self.counts(word, id);
            if !self.fits(prev, cur, n.max(1), elapsed) {
                return Err(TryAcquireError::Rejected(Rejection::new(
                    self.retry_after(prev, cur, n.max(1), elapsed),
                    self.limit,
                )));
            }
            let remaining = |taken: u32| {
                let reset = if cur + taken > 0 {
                    self.window.saturating_mul(2) - elapsed
                } else if prev > 0 {
                    self.window - elapsed
                } else {
                    0
                };
                Admission::new(
                    now,
                    reset,
                    self.limit - cur - taken - self.weighted(prev, elapsed),
                )
            };
            if n == 0 {
                return Ok(remaining(0));
            }
            let (wid, count) = unpack(word);
            if wid != id && wid == id.wrapping_sub(1) {
                self.publish_previous(pack(wid, count));
            }
            // Release on success: orders the `previous` store above (and our clock read) before
            // the new word for every thread that loads it with Acquire. Acquire on failure: as for
            // the first load.
            match self.words.current.compare_exchange_weak(
                word,
                pack(id, cur + n),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(remaining(n)),
                Err(actual) => word = actual,
            }
        }
    }

    /// Raises `previous` to `word` unless it already holds a later window (or a larger count for the
    /// same window): a fetch_max under wrapping window ids.
    fn publish_previous(&self, word: u64) {
        // Relaxed throughout: `previous` is published by the Release CAS on `current` that follows.
        let mut seen = self.words.previous.load(Ordering::Relaxed);
        while later(word, seen) {
            match self.words.previous.compare_exchange_weak(
                seen,
                word,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => seen = actual,
            }
        }
    }

    /// Every atomic word, for tests that check a rejection wrote nothing.
    #[cfg(test)]
    pub(crate) fn words(&self) -> Vec<u64> {
        vec![
            self.words.current.load(Ordering::Relaxed),
            self.words.previous.load(Ordering::Relaxed),
        ]
    }

    /// ⌈prev · (W − e) / W⌉: the previous window's share of the estimate, in whole permits.
    #[inline(always)]
    fn weighted(&self, prev: u32, elapsed: u64) -> u32 {
        if prev == 0 {
            return 0;
        }
        let product = u128::from(prev) * u128::from(self.window - elapsed);
        // The share never exceeds prev, so it fits in u32; the division is strength-reduced when
        // the product fits in 64 bits (windows under ~4 s always, longer ones at small counts).
        let share = match u64::try_from(product + u128::from(self.window) - 1) {
            Ok(p) => u128::from(p / self.per_window),
            Err(_) => product.div_ceil(u128::from(self.window)),
        };
        share as u32
    }

    /// Permits available at `now` (a snapshot).
    pub(crate) fn available(&self, now: u64) -> u32 {
        let (window, elapsed) = StrengthReducedU64::div_rem(now, self.per_window);
        // Acquire: as in try_acquire, so that `previous` is current for this word.
        let (prev, cur) = self.counts(self.words.current.load(Ordering::Acquire), window as u32);
        self.limit
            .saturating_sub(cur)
            .saturating_sub(self.weighted(prev, elapsed))
    }
}
