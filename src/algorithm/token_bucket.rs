//! Token bucket as GCRA: one atomic word holding the theoretical arrival time.

use super::{too_big, Algo, RETIRED};
use crate::clock::{nanos, Clock};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering};
use crate::Rate;
use strength_reduce::StrengthReducedU64;

/// The generic cell rate algorithm with emission interval `T` (time per permit) and a burst `b`.
///
/// The word holds the theoretical arrival time `tat` (nanoseconds since the clock's epoch). A request
/// for n permits at `now` computes `next = max(tat, now) + n·T` and is admitted iff
/// `next − now ≤ b·T`; the bucket is then `(b·T − (next − now)) / T` permits full.
///
/// | word holds | decision | new word |
/// |---|---|---|
/// | tat with max(tat, now) + n·T − now ≤ b·T | admit | max(tat, now) + n·T |
/// | otherwise | reject, retry after (next − now) − b·T | unchanged |
///
/// `T` is the period divided by the permits, rounded *up* to a whole nanosecond, so the long-run
/// rate is never above the configured one (and below it by less than one nanosecond per permit).
///
/// This struct holds the parameters; the `tat` word is the [`Algo::Cell`]. `tat` never exceeds
/// now + b·T < 2^63, so [`RETIRED`] is never a live value.
pub(crate) struct TokenBucket {
    interval: u64,
    /// `interval` strength-reduced: `remaining` divides by it on every admission.
    per_permit: StrengthReducedU64,
    capacity: u64,
    burst: u32,
}

impl TokenBucket {
    pub(crate) fn new(rate: Rate, burst: u32) -> Result<Self, ConfigError> {
        if rate.permits == 0 {
            return Err(ConfigError::Zero {
                what: "rate permits",
            });
        }
        let period = nanos(rate.period, "rate period")?;
        if period == 0 {
            return Err(ConfigError::Zero {
                what: "rate period",
            });
        }
        if burst == 0 {
            return Err(ConfigError::Zero { what: "burst" });
        }
        let interval = period.div_ceil(u64::from(rate.permits));
        // Keep b·T well inside u64 so that `tat`, which never exceeds now + b·T, cannot overflow
        // for centuries.
        let capacity = interval
            .checked_mul(u64::from(burst))
            .filter(|c| *c <= u64::MAX / 4)
            .ok_or(ConfigError::TooLarge {
                what: "burst × (period / permits)",
                max: "about 146 years",
            })?;
        Ok(TokenBucket {
            interval,
            per_permit: StrengthReducedU64::new(interval),
            capacity,
            burst,
        })
    }

    /// Whole permits left when the bucket's arrival time is `ahead` of now: burst − ⌈ahead / T⌉.
    #[inline(always)]
    fn remaining(&self, ahead: u64) -> u32 {
        // ahead ≤ capacity ≤ u64::MAX / 4 on every caller's path, so the addition cannot overflow.
        let used =
            (ahead.saturating_add(self.interval - 1) / self.per_permit).min(u64::from(u32::MAX));
        self.burst.saturating_sub(used as u32)
    }
}

impl Algo for TokenBucket {
    type Cell = AtomicU64;

    fn cell(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn limit(&self) -> u32 {
        self.burst
    }

    #[inline(always)]
    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        if n > self.burst {
            return Err(too_big(n, self.burst));
        }
        // Acquire: pairs with the Release of the CAS that stored this tat, so our clock read below
        // is no earlier than the one that produced it.
        let mut tat = state.load(Ordering::Acquire);
        loop {
            if tat == RETIRED {
                return Err(TryAcquireError::Closed);
            }
            let now = clock.now();
            let start = tat.max(now);
            let next = start.saturating_add(u64::from(n.max(1)) * self.interval);
            let ahead = next - now;
            if ahead > self.capacity {
                return Err(TryAcquireError::Rejected(Rejection::new(
                    ahead - self.capacity,
                    self.burst,
                )));
            }
            if n == 0 || !COMMIT {
                let full_in = start - now;
                return Ok(Admission::new(now, full_in, self.remaining(full_in)));
            }
            // Release on success: publishes our clock reading with the new tat. Acquire on
            // failure: as for the first load.
            match state.compare_exchange_weak(tat, next, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return Ok(Admission::new(now, ahead, self.remaining(ahead))),
                Err(actual) => tat = actual,
            }
        }
    }

    /// Moves `tat` back by `n·T − (now − at)` (nothing once that is ≤ 0): the whole `n·T` when
    /// the clock has not moved since the admission, less the longer the refund comes after it.
    ///
    /// **Why not simply `n·T`.** GCRA's state is `tat` over the admissions so far, `G(L)` with
    /// `G(L + a) = max(G(L), t_a) + n_a·T`. Removing admission j from L lowers G by
    /// `d = G(L) − G(L \ {j})`, and d can be *less* than `n_j·T`: if the bucket drained after j
    /// (a later admission k found `tat` behind its `t_k`), the `max` absorbed part of j. Example:
    /// one permit at 0 (`tat` = T), another at 10·T (`tat` = 11·T); without the first, `tat`
    /// would still be 11·T, so subtracting T would credit a permit the bucket never lacked.
    ///
    /// **The bound used.** Each later step k gives `d_k ≥ min(d_{k−1}, G_{k−1} − t_k)`, with
    /// `d_j ≥ n_j·T`, `G_{k−1} ≥ G_j ≥ t_j + n_j·T` and `t_k ≤ now` (every admission this
    /// refund's CAS can follow read its clock before our clock read: load-then-clock). So
    /// `d ≥ n_j·T − (now − t_j)`, which is what this subtracts.
    ///
    /// **Invariant (never looser).** The word is at least `G` over the admissions not yet
    /// refunded: an admission maps `tat ≥ G(L)` to `max(tat, t) + n·T ≥ G(L + a)` (monotone), and
    /// a refund subtracts at most d. `G` over a subset is smaller, so the word also bounds `G` over
    /// the admissions that are never refunded, and every decision made on it is at least as
    /// strict as on those alone. With the clock unchanged (`now = at`: `ManualClock`, or the same
    /// tick of an `UpkeepClock`) the refund is exact: the word becomes `max(tat_before, at)`,
    /// which decides every later call like `tat_before`.
    fn refund<C: Clock>(&self, state: &AtomicU64, n: u32, admission: &Admission, clock: &C) {
        let cost = u64::from(n) * self.interval;
        // Acquire: as in `try_acquire`: every admission our CAS follows read its clock earlier.
        let mut tat = state.load(Ordering::Acquire);
        loop {
            if tat == RETIRED {
                return;
            }
            let elapsed = clock.now().saturating_sub(admission.at_nanos());
            let give = cost.saturating_sub(elapsed);
            if give == 0 {
                return;
            }
            // Release on success: publishes our clock reading with the new tat, as an admission
            // does. Acquire on failure: as for the first load.
            match state.compare_exchange_weak(
                tat,
                tat.saturating_sub(give),
                Ordering::Release,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(actual) => tat = actual,
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
            RETIRED => self.burst,
            tat => self.remaining(tat.saturating_sub(now)),
        }
    }

    fn retire<C: Clock>(&self, state: &AtomicU64, clock: &C) -> Result<(), u64> {
        // Acquire: as in `try_acquire`.
        let tat = state.load(Ordering::Acquire);
        if tat == RETIRED {
            return Ok(());
        }
        let now = clock.now();
        if tat == 0 {
            // Never used: its inserter is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        if tat > now {
            // The bucket is full again (as fresh as a new one) at `tat`.
            return Err(tat);
        }
        // Release on success: as in the fixed window's `retire`. Relaxed on failure: an admission
        // landed, so the bucket is busy; we report `now` and look again later.
        state
            .compare_exchange(tat, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    fn retired(state: &AtomicU64) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        state.load(Ordering::Relaxed) == RETIRED
    }
}
