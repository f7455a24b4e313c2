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
#[cfg(feature = "store")]
pub(crate) use sliding_window::slot_expiry;
pub(crate) use token_bucket::TokenBucket;

use crate::clock::Clock;
use crate::decision::Admission;
use crate::error::{ConfigError, TryAcquireError};

/// What every algorithm provides: shared parameters (`self`) acting on a cell of atomic state.
///
/// An unkeyed limiter owns one cell; a keyed limiter owns one per key, created by [`cell`] on a
/// key's first use and removed by [`retire`] once it is indistinguishable from a fresh one.
///
/// **Retirement.** `retire` swaps an idle cell's state word to [`RETIRED`] with a compare-and-swap
/// from the very word it judged idle, so it fails if any admission landed in between. A caller
/// that loads `RETIRED` (or whose CAS fails with it) gets [`TryAcquireError::Closed`] back, never a
/// decision: the keyed limiter then drops the dead cell from its map and retries on a fresh one.
/// An admission is therefore never made on, or lost with, a cell that eviction has removed.
///
/// [`cell`]: Algo::cell
/// [`retire`]: Algo::retire
pub(crate) trait Algo: Send + Sync + 'static {
    /// The atomic state of one limiter (one key).
    type Cell: Send + Sync + 'static;

    /// A fresh cell: nothing admitted yet.
    fn cell(&self) -> Self::Cell;

    /// The most permits one call can ask for.
    fn limit(&self) -> u32;

    /// The version the parameters are published under now: even, and larger after every
    /// reconfiguration (a `u64` that never wraps). A receipt's refund compares it in full, where
    /// an admission's token keeps only some bits of it (`refund::Refundable`).
    fn version(&self) -> u64;

    /// The decision for `n` permits at the clock's time. With `COMMIT` the permits are taken
    /// (all or nothing; `n == 0` is a probe for one permit that takes nothing); without it the
    /// decision is made for `n.max(1)` permits and nothing is written either way (for `n > 0`
    /// only the verdict and `at` of such a check are meaningful).
    /// Loads the state before it reads the clock (see the module docs); writes nothing when it
    /// rejects. `Err(Closed)` means the cell is retired.
    fn decide<C: Clock, const COMMIT: bool>(
        &self,
        cell: &Self::Cell,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError>;

    /// Takes `n` permits from `cell` at the clock's time, all or nothing; `n == 0` is a probe.
    #[inline(always)]
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))] // unkeyed limiters call `decide`
    fn try_acquire<C: Clock>(
        &self,
        cell: &Self::Cell,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.decide::<C, true>(cell, n, clock)
    }

    /// Whether `n.max(1)` permits would be admitted now, writing nothing: a chain's first pass.
    #[inline(always)]
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))] // unkeyed limiters call `decide`
    fn check<C: Clock>(
        &self,
        cell: &Self::Cell,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.decide::<C, false>(cell, n, clock)
    }

    /// Gives back the `n` permits of `admission`, which `try_acquire` on this cell returned, as
    /// far as that can be done without making the cell looser than if the admission had never
    /// happened. Used by a [`Chain`](crate::Chain) when a later member rejects, and by a receipt of
    /// `try_acquire_refundable` (`src/refund.rs`), whose refund may come any time later.
    ///
    /// Every implementation keeps one invariant, stated per algorithm: the state always charges
    /// *at least* the admissions that are never refunded, so every decision made on it is at
    /// least as strict as the same decision without the refunded admissions. A refund that
    /// cannot prove it is still exact gives back less (or nothing): conservative, never looser.
    /// A retired cell is never written (a cell holding a live admission is not idle, so it
    /// cannot have been retired while there was anything left to give back).
    fn refund<C: Clock>(&self, cell: &Self::Cell, n: u32, admission: &Admission, clock: &C);

    /// Whether [`refund`](Self::refund) restores the state exactly (for every later decision)
    /// whenever the clock has not moved since the admission, whatever else was admitted in
    /// between. The exact sliding window's refund is positional instead (see its docs), so a
    /// chain commits its sliding-window members last.
    fn exact_refund(&self) -> bool {
        true
    }

    /// Permits available at `now` (a snapshot; a retired cell counts as fresh).
    fn available(&self, cell: &Self::Cell, now: u64) -> u32;

    /// A lower bound of the time from `now` until more than the limit (`extra` beyond it) could
    /// have been admitted by calls one after another, from what the algorithm guarantees of
    /// any such sequence; `at_limit` is the time the limit needs at once (a check's
    /// retry-after, 0 if it fits now). A call that queued waiters hold back, whose permits and
    /// theirs are more than the limit, is answered with this (see
    /// `limiter::refused_for_waiters`), never less than `at_limit`. 0 (the default) when
    /// nothing more is known: permits in flight come back at no known time.
    #[cold]
    fn beyond_limit(&self, _now: u64, _at_limit: u64, _extra: u64) -> u64 {
        0
    }

    /// Marks `cell` retired if it is idle now (its state admits exactly what a fresh cell would,
    /// now and later). `Err(t)`: not idle; it cannot become idle before clock time `t`.
    ///
    /// A cell that has never admitted anything is *not* retired (`Err(now)`): a keyed limiter
    /// inserts a fresh cell and then admits on it through the ordinary path (load, then clock),
    /// and retiring it in between would only make the inserter retry, which a sweeper looping
    /// without pause could repeat forever. Every fresh cell is used by its inserter at once, or
    /// taken back by it (`keyed::Unused`) if that first decision admitted nothing.
    ///
    /// Nor is a cell found retired already (`Err(now)`): a reset (`keyed::Unused::retire_now`)
    /// retired it and counts it itself, so a sweep that met it just after its own check must
    /// not count it again.
    ///
    /// Keyed stores call [`retire_unless`](Self::retire_unless); this is it for a key without
    /// waiters (the unit tests' way in).
    #[allow(dead_code)]
    fn retire<C: Clock>(&self, cell: &Self::Cell, clock: &C) -> Result<(), u64> {
        self.retire_unless(cell, clock, || false)
    }

    /// As [`retire`](Self::retire), for a keyed store's sweep, which also asks `waited` whether
    /// the cell's key has waiters queued: such a key is not idle whatever its cell says, since a
    /// head woken by a release has yet to take what was freed for it, and its key must still be
    /// there (at the key cap a fresh cell may be refused to it). `Err(now)` then: look again.
    ///
    /// Every algorithm asks `waited` only once it has judged the cell idle, between its load
    /// and its compare-and-swap (for the concurrency limiter, whose idle word can come back
    /// after a head was woken, so that the CAS fails if the word changed since the check). A
    /// busy cell answers the time it turns idle, waiters or not: that is a lower bound still
    /// (waiters only add admissions). The time-based ones asked first and answered `Err(now)`
    /// for every key with waiters, busy or not: the shard's hint then said "now", so at the key
    /// cap every new key's search for room walked every such shard, key by key, however long
    /// the keys stayed busy, instead of one pass in all
    /// (`at_the_cap_busy_keys_with_waiters_cost_new_keys_one_search_in_all` counts the clock
    /// reads).
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))] // only keyed limiters evict
    fn retire_unless<C: Clock>(
        &self,
        cell: &Self::Cell,
        clock: &C,
        waited: impl FnOnce() -> bool,
    ) -> Result<(), u64>;

    /// Replaces the parameters with those of `to` (a freshly validated instance of the same
    /// algorithm), translating the state as each algorithm documents, at the clock's time.
    /// `cells` calls its argument on every cell (an unkeyed limiter's one, or every key's and the
    /// overflow cell of a keyed limiter); only algorithms whose translation writes cells use it.
    /// Callers serialise reconfigurations (each limiter holds a mutex around this call). On
    /// `Err` nothing has changed.
    fn reconfigure<C: Clock>(
        &self,
        to: &Self,
        clock: &C,
        cells: EachCell<'_, Self::Cell>,
    ) -> Result<(), ConfigError>;

    /// Whether `cell` is retired. Retirement is final, so a `true` never goes stale.
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))]
    fn retired(cell: &Self::Cell) -> bool;

    /// The cell's words, for a [`Store`](crate::Store) that keeps state as bytes. The four rate
    /// algorithms implement it; other cells (permits in flight) are not stored.
    ///
    /// The cell is the store's decision's own (restored from the store, decided on and saved by
    /// one call under the subject's lock), never shared with another thread: its loads are
    /// `Relaxed`.
    #[cfg(feature = "store")]
    fn save(_cell: &Self::Cell) -> Vec<u64> {
        Vec::new()
    }

    /// A cell holding `words` as [`save`](Self::save) wrote them, or `None` if they cannot be this
    /// algorithm's state with these parameters (then the caller starts from a fresh cell).
    #[cfg(feature = "store")]
    fn restore(&self, _words: &[u64]) -> Option<Self::Cell> {
        None
    }

    /// Every atomic word, for tests that check a rejection wrote nothing.
    #[cfg(all(test, not(turnstile_loom)))]
    fn words(cell: &Self::Cell) -> Vec<u64>;
}

/// The rate algorithms' [`charge`](Charge::charge): usage recorded after the fact. Permits in
/// flight (the concurrency limiter's cells) are not charged, so this is a trait of its own.
pub(crate) trait Charge: Algo {
    /// The decision protocol, once for both: [`Algo::decide`] is `run::<C, COMMIT, false>`, and
    /// a charge `run::<C, true, true>`, the same compare-and-swap loop minus the limit checks.
    fn run<C: Clock, const COMMIT: bool, const CHARGE: bool>(
        &self,
        cell: &Self::Cell,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError>;

    /// Records `n` permits as used at the clock's time without checking the limit (see
    /// `RateLimiter::charge` for each algorithm's semantics and bounds): the same protocol as
    /// [`decide`](Algo::decide) with `COMMIT` (load, then clock; the parameters' version
    /// re-checked before a Release CAS), minus the rejection. Never `Rejected` nor
    /// `InsufficientCapacity`; `n == 0` writes nothing and answers like a probe. The admission
    /// says what is left after the charge (0 while in debt) and when the cell is full again.
    /// `Err(Closed)` means the cell is retired.
    #[inline]
    fn charge<C: Clock>(
        &self,
        cell: &Self::Cell,
        n: u32,
        clock: &C,
    ) -> Result<Admission, TryAcquireError> {
        self.run::<C, true, true>(cell, n, clock)
    }
}

/// A divisor and its strength-reduced multiplier, kept as plain words so that it can live in
/// [`Params`](crate::sync::Params) and be replaced at run time without recomputing it on the hot
/// path. The arithmetic is `strength_reduce::StrengthReducedU64`'s (whose fields are private):
/// a power of two divides by shifting, anything else multiplies by ⌊(2^128 − 1) / d⌋ + 1 and
/// keeps the top 64 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Divisor {
    divisor: u64,
    multiplier: u128,
}

impl Divisor {
    /// `divisor` must be positive (every caller validated it).
    pub(crate) fn new(divisor: u64) -> Self {
        let divisor = divisor.max(1);
        let multiplier = if divisor.is_power_of_two() {
            0
        } else {
            u128::MAX / u128::from(divisor) + 1
        };
        Divisor {
            divisor,
            multiplier,
        }
    }

    /// The divisor.
    #[inline(always)]
    pub(crate) fn get(&self) -> u64 {
        self.divisor
    }

    /// `n / d`.
    #[inline(always)]
    pub(crate) fn div(&self, n: u64) -> u64 {
        if self.multiplier == 0 {
            n >> self.divisor.trailing_zeros()
        } else {
            let n = u128::from(n);
            let hi = n * (self.multiplier >> 64);
            let lo = (n * u128::from(self.multiplier as u64)) >> 64;
            ((hi + lo) >> 64) as u64
        }
    }

    /// `(n / d, n % d)`.
    #[inline(always)]
    pub(crate) fn div_rem(&self, n: u64) -> (u64, u64) {
        let q = self.div(n);
        (q, n - q * self.divisor)
    }

    pub(crate) fn to_words(self) -> [u64; 3] {
        [
            self.divisor,
            (self.multiplier >> 64) as u64,
            self.multiplier as u64,
        ]
    }

    pub(crate) fn from_words(words: [u64; 3]) -> Self {
        Divisor {
            divisor: words[0],
            multiplier: (u128::from(words[1]) << 64) | u128::from(words[2]),
        }
    }
}

/// The wait an algorithm reports for a time no clock reading reaches: 2^62 ns, about 146 years,
/// at least. Past the readings an algorithm distinguishes (the token bucket's and the exact
/// sliding window's are capped at 2^62 − 1 ns, the grid's saturate at `u64::MAX` ns) time stands
/// still for it, so a wait to a later time is never over; reported as the time to it, it was a
/// few nanoseconds that a waiting head slept and retried for ever (`acquire_blocking` spinning a
/// core). A ban for good reads the same.
pub(crate) const NEVER: u64 = 1 << 62;

/// The window grid of the fixed window and the sliding counter: window number
/// `base + (now + shift) / window` (wrapping), elapsed `(now + shift) % window`.
///
/// A limiter starts with `shift = base = 0`, which is exactly the aligned grid `now / window`.
/// [`rebase`](Self::rebase) changes the window length at run time without handing out a fresh
/// window: the current window keeps its number (and so its count) and its start, and takes the
/// new length; if it is already older than the new length, it ends at the earlier of its old end
/// and `now + new length` instead. Later windows have the new length. Window numbers therefore
/// keep increasing with time across any number of changes, which is all the 31-bit id rules need
/// (see [`pack`]): ids are still compared for equality only, and a wrap still only makes the
/// limiter stricter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grid {
    pub(crate) window: Divisor,
    shift: u64,
    base: u64,
}

impl Grid {
    pub(crate) fn new(window: u64) -> Self {
        Grid {
            window: Divisor::new(window),
            shift: 0,
            base: 0,
        }
    }

    /// The window length.
    #[inline(always)]
    pub(crate) fn len(&self) -> u64 {
        self.window.get()
    }

    /// The number of the window holding `now` and the time elapsed in it.
    #[inline(always)]
    pub(crate) fn locate(&self, now: u64) -> (u64, u64) {
        let (q, elapsed) = self.window.div_rem(now.saturating_add(self.shift));
        (self.base.wrapping_add(q), elapsed)
    }

    /// `wait` from `now`, or at least [`NEVER`] when the grid never gets there: its time
    /// (`now + shift`) saturates at `u64::MAX`, so a window whose end lies beyond never ends (a
    /// clock pushed to `u64::MAX` ns, `ManualClock::advance(Duration::MAX)`).
    #[inline(always)]
    pub(crate) fn wait(&self, now: u64, wait: u64) -> u64 {
        match now.saturating_add(self.shift).checked_add(wait) {
            Some(_) => wait,
            None => wait.max(NEVER),
        }
    }

    /// The grid for windows of length `to` from `now` on (see the type's docs). Times before
    /// `now` are never located on the new grid: the new parameters are published after this
    /// clock reading, and every caller that loads them reads its clock afterwards.
    pub(crate) fn rebase(&self, to: u64, now: u64) -> Self {
        let (number, elapsed) = self.locate(now);
        // Saturating: `elapsed ≤ now` for a clock that keeps the `Clock` contract (the grid's
        // windows start at 0 or later), but a user's clock that went back behind an earlier
        // rebase would make this underflow (a panic in debug builds).
        let start = now.saturating_sub(elapsed);
        let end = if elapsed < to {
            // Young enough for the new length: keep the start.
            start.saturating_add(to)
        } else {
            // Already older than the new length: end soon, but never at once.
            let old_end = now.saturating_add(self.len() - elapsed);
            old_end.min(now.saturating_add(to))
        };
        // Make `end` a boundary of the new grid: (end + shift) is a multiple of `to`.
        let shift = (to - end % to) % to;
        let window = Divisor::new(to);
        // end − to ≤ now < end in both cases, so `now` is in grid window (end + shift) / to − 1.
        let q = window.div(now.saturating_add(shift));
        Grid {
            window,
            shift,
            base: number.wrapping_sub(q),
        }
    }

    pub(crate) fn to_words(self) -> [u64; 5] {
        let [d, hi, lo] = self.window.to_words();
        [d, hi, lo, self.shift, self.base]
    }

    pub(crate) fn from_words(w: [u64; 5]) -> Self {
        Grid {
            window: Divisor::from_words([w[0], w[1], w[2]]),
            shift: w[3],
            base: w[4],
        }
    }
}

/// Visits cells: calls its argument on every cell of a limiter (see [`Algo::reconfigure`]).
pub(crate) type EachCell<'a, T> = &'a dyn Fn(&dyn Fn(&T));

/// The state word of a retired cell. No live state word takes this value: window words keep bit
/// 63 clear (31-bit ids, see [`pack`]), ticket counters stay below 2^63, and a token bucket's
/// word is an epoch bit over an arrival time below 2^63 − 1.
pub(crate) const RETIRED: u64 = u64::MAX;

/// `keyed::Unused::retire_now` for a cell whose retirement is a compare-and-swap of one word
/// (`word`) to [`RETIRED`]: from whatever the word holds, unless `unused` says it is never-used
/// or it is retired already. True if this call retired it.
#[cfg(feature = "keyed")]
pub(crate) fn retire_word(word: &crate::sync::AtomicU64, unused: impl Fn(u64) -> bool) -> bool {
    use crate::sync::Ordering;
    // Relaxed: only seeds the CAS, which decides.
    let mut seen = word.load(Ordering::Relaxed);
    while seen != RETIRED && !unused(seen) {
        // Release on success: what the resetting thread did before (moving the limiter's reset
        // count to odd, see `KeyedLimiter::reset`) is seen by whoever loads RETIRED (Acquire)
        // and re-creates the key, and through the map by anyone who then finds the new cell.
        // Relaxed on failure: we only look again at the word that beat us.
        match word.compare_exchange_weak(seen, RETIRED, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return true,
            Err(actual) => seen = actual,
        }
    }
    false
}

/// The id of window `window`: its low 31 bits.
#[inline(always)]
pub(crate) fn window_id(window: u64) -> u32 {
    (window as u32) & ID_MASK
}

/// Window ids are 31 bits, so that a window word never has bit 63 set (see [`RETIRED`]).
pub(crate) const ID_MASK: u32 = u32::MAX >> 1;

/// Packs a window id ([`window_id`]: the low 31 bits of `now / window`) and a count into one word.
///
/// | bit 63 | bits 62..32 | bits 31..0 |
/// |---|---|---|
/// | 0 (1 only in [`RETIRED`]) | window id, wrapping | permits counted in that window |
///
/// Ids are compared for equality only (or as "the id just before", modulo 2^31), so wrapping after
/// 2^31 windows can only make two windows 2^31 apart look like one: the limiter is then *stricter*
/// for one window, never looser.
#[inline]
pub(crate) fn pack(window: u32, count: u32) -> u64 {
    (u64::from(window) << 32) | u64::from(count)
}

/// `word`, or, if it is the fresh word `(0, 0)`, the word `(ID_MASK, 0)`, which decides every
/// call alike: a count of 0 frees the whole limit whatever window it names. A refund that empties
/// window 0 writes it so that [`Algo::retire`], which never retires a fresh word (its inserter is
/// about to admit), can still retire the key once idle; otherwise a key whose only admission was
/// given back in window 0 would stay in a keyed limiter's map, and count against its cap, for
/// good. (The sliding counter's window 0 can also weigh the window before it, once ids have
/// wrapped: its refund writes `(ID_MASK, prev)` instead, see `SlidingCounter::refund`.)
#[inline]
pub(crate) fn not_fresh(word: u64) -> u64 {
    if word == pack(0, 0) {
        pack(ID_MASK, 0)
    } else {
        word
    }
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
    use crate::Rate;
    use crate::clock::ManualClock;
    use proptest::prelude::*;
    use std::time::Duration;

    /// Drives an algorithm to exhaustion at several points in time, then checks that a burst of
    /// rejections (single, multi-permit and probes) leaves every atomic word as it was.
    fn rejections_write_nothing<A: Algo>(algo: A) {
        let clock = ManualClock::new();
        let cell = algo.cell();
        for step in 0..20 {
            clock.advance(Duration::from_millis(37 * step));
            while algo.try_acquire(&cell, 1, &clock).is_ok() {}
            let before = A::words(&cell);
            for n in [1, 2, 0, 1] {
                assert!(algo.try_acquire(&cell, n, &clock).is_err());
            }
            assert_eq!(A::words(&cell), before, "a rejection wrote shared memory");
        }
    }

    /// `check` decides like `try_acquire` would and writes nothing, admitting or not.
    fn checks_write_nothing<A: Algo>(algo: A) {
        let clock = ManualClock::new();
        let cell = algo.cell();
        for step in 0..40u64 {
            clock.advance(Duration::from_millis(13 * (step % 5)));
            for n in [1, 2, 3] {
                let before = A::words(&cell);
                let checked = algo.check(&cell, n, &clock).is_ok();
                assert_eq!(A::words(&cell), before, "a check wrote shared memory");
                let admitted = algo.try_acquire(&cell, n, &clock).is_ok();
                assert_eq!(checked, admitted, "check and try_acquire disagree (n {n})");
            }
        }
    }

    #[test]
    fn checks_write_no_shared_memory() {
        let window = Duration::from_millis(100);
        checks_write_nothing(FixedWindow::new(5, window).unwrap());
        checks_write_nothing(SlidingWindow::new(5, window).unwrap());
        checks_write_nothing(SlidingCounter::new(5, window).unwrap());
        checks_write_nothing(TokenBucket::new(Rate::new(5, window), 5).unwrap());
    }

    /// One step of the refund property: move the clock, then take n permits and keep them, take
    /// n permits and hold them for a later refund, or refund one of the held admissions.
    #[derive(Debug, Clone)]
    enum Step {
        Keep {
            advance: u64,
            n: u32,
        },
        Hold {
            advance: u64,
            n: u32,
        },
        Release {
            advance: u64,
            which: usize,
        },
        /// A charge of n, on both cells (it is usage both saw).
        Charge {
            advance: u64,
            n: u32,
        },
    }

    fn steps(limit: u32, window: u64) -> impl Strategy<Value = Vec<Step>> {
        let advance = || prop_oneof![3 => Just(0u64), 4 => 0..=window, 1 => 0..=3 * window];
        let step = prop_oneof![
            3 => (advance(), 1..=limit).prop_map(|(advance, n)| Step::Keep { advance, n }),
            2 => (advance(), 1..=limit).prop_map(|(advance, n)| Step::Hold { advance, n }),
            2 => (advance(), any::<usize>())
                .prop_map(|(advance, which)| Step::Release { advance, which }),
            1 => (advance(), 0..=2 * limit + 1).prop_map(|(advance, n)| Step::Charge { advance, n }),
        ];
        prop::collection::vec(step, 1..80)
    }

    /// Refunds never make a cell looser than a twin that never saw the refunded admissions (both
    /// see the same charges, which may put them in debt, and the sliding window's overdraw): the
    /// twin gets exactly the admissions the refunding cell keeps, and must admit each of them too
    /// (held admissions, refunded later, are never on the twin). `exact(at, now)` says whether a
    /// refund at clock `now` of an admission at `at` is exact for this algorithm (see each
    /// `refund`); while every refund so far was and nothing is held, the two cells must agree on
    /// every decision and on `available`. The clock starts at `start`.
    fn refunds_are_never_looser<A: Charge>(
        algo: A,
        start: u64,
        steps: &[Step],
        exact: impl Fn(u64, u64) -> bool,
    ) {
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(start));
        let (cell, twin) = (algo.cell(), algo.cell());
        let mut held: Vec<(u32, Admission)> = Vec::new();
        let mut exact_so_far = true;
        let release_all = [Step::Release {
            advance: 0,
            which: 0,
        }];
        let tail = std::iter::repeat_n(&release_all[0], steps.len());
        for step in steps.iter().chain(tail) {
            match *step {
                Step::Keep { advance, n } | Step::Hold { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    let got = algo.try_acquire(&cell, n, &clock);
                    if let (Step::Hold { .. }, Ok(admission)) = (step, got) {
                        held.push((n, admission));
                    } else if got.is_ok() {
                        let twin_got = algo.try_acquire(&twin, n, &clock);
                        assert!(twin_got.is_ok(), "looser than the twin at {}", clock.now());
                        if exact_so_far && held.is_empty() {
                            assert_eq!(got, twin_got, "admission differs from the twin");
                        }
                    } else if exact_so_far && held.is_empty() {
                        assert_eq!(got, algo.check(&twin, n, &clock), "the twin admits");
                    }
                }
                Step::Charge { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    let charged = algo.charge(&cell, n, &clock).unwrap();
                    let twin_charged = algo.charge(&twin, n, &clock).unwrap();
                    if exact_so_far && held.is_empty() {
                        assert_eq!(charged, twin_charged, "charge differs from the twin");
                    }
                }
                Step::Release { advance, which } => {
                    if held.is_empty() {
                        continue;
                    }
                    clock.advance(Duration::from_nanos(advance));
                    let (n, admission) = held.swap_remove(which % held.len());
                    algo.refund(&cell, n, &admission, &clock);
                    exact_so_far &= exact(admission.at_nanos(), clock.now());
                }
            }
            let now = clock.now();
            if exact_so_far && held.is_empty() {
                assert_eq!(algo.available(&cell, now), algo.available(&twin, now));
            }
        }
    }

    /// As [`refunds_are_never_looser`], with reconfigurations (`make` builds the parameters
    /// `(a, b)` stand for) applied to both cells between the steps: refunds made before, across
    /// and after them never leave the refunding cell looser than its twin (every admission it
    /// keeps, the twin makes too, and it never has more available).
    fn refunds_across_reconfigurations<A: Charge>(
        make: impl Fn(u32, u64) -> A,
        start: (u32, u64),
        at: u64,
        steps: &[(Step, Option<(u32, u64)>)],
    ) {
        let algo = make(start.0, start.1);
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(at));
        let (cell, twin) = (algo.cell(), algo.cell());
        let mut held: Vec<(u32, Admission)> = Vec::new();
        for (step, change) in steps {
            if let Some((a, b)) = *change {
                algo.reconfigure(&make(a, b), &clock, &|each| {
                    each(&cell);
                    each(&twin);
                })
                .unwrap();
            }
            match *step {
                Step::Keep { advance, n } | Step::Hold { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    let got = algo.try_acquire(&cell, n, &clock);
                    if let (Step::Hold { .. }, Ok(admission)) = (step, got) {
                        held.push((n, admission));
                    } else if got.is_ok() {
                        let twin_got = algo.try_acquire(&twin, n, &clock);
                        assert!(twin_got.is_ok(), "looser than the twin at {}", clock.now());
                    }
                }
                Step::Charge { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    algo.charge(&cell, n, &clock).unwrap();
                    algo.charge(&twin, n, &clock).unwrap();
                }
                Step::Release { advance, which } => {
                    if held.is_empty() {
                        continue;
                    }
                    clock.advance(Duration::from_nanos(advance));
                    let (n, admission) = held.swap_remove(which % held.len());
                    algo.refund(&cell, n, &admission, &clock);
                }
            }
            let now = clock.now();
            assert!(
                algo.available(&cell, now) <= algo.available(&twin, now),
                "more available than the twin at {now}"
            );
        }
    }

    /// Steps for [`refunds_across_reconfigurations`]: one in four changes the parameters to
    /// `(a, b)` first (a limit or burst in 1..6, a window or period in 1..30).
    fn steps_with_changes(
        limit: u32,
        window: u64,
    ) -> impl Strategy<Value = Vec<(Step, Option<(u32, u64)>)>> {
        let change = prop_oneof![3 => Just(None), 1 => (1u32..6, 1u64..30).prop_map(Some)];
        steps(limit, window).prop_flat_map(move |steps| {
            let n = steps.len();
            (Just(steps), prop::collection::vec(change.clone(), n))
                .prop_map(|(steps, changes)| steps.into_iter().zip(changes).collect::<Vec<_>>())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

        #[test]
        fn fixed_window_refunds_across_reconfigurations((limit, window, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps_with_changes(l, w)))) {
            let make = |l, w| FixedWindow::new(l, Duration::from_nanos(w)).unwrap();
            refunds_across_reconfigurations(make, (limit, window), at, &steps);
        }

        #[test]
        fn sliding_counter_refunds_across_reconfigurations((limit, window, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps_with_changes(l, w)))) {
            let make = |l, w| SlidingCounter::new(l, Duration::from_nanos(w)).unwrap();
            refunds_across_reconfigurations(make, (limit, window), at, &steps);
        }

        #[test]
        fn token_bucket_refunds_across_reconfigurations((burst, period, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(b, t)| (Just(b), Just(t), start(t), steps_with_changes(b, t)))) {
            let make = |b, t| TokenBucket::new(Rate::new(1, Duration::from_nanos(t)), b).unwrap();
            refunds_across_reconfigurations(make, (burst, period), at, &steps);
        }
    }

    /// After `steps` (admissions kept and held, refunds, charges, reconfigurations), `retire`
    /// says exactly when
    /// the cell turns idle: an `Err(t)` ahead of now is still busy at t − 1 and retires at t.
    /// A keyed store trusts t as the earliest time the key can go (its sweeps and, at the key
    /// cap, its search for room wait for it), so a t too late keeps an idle key for nothing.
    fn retire_says_when<A: Charge>(
        make: impl Fn(u32, u64) -> A,
        start: (u32, u64),
        at: u64,
        steps: &[(Step, Option<(u32, u64)>)],
    ) {
        let algo = make(start.0, start.1);
        let clock = ManualClock::new();
        clock.set(Duration::from_nanos(at));
        let cell = algo.cell();
        let mut held: Vec<(u32, Admission)> = Vec::new();
        for (step, change) in steps {
            if let Some((a, b)) = *change {
                algo.reconfigure(&make(a, b), &clock, &|each| each(&cell))
                    .unwrap();
            }
            match *step {
                Step::Keep { advance, n } | Step::Hold { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    if let Ok(admission) = algo.try_acquire(&cell, n, &clock) {
                        held.push((n, admission));
                    }
                }
                Step::Charge { advance, n } => {
                    clock.advance(Duration::from_nanos(advance));
                    algo.charge(&cell, n, &clock).unwrap();
                }
                Step::Release { advance, which } => {
                    if held.is_empty() {
                        continue;
                    }
                    clock.advance(Duration::from_nanos(advance));
                    let (n, admission) = held.swap_remove(which % held.len());
                    algo.refund(&cell, n, &admission, &clock);
                }
            }
        }
        let now = clock.now();
        match algo.retire(&cell, &clock) {
            Err(t) if t > now => {
                clock.set(Duration::from_nanos(t - 1));
                assert!(algo.retire(&cell, &clock).is_err(), "idle before {t}");
                clock.set(Duration::from_nanos(t));
                assert_eq!(algo.retire(&cell, &clock), Ok(()), "still busy at {t}");
            }
            Err(t) => {
                assert_eq!(t, now);
                // Only a never-used word (or a bucket's, given back at time 0; either may carry
                // a reconfiguration's epoch bit) is refused for now.
                assert_eq!(
                    A::words(&cell)[0] & !(1 << 63),
                    0,
                    "busy, for no time ahead"
                );
            }
            Ok(()) => {}
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        #[test]
        fn fixed_window_retire_says_when((limit, window, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps_with_changes(l, w)))) {
            let make = |l, w| FixedWindow::new(l, Duration::from_nanos(w)).unwrap();
            retire_says_when(make, (limit, window), at, &steps);
        }

        #[test]
        fn sliding_counter_retire_says_when((limit, window, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps_with_changes(l, w)))) {
            let make = |l, w| SlidingCounter::new(l, Duration::from_nanos(w)).unwrap();
            retire_says_when(make, (limit, window), at, &steps);
        }

        #[test]
        fn sliding_window_retire_says_when((limit, window, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps_with_changes(l, w)))) {
            // A ring of 5 slots, so that every limit the changes pick (1..6) fits.
            let make = |l, w| {
                SlidingWindow::new(l, Duration::from_nanos(w)).unwrap().with_capacity(5).unwrap()
            };
            retire_says_when(make, (limit, window), at, &steps);
        }

        #[test]
        fn token_bucket_retire_says_when((burst, period, at, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(b, t)| (Just(b), Just(t), start(t), steps_with_changes(b, t)))) {
            let make = |b, t| TokenBucket::new(Rate::new(1, Duration::from_nanos(t)), b).unwrap();
            retire_says_when(make, (burst, period), at, &steps);
        }
    }

    proptest! {
        /// The stored strength reduction divides exactly, whatever the divisor (powers of two,
        /// 1, u64::MAX included), and survives a round trip through its words.
        #[test]
        fn divisor_divides_exactly(d in prop_oneof![1u64..100, any::<u64>().prop_map(|d| d.max(1)),
                                                   (0u32..64).prop_map(|s| 1u64 << s)],
                                   n in any::<u64>()) {
            let divisor = Divisor::from_words(Divisor::new(d).to_words());
            prop_assert_eq!(divisor.div_rem(n), (n / d, n % d));
        }

        /// A rebased grid keeps the current window's number at the switch and never ends it at
        /// once; later windows have the new length.
        #[test]
        fn rebase_keeps_the_current_window(w in 1u64..1000, to in 1u64..1000, now in 0u64..100_000) {
            let grid = Grid::new(w);
            let (number, _) = grid.locate(now);
            let rebased = grid.rebase(to, now);
            let (same, elapsed) = rebased.locate(now);
            prop_assert_eq!(same, number);
            prop_assert!(elapsed < to);
            let end = now + (to - elapsed);
            prop_assert_eq!(rebased.locate(end), (number + 1, 0));
            prop_assert_eq!(rebased.locate(end + to), (number + 2, 0));
        }
    }

    /// Where the refund and retirement properties start the clock: at 0, a few windows of `window`
    /// before the 31-bit window ids wrap (window 2^31 has id 0 again, and the window before it
    /// still weighs on a sliding counter), or anywhere up to 2^40 ns.
    fn start(window: u64) -> impl Strategy<Value = u64> {
        prop_oneof![
            1 => Just(0u64),
            3 => (0u64..3).prop_map(move |k| window * ((1 << 31) - 2 + k)),
            1 => 0u64..1 << 40,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn fixed_window_refunds((limit, window, start, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps(l, w)))) {
            let algo = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
            refunds_are_never_looser(algo, start, &steps, |_, _| true);
        }

        #[test]
        fn sliding_counter_refunds((limit, window, start, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps(l, w)))) {
            let algo = SlidingCounter::new(limit, Duration::from_nanos(window)).unwrap();
            // Exact while `current` has not rolled over, which it cannot have in the same window.
            refunds_are_never_looser(algo, start, &steps, |at, now| at / window == now / window);
        }

        #[test]
        fn token_bucket_refunds((burst, permits, period, start, steps) in (1u32..6, 1u32..4, 1u64..40)
            .prop_flat_map(|(b, p, t)| (Just(b), Just(p), Just(t), start(t), steps(b, t)))) {
            let algo = TokenBucket::new(Rate::new(permits, Duration::from_nanos(period)), burst).unwrap();
            refunds_are_never_looser(algo, start, &steps, |at, now| at == now);
        }

        #[test]
        fn sliding_window_refunds((limit, window, start, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), start(w), steps(l, w)))) {
            let algo = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
            // Positional: never looser, exact only until the first refund.
            refunds_are_never_looser(algo, start, &steps, |_, _| false);
        }
    }

    #[test]
    fn rejections_write_no_shared_memory() {
        let window = Duration::from_millis(100);
        rejections_write_nothing(FixedWindow::new(5, window).unwrap());
        rejections_write_nothing(SlidingWindow::new(5, window).unwrap());
        rejections_write_nothing(SlidingCounter::new(5, window).unwrap());
        rejections_write_nothing(TokenBucket::new(Rate::new(5, window), 5).unwrap());
    }

    /// A cell retires only when idle, says when it will be idle otherwise, and once retired
    /// answers `Closed` to every call without writing.
    fn retires_only_when_idle<A: Algo>(algo: A, idle_after: Duration) {
        let clock = ManualClock::new();
        let cell = algo.cell();
        let before = A::words(&cell);
        assert_eq!(
            algo.retire(&cell, &clock),
            Err(0),
            "a never-used cell is left to its inserter"
        );
        assert_eq!(A::words(&cell), before);

        clock.advance(Duration::from_millis(5));
        algo.try_acquire(&cell, 1, &clock).unwrap();
        let busy_until = algo.retire(&cell, &clock).unwrap_err();
        assert!(
            busy_until > clock.now(),
            "busy_until {busy_until} is not ahead"
        );
        assert!(busy_until <= clock.now() + idle_after.as_nanos() as u64);
        clock.set(Duration::from_nanos(busy_until - 1));
        assert!(
            algo.retire(&cell, &clock).is_err(),
            "retired before busy_until"
        );
        // `busy_until` is a lower bound; one more idle period later the cell is idle for sure.
        clock.set(Duration::from_nanos(busy_until));
        clock.advance(idle_after);
        let before = A::words(&cell);
        assert_eq!(algo.retire(&cell, &clock), Ok(()));
        assert_ne!(A::words(&cell), before);
        let retired = A::words(&cell);
        assert_eq!(
            algo.try_acquire(&cell, 1, &clock),
            Err(TryAcquireError::Closed)
        );
        assert_eq!(
            algo.try_acquire(&cell, 0, &clock),
            Err(TryAcquireError::Closed)
        );
        assert_eq!(A::words(&cell), retired, "a retired cell was written");
    }

    #[test]
    fn cells_retire_only_when_idle() {
        let window = Duration::from_millis(100);
        retires_only_when_idle(FixedWindow::new(5, window).unwrap(), window);
        retires_only_when_idle(SlidingWindow::new(5, window).unwrap(), window);
        retires_only_when_idle(SlidingCounter::new(5, window).unwrap(), window * 2);
        retires_only_when_idle(TokenBucket::new(Rate::new(5, window), 5).unwrap(), window);
    }
}
