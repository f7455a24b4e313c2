//! Differential probes of the fixed window, the sliding counter and the token bucket against
//! sequential reference models that follow the documented semantics, including the parts the
//! model tests in `tests/model.rs` and `tests/reconfigure.rs` leave out: `reset_after`, probes
//! (n = 0) after reconfigurations, and the sliding counter's rebased grid. Time is driven by
//! `ManualClock`; everything is in nanoseconds.

use proptest::prelude::*;
use std::time::Duration;
use turnstile::{Algorithm, Clock, ManualClock, Rate, RateLimiter, TryAcquireError};

const NS: fn(u64) -> Duration = Duration::from_nanos;

/// What a call answered: admitted (remaining, reset_after), rejected (retry_after), or too big.
type Outcome = Option<Result<(u64, u64), u64>>;

fn outcome(got: Result<turnstile::Admission, TryAcquireError>) -> Outcome {
    match got {
        Ok(a) => Some(Ok((
            u64::from(a.remaining()),
            a.reset_after().as_nanos() as u64,
        ))),
        Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
        Err(TryAcquireError::InsufficientCapacity { .. }) => None,
        Err(other) => panic!("unexpected {other:?}"),
    }
}

/// The sliding counter as documented, on an explicit window grid: the current window
/// `[start, start + window)`, its count and the previous window's. A reconfiguration keeps the
/// current window's start with the new length, or, if it is already older than that, ends it at
/// the earlier of its old end and now + the new length (`Grid::rebase`).
#[derive(Clone, Debug)]
struct RebasedCounter {
    limit: u64,
    window: u64,
    start: u64,
    cur: u64,
    prev: u64,
}

impl RebasedCounter {
    fn roll(&mut self, now: u64) {
        if now >= self.start + self.window {
            let k = (now - self.start) / self.window;
            self.prev = if k == 1 { self.cur } else { 0 };
            self.cur = 0;
            self.start += k * self.window;
        }
    }

    fn fits(&self, now: u64, n: u64) -> bool {
        let e = now - self.start;
        u128::from(self.prev) * u128::from(self.window - e)
            + u128::from(self.cur + n) * u128::from(self.window)
            <= u128::from(self.limit) * u128::from(self.window)
    }

    fn weighted(&self, now: u64) -> u64 {
        let e = now - self.start;
        (u128::from(self.prev) * u128::from(self.window - e)).div_ceil(u128::from(self.window))
            as u64
    }

    /// The first instant from `now` on at which the state (nothing else admitted) is empty.
    fn full_at(&self, now: u64) -> u64 {
        let empty_at = |t: u64| {
            let mut m = self.clone();
            m.roll(t);
            m.cur == 0 && m.weighted(t) == 0
        };
        if empty_at(now) {
            return now;
        }
        let (mut lo, mut hi) = (now, self.start + 3 * self.window);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if empty_at(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    fn reconfigure(&mut self, limit: u64, window: u64, now: u64) {
        self.roll(now);
        let e = now - self.start;
        let end = if e < window {
            self.start + window
        } else {
            (self.start + self.window).min(now + window)
        };
        self.start = end - window;
        (self.limit, self.window) = (limit, window);
    }

    fn decide(&mut self, now: u64, n: u64) -> Outcome {
        if n > self.limit {
            return None;
        }
        self.roll(now);
        let want = n.max(1);
        if !self.fits(now, want) {
            // The estimate never rises while nothing is admitted, and `want` fits once two
            // windows have passed: the first instant it fits, by bisection.
            let fits_at = |t: u64| {
                let mut m = self.clone();
                m.roll(t);
                m.fits(t, want)
            };
            let (mut lo, mut hi) = (now, self.start + 3 * self.window);
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if fits_at(mid) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            return Some(Err(hi - now));
        }
        self.cur += n;
        let remaining = self.limit - self.cur - self.weighted(now);
        Some(Ok((remaining, self.full_at(now) - now)))
    }
}

/// The fixed window as documented (see `RebasedCounter` for the grid), with `reset_after` the
/// time to the end of the current window, for probes too.
#[derive(Clone, Debug)]
struct RebasedFixed {
    limit: u64,
    window: u64,
    start: u64,
    count: u64,
}

impl RebasedFixed {
    fn roll(&mut self, now: u64) {
        if now >= self.start + self.window {
            self.start += (now - self.start) / self.window * self.window;
            self.count = 0;
        }
    }

    fn reconfigure(&mut self, limit: u64, window: u64, now: u64) {
        self.roll(now);
        let end = if now - self.start < window {
            self.start + window
        } else {
            (self.start + self.window).min(now + window)
        };
        self.start = end - window;
        (self.limit, self.window) = (limit, window);
    }

    fn decide(&mut self, now: u64, n: u64) -> Outcome {
        if n > self.limit {
            return None;
        }
        self.roll(now);
        let end = self.start + self.window;
        if self.count + n.max(1) > self.limit {
            return Some(Err(end - now));
        }
        self.count += n;
        Some(Ok((self.limit - self.count, end - now)))
    }
}

/// GCRA as a credit in nanoseconds (at most burst·T), with T = ⌈period / permits⌉; a
/// reconfiguration scales the debt by new capacity / old capacity, rounded up.
#[derive(Clone, Debug)]
struct Credit {
    interval: u64,
    burst: u64,
    credit: u64,
    last: u64,
}

impl Credit {
    fn new(permits: u32, period: u64, burst: u32) -> Self {
        let interval = period.div_ceil(permits.into());
        Credit {
            interval,
            burst: burst.into(),
            credit: interval * u64::from(burst),
            last: 0,
        }
    }

    fn capacity(&self) -> u64 {
        self.interval * self.burst
    }

    fn refill(&mut self, now: u64) {
        self.credit = (self.credit + (now - self.last)).min(self.capacity());
        self.last = now;
    }

    fn reconfigure(&mut self, permits: u32, period: u64, burst: u32, now: u64) {
        self.refill(now);
        let debt = self.capacity() - self.credit;
        let old = self.capacity();
        let next = Credit::new(permits, period, burst);
        let scaled =
            (u128::from(debt) * u128::from(next.capacity())).div_ceil(u128::from(old)) as u64;
        *self = Credit {
            credit: next.capacity() - scaled,
            last: now,
            ..next
        };
    }

    fn decide(&mut self, now: u64, n: u64) -> Outcome {
        if n > self.burst {
            return None;
        }
        self.refill(now);
        let need = n.max(1) * self.interval;
        if need > self.credit {
            return Some(Err(need - self.credit));
        }
        self.credit -= n * self.interval;
        Some(Ok((
            self.credit / self.interval,
            self.capacity() - self.credit,
        )))
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        advance: u64,
        n: u32,
    },
    Reconfigure {
        advance: u64,
        limit: u32,
        window: u64,
    },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        5 => (0u64..40, 0u32..6).prop_map(|(advance, n)| Op::Acquire { advance, n }),
        1 => (0u64..40, 1u32..6, 1u64..30)
            .prop_map(|(advance, limit, window)| Op::Reconfigure { advance, limit, window }),
    ];
    prop::collection::vec(op, 1..100)
}

/// Like [`ops`], for larger limits and windows.
/// Drives a sliding counter and [`RebasedCounter`] through `ops` from the start of window
/// `first`: every call's outcome equal.
fn counter_matches_the_rebased_model(
    limit: u32,
    window: u64,
    first: u64,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let clock = ManualClock::new();
    let algorithm = |limit, window| Algorithm::SlidingCounter {
        limit,
        window: NS(window),
    };
    let limiter = RateLimiter::with_clock(algorithm(limit, window), clock.clone()).unwrap();
    // From the start of window `first` (2^31 − 2: the 31-bit window ids wrap two windows on).
    let offset = window * first;
    clock.set(NS(offset));
    let mut model = RebasedCounter {
        limit: limit.into(),
        window,
        start: offset,
        cur: 0,
        prev: 0,
    };
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Acquire { advance, n } => {
                clock.advance(NS(advance));
                let now = clock.elapsed().as_nanos() as u64;
                let expected = model.decide(now, n.into());
                prop_assert_eq!(
                    outcome(limiter.try_acquire_n(n)),
                    expected,
                    "op {} at {}: {:?}",
                    i,
                    now,
                    model
                );
            }
            Op::Reconfigure {
                advance,
                limit,
                window,
            } => {
                clock.advance(NS(advance));
                let now = clock.elapsed().as_nanos() as u64;
                limiter.reconfigure(algorithm(limit, window)).unwrap();
                model.reconfigure(limit.into(), window, now);
            }
        }
    }
    Ok(())
}

fn wide_ops(limit: u32, window: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        8 => (0..=window, 0..=limit + 1).prop_map(|(advance, n)| Op::Acquire { advance, n }),
        1 => (0..=2 * window, 1..=2 * limit, 1..=2 * window)
            .prop_map(|(advance, limit, window)| Op::Reconfigure { advance, limit, window }),
    ];
    prop::collection::vec(op, 1..100)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The sliding counter with limits and windows large enough for uneven weights: rounding
    /// of retry_after, remaining and reset_after at every n up to the limit.
    #[test]
    fn sliding_counter_matches_the_rebased_model_wide((limit, window, ops) in (1u32..300, 1u64..5000)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), wide_ops(l, w)))) {
        counter_matches_the_rebased_model(limit, window, 0, &ops)?;
    }

    /// The sliding counter across reconfigurations: verdicts, remaining, reset_after and
    /// retry_after equal the rebased model's, from time 0 or from two windows before the
    /// 31-bit window ids wrap (the grid rebased across the wrap).
    #[test]
    fn sliding_counter_matches_the_rebased_model(limit in 1u32..6, window in 1u64..30,
        first in prop_oneof![Just(0u64), Just((1 << 31) - 2)], ops in ops()) {
        counter_matches_the_rebased_model(limit, window, first, &ops)?;
    }

    /// The fixed window across reconfigurations, `reset_after` included (probes too), from time
    /// 0 or from two windows before the 31-bit window ids wrap.
    #[test]
    fn fixed_window_reset_after_matches_the_rebased_model(limit in 1u32..6, window in 1u64..30,
        first in prop_oneof![Just(0u64), Just((1 << 31) - 2)], ops in ops()) {
        let clock = ManualClock::new();
        let algorithm = |limit, window| Algorithm::FixedWindow { limit, window: NS(window) };
        let limiter = RateLimiter::with_clock(algorithm(limit, window), clock.clone()).unwrap();
        clock.set(NS(window * first));
        let mut model = RebasedFixed { limit: limit.into(), window, start: window * first, count: 0 };
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Acquire { advance, n } => {
                    clock.advance(NS(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    let expected = model.decide(now, n.into());
                    prop_assert_eq!(outcome(limiter.try_acquire_n(n)), expected, "op {} at {}: {:?}", i, now, model);
                }
                Op::Reconfigure { advance, limit, window } => {
                    clock.advance(NS(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    limiter.reconfigure(algorithm(limit, window)).unwrap();
                    model.reconfigure(limit.into(), window, now);
                }
            }
        }
    }

    /// The token bucket with several permits per period (T rounded up) across
    /// reconfigurations, `reset_after` included (probes too).
    #[test]
    fn token_bucket_matches_the_credit_model_with_rounded_intervals(
        burst in 1u32..6, permits in 1u32..4, period in 1u64..40,
        ops in ops(), rates in prop::collection::vec(1u32..4, 100)
    ) {
        let clock = ManualClock::new();
        let algorithm = |permits, period, burst| Algorithm::TokenBucket {
            rate: Rate::new(permits, NS(period)),
            burst,
        };
        let limiter = RateLimiter::with_clock(algorithm(permits, period, burst), clock.clone()).unwrap();
        let mut model = Credit::new(permits, period, burst);
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Acquire { advance, n } => {
                    clock.advance(NS(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    let expected = model.decide(now, n.into());
                    prop_assert_eq!(outcome(limiter.try_acquire_n(n)), expected, "op {} at {}: {:?}", i, now, model);
                }
                Op::Reconfigure { advance, limit, window } => {
                    clock.advance(NS(advance));
                    let now = clock.elapsed().as_nanos() as u64;
                    limiter.reconfigure(algorithm(rates[i], window, limit)).unwrap();
                    model.reconfigure(rates[i], window, limit, now);
                }
            }
        }
    }
}

fn retry_of(got: Result<turnstile::Admission, TryAcquireError>) -> u64 {
    match got {
        Err(TryAcquireError::Rejected(r)) => r.retry_after_nanos(),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Checks that a rejection's retry_after is exact: rejected one nanosecond earlier, admitted
/// then (on a copy of the state: the limiter is rebuilt by `make` and replayed by `replay`).
fn exact_retry(
    make: impl Fn() -> (RateLimiter<ManualClock>, ManualClock),
    replay: impl Fn(&RateLimiter<ManualClock>, &ManualClock),
    n: u32,
) {
    let (limiter, clock) = make();
    replay(&limiter, &clock);
    let retry = retry_of(limiter.try_acquire_n(n));
    assert!(retry > 0);
    let (early, clock_early) = make();
    replay(&early, &clock_early);
    clock_early.advance(NS(retry - 1));
    assert!(
        early.try_acquire_n(n).is_err(),
        "admitted one nanosecond before retry_after {retry}"
    );
    if retry == u64::MAX || clock.now().checked_add(retry).is_none() {
        // Beyond the clock's range (a window of u64::MAX ns): never reachable.
        return;
    }
    clock.advance(NS(retry));
    assert!(
        limiter.try_acquire_n(n).is_ok(),
        "refused at retry_after {retry}"
    );
}

/// The largest parameters each algorithm accepts: windows of u64::MAX ns, limits and bursts of
/// u32::MAX, a bucket's capacity at its cap, clocks far out.
#[test]
fn extreme_parameters_answer_exactly() {
    let manual = |algorithm: Algorithm| {
        let clock = ManualClock::new();
        (
            RateLimiter::with_clock(algorithm, clock.clone()).unwrap(),
            clock,
        )
    };
    let huge = NS(u64::MAX);
    for algorithm in [
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: huge,
        },
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window: huge,
        },
        Algorithm::FixedWindow {
            limit: u32::MAX,
            window: NS(3),
        },
        Algorithm::SlidingCounter {
            limit: u32::MAX,
            window: NS(3),
        },
        Algorithm::TokenBucket {
            rate: Rate::new(u32::MAX, NS(1)),
            burst: u32::MAX,
        },
        Algorithm::TokenBucket {
            rate: Rate::new(3, NS(10)),
            burst: u32::MAX,
        },
    ] {
        // (A token bucket's clock is capped at 2^62 − 1 ns, where it stops refilling: starts
        // stay far enough below it for these retries to fall before it.)
        for start in [0, 1, 1 << 40, (1 << 62) - (1 << 34)] {
            let make = || manual(algorithm);
            let replay = |l: &RateLimiter<ManualClock>, c: &ManualClock| {
                c.set(NS(start));
                let a = l.try_acquire_n(u32::MAX).unwrap();
                assert_eq!(a.remaining(), 0, "{algorithm:?} at {start}");
            };
            exact_retry(make, replay, 1);
            exact_retry(make, replay, u32::MAX);
            // Probes say what a call would get.
            let (l, c) = make();
            replay(&l, &c);
            assert!(l.try_acquire_n(0).is_err());
        }
    }
    // A bucket whose capacity is at its cap (2^62 − 1 ns, the clock's cap too), from time 0.
    let algorithm = Algorithm::TokenBucket {
        rate: Rate::new(1, NS(u64::MAX / 4)),
        burst: 1,
    };
    let make = || manual(algorithm);
    let replay = |l: &RateLimiter<ManualClock>, c: &ManualClock| {
        assert_eq!(c.now(), 0);
        l.try_acquire().unwrap();
    };
    exact_retry(make, replay, 1);
}

/// A sliding counter window older than the new length it shrinks to is reckoned from its
/// rebased start, `end − W'`: the previous window's weight jumps up at the switch and fades by
/// the window's end (ARCHITECTURE.md, "Per algorithm"); it does not weigh in full until then.
#[test]
fn a_shrunk_old_window_reweighs_its_previous_count_from_the_rebased_start() {
    let clock = ManualClock::new();
    let algorithm = |window| Algorithm::SlidingCounter {
        limit: 4,
        window: NS(window),
    };
    let limiter = RateLimiter::with_clock(algorithm(100), clock.clone()).unwrap();
    // A probe (n = 0) answers what is free now, or refuses when not one permit is.
    let available = || limiter.try_acquire_n(0).map_or(0, |a| a.remaining());
    clock.set(NS(50));
    limiter.try_acquire_n(4).unwrap();
    // 90 ns into window 1: window 0's 4 weigh 4 · 10/100, so 3 would fit.
    clock.set(NS(190));
    assert_eq!(available(), 3);
    // Shrunk to 10 ns: window 1 ends at min(200, 190 + 10) = 200 and is reckoned from 190.
    limiter.reconfigure(algorithm(10)).unwrap();
    assert_eq!(available(), 0);
    // One permit fits once 4 · (10 − e) + 10 ≤ 40: at e = 3.
    assert_eq!(retry_of(limiter.try_acquire()), 3);
    clock.set(NS(195));
    assert_eq!(available(), 2);
    clock.set(NS(200));
    assert_eq!(available(), 4);
}

/// Threads admit on a sliding counter while another moves a `ManualClock` and changes the
/// window length (rebasing the grid) between its steps. Replayed on the documented grid
/// afterwards, no window holds more than the limit, and at every instant that is not a
/// switch the estimate (the previous window's count weighted, plus the current window's up to
/// that instant) stays within the limit: the roll-over's publish and the parameters'
/// re-check hold across rebases.
#[test]
fn a_sliding_counter_rebased_under_load_never_over_admits() {
    rebased_under_load(true);
}

/// As [`a_sliding_counter_rebased_under_load_never_over_admits`], for the fixed window: no
/// window of the rebased grid holds more than the limit.
#[test]
fn a_fixed_window_rebased_under_load_never_over_admits() {
    rebased_under_load(false);
}

fn rebased_under_load(counter: bool) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const LIMIT: u64 = 5;
    let lengths = [7u64, 13, 20];
    let clock = ManualClock::new();
    let algorithm = |window| {
        let (limit, window) = (LIMIT as u32, NS(window));
        if counter {
            Algorithm::SlidingCounter { limit, window }
        } else {
            Algorithm::FixedWindow { limit, window }
        }
    };
    let limiter = RateLimiter::with_clock(algorithm(lengths[0]), clock.clone()).unwrap();
    // Lockstep without sleeps: the driver moves the clock, opens a round (`round`), may
    // reconfigure while the workers make their few attempts of the round, then waits for both
    // to be done with it (`acks`). Spinning freely would starve the driver on a busy machine.
    const ROUNDS: u64 = 1500;
    let (round, acks, done) = (AtomicU64::new(0), AtomicU64::new(0), AtomicBool::new(false));
    let (switches, mut admitted) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u32)
            .map(|id| {
                let (limiter, round, acks, done) = (&limiter, &round, &acks, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let mut seen = 0;
                    loop {
                        let now = loop {
                            let r = round.load(Ordering::Acquire);
                            if r != seen || done.load(Ordering::Acquire) {
                                break r;
                            }
                            std::thread::yield_now();
                        };
                        if now == seen {
                            return mine;
                        }
                        seen = now;
                        for i in 0..3u32 {
                            let n = 1 + (i + id) % 2;
                            if let Ok(a) = limiter.try_acquire_n(n) {
                                mine.push((a.at_nanos(), u64::from(n)));
                            }
                        }
                        acks.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        let mut switches = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for r in 1..=ROUNDS {
            clock.advance(NS(next() % 9));
            round.store(r, Ordering::Release);
            if next() % 4 == 0 {
                let window = lengths[(next() % 3) as usize];
                limiter.reconfigure(algorithm(window)).unwrap();
                switches.push((clock.now(), window));
            }
            while acks.load(Ordering::Acquire) < 2 * r {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);
        let admitted: Vec<_> = workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect();
        (switches, admitted)
    });
    admitted.sort_unstable();
    assert!(
        admitted.len() > 100,
        "too few admissions: {}",
        admitted.len()
    );
    // The grid: (number, start, length) of the window holding t, switches applied at their
    // time (an admission at a switch's own instant is in the same window under either grid).
    let mut grid = (0u64, 0u64, lengths[0]);
    let mut switches = switches.into_iter().peekable();
    let mut counts: std::collections::HashMap<u64, u64> = Default::default();
    let mut i = 0;
    while i < admitted.len() {
        let t = admitted[i].0;
        let mut switched_now = false;
        loop {
            // Roll to t, applying the switches up to t in order.
            let until = switches.peek().map_or(t, |&(at, _)| at.min(t));
            let (number, start, len) = grid;
            if until >= start + len {
                let k = (until - start) / len;
                grid = (number + k, start + k * len, len);
            }
            match switches.peek() {
                Some(&(at, window)) if at <= t => {
                    let (number, start, len) = grid;
                    let end = if at - start < window {
                        start + window
                    } else {
                        (start + len).min(at + window)
                    };
                    grid = (number, end - window, window);
                    switched_now |= at == t;
                    switches.next();
                }
                _ => break,
            }
        }
        let (number, start, len) = grid;
        let mut at_t = 0;
        while i < admitted.len() && admitted[i].0 == t {
            at_t += admitted[i].1;
            i += 1;
        }
        let cur = counts.entry(number).or_insert(0);
        *cur += at_t;
        let cur = *cur;
        assert!(cur <= LIMIT, "window {number} holds {cur} at {t}");
        let prev = if number == 0 {
            0
        } else {
            counts.get(&(number - 1)).copied().unwrap_or(0)
        };
        if counter && !switched_now {
            let e = t - start;
            assert!(
                prev * (len - e) + cur * len <= LIMIT * len,
                "estimate over the limit at {t}: prev {prev}, cur {cur}, e {e}, W {len}"
            );
        }
    }
}
