//! Token bucket as GCRA: one atomic word holding the theoretical arrival time.

use super::{Algo, Charge, Divisor, EachCell, RETIRED, too_big};
use crate::Rate;
use crate::clock::{Clock, nanos};
use crate::decision::{Admission, Rejection};
use crate::error::{ConfigError, TryAcquireError};
use crate::sync::{AtomicU64, Ordering, Params};

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
/// **The word and reconfiguration.** Bit 63 is the *epoch* of the parameters the word was written
/// under (parity of the number of reconfigurations); bits 62..0 are `tat`:
///
/// | bit 63 | bits 62..0 | meaning |
/// |---|---|---|
/// | the parameters' epoch | tat | written under the current parameters |
/// | the other epoch | tat | written under the previous parameters (or full at the switch, its bit flipped by the sweep): translate before use |
/// | 1 | all ones | [`RETIRED`] (never a live value: tat < 2^63 − 1) |
///
/// A reconfiguration keeps how *full* the bucket is: the debt `tat − t` at the switch time `t`
/// (at most the old capacity b·T, unless a [charge](Charge) went beyond) is scaled by new
/// capacity / old capacity, so a full bucket
/// stays full, an empty one stays empty, a bucket at 70 % stays at 70 %, and it refills at the new
/// rate from then on (Guava's `setRate` scales its stored permits the same way). The translation
/// is a pure function of the word and the published parameters (`t`, the old capacity), so
/// whoever applies it first, a caller deciding on an old-epoch word or the reconfigure's own sweep
/// over every cell, writes the same value; the CAS that translates a word is the admission's own.
/// Time is capped at 2^62 − 1 ns (146 years after the clock's epoch; later times read as that), so
/// `tat ≤ now + b·T ≤ 2^63 − 2` (and a charge's `tat` is held at [`MAX_TAT`] = 2^63 − 2): the epoch bit is never part of a time, and a word is never
/// [`RETIRED`].
///
/// This struct holds the parameters; the word is the [`Algo::Cell`].
pub(crate) struct TokenBucket {
    /// [`Shape`] as words, replaceable at run time by [`Algo::reconfigure`].
    params: Params<8>,
}

/// Bit 63 of a word: the epoch it was written under.
const EPOCH: u64 = 1 << 63;
/// Times are capped here, so that `tat`, at most a capacity (< 2^62) ahead, stays below 2^63 − 1
/// (at 2^63 − 1 in the odd epoch, the word would be `RETIRED`).
const MAX_NOW: u64 = (1 << 62) - 1;
/// The latest `tat` a [charge](Charge::charge) writes (2^63 − 2: in the odd epoch the word is
/// then one below [`RETIRED`]). Admissions get there only emptying a bucket of the largest
/// capacity (2^62 − 1 ns) at the capped time (`tat ≤ now + b·T ≤ 2^63 − 2`); a charge's debt
/// saturates here, at least 2^62 ns (146 years) after any clock reading.
const MAX_TAT: u64 = EPOCH - 2;

/// `wait` from `now` (a capped reading), or at least [`NEVER`](super::NEVER) when it ends past
/// [`MAX_NOW`], where time stands still for the bucket: no reading ends it, and the few
/// nanoseconds to the cap were a wait a head slept and retried for ever.
#[inline(always)]
fn wait_from(now: u64, wait: u64) -> u64 {
    if now.saturating_add(wait) > MAX_NOW {
        wait.max(super::NEVER)
    } else {
        wait
    }
}

/// The token bucket's parameters: a snapshot of [`TokenBucket::params`].
#[derive(Clone, Copy)]
struct Shape {
    /// T, strength-reduced: `remaining` divides by it on every admission.
    per_permit: Divisor,
    /// b·T.
    capacity: u64,
    burst: u32,
    /// 0 or [`EPOCH`]: the epoch words written under these parameters carry.
    epoch: u64,
    /// The previous parameters' capacity (0 before the first reconfiguration).
    prev_capacity: u64,
    /// The clock time of the last reconfiguration.
    switched_at: u64,
}

impl Shape {
    fn to_words(self) -> [u64; 8] {
        let [d, hi, lo] = self.per_permit.to_words();
        [
            d,
            hi,
            lo,
            self.capacity,
            u64::from(self.burst),
            self.epoch,
            self.prev_capacity,
            self.switched_at,
        ]
    }

    #[inline(always)]
    fn from_words(w: [u64; 8]) -> Self {
        Shape {
            per_permit: Divisor::from_words([w[0], w[1], w[2]]),
            capacity: w[3],
            burst: w[4] as u32,
            epoch: w[5],
            prev_capacity: w[6],
            switched_at: w[7],
        }
    }

    /// T.
    #[inline(always)]
    fn interval(&self) -> u64 {
        self.per_permit.get()
    }

    /// Whole permits left when the bucket's arrival time is `ahead` of now: burst − ⌈ahead / T⌉.
    #[inline(always)]
    fn remaining(&self, ahead: u64) -> u32 {
        // ahead < 2^63 on every caller's path, and T ≤ 2^62, so the addition cannot overflow.
        let used = self
            .per_permit
            .div(ahead.saturating_add(self.interval() - 1))
            .min(u64::from(u32::MAX));
        self.burst.saturating_sub(used as u32)
    }

    /// `tat` of `word` (bit 63 cleared), or `None` if it was written under the other epoch.
    #[inline(always)]
    fn tat(&self, word: u64) -> Option<u64> {
        (word & EPOCH == self.epoch).then_some(word & !EPOCH)
    }

    /// The `tat` a word written under the previous parameters stands for under these: its debt
    /// at the switch scaled by new capacity / old capacity and rounded up (never looser), at
    /// most [`MAX_TAT`]. A bucket full at the switch (`tat ≤ t`) stays full.
    #[cold]
    #[inline(never)]
    fn translate(&self, word: u64) -> u64 {
        let debt = (word & !EPOCH).saturating_sub(self.switched_at);
        if debt == 0 {
            return self.switched_at;
        }
        // Admissions leave debt ≤ old capacity, so the scaled debt is at most the new capacity
        // (≤ 2^62); only a charge's debt goes beyond, and it is scaled alike and bounded by
        // `MAX_TAT` as a charge is. (debt < 2^63 and capacity < 2^62: the product fits u128.)
        let scaled =
            (u128::from(debt) * u128::from(self.capacity)).div_ceil(u128::from(self.prev_capacity));
        let room = MAX_TAT.saturating_sub(self.switched_at);
        self.switched_at + scaled.min(u128::from(room)) as u64
    }
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
        // for centuries (and leaves bit 63 to the epoch).
        let capacity = interval
            .checked_mul(u64::from(burst))
            .filter(|c| *c <= u64::MAX / 4)
            .ok_or(ConfigError::TooLarge {
                what: "burst × (period / permits)",
                max: "about 146 years",
            })?;
        let shape = Shape {
            per_permit: Divisor::new(interval),
            capacity,
            burst,
            epoch: 0,
            prev_capacity: 0,
            switched_at: 0,
        };
        Ok(TokenBucket {
            params: Params::new(shape.to_words()),
        })
    }

    /// The parameters now, and the version they were published under.
    #[inline(always)]
    fn shape(&self) -> (Shape, u64) {
        let (words, version) = self.params.load();
        (Shape::from_words(words), version)
    }

    /// [`Shape::translate`] of an other-epoch `word` under the parameters of `version`, or
    /// `None` if they are no longer current (the word is then of a newer epoch, or the
    /// parameters changed again: decide again). Out of line and re-reading the parameters, so
    /// that the decision loop does not keep the translation's words live in registers.
    #[cold]
    #[inline(never)]
    fn translate_under(&self, version: u64, word: u64) -> Option<u64> {
        let (p, now_version) = self.shape();
        (now_version == version).then(|| p.translate(word))
    }
}

impl Algo for TokenBucket {
    type Cell = AtomicU64;

    fn cell(&self) -> AtomicU64 {
        AtomicU64::new(0)
    }

    fn limit(&self) -> u32 {
        self.shape().0.burst
    }

    fn version(&self) -> u64 {
        self.shape().1
    }

    #[inline(always)]
    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.run::<C, COMMIT, false>(state, n, clock)
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
    ///
    /// **Saturated.** A [charge](Charge) holds `tat` at [`MAX_TAT`], below `G` when it saturates:
    /// nothing is given back from there (subtracting let a permit through, at the clock's cap,
    /// that the charge alone forbids). Only refunds and a reconfiguration's translation lower a
    /// saturated `tat`, and an admission under the translated parameters is refused while it is
    /// that far ahead, so below `MAX_TAT` the invariant holds. (An admission that empties a
    /// bucket of the largest capacity at the capped time lands on `MAX_TAT` too, and its refund
    /// gives nothing back either: the two words cannot be told apart.)
    ///
    /// **Reconfigured since.** If the admission's parameters version (its token) is no longer
    /// current, or the word is of another epoch, nothing is given back (conservative).
    fn refund<C: Clock>(&self, state: &AtomicU64, n: u32, admission: &Admission, clock: &C) {
        let (p, version) = self.shape();
        if version as u32 != admission.token() {
            return;
        }
        let cost = u64::from(n) * p.interval();
        // Acquire: as in `try_acquire`: every admission our CAS follows read its clock earlier.
        let mut word = state.load(Ordering::Acquire);
        loop {
            let Some(tat) = p.tat(word).filter(|_| word != RETIRED) else {
                return;
            };
            if tat >= MAX_TAT {
                // A charge's saturated tat, which no longer holds every admission: see below.
                return;
            }
            // Capped as the admissions' times are (the bound below needs `t_k ≤ now` of their
            // times, which capping both keeps): past the cap, time stands still for the bucket,
            // and an uncapped reading made every refund there look ages late.
            let elapsed = clock
                .now()
                .min(MAX_NOW)
                .saturating_sub(admission.at_nanos());
            let give = cost.saturating_sub(elapsed);
            if give == 0 {
                return;
            }
            // Release on success: publishes our clock reading with the new tat, as an admission
            // does. Acquire on failure: as for the first load.
            match state.compare_exchange_weak(
                word,
                tat.saturating_sub(give) | p.epoch,
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
        vec![state.load(Ordering::Relaxed)]
    }

    /// Only a word of the current epoch: a `StoreLimiter` is never reconfigured, so it writes
    /// none other, and a word of the other epoch (bit 63 set: a foreign value) would be
    /// translated from previous parameters that do not exist (a capacity of 0, a division by
    /// zero). Such a word is no state, as [`RETIRED`] is not.
    #[cfg(feature = "store")]
    fn restore(&self, words: &[u64]) -> Option<AtomicU64> {
        match words {
            [word] if *word != RETIRED && self.shape().0.tat(*word).is_some() => {
                Some(AtomicU64::new(*word))
            }
            _ => None,
        }
    }

    #[cfg(all(test, not(turnstile_loom)))]
    fn words(state: &AtomicU64) -> Vec<u64> {
        vec![state.load(Ordering::Relaxed)]
    }

    /// Exact: the burst once the bucket is full (`at_limit`), then one permit a period each.
    fn beyond_limit(&self, now: u64, at_limit: u64, extra: u64) -> u64 {
        let wait = at_limit.saturating_add(extra.saturating_mul(self.shape().0.interval()));
        wait_from(now.min(MAX_NOW), wait)
    }

    fn available(&self, state: &AtomicU64, now: u64) -> u32 {
        // Relaxed: a statistic; no decision depends on it.
        let p = self.shape().0;
        match state.load(Ordering::Relaxed) {
            RETIRED => p.burst,
            word => {
                let tat = p.tat(word).unwrap_or_else(|| p.translate(word));
                p.remaining(tat.saturating_sub(now.min(MAX_NOW)))
            }
        }
    }

    fn retire_unless<C: Clock>(
        &self,
        state: &AtomicU64,
        clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64> {
        // Acquire: as in `try_acquire`.
        let word = state.load(Ordering::Acquire);
        let now = clock.now().min(MAX_NOW);
        if word == RETIRED {
            // Retired by a reset (`retire_now`), which counts it: not ours to count.
            return Err(now);
        }
        if word & !EPOCH == 0 {
            // Never used (a reconfiguration's sweep may have flipped its epoch bit): its inserter
            // is about to admit on it (see `Algo::retire`).
            return Err(now);
        }
        let p = self.shape().0;
        let tat = p.tat(word).unwrap_or_else(|| p.translate(word));
        if tat > now {
            // The bucket is full again (as fresh as a new one) at `tat`, under either epoch's
            // reading of the word (a translated debt is no longer than the new capacity).
            return Err(tat);
        }
        if waited() {
            // Idle, but its key has waiters queued: not evicted (see `Algo::retire_unless`).
            return Err(now);
        }
        // Release on success: as in the fixed window's `retire`. Relaxed on failure: an admission
        // landed, so the bucket is busy; we report `now` and look again later.
        state
            .compare_exchange(word, RETIRED, Ordering::Release, Ordering::Relaxed)
            .map(drop)
            .map_err(|_| now)
    }

    /// New parameters in a new epoch, then every cell translated (see the type's docs): the
    /// parameters are published first, so a caller that meets an untranslated word translates
    /// it itself; the sweep over `cells` makes sure no word that still owes a debt is two
    /// epochs old at the next reconfiguration (a word's epoch is one bit). It rewrites every
    /// word not yet written under the new parameters (a full one by flipping its epoch bit), so
    /// that a call racing the publication cannot store an old-epoch word behind it.
    fn reconfigure<C: Clock>(
        &self,
        to: &Self,
        clock: &C,
        cells: EachCell<'_, AtomicU64>,
    ) -> Result<(), ConfigError> {
        let (from, target) = (self.shape().0, to.shape().0);
        // The old parameters are closed before the clock is read, and the new ones published
        // after (`Params::begin`): every call that commits under the old ones read its clock
        // before the switch, so the debt its word holds at the switch is at most the old
        // capacity (beyond it only by a charge) and the translation keeps all of it (read
        // first and published later, a
        // bucket drained after the switch time came out of the clamp full again); every call
        // that loads the new ones reads its clock later, so none decides at a time before the
        // switch under them.
        let writing = self.params.begin();
        let now = clock.now().min(MAX_NOW);
        let p = Shape {
            epoch: from.epoch ^ EPOCH,
            prev_capacity: from.capacity,
            switched_at: now,
            ..target
        };
        writing.finish(p.to_words());
        cells(&|cell| {
            // Acquire: as in `try_acquire`, for the word we translate.
            let mut word = cell.load(Ordering::Acquire);
            // Every word not written under these parameters (their epoch and a `tat` after the
            // switch: every call deciding under them read its clock at or after `t`) gets a new
            // value, so that the CAS of a call still deciding under the old ones (between its
            // re-check and its CAS) fails and decides again. Leaving a word alone would let that
            // call write an old-epoch word after this sweep, which the next reconfiguration would
            // read as its own (one bit cannot tell two epochs apart).
            while word != RETIRED {
                let tat = word & !EPOCH;
                let new = match p.tat(word) {
                    Some(_) if tat > p.switched_at => break,
                    // Full at the switch (never-used cells included) reads as full under either
                    // epoch: flip the epoch, only to change the value.
                    _ if tat <= p.switched_at => word ^ EPOCH,
                    _ => p.translate(word) | p.epoch,
                };
                // Release on success: publishes the new word like an admission does.
                // Acquire on failure: as for the first load.
                match cell.compare_exchange_weak(word, new, Ordering::Release, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(actual) => word = actual,
                }
            }
        });
        Ok(())
    }

    fn retired(state: &AtomicU64) -> bool {
        // Relaxed: RETIRED is final, and the caller only removes the dead cell from its map.
        state.load(Ordering::Relaxed) == RETIRED
    }
}

/// `tat = max(tat, now) + n·T`, bounded by [`MAX_TAT`]: the bucket owes `tat − now − b·T` beyond
/// empty, and a call for m permits is admitted once `tat − now + m·T ≤ b·T` again.
impl Charge for TokenBucket {
    /// [`Algo::decide`] (`CHARGE` off) and [`Charge::charge`] (`COMMIT` and `CHARGE` on): one
    /// protocol, where a charge skips the two limit checks and bounds `tat` by [`MAX_TAT`].
    #[inline(always)]
    fn run<C: Clock, const COMMIT: bool, const CHARGE: bool>(
        &self,
        state: &AtomicU64,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        'params: loop {
            let (p, version) = self.shape();
            if !CHARGE && n > p.burst {
                return Err(too_big(n, p.burst));
            }
            // Acquire: pairs with the Release of the CAS that stored this word, so our clock read
            // below is no earlier than the one that produced it (and if it was written under newer
            // parameters, `changed` below sees their version).
            let mut word = state.load(Ordering::Acquire);
            loop {
                if word == RETIRED {
                    return Err(TryAcquireError::Closed);
                }
                let tat = match p.tat(word) {
                    Some(tat) => tat,
                    // The other epoch: newer parameters than our snapshot (reload them) or the
                    // previous ones (translate).
                    None => match self.translate_under(version, word) {
                        Some(tat) => tat,
                        None => continue 'params,
                    },
                };
                let now = clock.now().min(MAX_NOW);
                let start = tat.max(now);
                let next = if CHARGE {
                    // n·T can exceed u64 (n up to 2^32, T up to 2^62): saturate, then bound.
                    start
                        .saturating_add(u64::from(n.max(1)).saturating_mul(p.interval()))
                        .min(MAX_TAT.max(start))
                } else {
                    start.saturating_add(u64::from(n.max(1)) * p.interval())
                };
                let ahead = next - now;
                if !CHARGE && ahead > p.capacity {
                    return Err(TryAcquireError::Rejected(Rejection::new(
                        wait_from(now, ahead - p.capacity),
                        p.burst,
                    )));
                }
                if n == 0 || !COMMIT {
                    let full_in = start - now;
                    return Ok(Admission::new(
                        now,
                        wait_from(now, full_in),
                        p.remaining(full_in),
                    ));
                }
                if self.params.changed(version) {
                    // Reconfigured since our snapshot: decide again under the new parameters.
                    continue 'params;
                }
                // Release on success: publishes our clock reading with the new tat. Acquire on
                // failure: as for the first load.
                match state.compare_exchange_weak(
                    word,
                    next | p.epoch,
                    Ordering::Release,
                    Ordering::Acquire,
                ) {
                    Ok(_) => {
                        return Ok(Admission::with_token(
                            now,
                            wait_from(now, ahead),
                            p.remaining(ahead),
                            version as u32,
                        ));
                    }
                    Err(actual) => word = actual,
                }
            }
        }
    }
}

/// A never-used word is 0, or `EPOCH` once a reconfiguration's sweep has flipped its epoch bit
/// (as `retire` judges it): a full bucket that nobody has drawn from.
#[cfg(feature = "keyed")]
impl crate::keyed::Unused for TokenBucket {
    fn unused(state: &AtomicU64) -> bool {
        // Relaxed: a hint; `retire_unused`'s CAS decides.
        state.load(Ordering::Relaxed) & !EPOCH == 0
    }

    fn retire_unused(state: &AtomicU64) -> bool {
        // Relaxed: only seeds the CAS, which decides.
        let mut word = state.load(Ordering::Relaxed);
        // A sweep may flip the epoch bit between our load and our CAS: try again from the word
        // it wrote while that is still a never-used one.
        while word & !EPOCH == 0 {
            // Release on success, as `retire`'s. Relaxed on failure: we only look at the word
            // that beat us (an admission: the cell is used and stays).
            match state.compare_exchange(word, RETIRED, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
        false
    }

    fn retire_now(state: &AtomicU64) -> bool {
        super::retire_word(state, |word| word & !EPOCH == 0)
    }
}

#[cfg(all(test, not(turnstile_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    /// The largest capacity admitted at the capped time, in the odd epoch, must not produce the
    /// all-ones word `RETIRED` (the limiter would then be closed for good).
    #[test]
    fn largest_capacity_at_capped_time_is_not_retired() {
        let clock = ManualClock::new();
        let rate = Rate::new(1, Duration::from_nanos(u64::MAX / 4));
        let algo = TokenBucket::new(rate, 1).unwrap();
        let cell = algo.cell();
        // One reconfiguration (to the same parameters): words now carry epoch bit 1.
        algo.reconfigure(&TokenBucket::new(rate, 1).unwrap(), &clock, &|each| {
            each(&cell)
        })
        .unwrap();
        clock.set(Duration::from_nanos(1 << 62));
        algo.try_acquire(&cell, 1, &clock).unwrap();
        assert_ne!(cell.load(Ordering::Relaxed), RETIRED);
        assert!(matches!(
            algo.try_acquire(&cell, 1, &clock),
            Err(TryAcquireError::Rejected(_))
        ));
    }

    /// A call that passed its re-check under the old parameters just before a reconfiguration
    /// published, and whose CAS lands after the sweep visited its cell, must fail that CAS:
    /// otherwise its old-epoch word survives the sweep, and the next reconfiguration (which
    /// flips the epoch back) reads it untranslated. Here an emptied bucket then refilled.
    #[test]
    fn sweep_defeats_a_call_racing_the_publication() {
        let clock = ManualClock::new();
        let bucket = |period| TokenBucket::new(Rate::new(1, Duration::from_nanos(period)), 2);
        let algo = bucket(16).unwrap();
        let cell = algo.cell();
        // The racing call: loads the fresh word and decides to take the whole burst (tat 32)
        // under the old parameters, re-checking them before the reconfiguration publishes.
        let (p, _) = algo.shape();
        // Orderings as a decision's load and CAS (one thread here: they only mirror them).
        let seen = cell.load(Ordering::Acquire);
        let next = 2 * p.interval();
        algo.reconfigure(&bucket(16).unwrap(), &clock, &|each| each(&cell))
            .unwrap();
        // Its CAS, after the sweep.
        let raced = cell
            .compare_exchange(seen, next | p.epoch, Ordering::Release, Ordering::Acquire)
            .is_ok();
        algo.reconfigure(&bucket(64).unwrap(), &clock, &|each| each(&cell))
            .unwrap();
        if raced {
            assert_eq!(
                algo.available(&cell, clock.now()),
                0,
                "an emptied bucket refilled across two reconfigurations"
            );
        }
        assert!(
            !raced,
            "the sweep left a word a racing call could still replace"
        );
    }
}
