//! proptest: random sequences of (advance the clock, try_acquire_n) against simple sequential
//! reference models, written independently of the lock-free code. Decisions, retry-after values and
//! remaining permits must match exactly.

use proptest::prelude::*;
use std::collections::VecDeque;
use std::time::Duration;
use turnstile::{Algorithm, ManualClock, Rate, RateLimiter, TryAcquireError};

/// What a reference model decides: Ok(remaining) or Err(retry_after), or None for "can never fit".
type Expected = Option<Result<u64, u64>>;

trait Model {
    fn decide(&mut self, now: u64, n: u64) -> Expected;
}

/// Fixed window, kept as "window index → count".
struct FixedModel {
    limit: u64,
    window: u64,
    index: u64,
    count: u64,
}

impl Model for FixedModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        if now / self.window != self.index {
            self.index = now / self.window;
            self.count = 0;
        }
        let reset = (self.index + 1) * self.window - now;
        if self.count + n.max(1) > self.limit {
            return Some(Err(reset));
        }
        self.count += n;
        Some(Ok(self.limit - self.count))
    }
}

/// Sliding log: the times of the admissions still inside the window.
struct LogModel {
    limit: u64,
    window: u64,
    log: VecDeque<u64>,
}

impl Model for LogModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        while self.log.front().is_some_and(|&t| t + self.window <= now) {
            self.log.pop_front();
        }
        let live = self.log.len() as u64;
        let want = n.max(1);
        if live + want > self.limit {
            // The (live + want − limit)-th oldest live admission must leave first.
            let blocker = self.log[(live + want - self.limit - 1) as usize];
            return Some(Err(blocker + self.window - now));
        }
        for _ in 0..n {
            self.log.push_back(now);
        }
        Some(Ok(self.limit - live - n))
    }
}

/// Sliding counter: counts per fixed window, estimate = prev·(W − e)/W + cur, in rationals.
struct CounterModel {
    limit: u64,
    window: u64,
    counts: std::collections::HashMap<u64, u64>,
}

impl CounterModel {
    fn fits(&self, prev: u64, cur: u64, n: u64, e: u64) -> bool {
        // estimate + n ≤ limit, multiplied through by W.
        (prev as u128) * ((self.window - e) as u128) + ((cur + n) as u128) * (self.window as u128)
            <= (self.limit as u128) * (self.window as u128)
    }
}

impl Model for CounterModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.limit {
            return None;
        }
        let (w, e) = (now / self.window, now % self.window);
        let prev = if w == 0 {
            0
        } else {
            *self.counts.get(&(w - 1)).unwrap_or(&0)
        };
        let cur = *self.counts.get(&w).unwrap_or(&0);
        let want = n.max(1);
        if !self.fits(prev, cur, want, e) {
            // Search the first instant (in ns) at which `want` fits, assuming nothing else happens.
            let mut t = now + 1;
            loop {
                let (w2, e2) = (t / self.window, t % self.window);
                let p = if w2 == w {
                    prev
                } else if w2 == w + 1 {
                    cur
                } else {
                    0
                };
                let c = if w2 == w { cur } else { 0 };
                if self.fits(p, c, want, e2) {
                    return Some(Err(t - now));
                }
                t += 1;
            }
        }
        *self.counts.entry(w).or_insert(0) += n;
        let weighted = ((prev as u128) * ((self.window - e) as u128)).div_ceil(self.window as u128);
        Some(Ok(self.limit - cur - n - weighted as u64))
    }
}

/// Token bucket as accumulated credit (in nanoseconds of capacity), not as GCRA's arrival time.
struct CreditModel {
    interval: u64,
    burst: u64,
    credit: u64,
    last: u64,
}

impl Model for CreditModel {
    fn decide(&mut self, now: u64, n: u64) -> Expected {
        if n > self.burst {
            return None;
        }
        let capacity = self.burst * self.interval;
        self.credit = (self.credit + (now - self.last)).min(capacity);
        self.last = now;
        let cost = n.max(1) * self.interval;
        if self.credit < cost {
            return Some(Err(cost - self.credit));
        }
        if n > 0 {
            self.credit -= cost;
        }
        Some(Ok(self.credit / self.interval))
    }
}

fn check(algorithm: Algorithm, mut model: impl Model, ops: &[(u64, u32)]) {
    let clock = ManualClock::new();
    let limiter = RateLimiter::with_clock(algorithm, clock.clone()).unwrap();
    for (i, &(advance, n)) in ops.iter().enumerate() {
        clock.advance(Duration::from_nanos(advance));
        let now = clock.elapsed().as_nanos() as u64;
        let got = match limiter.try_acquire_n(n) {
            Ok(a) => {
                assert_eq!(a.at_nanos(), now);
                Some(Ok(u64::from(a.remaining())))
            }
            Err(TryAcquireError::Rejected(r)) => Some(Err(r.retry_after_nanos())),
            Err(TryAcquireError::InsufficientCapacity { .. }) => None,
            Err(e) => panic!("unexpected {e:?}"),
        };
        let expected = model.decide(now, u64::from(n));
        assert_eq!(
            got, expected,
            "op {i} (advance {advance}, n {n}) at {now} in {algorithm:?}"
        );
    }
}

fn ops(limit: u32, max_advance: u64) -> impl Strategy<Value = Vec<(u64, u32)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => Just(0u64), 5 => 0..=max_advance, 1 => 0..=(4 * max_advance)],
            0..=limit + 1,
        ),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn fixed_window_matches_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        check(
            Algorithm::FixedWindow { limit, window: Duration::from_nanos(window) },
            FixedModel { limit: limit.into(), window, index: 0, count: 0 },
            &ops,
        );
    }

    #[test]
    fn sliding_window_matches_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        check(
            Algorithm::SlidingWindow { limit, window: Duration::from_nanos(window) },
            LogModel { limit: limit.into(), window, log: VecDeque::new() },
            &ops,
        );
    }

    #[test]
    fn sliding_counter_matches_model((limit, window, ops) in (1u32..8, 1u64..40)
        .prop_flat_map(|(l, w)| (Just(l), Just(w), ops(l, w)))) {
        check(
            Algorithm::SlidingCounter { limit, window: Duration::from_nanos(window) },
            CounterModel { limit: limit.into(), window, counts: Default::default() },
            &ops,
        );
    }

    #[test]
    fn token_bucket_matches_model((burst, permits, period, ops) in (1u32..8, 1u32..5, 1u64..60)
        .prop_flat_map(|(b, p, t)| (Just(b), Just(p), Just(t), ops(b, t)))) {
        let interval = period.div_ceil(u64::from(permits));
        check(
            Algorithm::TokenBucket { rate: Rate::new(permits, Duration::from_nanos(period)), burst },
            CreditModel {
                interval,
                burst: burst.into(),
                credit: u64::from(burst) * interval,
                last: 0,
            },
            &ops,
        );
    }
}
