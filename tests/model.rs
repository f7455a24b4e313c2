//! proptest: random sequences of (advance the clock, try_acquire_n) against simple sequential
//! reference models, written independently of the lock-free code. Decisions, retry-after values and
//! remaining permits must match exactly.

mod common;

use common::models::{CounterModel, CreditModel, FixedModel, LogModel, Model};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::time::Duration;
use turnstile::{Algorithm, ManualClock, Rate, RateLimiter, TryAcquireError};

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
                debt: 0,
            },
            &ops,
        );
    }
}
