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

use crate::clock::Clock;
use crate::decision::Admission;
use crate::error::TryAcquireError;

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
    /// happened. Used by a [`Chain`](crate::Chain) when a later member rejects.
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

    /// Marks `cell` retired if it is idle now (its state admits exactly what a fresh cell would,
    /// now and later). `Err(t)`: not idle; it cannot become idle before clock time `t`.
    ///
    /// A cell that has never admitted anything is *not* retired (`Err(now)`): a keyed limiter
    /// inserts a fresh cell and then admits on it through the ordinary path (load, then clock),
    /// and retiring it in between would only make the inserter retry, which a sweeper looping
    /// without pause could repeat forever. Every fresh cell is used by its inserter at once.
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))] // only keyed limiters evict
    fn retire<C: Clock>(&self, cell: &Self::Cell, clock: &C) -> Result<(), u64>;

    /// Whether `cell` is retired. Retirement is final, so a `true` never goes stale.
    #[cfg_attr(not(feature = "keyed"), allow(dead_code))]
    fn retired(cell: &Self::Cell) -> bool;

    /// The cell's words, for a [`Store`](crate::Store) that keeps state as bytes. The four rate
    /// algorithms implement it; other cells (permits in flight) are not stored.
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

/// The state word of a retired cell. No live state word takes this value: window words keep bit
/// 63 clear (31-bit ids, see [`pack`]), and arrival times and ticket counters stay below 2^63.
pub(crate) const RETIRED: u64 = u64::MAX;

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
        Keep { advance: u64, n: u32 },
        Hold { advance: u64, n: u32 },
        Release { advance: u64, which: usize },
    }

    fn steps(limit: u32, window: u64) -> impl Strategy<Value = Vec<Step>> {
        let advance = || prop_oneof![3 => Just(0u64), 4 => 0..=window, 1 => 0..=3 * window];
        let step = prop_oneof![
            3 => (advance(), 1..=limit).prop_map(|(advance, n)| Step::Keep { advance, n }),
            2 => (advance(), 1..=limit).prop_map(|(advance, n)| Step::Hold { advance, n }),
            2 => (advance(), any::<usize>())
                .prop_map(|(advance, which)| Step::Release { advance, which }),
        ];
        prop::collection::vec(step, 1..80)
    }

    /// Refunds never make a cell looser than a twin that never saw the refunded admissions: the
    /// twin gets exactly the admissions the refunding cell keeps, and must admit each of them too
    /// (held admissions, refunded later, are never on the twin). `exact(at, now)` says whether a
    /// refund at clock `now` of an admission at `at` is exact for this algorithm (see each
    /// `refund`); while every refund so far was and nothing is held, the two cells must agree on
    /// every decision and on `available`.
    fn refunds_are_never_looser<A: Algo>(
        algo: A,
        steps: &[Step],
        exact: impl Fn(u64, u64) -> bool,
    ) {
        let clock = ManualClock::new();
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

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        #[test]
        fn fixed_window_refunds((limit, window, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), steps(l, w)))) {
            let algo = FixedWindow::new(limit, Duration::from_nanos(window)).unwrap();
            refunds_are_never_looser(algo, &steps, |_, _| true);
        }

        #[test]
        fn sliding_counter_refunds((limit, window, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), steps(l, w)))) {
            let algo = SlidingCounter::new(limit, Duration::from_nanos(window)).unwrap();
            // Exact while `current` has not rolled over, which it cannot have in the same window.
            refunds_are_never_looser(algo, &steps, |at, now| at / window == now / window);
        }

        #[test]
        fn token_bucket_refunds((burst, permits, period, steps) in (1u32..6, 1u32..4, 1u64..40)
            .prop_flat_map(|(b, p, t)| (Just(b), Just(p), Just(t), steps(b, t)))) {
            let algo = TokenBucket::new(Rate::new(permits, Duration::from_nanos(period)), burst).unwrap();
            refunds_are_never_looser(algo, &steps, |at, now| at == now);
        }

        #[test]
        fn sliding_window_refunds((limit, window, steps) in (1u32..6, 1u64..30)
            .prop_flat_map(|(l, w)| (Just(l), Just(w), steps(l, w)))) {
            let algo = SlidingWindow::new(limit, Duration::from_nanos(window)).unwrap();
            // Positional: never looser, exact only until the first refund.
            refunds_are_never_looser(algo, &steps, |_, _| false);
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
